// runtime/bench/cuda_peaks.cpp: the GPU's measured ceilings and a few of
// our kernels against them, as one table (a benchmark program, not a test).
//
//   modar_cuda_peaks [--quick] [--reps N] [--side-by-side FILE.tsv]
//
// --side-by-side: also time the shapes of the PyTorch comparison
// (scripts/gpu_torch_compare.py reads FILE.tsv and times the same shapes with
// torch.matmul, F.scaled_dot_product_attention and the same layers written in
// PyTorch): bf16 GEMMs, attention forward and forward + backward (our default
// path, i.e. cuDNN where available, and the reference kernel), and the dense
// and MoD routed transformer layer forward + backward (runtime/layers.hpp).
// One row per case: kind, the case's parameters as key=value, our median
// seconds, the spread, and the path that ran.
//
// Rows: cuBLASLt bf16 GEMM (fp32 accumulation) and fp32 GEMM at large square
// sizes (FLOP/s), a device-to-device copy (bytes read + written per second),
// then our kernels at representative shapes with their achieved rate and the
// fraction of the matching ceiling.  Timing rules (docs/profiler.md): random
// data (never zeros), warm-up, CUDA events around each repetition, median and
// p10/p90 spread; inputs that fit in L2 are rotated over enough copies to
// exceed twice the L2 size.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench_main.hpp"
#include "modar/base/errors.hpp"
#include "modar/runtime/backend.hpp"
#include "modar/runtime/cuda_backend.hpp"
#include "modar/runtime/layers.hpp"

