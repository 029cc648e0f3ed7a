// `modar calibrate` run time against the number of runs: 10 and 100 (and any
// counts given) synthetic Megatron-style cluster jobs (GPT shapes from 1.3B
// to 40B, TP 1-8, PP 1-4, 8-512 A100s, both 2021 and current kernel
// settings), their step times the a100-80gb-dgx profile's predictions with
// the default fitted parameters moved by known factors and 2 % log-normal
// noise; calibrate with the defaults (leave-one-out on).  Prints a table of
// process CPU seconds, estimator calls and the fit's quality; no assertions
// (speed is shown by programs, not tests).
//   modar_bench_calibrate [runs ...]      (default: 10 100)
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_clock.hpp"
#include "modar/calibrate.hpp"
#include "modar/profile.hpp"

namespace {

// Run i of a synthetic campaign: a shape, a layout and a batch cycled so that
// every default parameter is exercised.
std::string run_row(int64_t i) {
  static const int64_t widths[] = {2048, 3072, 4096, 5120, 6144, 8192};
  static const int64_t layers[] = {24, 32, 40, 48};
  static const int64_t tensors[] = {1, 2, 4, 8};
  static const int64_t pipelines[] = {1, 2, 4};
  const int64_t d = widths[i % 6];
  const int64_t l = layers[(i / 6) % 4];
  const int64_t t = tensors[(i / 2) % 4];
  const int64_t p = pipelines[(i / 5) % 3];
  const int64_t data = int64_t{1} << ((i / 3) % 5);  // 1 .. 16 replicas
  const int64_t gpus = t * p * data;
  const int64_t global = 8 * p * data;
  std::string row =
      "run" + std::to_string(i) + ",,model.d_model=" + std::to_string(d) +
      " model.n_heads=" + std::to_string(d / 128) + " model.n_layers=" + std::to_string(l) +
      " parallel.tensor=" + std::to_string(t) + " parallel.pipeline=" + std::to_string(p) +
      " device.count=" + std::to_string(gpus) +
      " train.micro_batch=1 train.global_batch=" + std::to_string(global) + " train.recompute=full";
  if (i % 2 == 0) {
    row += " train.attention_kernel=unfused parallel.overlap_grad_reduce=false";
  }
  return row + ",1\n";
}

double normal(uint64_t& state) {  // splitmix64 + Box-Muller
  const auto uniform = [&state] {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double(z >> 11) + 0.5) / 9007199254740992.0;
  };
  return std::sqrt(-2.0 * std::log(uniform())) * std::cos(6.283185307179586 * uniform());
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> counts;
  for (int i = 1; i < argc; ++i) {
    counts.push_back(std::atoll(argv[i]));
  }
  if (counts.empty()) {
    counts = {10, 100};
  }
  const modar::DeviceProfile base = modar::load_profile("a100-80gb-dgx");
  modar::DeviceProfile truth = base;
  double factor = 0.95;
  for (const std::string& name : modar::default_calibration_parameters()) {
    modar::set_calibration_parameter(truth, name,
                                     factor * modar::calibration_parameter_value(base, name));
    factor -= 0.07;
  }
  const modar::CalibrateOptions options =
      modar::resolve_calibrate_options(modar::CalibrateRequest{}, base);
  std::printf(
      "modar calibrate: default parameters (%zu), leave-one-out on, one thread;\n"
      "synthetic cluster runs on a100-80gb-dgx, parameters moved 5-33 %%, 2 %% noise\n",
      options.parameters.size());
  std::printf("%6s %10s %10s %12s %11s %11s %11s %11s\n", "runs", "CPU s", "wall s", "estimates",
              "iterations", "|err| med", "LOO med", "LOO max");
  for (const int64_t count : counts) {
    std::string csv = "name,config,overrides,step_s\n";
    for (int64_t i = 0; i < count; ++i) {
      csv += run_row(i);
    }
    std::vector<modar::CalibrationRun> runs = modar::parse_calibration_runs(csv, "bench.csv");
    const std::vector<double> times = modar::predicted_step_times(runs, truth);
    uint64_t state = 20260101;
    for (size_t i = 0; i < runs.size(); ++i) {
      runs[i].step_s = times[i] * std::exp(0.02 * normal(state));
    }
    const auto start = std::chrono::steady_clock::now();
    const double cpu_start = cpu_seconds();
    const modar::CalibrationResult result = modar::calibrate(runs, base, options);
    const double cpu = cpu_seconds() - cpu_start;
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%6lld %10.2f %10.2f %12lld %11d %10.2f%% %10.2f%% %10.2f%%\n",
                static_cast<long long>(count), cpu, wall, static_cast<long long>(result.estimates),
                result.iterations, 100.0 * result.median_abs_error,
                100.0 * result.loo_median_abs_error.value_or(NAN),
                100.0 * result.loo_max_abs_error.value_or(NAN));
    std::fflush(stdout);
  }
  return 0;
}
