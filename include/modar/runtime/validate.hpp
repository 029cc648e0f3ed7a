// modar/runtime/validate.hpp: measured vs predicted step time and peak memory.
//
// `modar validate` runs held-out configurations (shapes that are NOT points of
// the profile's grid: dense, MoD at several capacities, AttnRes, DAR; single
// layers and whole small training steps) on the reference runtime (Model::
// train_step), and compares
//   * the median measured step time with the cost model's estimate() on the
//     profile (the sum over lower(config)'s ops, each interpolated in the
//     profile's measured grid), and
//   * the runtime's tracked peak bytes with estimate().memory.peak.
// error = (predicted - measured) / measured.
//
// Noise (the machine may be shared): every model is built and warmed up
// first, then the cases are timed in interleaved rounds (round r times one
// step of every case), so a burst of load hits all cases alike; the median of
// the rounds is the case's time.  The executed op list is traced (a Backend
// wrapper that counts every call) and compared with lower(): GEMM calls and
// FLOPs per step, so a mismatch between what the runtime runs and what the
// cost model lowers is reported next to the error it causes.
#pragma once

#include <array>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "modar/config.hpp"
#include "modar/cost_model.hpp"
#include "modar/profile.hpp"
#include "modar/runtime/backend.hpp"
#include "modar/runtime/profiler.hpp"

