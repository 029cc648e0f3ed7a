// runtime/validate.cpp: held-out configurations, measured on the runtime and
// predicted by the cost model from a profile (see modar/runtime/validate.hpp).
#include "modar/runtime/validate.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>

#include "modar/base/errors.hpp"
#include "modar/base/files.hpp"
#include "modar/base/json.hpp"
#include "modar/runtime/model.hpp"
#include "modar/runtime/profiler.hpp"
#include "validate_internal.hpp"

namespace modar::runtime {
namespace {

using validate_detail::TracingBackend;

// A small model; every size is chosen OFF the profiler's grid axes (powers of
// 4 from 16 on the CPU: 16, 64, 256, 1024, 4096), so the prediction
// interpolates rather than reading a measured point back.
Config small_config(int64_t d, int64_t layers, int64_t heads, int64_t seq, int64_t batch,
                    int64_t vocab, DType dtype) {
  Config c;
  c.model.d_model = d;
  c.model.n_layers = layers;
  c.model.n_heads = heads;
  c.model.seq_len = seq;
  c.model.vocab_size = vocab;
  c.model.mlp = MlpKind::gelu;
  c.train.micro_batch = batch;
  c.train.dtype = dtype;
  c.device.count = 1;
  c.dar.block_layers = std::min<int64_t>(c.dar.block_layers, layers);
  return c;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median_of(std::vector<double> values) {
  if (values.empty()) {
    return 0.0;
  }
  return summarize_samples(std::move(values)).median_s;
}

}  // namespace

std::vector<ValidationCase> validation_cases(bool quick, DeviceKind device, DType dtype) {
  std::vector<ValidationCase> cases;
  auto add = [&](const std::string& name, const std::string& scope, Config config) {
    cases.push_back({name, scope, std::move(config)});
  };
  const bool cpu = device == DeviceKind::cpu;
  // Base shapes: CPU small models; GPU a ~100M-class model.
  const int64_t d = cpu ? 192 : 1536;
  const int64_t heads = cpu ? 6 : 12;
  const int64_t seq = cpu ? 128 : 1536;
  const int64_t batch = cpu ? 3 : 3;
  const int64_t vocab = cpu ? 3000 : 40000;
  const int64_t layer_vocab = cpu ? 96 : 512;

  // Single layers (small vocabulary: the layer dominates).
  add("dense-layer", "layer", small_config(d, 1, heads, seq, batch, layer_vocab, dtype));
  {
    Config c = small_config(d, 1, heads, seq * 2, batch, layer_vocab, dtype);
    c.mod.every = 1;
    c.mod.offset = 0;
    c.mod.capacity = 0.25;
    add("mod-c0.25-layer", "layer", c);
  }
  {
    Config c = small_config(d, 1, heads, seq, batch, layer_vocab, dtype);
    c.dar.variant = DarVariant::dar;
    c.dar.block_layers = 1;
    add("dar-layer", "layer", c);
  }
  // Whole small training steps.
  add("dense-step", "step", small_config(d, 4, heads, seq, batch, vocab, dtype));
  for (const double capacity : {0.125, 0.5}) {
    Config c = small_config(d, 4, heads, seq * 2, batch, vocab, dtype);
    c.mod.every = 2;
    c.mod.offset = 1;
    c.mod.capacity = capacity;
    std::ostringstream name;
    name << "mod-c" << capacity << "-step";
    add(name.str(), "step", c);
  }
  {
    Config c = small_config(d, 4, heads, seq, batch, vocab, dtype);
    c.dar.variant = DarVariant::attnres;
    c.dar.block_layers = 2;
    add("attnres-step", "step", c);
  }
  {
    Config c = small_config(d, 4, heads, seq, batch, vocab, dtype);
    c.dar.variant = DarVariant::dar;
    c.dar.block_layers = 2;
    add("dar-step", "step", c);
  }
  // Experts ([moe], dropless): MoE FFN, integrated MoDE (null experts) and
  // staged MoDE (MoD around the block, MoE inside the routed blocks).  CPU
  // only until the MoE CUDA kernels (runtime/cuda/moe.cu) have passed the op
  // harness on a GPU: they build but have not run on one yet.
  if (cpu) {
    Config c = small_config(d, 1, heads, seq, batch, layer_vocab, dtype);
    c.moe.experts = 6;
    c.moe.top_k = 2;
    c.moe.expert_ffn = 2 * d;
    add("moe-e6k2-layer", "layer", c);
  }
  if (cpu) {
    Config c = small_config(d, 4, heads, seq, batch, vocab, dtype);
    c.moe.experts = 6;
    c.moe.top_k = 2;
    c.moe.expert_ffn = 2 * d;
    c.moe.first_dense = 1;
    add("moe-e6k2-step", "step", c);
    Config integrated = c;
    integrated.moe.mode = MoeMode::integrated;
    integrated.moe.null_experts = 2;
    add("mode-integrated-step", "step", integrated);
  }
  if (cpu) {
    Config c = small_config(d, 4, heads, seq * 2, batch, vocab, dtype);
    c.mod.every = 2;
    c.mod.offset = 1;
    c.mod.capacity = 0.25;
    c.moe.experts = 6;
    c.moe.top_k = 2;
    c.moe.expert_ffn = 2 * d;
    c.moe.mode = MoeMode::staged;
    add("mode-staged-step", "step", c);
  }
  if (!quick) {
    Config wide = small_config(cpu ? 384 : 3072, 2, cpu ? 6 : 24, seq, batch, vocab, dtype);
    add("dense-wide-step", "step", wide);
    Config swiglu = small_config(d, 4, heads, seq, batch, vocab, dtype);
    swiglu.model.mlp = MlpKind::swiglu;
    add("dense-swiglu-step", "step", swiglu);
    Config mod_dar = small_config(d, 4, heads, seq * 2, batch, vocab, dtype);
    mod_dar.mod.every = 2;
    mod_dar.mod.capacity = 0.25;
    mod_dar.dar.variant = DarVariant::dar;
    mod_dar.dar.block_layers = 2;
    add("mod-dar-step", "step", mod_dar);
    Config gqa = small_config(d, 4, heads, seq, batch, vocab, dtype);
    gqa.model.n_kv_heads = heads / 3;
    add("dense-gqa-step", "step", gqa);
  }
  for (auto& c : cases) {
    validate(c.config);
  }
  return cases;
}

ValidationReport run_validation(Backend& backend, const DeviceProfile& profile,
                                const ValidationOptions& options) {
  set_cpu_threads(options.threads);
  const auto stop_if_asked = [&] {
    if (options.should_stop && options.should_stop()) {
      throw Interrupted("interrupted (Ctrl-C) during the validation");
    }
  };
  const DType dtype =
      profile.provenance.count("dtype") > 0 && profile.provenance.at("dtype") == "bf16"
          ? DType::bf16
          : DType::fp32;
  std::vector<ValidationCase> cases = options.cases.empty()
                                          ? validation_cases(options.quick, backend.device(), dtype)
                                          : options.cases;
  ValidationReport report;
  report.profile_name = profile.name;
  report.backend = backend.name();
  report.load_average_before = load_average();
  report.method =
      "each case's model is built and warmed up (" + std::to_string(options.warmup_steps) +
      " steps) first; then " + std::to_string(options.rounds) +
      " interleaved rounds time one train_step of every case (" +
      std::string(options.clock == Clock::wall ? "wall clock: backend timer" : "process CPU time") +
      "), and each case's "
      "time is the median of its rounds; the predicted time is estimate(config, profile) (sum "
      "over lower(config)'s ops); one extra step per case is traced to count the executed ops";

  const TimingModel timing(profile);
  TracingBackend tracer(backend, dtype);
  struct Live {
    std::unique_ptr<Model> model;
    Buffer tokens, targets;
    std::vector<double> samples;
  };
  std::vector<Live> live(cases.size());
  std::vector<CaseResult> results(cases.size());

  for (size_t i = 0; i < cases.size(); ++i) {
    stop_if_asked();
    const Config& config = cases[i].config;
    ModelOptions model_options;
    model_options.dtype = scalar_type(config.train.dtype);
    model_options.seed = options.seed + i;
    live[i].model = std::make_unique<Model>(tracer, config, model_options);
    const int64_t b = config.train.micro_batch, s = config.model.seq_len;
    std::vector<int32_t> ids(static_cast<size_t>(b * s)), next(static_cast<size_t>(b * s));
    uint64_t state = 0x9e3779b97f4a7c15ULL * (i + 1);
    for (size_t t = 0; t < ids.size(); ++t) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      ids[t] = static_cast<int32_t>((state >> 33) % static_cast<uint64_t>(config.model.vocab_size));
    }
    for (size_t t = 0; t < ids.size(); ++t) {
      next[t] = ids[(t + 1) % ids.size()];
    }
    live[i].tokens = live[i].model->make_tokens(ids, b, s);
    live[i].targets = live[i].model->make_tokens(next, b, s);
    // Warm-up, then one traced step (what the runtime executes).
    StepResult step;
    for (int w = 0; w < options.warmup_steps; ++w) {
      step = live[i].model->train_step(live[i].tokens, live[i].targets);
    }
    tracer.start_recording();
    step = live[i].model->train_step(live[i].tokens, live[i].targets);
    tracer.stop_recording();
    backend.synchronize();

    CaseResult& r = results[i];
    r.validation_case = cases[i];
    r.measured_peak_bytes = static_cast<double>(step.peak_bytes);
    r.executed = tracer.executed();
    for (const OpShape& shape : tracer.gemm_shapes()) {
      TimingModel::Source source = TimingModel::Source::roofline;
      r.predicted_gemm_s_executed += timing.op_time_s(shape, Pass::forward, &source);
    }
    const Estimate estimate_result = estimate(config, profile, StepKind::train);
    r.predicted_step_s = estimate_result.time.step_s;
    r.predicted_peak_bytes = estimate_result.memory.peak;
    r.extrapolated = estimate_result.time.extrapolated;
    r.ops_interpolated = estimate_result.time.ops_interpolated;
    r.ops_extrapolated = estimate_result.time.ops_extrapolated;
    r.ops_roofline = estimate_result.time.ops_roofline;
    for (size_t k = 0; k < r.predicted_by_kind_s.size(); ++k) {
      r.predicted_by_kind_s[k] = estimate_result.time.by_kind[k].time_s;
    }
    for (const OpRecord& op : lower(config, StepKind::train)) {
      if (op.shape.kind != OpKind::gemm) {
        continue;
      }
      r.lowered_gemm_ops += op.multiplicity;
      r.lowered_gemm_flops += op.flops * static_cast<double>(op.multiplicity);
      TimingModel::Source source = TimingModel::Source::roofline;
      r.predicted_gemm_s_lowered +=
          timing.op_time_s(op.shape, op.pass, &source) * static_cast<double>(op.multiplicity);
    }
    if (options.progress != nullptr) {
      std::fprintf(options.progress, "modar validate: built %s (%zu/%zu)\n", cases[i].name.c_str(),
                   i + 1, cases.size());
    }
  }

