// runtime/validate.cpp: held-out configurations, measured on the runtime and
// predicted by the cost model from a profile (see modar/runtime/validate.hpp).
#include "modar/runtime/validate.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>

#include "modar/base/clock.hpp"
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
    c.mod = {.capacity = 0.25, .every = 1, .offset = 0};
    add("mod-c0.25-layer", "layer", c);
  }
  {
    Config c = small_config(d, 1, heads, seq, batch, layer_vocab, dtype);
    c.dar = {.variant = DarVariant::dar, .block_layers = 1};
    add("dar-layer", "layer", c);
  }
  // Whole small training steps.
  add("dense-step", "step", small_config(d, 4, heads, seq, batch, vocab, dtype));
  for (const double capacity : {0.125, 0.5}) {
    Config c = small_config(d, 4, heads, seq * 2, batch, vocab, dtype);
    c.mod = {.capacity = capacity, .every = 2, .offset = 1};
    std::ostringstream name;
    name << "mod-c" << capacity << "-step";
    add(name.str(), "step", c);
  }
  {
    Config c = small_config(d, 4, heads, seq, batch, vocab, dtype);
    c.dar = {.variant = DarVariant::attnres, .block_layers = 2};
    add("attnres-step", "step", c);
  }
  {
    Config c = small_config(d, 4, heads, seq, batch, vocab, dtype);
    c.dar = {.variant = DarVariant::dar, .block_layers = 2};
    add("dar-step", "step", c);
  }
  // Experts ([moe], dropless): MoE FFN, integrated MoDE (null experts) and
  // staged MoDE (MoD around the block, MoE inside the routed blocks).  CPU
  // only until the MoE CUDA kernels (runtime/cuda/moe.cu) have passed the op
  // harness on a GPU: they build but have not run on one yet.
  if (cpu) {
    Config c = small_config(d, 1, heads, seq, batch, layer_vocab, dtype);
    c.moe = {.experts = 6, .top_k = 2, .expert_ffn = 2 * d};
    add("moe-e6k2-layer", "layer", c);
  }
  if (cpu) {
    Config c = small_config(d, 4, heads, seq, batch, vocab, dtype);
    c.moe = {.experts = 6, .top_k = 2, .expert_ffn = 2 * d, .first_dense = 1};
    add("moe-e6k2-step", "step", c);
    Config integrated = c;
    integrated.moe.mode = MoeMode::integrated;
    integrated.moe.null_experts = 2;
    add("mode-integrated-step", "step", integrated);
  }
  if (cpu) {
    Config c = small_config(d, 4, heads, seq * 2, batch, vocab, dtype);
    c.mod = {.capacity = 0.25, .every = 2, .offset = 1};
    c.moe = {.experts = 6, .top_k = 2, .expert_ffn = 2 * d, .mode = MoeMode::staged};
    add("mode-staged-step", "step", c);
  }
  if (!quick) {
    Config wide = small_config(cpu ? 384 : 3072, 2, cpu ? 6 : 24, seq, batch, vocab, dtype);
    add("dense-wide-step", "step", wide);
    Config swiglu = small_config(d, 4, heads, seq, batch, vocab, dtype);
    swiglu.model.mlp = MlpKind::swiglu;
    add("dense-swiglu-step", "step", swiglu);
    Config mod_dar = small_config(d, 4, heads, seq * 2, batch, vocab, dtype);
    mod_dar.mod = {.capacity = 0.25, .every = 2};
    mod_dar.dar = {.variant = DarVariant::dar, .block_layers = 2};
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

namespace {

// A built, warmed-up case: its model and batch, and its samples per repeat.
struct LiveCase {
  std::unique_ptr<Model> model;
  Buffer tokens, targets;
  std::vector<std::vector<double>> samples_by_repeat;
};

// Build case i's model through the tracer, warm it up, trace one step, and
// fill what does not need timing (prediction, executed vs lowered ops).
LiveCase build_case(Backend& backend, TracingBackend& tracer, const TimingModel& timing,
                    const DeviceProfile& profile, const ValidationCase& validation_case, size_t i,
                    const ValidationOptions& options, CaseResult& r) {
  LiveCase live;
  const Config& config = validation_case.config;
  ModelOptions model_options;
  model_options.dtype = scalar_type(config.train.dtype);
  model_options.seed = options.seed + i;
  live.model = std::make_unique<Model>(tracer, config, model_options);
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
  live.tokens = live.model->make_tokens(ids, b, s);
  live.targets = live.model->make_tokens(next, b, s);
  // Warm-up, then one traced step (what the runtime executes).
  StepResult step;
  for (int w = 0; w < options.warmup_steps; ++w) {
    step = live.model->train_step(live.tokens, live.targets);
  }
  tracer.start_recording();
  step = live.model->train_step(live.tokens, live.targets);
  tracer.stop_recording();
  backend.synchronize();

  r.validation_case = validation_case;
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
  live.samples_by_repeat.resize(static_cast<size_t>(std::max(1, options.repeats)));
  return live;
}

// One repeat: `rounds` interleaved rounds of one train_step per case.
void time_repeat(Backend& backend, std::vector<LiveCase>& live, int repeat,
                 const ValidationOptions& options, const std::function<void()>& stop_if_asked) {
  auto timer = make_sample_timer(backend, options.clock);
  for (int round = 0; round < options.rounds; ++round) {
    stop_if_asked();
    const double round_start = steady_now_s();
    for (LiveCase& c : live) {
      backend.synchronize();
      timer->start();
      c.model->train_step(c.tokens, c.targets);
      timer->stop();
      c.samples_by_repeat[static_cast<size_t>(repeat)].push_back(timer->elapsed_s());
    }
    if (options.progress != nullptr) {
      std::fprintf(options.progress, "modar validate: repeat %d/%d, round %d/%d (%.1f s)\n",
                   repeat + 1, options.repeats, round + 1, options.rounds,
                   steady_now_s() - round_start);
    }
  }
}

// The host check before measuring: the sentinel against the profile's
// recorded time, the profile's machine against this one, the CPUs other work
// used over the sentinel's timings.  Fills the report; returns the failures.
std::vector<std::string> check_host_before(DriftSentinel& sentinel, const DeviceProfile& profile,
                                           const ValidationOptions& options, int threads,
                                           ValidationReport& report,
                                           std::vector<double>& sentinel_times) {
  std::vector<std::string> flags;
  const HostFacts host = read_host_facts();
  report.logical_cpus = host.logical_cpus;
  const HostLoadMeter meter;
  for (int i = 0; i < 5; ++i) {
    sentinel_times.push_back(sentinel.time_s());
  }
  report.other_busy_cpus_before = meter.other_busy_cpus();
  report.sentinel_s = summarize_samples(sentinel_times).median_s;
  const auto recorded = [&](const char* key) {
    const auto it = profile.provenance.find(key);
    return it == profile.provenance.end() ? std::string() : it->second;
  };
  char line[512];
  // Comparable only when timed alike: same kernel and clock, same threads.
  if (recorded("sentinel") == sentinel.description() &&
      recorded("threads") == std::to_string(cpu_threads())) {
    report.sentinel_profile_s = provenance_positive_number(profile, "sentinel_reference_s");
  }
  if (report.sentinel_profile_s > 0.0) {
    const double change = report.sentinel_s / report.sentinel_profile_s - 1.0;
    if (std::abs(change) > options.sentinel_tolerance) {
      std::snprintf(line, sizeof(line),
                    "the machine does not match the profile: the sentinel (%s) takes %.3g ms now, "
                    "%.3g ms when the profile was measured (%+.0f%%, tolerance %.0f%%)",
                    sentinel.description().c_str(), 1e3 * report.sentinel_s,
                    1e3 * report.sentinel_profile_s, 100.0 * change,
                    100.0 * options.sentinel_tolerance);
      flags.emplace_back(line);
    }
  }
  if (!recorded("device").empty() && !host.cpu_model.empty() && profile.backend == "cpu" &&
      recorded("device") != host.cpu_model) {
    flags.push_back("the profile was measured on \"" + recorded("device") +
                    "\", this machine is \"" + host.cpu_model + "\"");
  }
  // Saturated: other work left our threads less than a whole CPU each.
  const double room = static_cast<double>(host.logical_cpus) - std::max(1, threads);
  if (report.other_busy_cpus_before > std::max(0.25, room - 0.25)) {
    std::snprintf(line, sizeof(line),
                  "other work kept %.2f of the %d CPUs busy before the run (load average %s)",
                  report.other_busy_cpus_before, host.logical_cpus,
                  report.load_average_before.c_str());
    flags.emplace_back(line);
  }
  return flags;
}

}  // namespace

double error_noise_floor(double run_to_run_spread, double predicted_noise) {
  return 0.5 * run_to_run_spread + predicted_noise;
}

double predicted_noise(const DeviceProfile& profile,
                       const std::array<double, kOpKindCount>& predicted_by_kind_s) {
  std::array<std::vector<double>, kOpKindCount> spreads;
  for (const OpMeasurement& m : profile.measurements) {
    if (m.rounds > 1) {
      spreads[static_cast<size_t>(m.shape.kind)].push_back(m.round_spread);
    }
  }
  double total_s = 0.0, noise_s = 0.0;
  for (size_t k = 0; k < predicted_by_kind_s.size(); ++k) {
    total_s += predicted_by_kind_s[k];
    if (!spreads[k].empty()) {
      noise_s += predicted_by_kind_s[k] * 0.5 * median_of(spreads[k]);
    }
  }
  return total_s > 0.0 ? noise_s / total_s : 0.0;
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
  report.load_average_before = load_average_text();
  const int repeats = std::max(1, options.repeats);
  report.method =
      "each case's model is built and warmed up (" + std::to_string(options.warmup_steps) +
      " steps) first; then " + std::to_string(repeats) + " repeat(s) of " +
      std::to_string(options.rounds) + " interleaved rounds time one train_step of every case (" +
      std::string(options.clock == Clock::wall ? "wall clock: backend timer" : "process CPU time") +
      "); a case's time is the median of all its rounds, its run-to-run spread (max - min) / "
      "median of the repeats' medians; noise floor = half that + the profile's round spread "
      "weighted by the predicted time per op kind, and an |error| within it is reported as the "
      "floor; the predicted time is estimate(config, profile) (sum over lower(config)'s ops); "
      "one extra step per case is traced to count the executed ops; the drift sentinel is "
      "timed before the run and after each repeat";

  // The host, before anything is built.
  DriftSentinel sentinel(backend, options.clock);
  std::vector<double> sentinel_times;
  report.host_flags =
      check_host_before(sentinel, profile, options, options.threads, report, sentinel_times);
  if (options.refuse_under_load && !report.host_flags.empty()) {
    throw HostBusyError("refused before measuring: " + report.host_flags.front() +
                        "; re-run on a quiet machine (or re-profile this one), or leave out "
                        "refuse_under_load to compare anyway with the flag");
  }

  const TimingModel timing(profile);
  TracingBackend tracer(backend, dtype);
  std::vector<LiveCase> live(cases.size());
  std::vector<CaseResult> results(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    stop_if_asked();
    live[i] = build_case(backend, tracer, timing, profile, cases[i], i, options, results[i]);
    if (options.progress != nullptr) {
      std::fprintf(options.progress, "modar validate: built %s (%zu/%zu)\n", cases[i].name.c_str(),
                   i + 1, cases.size());
    }
  }

  const HostLoadMeter during;
  for (int repeat = 0; repeat < repeats; ++repeat) {
    time_repeat(backend, live, repeat, options, stop_if_asked);
    sentinel_times.push_back(sentinel.time_s());
  }
  report.other_busy_cpus_during = during.other_busy_cpus();
  report.load_average_after = load_average_text();
  {
    const auto [low, high] = std::minmax_element(sentinel_times.begin(), sentinel_times.end());
    report.sentinel_drift = (*high - *low) / summarize_samples(sentinel_times).median_s;
  }
  char line[512];
  if (report.sentinel_drift > options.sentinel_tolerance) {
    std::snprintf(line, sizeof(line),
                  "the machine's speed changed during the run: the sentinel moved %.0f%% "
                  "(tolerance %.0f%%)",
                  100.0 * report.sentinel_drift, 100.0 * options.sentinel_tolerance);
    report.host_flags.emplace_back(line);
  }
  const double room = static_cast<double>(report.logical_cpus) - std::max(1, options.threads);
  if (report.other_busy_cpus_during > std::max(0.25, room - 0.25)) {
    std::snprintf(line, sizeof(line),
                  "other work kept %.2f of the %d CPUs busy during the run (load average %s)",
                  report.other_busy_cpus_during, report.logical_cpus,
                  report.load_average_after.c_str());
    report.host_flags.emplace_back(line);
  }
  if (options.refuse_under_load && !report.host_flags.empty()) {
    throw HostBusyError("refused: " + report.host_flags.back() +
                        "; the comparison is not valid: re-run on a quiet machine (or re-profile "
                        "this one)");
  }

  std::vector<double> step_errors, raw_errors, floors, memory_errors;
  std::vector<std::vector<double>> errors_by_repeat(static_cast<size_t>(repeats));
  for (size_t i = 0; i < cases.size(); ++i) {
    CaseResult& r = results[i];
    std::vector<double> all;
    for (const std::vector<double>& samples : live[i].samples_by_repeat) {
      all.insert(all.end(), samples.begin(), samples.end());
      r.repeat_step_s.push_back(median_of(samples));
    }
    const TimingStats stats = summarize_samples(all);
    r.measured_step_s = stats.median_s;
    r.measured_spread = stats.spread();
    r.rounds = stats.repeats;
    const auto [low, high] = std::minmax_element(r.repeat_step_s.begin(), r.repeat_step_s.end());
    r.run_to_run_spread = (*high - *low) / r.measured_step_s;
    r.step_error = (r.predicted_step_s - r.measured_step_s) / r.measured_step_s;
    r.predicted_noise = predicted_noise(profile, r.predicted_by_kind_s);
    r.noise_floor = error_noise_floor(r.run_to_run_spread, r.predicted_noise);
    r.within_noise = std::abs(r.step_error) <= r.noise_floor;
    report.cases_within_noise += r.within_noise ? 1 : 0;
    r.memory_error = r.measured_peak_bytes > 0.0
                         ? (r.predicted_peak_bytes - r.measured_peak_bytes) / r.measured_peak_bytes
                         : 0.0;
    step_errors.push_back(std::max(std::abs(r.step_error), r.noise_floor));
    raw_errors.push_back(std::abs(r.step_error));
    floors.push_back(r.noise_floor);
    memory_errors.push_back(std::abs(r.memory_error));
    for (size_t rep = 0; rep < r.repeat_step_s.size(); ++rep) {
      errors_by_repeat[rep].push_back(std::abs(r.predicted_step_s / r.repeat_step_s[rep] - 1.0));
    }
  }
  report.step_median_abs_error = median_of(step_errors);
  report.step_max_abs_error = *std::max_element(step_errors.begin(), step_errors.end());
  report.step_median_abs_error_raw = median_of(raw_errors);
  report.step_median_noise_floor = median_of(floors);
  for (const std::vector<double>& errors : errors_by_repeat) {
    report.step_median_abs_error_by_repeat.push_back(median_of(errors));
  }
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
  // 3 repeats of 5 interleaved rounds: 15 steps per case, and a run-to-run
  // spread from three medians taken one after the other.
  options.rounds = request.rounds.value_or(5);
  if (options.rounds < 1 || options.rounds > 1000) {
    throw ConfigError("rounds = " + std::to_string(options.rounds) + ": must be in [1, 1000]");
  }
  options.repeats = request.repeats.value_or(3);
  if (options.repeats < 1 || options.repeats > 100) {
    throw ConfigError("repeats = " + std::to_string(options.repeats) + ": must be in [1, 100]");
  }
  options.refuse_under_load = request.refuse_under_load;
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
  json.field("repeats", options.repeats);
  json.field("refuse_under_load", options.refuse_under_load);
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
    json.field("repeat_measured_s", r.repeat_step_s);
    json.field("run_to_run_spread", r.run_to_run_spread);
    json.field("predicted_noise", r.predicted_noise);
    json.field("noise_floor", r.noise_floor).field("within_noise", r.within_noise);
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
  validate_detail::write_abs_errors_json(
      json, "step_time", report.step_median_abs_error, report.step_max_abs_error, [&] {
        json.field("median_abs_error_raw", report.step_median_abs_error_raw);
        json.field("median_noise_floor", report.step_median_noise_floor);
        json.field("median_abs_error_by_repeat", report.step_median_abs_error_by_repeat);
        json.field("cases_within_noise", report.cases_within_noise);
      });
  validate_detail::write_memory_and_load_json(json, report);
  json.key("host").begin_object();
  json.field("sentinel_s", report.sentinel_s);
  json.field("sentinel_profile_s", report.sentinel_profile_s);
  json.field("sentinel_drift", report.sentinel_drift);
  json.field("other_busy_cpus_before", report.other_busy_cpus_before);
  json.field("other_busy_cpus_during", report.other_busy_cpus_during);
  json.field("logical_cpus", report.logical_cpus);
  json.field("valid", report.host_flags.empty());
  json.field("flags", report.host_flags);
  json.end_object();
  json.field("method", report.method);
  json.end_object();
  return json.str() + "\n";
}

std::string validation_text(const ValidationReport& report) {
  std::ostringstream out;
  char line[512];
  out << "modar validate: profile " << report.profile_name << ", backend " << report.backend
      << "\n\n";
  std::snprintf(line, sizeof(line), "%-20s %-5s %11s %11s %8s %7s %10s %10s %8s %11s\n", "case",
                "scope", "measured", "predicted", "error", "+-noise", "peak MiB", "pred MiB",
                "mem err", "gemm calls");
  out << line;
  for (const CaseResult& r : report.cases) {
    char gemms[48];
    std::snprintf(gemms, sizeof(gemms), "%lld/%lld", static_cast<long long>(r.executed.gemm_calls),
                  static_cast<long long>(r.lowered_gemm_ops));
    std::snprintf(line, sizeof(line),
                  "%-20s %-5s %9.2fms %9.2fms %+7.1f%% %6.1f%% %10.2f %10.2f %+7.1f%% %11s%s%s\n",
                  r.validation_case.name.c_str(), r.validation_case.scope.c_str(),
                  1e3 * r.measured_step_s, 1e3 * r.predicted_step_s, 100.0 * r.step_error,
                  100.0 * r.noise_floor, r.measured_peak_bytes / 1048576.0,
                  r.predicted_peak_bytes / 1048576.0, 100.0 * r.memory_error, gemms,
                  r.within_noise ? "  (within noise)" : "",
                  r.extrapolated ? "  (extrapolated ops)" : "");
    out << line;
  }
  std::string by_repeat;
  for (const double e : report.step_median_abs_error_by_repeat) {
    std::snprintf(line, sizeof(line), "%s%.1f%%", by_repeat.empty() ? "" : " / ", 100.0 * e);
    by_repeat += line;
  }
  std::snprintf(line, sizeof(line),
                "\nstep time  |error|: median %.1f%%, max %.1f%% (an error within its noise counts "
                "as the noise; raw median %.1f%%)\n"
                "  noise floor median +-%.1f%%; %lld of %zu cases within their noise; median "
                "|error| per repeat: %s\n"
                "peak memory |error|: median %.1f%%, max %.1f%%\n",
                100.0 * report.step_median_abs_error, 100.0 * report.step_max_abs_error,
                100.0 * report.step_median_abs_error_raw, 100.0 * report.step_median_noise_floor,
                static_cast<long long>(report.cases_within_noise), report.cases.size(),
                by_repeat.c_str(), 100.0 * report.memory_median_abs_error,
                100.0 * report.memory_max_abs_error);
  out << line;
  out << "noise = half the run-to-run spread of the measured step + the profile's round spread "
         "(weighted by the predicted time per op kind)\n";
  out << "gemm calls = executed by the runtime / lowered by the cost model (per step)\n";
  out << "load average before / after: " << report.load_average_before << " / "
      << report.load_average_after << "\n";
  char profiled[64] = " (the profile records none)";
  if (report.sentinel_profile_s > 0.0) {
    std::snprintf(profiled, sizeof(profiled), ", %.3g ms when profiled",
                  1e3 * report.sentinel_profile_s);
  }
  std::snprintf(line, sizeof(line),
                "host: sentinel %.3g ms now%s, drift %.1f%% through the run; other work used "
                "%.2f CPUs before, %.2f during (of %d)\n",
                1e3 * report.sentinel_s, profiled, 100.0 * report.sentinel_drift,
                report.other_busy_cpus_before, report.other_busy_cpus_during, report.logical_cpus);
  out << line;
  for (const std::string& flag : report.host_flags) {
    out << "WARNING: " << flag << "\n";
  }
  if (!report.host_flags.empty()) {
    out << "WARNING: this comparison was taken on a machine that does not match its profile or "
           "under load: re-run on a quiet machine (uptime's load below the CPU count) or "
           "re-profile it; refuse_under_load (--refuse-under-load) refuses such a run\n";
  }
  out << "method: " << report.method << "\n";
  return out.str();
}

}  // namespace modar::runtime