namespace modar::runtime {

struct ValidationCase {
  std::string name;   // "mod-c0.125-step", ...
  std::string scope;  // "layer" (one layer, small vocab) | "step" (whole small model)
  Config config;
};

// The held-out configurations for a device kind (quick: fewer, smaller).
// dtype: what the runtime computes in (CPU fp32, GPU bf16).
std::vector<ValidationCase> validation_cases(bool quick, DeviceKind device, DType dtype);

struct ValidationOptions {
  bool quick = false;
  int warmup_steps = 2;
  int rounds = 7;  // interleaved timing rounds per repeat (the median is taken)
  // Independent repeats of the rounds, one after the other: their medians
  // give each case's run-to-run spread (resolve_validation_options: 3).
  int repeats = 1;
  // The host check (docs/profiler.md, "Noise"): the drift sentinel against
  // the profile's recorded time and through the run, and the CPUs other work
  // kept busy, before and during the run.  A check that fails flags the
  // comparison (ValidationReport::host_flags); with refuse_under_load, it is
  // refused instead (HostBusyError), before measuring when it fails before.
  double sentinel_tolerance = 0.10;
  bool refuse_under_load = false;
  uint64_t seed = 1;
  // The clock of the timing rounds; use the profile's (provenance.clock) so
  // measured and predicted times mean the same thing.
  Clock clock = Clock::wall;
  int threads = 0;  // CPU threads set by run_validation (0 = keep)
  std::FILE* progress = nullptr;
  std::vector<ValidationCase> cases;  // empty: validation_cases(quick, device, dtype)
  // Asked between cases and rounds: true stops by throwing Interrupted.
  std::function<bool()> should_stop;
};

// What the user said; resolve_validation_options() applies the defaults (the
// ONE owner: the CLI and Python pass only what the user gave).  Defaults: the
// profile's recorded clock (provenance.clock) and, on the CPU, its recorded
// threads (provenance.threads), so measured and predicted times mean the same
// thing; 7 rounds; 2 warm-up steps.
struct ValidationRequest {
  std::string backend = "cpu";
  bool quick = false;
  bool refuse_under_load = false;
  std::optional<int> rounds;   // default 5 per repeat
  std::optional<int> repeats;  // default 3
  std::optional<int> warmup_steps;
  std::optional<int> threads;
  std::optional<Clock> clock;
};
ValidationOptions resolve_validation_options(const ValidationRequest& request,
                                             const DeviceProfile& profile);
// The resolved settings as one JSON object (backend, quick, rounds,
// warmup_steps, threads, clock, profile).
std::string validation_settings_json(const ValidationOptions& options,
                                     const ValidationRequest& request,
                                     const DeviceProfile& profile);

// What the runtime executed in one training step, counted by a tracing Backend.
struct ExecutedOps {
  int64_t calls = 0;  // every op call
  int64_t gemm_calls = 0;
  double gemm_flops = 0.0;                            // 2 m n k summed
  std::array<int64_t, kOpKindCount> calls_by_kind{};  // mapped to the op vocabulary
  // Seconds per kind in the traced step, each op synchronised and timed on its
  // own (so the sum exceeds an untraced step by the synchronisations).
  std::array<double, kOpKindCount> measured_by_kind_s{};
};

struct CaseResult {
  ValidationCase validation_case;
  double measured_step_s = 0.0;  // median over every round of every repeat
  double measured_spread = 0.0;  // (p90 - p10) / median
  int64_t rounds = 0;
  std::vector<double> repeat_step_s;  // each repeat's median
  double run_to_run_spread = 0.0;     // (max - min) / median of repeat_step_s
  double predicted_step_s = 0.0;      // estimate(config, profile).time.step_s
  double step_error = 0.0;            // (predicted - measured) / measured
  // The error's noise floor (a fraction): half the run-to-run spread plus
  // half the profile's round spread, per op kind weighted by the kind's share
  // of the predicted step.  An |error| at or below it is within the noise.
  double predicted_noise = 0.0;  // the profile's part
  double noise_floor = 0.0;
  bool within_noise = false;
  double measured_peak_bytes = 0.0;   // Model::train_step peak
  double predicted_peak_bytes = 0.0;  // estimate().memory.peak
  double memory_error = 0.0;
  bool extrapolated = false;
  int64_t ops_interpolated = 0, ops_extrapolated = 0, ops_roofline = 0;
  // Executed vs lowered (per training step).
  ExecutedOps executed;
  int64_t lowered_gemm_ops = 0;  // with multiplicity
  double lowered_gemm_flops = 0.0;
  double predicted_gemm_s_lowered = 0.0;   // the GEMM part of predicted_step_s
  double predicted_gemm_s_executed = 0.0;  // the same model on the traced GEMM shapes
  std::array<double, kOpKindCount> predicted_by_kind_s{};
};

struct ValidationReport {
  std::string profile_name;
  std::string backend;
  std::vector<CaseResult> cases;
  // Step time: an error within its noise counts as its noise floor (never
  // claimed smaller); the medians are over the cases.
  double step_median_abs_error = 0.0;
  double step_max_abs_error = 0.0;
  double step_median_abs_error_raw = 0.0;  // the plain median of |error|
  double step_median_noise_floor = 0.0;
  std::vector<double> step_median_abs_error_by_repeat;  // each repeat's own median |error|
  int64_t cases_within_noise = 0;
  // The host: the sentinel now vs when the profile was measured, its drift
  // through this run, the CPUs other work used; what failed, with advice.
  double sentinel_s = 0.0, sentinel_profile_s = 0.0;  // 0: not recorded
  double sentinel_drift = 0.0;
  double other_busy_cpus_before = -1.0, other_busy_cpus_during = -1.0;
  int logical_cpus = 0;
  std::vector<std::string> host_flags;
  double memory_median_abs_error = 0.0;
  double memory_max_abs_error = 0.0;
  std::string load_average_before, load_average_after;  // /proc/loadavg
  std::string method;                                   // how noise was handled, in words
};

// Thrown by run_validation with refuse_under_load when the host check fails:
// the reason and what to do (the CLI exits 3).
class HostBusyError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

ValidationReport run_validation(Backend& backend, const DeviceProfile& profile,
                                const ValidationOptions& options);

// The noise floor of an error: half the run-to-run spread of the measured
// time plus the profile's part (both fractions).
double error_noise_floor(double run_to_run_spread, double predicted_noise);
// The profile's noise in a prediction: sum over op kinds of (the kind's share
// of the predicted time) x half the median round_spread of the profile's
// measurements of that kind (0 for kinds measured without rounds).
double predicted_noise(const DeviceProfile& profile,
                       const std::array<double, kOpKindCount>& predicted_by_kind_s);

// The machine-readable report (`modar validate --json`): cases[],
// step_time.{median,max}_abs_error, memory.{median,max}_abs_error (fractions).
std::string validation_json(const ValidationReport& report);
// The human-readable table.
std::string validation_text(const ValidationReport& report);

}  // namespace modar::runtime