namespace {

using namespace modar::runtime;

struct Timing {
  double median_s = 0.0;
  double spread = 0.0;  // (p90 - p10) / median
};

// fn(rep) runs one repetition (rep selects the rotated buffer set).
Timing time_it(Backend& backend, int warmup, int reps, const std::function<void(int)>& fn) {
  for (int i = 0; i < warmup; ++i)
    fn(i);
  backend.synchronize();
  auto timer = backend.make_timer();
  std::vector<double> seconds;
  for (int i = 0; i < reps; ++i) {
    timer->start();
    fn(i);
    timer->stop();
    seconds.push_back(timer->elapsed_s());
  }
  std::sort(seconds.begin(), seconds.end());
  auto at = [&](double q) {
    return seconds[static_cast<size_t>(std::lround(q * static_cast<double>(seconds.size() - 1)))];
  };
  Timing t;
  t.median_s = at(0.5);
  t.spread = t.median_s > 0 ? (at(0.9) - at(0.1)) / t.median_s : 0.0;
  return t;
}

// A device tensor of uniform random values in [lo, hi) (uploaded as fp32,
// converted on the device for bf16).
Tensor random_tensor(Backend& backend, const std::vector<int64_t>& shape, ScalarType type,
                     uint64_t seed, double lo = -1.0, double hi = 1.0) {
  int64_t count = 1;
  for (const int64_t d : shape)
    count *= d;
  std::vector<float> host(static_cast<size_t>(count));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(static_cast<float>(lo), static_cast<float>(hi));
  for (float& x : host)
    x = dist(rng);
  Tensor staging = make_tensor(backend, shape, ScalarType::fp32);
  backend.copy_from_host(host.data(), staging);
  if (type == ScalarType::fp32)
    return staging;
  Tensor out = make_tensor(backend, shape, type);
  backend.convert(staging, out);
  return out;
}

struct Row {
  std::string name;
  std::string shape;
  Timing timing;
  double work = 0.0;  // FLOPs or bytes
  bool is_bytes = false;
  double ceiling = 0.0;  // matching measured ceiling (FLOP/s or B/s), 0 = this row is one
};

void print_rows(const std::vector<Row>& rows) {
  std::printf("%-28s %-34s %12s %8s %14s %9s\n", "op", "shape", "median_us", "spread", "rate",
              "of_peak");
  for (const Row& r : rows) {
    const double rate = r.work / r.timing.median_s;
    const std::string rate_text = r.is_bytes ? std::to_string(rate / 1e9).substr(0, 8) + " GB/s"
                                             : std::to_string(rate / 1e12).substr(0, 8) + " TF/s";
    std::printf("%-28s %-34s %12.1f %8.3f %14s %9s\n", r.name.c_str(), r.shape.c_str(),
                r.timing.median_s * 1e6, r.timing.spread, rate_text.c_str(),
                r.ceiling > 0
                    ? (std::to_string(100.0 * rate / r.ceiling).substr(0, 5) + "%").c_str()
                    : "ceiling");
  }
}

// ---- the PyTorch side-by-side cases (scripts/gpu_torch_compare.py) -------------
struct SideRow {
  std::string kind, params, path;
  Timing timing;
};

void side_by_side(Backend& gpu, int reps, const std::string& path) {
  std::vector<SideRow> rows;
  const int warmup = 3;
  // GEMMs: square ceilings and the shapes of a d = 2048 layer on 16384 tokens.
  const int64_t gemms[][3] = {{4096, 4096, 4096},   {8192, 8192, 8192},  {16384, 2048, 2048},
                              {16384, 8192, 2048},  {16384, 2048, 8192}, {2048, 2048, 16384}};
  for (const auto& g : gemms) {
    Tensor a = random_tensor(gpu, {g[0], g[2]}, ScalarType::bf16, 101);
    Tensor b = random_tensor(gpu, {g[2], g[1]}, ScalarType::bf16, 102);
    Tensor c = make_tensor(gpu, {g[0], g[1]}, ScalarType::bf16);
    const Timing t = time_it(gpu, warmup, reps, [&](int) { gpu.gemm(a, false, b, false, c); });
    rows.push_back({"gemm", "m=" + std::to_string(g[0]) + " n=" + std::to_string(g[1]) +
                                " k=" + std::to_string(g[2]),
                    "cublaslt", t});
  }
  // Attention (causal, bf16): [b, s, H, d] with G kv heads.
  const int64_t attn[][5] = {{8, 2048, 16, 16, 128}, {2, 4096, 16, 4, 64}, {1, 8192, 16, 16, 128},
                             {8, 256, 16, 16, 128}};
  for (const auto& a : attn) {
    const int64_t b = a[0], s = a[1], h = a[2], g = a[3], d = a[4];
    Tensor q = random_tensor(gpu, {b, s, h, d}, ScalarType::bf16, 111);
    Tensor k = random_tensor(gpu, {b, s, g, d}, ScalarType::bf16, 112);
    Tensor v = random_tensor(gpu, {b, s, g, d}, ScalarType::bf16, 113);
    Tensor dout = random_tensor(gpu, {b, s, h, d}, ScalarType::bf16, 114);
    Tensor o = make_tensor(gpu, {b, s, h, d}, ScalarType::bf16);
    Tensor lse = make_tensor(gpu, {b, h, s}, ScalarType::fp32);
    Tensor dq = make_tensor(gpu, {b, s, h, d}, ScalarType::bf16);
    Tensor dk = make_tensor(gpu, {b, s, g, d}, ScalarType::bf16);
    Tensor dv = make_tensor(gpu, {b, s, g, d}, ScalarType::bf16);
    gpu.fill(dq, 0.0), gpu.fill(dk, 0.0), gpu.fill(dv, 0.0);
    const std::string params = "b=" + std::to_string(b) + " s=" + std::to_string(s) +
                               " h=" + std::to_string(h) + " g=" + std::to_string(g) +
                               " d=" + std::to_string(d) + " causal=1";
    for (const CudaAttentionPath which : {CudaAttentionPath::automatic, CudaAttentionPath::reference}) {
      // The reference kernel (CUDA cores) takes ~1 s per call at the largest
      // case: time it at the smaller ones only, with 3 repetitions.
      const bool reference = which == CudaAttentionPath::reference;
      if (reference && static_cast<double>(b * h) * s * s > 6e8) continue;
      set_cuda_attention_path(which);
      const CudaAttentionCounts before = cuda_attention_counts();
      const int attn_reps = reference ? 3 : std::max(3, reps / 2);
      const Timing fwd = time_it(gpu, 2, attn_reps, [&](int) {
        gpu.attention_forward(q, k, v, TensorView{}, o, lse, AttentionParams{});
      });
      const Timing both = time_it(gpu, 2, attn_reps, [&](int) {
        gpu.attention_forward(q, k, v, TensorView{}, o, lse, AttentionParams{});
        gpu.attention_backward(dout, q, k, v, TensorView{}, o, lse, dq, dk, dv, AttentionParams{});
      });
      const CudaAttentionCounts after = cuda_attention_counts();
      const std::string ran = after.cudnn_forward > before.cudnn_forward ? "cudnn" : "reference";
      rows.push_back({"attention_fwd", params, ran, fwd});
      rows.push_back({"attention_fwd_bwd", params, ran, both});
    }
    set_cuda_attention_path(CudaAttentionPath::automatic);
  }
  // Layers: pre-norm attention (MHA, d_head 128, RoPE) + GELU MLP (4d),
  // forward + backward; the MoD routed layer at capacity 0.125, g(r) = r.
  const int64_t layers[][3] = {{2048, 2048, 8}};
  for (const auto& l : layers) {
    const int64_t d = l[0], s = l[1], b = l[2];
    MemoryTracker tracker;
    const Context ctx{gpu, &tracker, ScalarType::bf16};
    BranchShape shape;
    shape.d_model = d;
    shape.d_head = 128;
    shape.n_heads = d / 128;
    shape.n_kv_heads = shape.n_heads;
    shape.d_ff = 4 * d;
    ParameterSet params;
    Rng rng(1);
    TransformerLayer dense(params, ctx, "dense", shape, rng, 0.02);
    RoutingOptions routing;
    routing.capacity = 0.125;
    RoutedLayer routed(params, ctx, "routed", shape, routing, rng, 0.02);
    Tensor x0 = random_tensor(gpu, {b, s, d}, ScalarType::bf16, 121, -2.0, 2.0);
    Tensor dy = random_tensor(gpu, {b, s, d}, ScalarType::bf16, 122);
    std::vector<double> pos(static_cast<size_t>(b * s));
    for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<double>(static_cast<int64_t>(i) % s);
    Tensor positions = make_tensor(gpu, {b, s}, ScalarType::i32, pos);
    Tensor x = make_tensor(gpu, {b, s, d}, ScalarType::bf16);
    Tensor dx = make_tensor(gpu, {b, s, d}, ScalarType::bf16);
    const std::string p = "d=" + std::to_string(d) + " s=" + std::to_string(s) + " b=" +
                          std::to_string(b) + " h=" + std::to_string(shape.n_heads) +
                          " ff=" + std::to_string(shape.d_ff);
    const int layer_reps = std::max(3, reps / 2);
    const Timing dense_t = time_it(gpu, 2, layer_reps, [&](int) {
      gpu.copy(x0, x);
      gpu.copy(dy, dx);
      TransformerLayer::Saved saved;
      dense.forward_inplace(ctx, x, positions, &saved);
      dense.backward_inplace(ctx, dx, saved);
    });
    const Timing routed_t = time_it(gpu, 2, layer_reps, [&](int) {
      gpu.copy(x0, x);
      gpu.copy(dy, dx);
      RoutedLayer::Saved saved;
      routed.forward_inplace(ctx, x, &saved);
      routed.backward_inplace(ctx, dx, saved);
    });
    rows.push_back({"layer_dense_fwd_bwd", p, "runtime", dense_t});
    rows.push_back({"layer_mod_fwd_bwd", p + " capacity=0.125", "runtime", routed_t});
  }
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    throw modar::FileError("--side-by-side " + path + ": cannot open for writing");
  }
  std::fprintf(f, "kind\tparams\tours_median_s\tours_spread\tours_path\n");
  for (const SideRow& r : rows) {
    std::fprintf(f, "%s\t%s\t%.9g\t%.4f\t%s\n", r.kind.c_str(), r.params.c_str(),
                 r.timing.median_s, r.timing.spread, r.path.c_str());
  }
  std::fclose(f);
  std::printf("# side-by-side: %zu cases written to %s; %s\n", rows.size(), path.c_str(),
              cuda_attention_report().c_str());
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  int reps = 20;
  std::string side_path;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--quick") {
      quick = true;
    } else if (flag == "--reps" && i + 1 < argc) {
      reps = std::max(3, std::atoi(argv[++i]));
    } else if (flag == "--side-by-side" && i + 1 < argc) {
      side_path = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: modar_cuda_peaks [--quick] [--reps N] [--side-by-side FILE.tsv]\n");
      return 2;
    }
  }
  return run_benchmark("modar_cuda_peaks", [&] {
    auto backend_owner = make_cuda_backend();
    Backend& gpu = *backend_owner;
    const auto provenance = cuda_provenance(0);
    std::printf(
        "# device: %s (cc %s, %s SMs, max SM clock %s MHz), driver %s, CUDA runtime %s, "
        "cuBLASLt %s\n",
        provenance.at("gpu_name").c_str(), provenance.at("compute_capability").c_str(),
        provenance.at("multiprocessors").c_str(), provenance.at("sm_clock_max_mhz").c_str(),
        provenance.at("driver_version").c_str(), provenance.at("cuda_runtime_version").c_str(),
        provenance.at("cublas_version").c_str());
    const int64_t l2_bytes = cuda_l2_cache_bytes(0);
    std::vector<Row> rows;
    const int warmup = 3;

    // ---- ceilings ---------------------------------------------------------------
    // One n^3 GEMM of `type` (inputs from seeds `seed`, `seed` + 1): its row,
    // and the FLOP/s it reached (the ceiling).
    auto gemm_ceiling = [&](ScalarType type, int64_t n, uint64_t seed, const char* name) {
      Tensor a = random_tensor(gpu, {n, n}, type, seed);
      Tensor b = random_tensor(gpu, {n, n}, type, seed + 1);
      Tensor c = make_tensor(gpu, {n, n}, type);
      const Timing t = time_it(gpu, warmup, reps, [&](int) { gpu.gemm(a, false, b, false, c); });
      rows.push_back({name, std::to_string(n) + "^3", t, 2.0 * std::pow(static_cast<double>(n), 3),
                      false, 0.0});
      return rows.back().work / rows.back().timing.median_s;
    };
    const double peak_bf16 =
        gemm_ceiling(ScalarType::bf16, quick ? 4096 : 8192, 1, "gemm bf16 (cuBLASLt)");
    const double peak_fp32 =
        gemm_ceiling(ScalarType::fp32, quick ? 2048 : 4096, 3, "gemm fp32 (cuBLASLt)");
    const int64_t copy_elements =
        (quick ? int64_t{1} << 26 : int64_t{1} << 28);  // 256 MiB / 1 GiB fp32
    {
      Tensor src = random_tensor(gpu, {copy_elements}, ScalarType::fp32, 5);
      Tensor dst = make_tensor(gpu, {copy_elements}, ScalarType::fp32);
      const Timing t = time_it(gpu, warmup, reps, [&](int) { gpu.copy(src, dst); });
      rows.push_back({"device copy", std::to_string(copy_elements * 4 >> 20) + " MiB", t,
                      2.0 * 4.0 * static_cast<double>(copy_elements), true, 0.0});
    }
    const double bandwidth = rows.back().work / rows.back().timing.median_s;

    // ---- our kernels at representative shapes ---------------------------------------
    {  // attention forward, bf16, causal: 4 * b * H * s^2 * d_h / 2 FLOPs
      const int64_t b = 2, s = quick ? 1024 : 2048, h = 16, dh = 128;
      Tensor q = random_tensor(gpu, {b, s, h, dh}, ScalarType::bf16, 6);
      Tensor k = random_tensor(gpu, {b, s, h, dh}, ScalarType::bf16, 7);
      Tensor v = random_tensor(gpu, {b, s, h, dh}, ScalarType::bf16, 8);
      Tensor o = make_tensor(gpu, {b, s, h, dh}, ScalarType::bf16);
      Tensor lse = make_tensor(gpu, {b, h, s}, ScalarType::fp32);
      const Timing t = time_it(gpu, 1, std::max(3, reps / 4), [&](int) {
        gpu.attention_forward(q, k, v, TensorView{}, o, lse, AttentionParams{});
      });
      rows.push_back({"attention fwd bf16 causal", "b2 s" + std::to_string(s) + " H16 d128", t,
                      4.0 * b * h * static_cast<double>(s) * s * dh / 2.0, false, peak_bf16});
    }
    {  // top-k: bytes = logits read once + indices written
      const int64_t b = 16, s = 4096, k = 512;
      const int64_t sets = std::max<int64_t>(1, 2 * l2_bytes / (b * s * 4) + 1);
      std::vector<Tensor> logits;
      for (int64_t i = 0; i < sets; ++i)
        logits.push_back(
            random_tensor(gpu, {b, s}, ScalarType::fp32, 10 + static_cast<uint64_t>(i)));
      Tensor idx = make_tensor(gpu, {b, k}, ScalarType::i32);
      const Timing t = time_it(gpu, warmup, reps, [&](int rep) {
        gpu.topk(logits[static_cast<size_t>(rep % sets)], idx);
      });
      rows.push_back({"topk (radix, 1 block/seq)", "b16 s4096 k512", t,
                      static_cast<double>(b * s * 4 + b * k * 4), true, bandwidth});
    }
    {  // RMSNorm forward bf16: read x + write out
      const int64_t rows_n = quick ? 4096 : 16384, d = 4096;
      Tensor x = random_tensor(gpu, {rows_n, d}, ScalarType::bf16, 30);
      Tensor w = random_tensor(gpu, {d}, ScalarType::bf16, 31, 0.5, 1.5);
      Tensor out = make_tensor(gpu, {rows_n, d}, ScalarType::bf16);
      Tensor rstd = make_tensor(gpu, {rows_n}, ScalarType::fp32);
      const Timing t =
          time_it(gpu, warmup, reps, [&](int) { gpu.rmsnorm_forward(x, w, out, rstd, 1e-6); });
      rows.push_back({"rmsnorm fwd bf16", std::to_string(rows_n) + "x4096", t,
                      2.0 * 2.0 * static_cast<double>(rows_n * d), true, bandwidth});
    }
    {  // depth-read prefix bf16: bank read (keys = values) + outputs written
      const int64_t sources = 9, tokens = quick ? 2048 : 8192, queries = 8, d = 2048;
      Tensor bank = random_tensor(gpu, {sources, tokens, d}, ScalarType::bf16, 40);
      Tensor rstd = random_tensor(gpu, {sources, tokens}, ScalarType::fp32, 41, 0.5, 1.5);
      Tensor q = random_tensor(gpu, {queries, d}, ScalarType::fp32, 42, -0.05, 0.05);
      Tensor out = make_tensor(gpu, {queries, tokens, d}, ScalarType::bf16);
      Tensor lse = make_tensor(gpu, {queries, tokens}, ScalarType::fp32);
      const Timing t = time_it(gpu, 1, std::max(3, reps / 4), [&](int) {
        gpu.depth_read_prefix_forward(bank, rstd, bank, q, out, lse);
      });
      rows.push_back({"depth_read_prefix fwd bf16", "R9 T" + std::to_string(tokens) + " Q8 d2048",
                      t, 2.0 * static_cast<double>(sources * tokens * d + queries * tokens * d),
                      true, bandwidth});
    }
    (void)peak_fp32;
    print_rows(rows);
    std::printf("# %s\n", cuda_attention_report().c_str());
    std::printf(
        "# ceilings: bf16 GEMM %.1f TFLOP/s, fp32 GEMM %.1f TFLOP/s, copy %.0f GB/s; "
        "L2 %lld bytes\n",
        peak_bf16 / 1e12, peak_fp32 / 1e12, bandwidth / 1e9, static_cast<long long>(l2_bytes));
    if (!side_path.empty()) {
      side_by_side(gpu, reps, side_path);
    }
  });
}
