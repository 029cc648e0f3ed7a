// modar_bench_layers: what MoD and AttnRes / DAR cost on a real backend.
//
// Part 1: forward + backward time of one MoD routed layer (capacity c, default
//         12.5%) against the dense layer of the same shape, per (d, s, b), and
//         the speed ratio dense / routed.  At 12.5% the routed layer runs its
//         GEMMs on 1/8 of the tokens and attention on a (s/8)^2 square, so the
//         ratio approaches 8x for large s, minus the router / top-k / gather /
//         scatter overhead.
// Part 2: training-step time (forward + backward + AdamW) of a small model
//         with the plain residual, Block AttnRes, Block DAR and Full DAR, and
//         the overhead of each over the plain residual.
//
// Times are medians over --reps runs after --warmup runs, measured with the
// backend's timer (steady_clock on the CPU, CUDA events on a GPU).
//
//   modar_bench_layers                                   (CPU defaults)
//   modar_bench_layers --backend cuda --dtype bf16 --shapes 2048x2048x8
//   modar_bench_layers --shapes 512x1024x1,512x2048x2 --capacity 0.125 --reps 5
//   modar_bench_layers --model-d 512 --model-layers 8 --model-seq 512 --skip-layers
//   modar_bench_layers --config examples/configs/tiny.toml --skip-layers
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "bench_main.hpp"
#include "modar/base/errors.hpp"
#include "modar/runtime/backend.hpp"
#include "modar/runtime/layers.hpp"
#include "modar/runtime/model.hpp"

namespace {

using namespace modar;
using namespace modar::runtime;

struct Shape {
  int64_t d, s, b;
};

struct Options {
  std::string backend = "cpu";
  ScalarType dtype = ScalarType::fp32;
  std::vector<Shape> shapes = {
      {256, 256, 1}, {256, 1024, 1}, {512, 1024, 1}, {512, 2048, 1}, {256, 1024, 4}};
  int64_t head_dim = 64;
  double capacity = 0.125;
  int reps = 3;
  int warmup = 1;
  bool layers = true;
  bool model = true;
  int64_t model_d = 256, model_layers = 4, model_seq = 256, model_batch = 2, model_vocab = 1024;
  std::string config_path;  // --config: model shape from a planner TOML instead
};

[[noreturn]] void usage(const std::string& problem) {
  std::fprintf(stderr,
               "modar_bench_layers: %s\n"
               "usage: modar_bench_layers [--backend cpu|cuda] [--dtype fp32|bf16]\n"
               "  [--shapes DxSxB,...] [--head-dim N] [--capacity C] [--reps N] [--warmup N]\n"
               "  [--model-d N] [--model-layers N] [--model-seq N] [--model-batch N]\n"
               "  [--model-vocab N] [--config FILE.toml] [--skip-layers] [--skip-model]\n",
               problem.c_str());
  std::exit(2);
}

int64_t parse_int(const std::string& flag, const std::string& text) {
  try {
    size_t used = 0;
    const long long v = std::stoll(text, &used);
    if (used == text.size() && v > 0)
      return v;
  } catch (const std::exception&) {
  }
  usage(flag + " = " + text + ": expected a positive integer");
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc)
        usage(flag + ": missing value");
      return argv[++i];
    };
    if (flag == "--backend") {
      o.backend = value();
    } else if (flag == "--dtype") {
      const std::string v = value();
      if (v == "fp32")
        o.dtype = ScalarType::fp32;
      else if (v == "bf16")
        o.dtype = ScalarType::bf16;
      else
        usage("--dtype = " + v + ": allowed fp32, bf16");
    } else if (flag == "--shapes") {
      o.shapes.clear();
      std::string list = value();
      size_t start = 0;
      while (start <= list.size()) {
        const size_t comma = std::min(list.find(',', start), list.size());
        const std::string item = list.substr(start, comma - start);
        const size_t x1 = item.find('x'), x2 = item.find('x', x1 + 1);
        if (x1 == std::string::npos || x2 == std::string::npos) {
          usage("--shapes item " + item + ": expected DxSxB, e.g. 512x2048x1");
        }
        o.shapes.push_back({parse_int("--shapes d", item.substr(0, x1)),
                            parse_int("--shapes s", item.substr(x1 + 1, x2 - x1 - 1)),
                            parse_int("--shapes b", item.substr(x2 + 1))});
        start = comma + 1;
      }
    } else if (flag == "--head-dim") {
      o.head_dim = parse_int(flag, value());
    } else if (flag == "--capacity") {
      const std::string v = value();
      o.capacity = std::atof(v.c_str());
      if (!(o.capacity > 0.0 && o.capacity <= 1.0))
        usage("--capacity = " + v + ": must be in (0, 1]");
    } else if (flag == "--reps") {
      o.reps = static_cast<int>(parse_int(flag, value()));
    } else if (flag == "--warmup") {
      o.warmup = static_cast<int>(std::atoi(value().c_str()));
    } else if (flag == "--model-d") {
      o.model_d = parse_int(flag, value());
    } else if (flag == "--model-layers") {
      o.model_layers = parse_int(flag, value());
    } else if (flag == "--model-seq") {
      o.model_seq = parse_int(flag, value());
    } else if (flag == "--model-batch") {
      o.model_batch = parse_int(flag, value());
    } else if (flag == "--model-vocab") {
      o.model_vocab = parse_int(flag, value());
    } else if (flag == "--skip-layers") {
      o.layers = false;
    } else if (flag == "--config") {
      o.config_path = value();
    } else if (flag == "--skip-model") {
      o.model = false;
    } else if (flag == "--help" || flag == "-h") {
      usage("help");
    } else {
      usage("unknown flag " + flag);
    }
  }
  return o;
}