  // Interleaved timing rounds.
  auto timer = make_sample_timer(backend, options.clock);
  for (int round = 0; round < options.rounds; ++round) {
    stop_if_asked();
    const double round_start = now_s();
    for (size_t i = 0; i < cases.size(); ++i) {
      backend.synchronize();
      timer->start();
      live[i].model->train_step(live[i].tokens, live[i].targets);
      timer->stop();
      live[i].samples.push_back(timer->elapsed_s());
    }
    if (options.progress != nullptr) {
      std::fprintf(options.progress, "modar validate: round %d/%d (%.1f s)\n", round + 1,
                   options.rounds, now_s() - round_start);
    }
  }
  report.load_average_after = load_average();

  std::vector<double> step_errors, memory_errors;
  for (size_t i = 0; i < cases.size(); ++i) {
    CaseResult& r = results[i];
    const TimingStats stats = summarize_samples(live[i].samples);
    r.measured_step_s = stats.median_s;
    r.measured_spread = stats.spread();
    r.rounds = stats.repeats;
    r.step_error = (r.predicted_step_s - r.measured_step_s) / r.measured_step_s;
    r.memory_error = r.measured_peak_bytes > 0.0
                         ? (r.predicted_peak_bytes - r.measured_peak_bytes) / r.measured_peak_bytes
                         : 0.0;
    step_errors.push_back(std::abs(r.step_error));
    memory_errors.push_back(std::abs(r.memory_error));
  }
  report.step_median_abs_error = median_of(step_errors);
  report.step_max_abs_error = *std::max_element(step_errors.begin(), step_errors.end());
  report.memory_median_abs_error = median_of(memory_errors);
  report.memory_max_abs_error = *std::max_element(memory_errors.begin(), memory_errors.end());
  report.cases = std::move(results);
  live.clear();  // models (allocated through the tracer) go before it
  return report;
}

ValidationOptions resolve_validation_options(const ValidationRequest& request,
                                             const DeviceProfile& profile) {
  ValidationOptions options;
  options.quick = request.quick;
  options.rounds = request.rounds.value_or(options.rounds);
  if (options.rounds < 1 || options.rounds > 1000) {
    throw ConfigError("rounds = " + std::to_string(options.rounds) + ": must be in [1, 1000]");
  }
  options.warmup_steps = request.warmup_steps.value_or(options.warmup_steps);
  if (options.warmup_steps < 0 || options.warmup_steps > 1000) {
    throw ConfigError("warmup_steps = " + std::to_string(options.warmup_steps) +
                      ": must be in [0, 1000]");
  }
  const auto recorded = [&](const char* key) {
    const auto it = profile.provenance.find(key);
    return it == profile.provenance.end() ? std::string() : it->second;
  };
  const bool cpu = request.backend == "cpu";
  // Default: the threads the profile was measured with (CPU backend).
  int threads = 0;
  const std::string recorded_threads = recorded("threads");
  if (cpu && !recorded_threads.empty()) {
    char* end = nullptr;
    const long value = std::strtol(recorded_threads.c_str(), &end, 10);
    if (end == recorded_threads.c_str() || *end != '\0' || value < 0 || value > max_cpu_threads()) {
      throw ConfigError(profile.name + ": provenance.threads = \"" + recorded_threads +
                        "\": not a thread count in [0, " + std::to_string(max_cpu_threads()) +
                        "]; give threads explicitly");
    }
    threads = static_cast<int>(value);
  }
  options.threads = request.threads.value_or(threads);
  if (options.threads < 0 || options.threads > max_cpu_threads()) {
    throw ConfigError("threads = " + std::to_string(options.threads) + ": must be in [0, " +
                      std::to_string(max_cpu_threads()) + "] (0 = all cores)");
  }
  // Default: the clock the profile was measured with.
  const std::string recorded_clock = recorded("clock");
  if (!recorded_clock.empty() && recorded_clock != "cpu" && recorded_clock != "wall") {
    throw ConfigError(profile.name + ": provenance.clock = \"" + recorded_clock +
                      "\": allowed: wall, cpu");
  }
  options.clock = request.clock.value_or(recorded_clock == "cpu" ? Clock::cpu : Clock::wall);
  if (options.clock == Clock::cpu && !cpu) {
    throw ConfigError("clock = cpu: only the cpu backend can be timed by CPU time; use wall");
  }
  return options;
}

std::string validation_settings_json(const ValidationOptions& options,
                                     const ValidationRequest& request,
                                     const DeviceProfile& profile) {
  JsonWriter json(2);
  json.begin_object();
  json.field("backend", request.backend);
  json.field("profile", profile.name);
  json.field("quick", options.quick);
  json.field("rounds", options.rounds);
  json.field("warmup_steps", options.warmup_steps);
  json.field("threads", options.threads);
  json.field("clock", to_string(options.clock));
  json.end_object();
  return json.str() + "\n";
}

std::string validation_json(const ValidationReport& report) {
  JsonWriter json;
  json.begin_object();
  json.field("profile", report.profile_name);
  json.field("backend", report.backend);
  json.key("cases").begin_array();
  for (const CaseResult& r : report.cases) {
    const Config& c = r.validation_case.config;
    json.begin_object();
    json.field("name", r.validation_case.name);
    json.field("scope", r.validation_case.scope);
    json.key("config").begin_object();
    json.field("d_model", c.model.d_model).field("n_layers", c.model.n_layers);
    json.field("n_heads", c.model.n_heads).field("n_kv_heads", c.model.resolved_kv_heads());
    json.field("seq_len", c.model.seq_len).field("micro_batch", c.train.micro_batch);
    json.field("vocab_size", c.model.vocab_size).field("mlp", to_string(c.model.mlp));
    json.field("mod_every", c.mod.every).field("mod_capacity", c.mod.capacity);
    json.field("dar_variant", to_string(c.dar.variant))
        .field("dar_block_layers", c.dar.block_layers);
    json.field("dtype", to_string(c.train.dtype));
    json.end_object();
    json.key("step_time").begin_object();
    json.field("measured_s", r.measured_step_s).field("predicted_s", r.predicted_step_s);
    json.field("error", r.step_error).field("measured_spread", r.measured_spread);
    json.field("rounds", r.rounds).field("extrapolated", r.extrapolated);
    json.field("ops_interpolated", r.ops_interpolated);
    json.field("ops_extrapolated", r.ops_extrapolated).field("ops_roofline", r.ops_roofline);
    json.key("predicted_by_kind_s").begin_object();
    for (size_t k = 0; k < r.predicted_by_kind_s.size(); ++k) {
      if (r.predicted_by_kind_s[k] > 0.0) {
        json.field(to_string(static_cast<OpKind>(k)), r.predicted_by_kind_s[k]);
      }
    }
    json.end_object();
    json.end_object();
    json.key("memory").begin_object();
    json.field("measured_peak_bytes", r.measured_peak_bytes);
    json.field("predicted_peak_bytes", r.predicted_peak_bytes).field("error", r.memory_error);
    json.end_object();
    json.key("ops").begin_object();
    json.field("executed_calls", r.executed.calls);
    json.field("executed_gemm_calls", r.executed.gemm_calls);
    json.field("executed_gemm_flops", r.executed.gemm_flops);
    json.field("lowered_gemm_ops", r.lowered_gemm_ops);
    json.field("lowered_gemm_flops", r.lowered_gemm_flops);
    json.field("predicted_gemm_s_lowered", r.predicted_gemm_s_lowered);
    json.field("predicted_gemm_s_executed_shapes", r.predicted_gemm_s_executed);
    json.key("executed_s_by_kind").begin_object();
    for (size_t k = 0; k < r.executed.measured_by_kind_s.size(); ++k) {
      if (r.executed.calls_by_kind[k] > 0) {
        json.field(to_string(static_cast<OpKind>(k)), r.executed.measured_by_kind_s[k]);
      }
    }
    json.end_object();
    json.key("executed_calls_by_kind").begin_object();
    for (size_t k = 0; k < r.executed.calls_by_kind.size(); ++k) {
      if (r.executed.calls_by_kind[k] > 0) {
        json.field(to_string(static_cast<OpKind>(k)), r.executed.calls_by_kind[k]);
      }
    }
    json.end_object();
    json.end_object();
    json.end_object();
  }
  json.end_array();
  json.key("step_time").begin_object();
  json.field("median_abs_error", report.step_median_abs_error);
  json.field("max_abs_error", report.step_max_abs_error);
  json.end_object();
  json.key("memory").begin_object();
  json.field("median_abs_error", report.memory_median_abs_error);
  json.field("max_abs_error", report.memory_max_abs_error);
  json.end_object();
  json.field("load_average_before", report.load_average_before);
  json.field("load_average_after", report.load_average_after);
  json.field("method", report.method);
  json.end_object();
  return json.str() + "\n";
}

std::string validation_text(const ValidationReport& report) {
  std::ostringstream out;
  char line[512];
  out << "modar validate: profile " << report.profile_name << ", backend " << report.backend
      << "\n\n";
  std::snprintf(line, sizeof(line), "%-18s %-5s %11s %11s %8s %7s %10s %10s %8s %11s\n", "case",
                "scope", "measured", "predicted", "error", "spread", "peak MiB", "pred MiB",
                "mem err", "gemm calls");
  out << line;
  for (const CaseResult& r : report.cases) {
    char gemms[48];
    std::snprintf(gemms, sizeof(gemms), "%lld/%lld", static_cast<long long>(r.executed.gemm_calls),
                  static_cast<long long>(r.lowered_gemm_ops));
    std::snprintf(line, sizeof(line),
                  "%-18s %-5s %9.2fms %9.2fms %+7.1f%% %6.1f%% %10.2f %10.2f %+7.1f%% %11s%s\n",
                  r.validation_case.name.c_str(), r.validation_case.scope.c_str(),
                  1e3 * r.measured_step_s, 1e3 * r.predicted_step_s, 100.0 * r.step_error,
                  100.0 * r.measured_spread, r.measured_peak_bytes / 1048576.0,
                  r.predicted_peak_bytes / 1048576.0, 100.0 * r.memory_error, gemms,
                  r.extrapolated ? "  (extrapolated ops)" : "");
    out << line;
  }
  std::snprintf(line, sizeof(line),
                "\nstep time  |error|: median %.1f%%, max %.1f%%\n"
                "peak memory |error|: median %.1f%%, max %.1f%%\n",
                100.0 * report.step_median_abs_error, 100.0 * report.step_max_abs_error,
                100.0 * report.memory_median_abs_error, 100.0 * report.memory_max_abs_error);
  out << line;
  out << "gemm calls = executed by the runtime / lowered by the cost model (per step)\n";
  out << "load average before / after: " << report.load_average_before << " / "
      << report.load_average_after << "\n";
  out << "method: " << report.method << "\n";
  return out.str();
}

}  // namespace modar::runtime
