// modar/calibrate.hpp: fit a device profile's named time-model parameters to
// the measured step times of real jobs (`modar calibrate`, modar.calibrate).
//
// A team runs a handful of short jobs on its own cluster (or reads step
// times from its logs), writes one CSV row per job (its config and --set
// overrides, the measured seconds per optimizer step), and calibrate fits a
// small set of the profile's parameters (GEMM / attention / memory
// efficiency, collective efficiency per level, per-step and per-micro-batch
// overhead, ...) so that the estimator's step times match, then writes the
// profile with its provenance: the runs, each fitted parameter with its
// standard error, the residuals and the leave-one-out errors.
//
// The fit: r_i = log(predicted_i / measured_i), minimise sum r_i^2 (relative
// errors, the same weight for a 0.1 s and a 100 s step) by Levenberg-
// Marquardt with Marquardt's diagonal scaling, inside each parameter's
// bounds (projected steps), the Jacobian by central differences of the
// estimator.  Standard errors from s^2 (J^T J)^-1, s^2 = RSS / (N - P).
// Leave-one-out: each run refitted without it (warm-started at the full
// fit), then predicted.  docs/calibrate.md.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "modar/config.hpp"
#include "modar/profile.hpp"

namespace modar {

// ---- the parameters a profile exposes (what calibrate fits) ------------------

// One named, settable parameter of the time model: its TOML key in a profile
// (section.key), what its number means, its allowed range.
struct CalibrationParameter {
  std::string name;
  std::string unit;
  double min = 0.0;
  double max = 0.0;
  std::string meaning;
  bool seconds = false;  // a time (an overhead): its scale is the runs' step times
  std::string capped_by;  // the profile field that bounds it physically ("" = none)
};
// Every parameter calibrate can fit, in table order: the time model's own
// (profile_parameters(), docs/kernel_model.md) and the fp32 rate.
const std::vector<CalibrationParameter>& calibration_parameters();
// The parameters fitted when none are named (docs/calibrate.md).
std::vector<std::string> default_calibration_parameters();
// The value the estimator uses (defaults resolved); ConfigError for an
// unknown name, listing the allowed ones.
double calibration_parameter_value(const DeviceProfile& profile, const std::string& name);
// Set it; ConfigError outside its range.
void set_calibration_parameter(DeviceProfile& profile, const std::string& name, double value);
// The range a fit may move it in on this profile: [min, max] narrowed by the
// physical cap (capped_by: the fp32 achievable rate never exceeds the
// datasheet peak; every [kernel] efficiency is at most 1 by its range).
std::pair<double, double> calibration_parameter_range(const DeviceProfile& profile,
                                                      const std::string& name);

// ---- the runs file ------------------------------------------------------------

// One measured job: a row of the runs CSV.
struct CalibrationRun {
  std::string name;
  std::string config_path;             // as written (relative to the CSV's folder); "" = defaults
  std::vector<std::string> overrides;  // "section.key=value", as --set takes them
  Config config;                       // the config with the overrides, validated
  double step_s = 0.0;                 // measured seconds per optimizer step
  std::optional<double> peak_memory_gib;
  int64_t line = 0;  // 1-based line in the CSV
};

// Header row required: name, config, overrides, step_s (any order, case-
// insensitive), optional peak_memory_gib; other columns are errors (a typo
// would otherwise be ignored).  Fields may be double-quoted (RFC 4180: "" is
// a quote, commas inside quotes).  Bad input: FileError "<file>:<line>: row
// '<name>', column '<col>' = '<value>': <what is allowed>".
std::vector<CalibrationRun> parse_calibration_runs(const std::string& csv_text,
                                                   const std::string& source_name,
                                                   const std::string& base_dir = ".");
std::vector<CalibrationRun> load_calibration_runs(const std::string& path);
// The config files the runs read (resolved paths), for output checks.
std::vector<std::string> calibration_run_inputs(const std::vector<CalibrationRun>& runs,
                                                const std::string& base_dir);

// ---- the request: what the user said -> the options of a fit ------------------------
// The ONE owner of calibrate's defaults (the CLI and modar.calibrate fill a
// request with only what the user gave).  Errors name the field, never a flag.
struct CalibrateRequest {
  std::optional<std::vector<std::string>> parameters;  // default: default_calibration_parameters()
  std::optional<bool> leave_one_out;                   // default true
  std::optional<int> max_iterations;                   // default 50
  std::optional<std::string> name;                     // default: "<base>-calibrated"
};

struct CalibrateOptions {
  std::vector<std::string> parameters;
  bool leave_one_out = true;
  int max_iterations = 50;
  std::string name;
  // Stage messages ("fit: iteration 3, rms 2.1%"), e.g. to stderr.
  std::function<void(const std::string&)> progress;
  // Asked between estimator calls batches: true stops with Interrupted.
  std::function<bool()> should_stop;
};
CalibrateOptions resolve_calibrate_options(const CalibrateRequest& request,
                                           const DeviceProfile& base);

// ---- the fit ---------------------------------------------------------------------

struct FittedParameter {
  std::string name;
  std::string unit;
  double base_value = 0.0;
  double value = 0.0;
  std::optional<double> standard_error;  // nullopt: not estimable (N <= P, or singular)
  bool determined = true;  // false: no run's step time depends on it; kept at base_value
  bool at_bound = false;   // the fit stopped at min or max
  double min = 0.0, max = 0.0;
};

struct CalibratedRun {
  std::string name;
  int64_t line = 0;
  double measured_s = 0.0;
  double base_predicted_s = 0.0;          // with the base profile
  double predicted_s = 0.0;               // with the calibrated profile
  double error = 0.0;                     // predicted / measured - 1
  std::optional<double> loo_predicted_s;  // refitted without this run
  std::optional<double> loo_error;
  std::optional<double> measured_peak_gib;
  double predicted_peak_gib = 0.0;
};

struct CalibrationResult {
  DeviceProfile profile;  // the calibrated profile (base + fitted values + provenance)
  std::string base_name;
  std::vector<FittedParameter> parameters;
  std::vector<CalibratedRun> runs;
  double rms_log_residual = 0.0;  // sqrt(mean r_i^2) at the fit
  double base_rms_log_residual = 0.0;
  double median_abs_error = 0.0, max_abs_error = 0.0;
  std::optional<double> loo_median_abs_error, loo_max_abs_error;
  int iterations = 0;
  bool converged = false;
  int64_t estimates = 0;  // estimator calls (the cost)
  std::vector<std::string> notes;
};

// Throws ConfigError (fewer runs than free parameters, bad options) and
// Interrupted (should_stop).
CalibrationResult calibrate(const std::vector<CalibrationRun>& runs, const DeviceProfile& base,
                            const CalibrateOptions& options);
std::string to_json(const CalibrationResult& result);
std::string to_text(const CalibrationResult& result);

// The measured step times of `runs` predicted on `profile` (tests, synthetic runs).
std::vector<double> predicted_step_times(const std::vector<CalibrationRun>& runs,
                                         const DeviceProfile& profile);

}  // namespace modar