// Median seconds of `body` over reps, after warmup runs: wall time from the
// backend's timer and, on the CPU backend, process CPU time (std::clock),
// which is the better measure of the work on a machine shared with other jobs.
struct Timing {
  double wall_s = 0.0;
  double cpu_s = 0.0;
};

Timing median_seconds(Backend& backend, int warmup, int reps, const std::function<void()>& body) {
  for (int i = 0; i < warmup; ++i)
    body();
  backend.synchronize();
  std::unique_ptr<Timer> timer = backend.make_timer();
  std::vector<double> wall, cpu;
  for (int i = 0; i < reps; ++i) {
    const std::clock_t cpu_start = std::clock();
    timer->start();
    body();
    timer->stop();
    wall.push_back(timer->elapsed_s());
    cpu.push_back(static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC);
  }
  std::sort(wall.begin(), wall.end());
  std::sort(cpu.begin(), cpu.end());
  return {wall[wall.size() / 2], cpu[cpu.size() / 2]};
}

BranchShape layer_shape(int64_t d, int64_t head_dim) {
  BranchShape shape;
  shape.d_model = d;
  shape.d_head = std::min(head_dim, d);
  shape.n_heads = d / shape.d_head;
  shape.n_kv_heads = shape.n_heads;
  shape.d_ff = 4 * d;
  return shape;
}

void bench_layers(Backend& backend, const Options& o) {
  std::printf(
      "MoD routed layer (capacity %.4g, g(r) = r) vs dense layer: forward + backward, "
      "median of %d (backend %s, %s)\n",
      o.capacity, o.reps, backend.name().c_str(), to_string(o.dtype));
  const bool cpu = backend.device() == DeviceKind::cpu;
  std::printf("%6s %6s %4s %4s %6s | %12s %12s %8s", "d", "s", "b", "H", "k", "dense_ms",
              "routed_ms", "speedup");
  if (cpu)
    std::printf(" | %12s %12s %8s", "dense_cpu_ms", "routed_cpu_ms", "speedup");
  std::printf("\n");
  for (const Shape& sh : o.shapes) {
    MemoryTracker tracker;
    const Context ctx{backend, &tracker, o.dtype};
    const BranchShape shape = layer_shape(sh.d, o.head_dim);
    ParameterSet params;
    Rng rng(1);
    TransformerLayer dense(params, ctx, "dense", shape, rng, 0.02);
    RoutingOptions routing;
    routing.capacity = o.capacity;
    RoutedLayer routed(params, ctx, "routed", shape, routing, rng, 0.02);
    // Inputs: random (never time on zeros), uploaded once.
    std::vector<double> host(static_cast<size_t>(sh.b * sh.s * sh.d));
    for (double& v : host)
      v = rng.normal();
    Buffer x0 = ctx.make({sh.b, sh.s, sh.d});
    upload(backend, host, x0);
    for (double& v : host)
      v = rng.normal();
    Buffer dy = ctx.make({sh.b, sh.s, sh.d});
    upload(backend, host, dy);
    std::vector<int32_t> pos(static_cast<size_t>(sh.b * sh.s));
    for (size_t i = 0; i < pos.size(); ++i)
      pos[i] = static_cast<int32_t>(i % sh.s);
    Buffer positions = ctx.indices({sh.b, sh.s}, pos);
    Buffer x = ctx.make({sh.b, sh.s, sh.d});
    Buffer dx = ctx.make({sh.b, sh.s, sh.d});

    const Timing dense_t = median_seconds(backend, o.warmup, o.reps, [&]() {
      backend.copy(x0, x);
      backend.copy(dy, dx);
      TransformerLayer::Saved saved;
      dense.forward_inplace(ctx, x, positions, &saved);
      dense.backward_inplace(ctx, dx, saved);
    });
    const Timing routed_t = median_seconds(backend, o.warmup, o.reps, [&]() {
      backend.copy(x0, x);
      backend.copy(dy, dx);
      RoutedLayer::Saved saved;
      routed.forward_inplace(ctx, x, &saved);
      routed.backward_inplace(ctx, dx, saved);
    });
    std::printf("%6lld %6lld %4lld %4lld %6lld | %12.3f %12.3f %7.2fx",
                static_cast<long long>(sh.d), static_cast<long long>(sh.s),
                static_cast<long long>(sh.b), static_cast<long long>(shape.n_heads),
                static_cast<long long>(routed.routed_tokens(sh.s)), dense_t.wall_s * 1e3,
                routed_t.wall_s * 1e3, dense_t.wall_s / routed_t.wall_s);
    if (cpu) {
      std::printf(" | %12.3f %12.3f %7.2fx", dense_t.cpu_s * 1e3, routed_t.cpu_s * 1e3,
                  dense_t.cpu_s / routed_t.cpu_s);
    }
    std::printf("\n");
    std::fflush(stdout);
  }
}

void bench_model(Backend& backend, const Options& o) {
  struct Variant {
    const char* name;
    DarVariant dar;
    int64_t block_layers;
    int64_t mod_every;
  };
  const Variant variants[] = {{"plain residual", DarVariant::none, 2, 0},
                              {"Block AttnRes (K=2)", DarVariant::attnres, 2, 0},
                              {"Block DAR n=2 (K=2)", DarVariant::dar, 2, 0},
                              {"Full DAR n=2 (K=1)", DarVariant::dar, 1, 0},
                              {"MoD (--capacity) every 2", DarVariant::none, 2, 2}};
  // The model shape: flags, or [model] and train.micro_batch of a planner
  // config file (its [mod] / [dar] are replaced by the rows below).
  Config base;
  if (!o.config_path.empty()) {
    base = load_config_file(o.config_path);
  } else {
    base.model.d_model = o.model_d;
    base.model.n_layers = o.model_layers;
    base.model.n_heads = std::max<int64_t>(1, o.model_d / std::min(o.head_dim, o.model_d));
    base.model.vocab_size = o.model_vocab;
    base.model.seq_len = o.model_seq;
    base.train.micro_batch = o.model_batch;
  }
  const int64_t batch = base.train.micro_batch, seq = base.model.seq_len,
                vocab = base.model.vocab_size;
  std::printf(
      "\nTraining step (forward + backward + AdamW), L=%lld d=%lld s=%lld b=%lld V=%lld%s, "
      "median of %d (backend %s, %s)\n",
      static_cast<long long>(base.model.n_layers), static_cast<long long>(base.model.d_model),
      static_cast<long long>(seq), static_cast<long long>(batch), static_cast<long long>(vocab),
      o.config_path.empty() ? "" : (" from " + o.config_path).c_str(), o.reps,
      backend.name().c_str(), to_string(o.dtype));
  const bool cpu = backend.device() == DeviceKind::cpu;
  std::printf("%-24s | %10s %10s", "residual / routing", "step_ms", "vs_plain");
  if (cpu)
    std::printf(" %10s %10s", "cpu_ms", "vs_plain");
  std::printf(" %10s\n", "peak_MiB");
  Timing plain;
  for (const Variant& v : variants) {
    Config config = base;
    config.dar.variant = v.dar;
    config.dar.block_layers = v.block_layers;
    config.dar.streams = 2;
    config.mod.every = v.mod_every;
    config.mod.offset = 1;
    config.mod.capacity = o.capacity;
    ModelOptions options;
    options.dtype = o.dtype;
    Model model(backend, config, options);
    std::vector<int32_t> ids(static_cast<size_t>(batch * seq));
    for (size_t i = 0; i < ids.size(); ++i) {
      ids[i] = static_cast<int32_t>((i * 7919 + 13) % static_cast<size_t>(vocab));
    }
    Buffer tokens = model.make_tokens(ids, batch, seq);
    std::rotate(ids.begin(), ids.begin() + 1, ids.end());
    Buffer targets = model.make_tokens(ids, batch, seq);
    int64_t peak = 0;
    const Timing t = median_seconds(backend, o.warmup, o.reps,
                                    [&]() { peak = model.train_step(tokens, targets).peak_bytes; });
    if (v.dar == DarVariant::none && v.mod_every == 0) {
      plain = t;
    }
    std::printf("%-24s | %10.3f %+9.1f%%", v.name, t.wall_s * 1e3,
                100.0 * (t.wall_s / plain.wall_s - 1.0));
    if (cpu) {
      std::printf(" %10.3f %+9.1f%%", t.cpu_s * 1e3, 100.0 * (t.cpu_s / plain.cpu_s - 1.0));
    }
    std::printf(" %10.1f\n", static_cast<double>(peak) / (1024.0 * 1024.0));
    std::fflush(stdout);
  }
  std::printf(
      "(DAR coefficient heads: modar's mHC-style reconstruction, see docs/runtime_layers.md)\n");
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  return run_benchmark("modar_bench_layers", [&] {
    std::unique_ptr<Backend> backend = make_backend(o.backend);
    if (o.layers)
      bench_layers(*backend, o);
    if (o.model)
      bench_model(*backend, o);
  });
}
