// `modar calibrate`: fit a profile's named time-model parameters to measured
// step times (modar/calibrate.hpp, docs/calibrate.md).
//
// Residuals r_i(theta) = log(predicted_i / measured_i), predicted by the
// estimator itself (estimate_into + apply_parallel_model on a copy of the
// profile with theta set); cost = sum r_i^2.  Levenberg-Marquardt with
// Marquardt's scaling (A + lambda diag(A)) delta = -J^T r, steps projected
// into each parameter's [min, max] (a parameter at a bound whose gradient
// points outward is held there), J by central differences with a relative
// step of 1e-3.  Parameters no run's step time depends on are left at the
// base value ("not determined").  Standard errors: s^2 (J^T J)^-1 at the fit
// on the free parameters, s^2 = cost / (N - P).  Leave-one-out: for each run,
// chord iterations (the full fit's Jacobian, fresh residuals) from the full
// fit on the other runs, then a Levenberg-Marquardt refit if they stall;
// the left-out run is predicted at the result.
#include "modar/calibrate.hpp"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include "modar/base/errors.hpp"
#include "modar/base/interrupt.hpp"
#include "modar/base/json.hpp"
#include "modar/base/text.hpp"
#include "modar/cost_model.hpp"

namespace modar {
namespace {

using Eigen::MatrixXd;
using Eigen::VectorXd;

// Central-difference steps, relative to each parameter's scale: 1e-3 while
// the fit moves (robust where op times switch regime), then 1e-6 to settle
// the minimum to the precision the final predictions are compared at.
constexpr double kRelativeStep = 1e-3;
constexpr double kFineRelativeStep = 1e-6;
constexpr int kFineIterations = 10;
constexpr double kDeterminedSlope = 1e-6;  // max |d log t / d log theta| below this: no run depends
constexpr int kChordIterations = 8;

double median_of(std::vector<double> values) {
  if (values.empty()) {
    return 0.0;
  }
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// The fit over a set of runs: evaluations of the estimator at theta.
class Problem {
 public:
  Problem(const std::vector<CalibrationRun>& runs, const DeviceProfile& base,
          const CalibrateOptions& options)
      : runs_(runs), base_(base), options_(options) {
    std::vector<double> steps;
    for (const CalibrationRun& run : runs) {
      steps.push_back(run.step_s);
      log_measured_.push_back(std::log(run.step_s));
    }
    const double typical_step = median_of(steps);
    for (const std::string& name : options.parameters) {
      const auto& table = calibration_parameters();
      const auto spec = std::find_if(table.begin(), table.end(),
                                     [&](const CalibrationParameter& p) { return p.name == name; });
      specs_.push_back(*spec);
      // The fit's range on this profile: physical caps applied.
      std::tie(specs_.back().min, specs_.back().max) = calibration_parameter_range(base, name);
      const double value = calibration_parameter_value(base, name);
      // The scale of a step: the value itself, or for an overhead at 0 a
      // millionth of a typical step (so a difference is visible).
      floor_.push_back(spec->seconds ? 1e-6 * typical_step : 1e-12 * std::max(spec->max, 1.0));
      base_values_.push_back(std::clamp(value, specs_.back().min, specs_.back().max));
    }
  }

  size_t parameters() const { return specs_.size(); }
  size_t runs() const { return runs_.size(); }
  const CalibrationParameter& spec(size_t j) const { return specs_[j]; }
  VectorXd base_theta() const {
    return Eigen::Map<const VectorXd>(base_values_.data(),
                                      static_cast<Eigen::Index>(base_values_.size()));
  }
  double scale(size_t j, double value) const { return std::max(std::abs(value), floor_[j]); }
  int64_t estimates() const { return estimates_; }

  DeviceProfile profile_at(const VectorXd& theta) const {
    DeviceProfile profile = base_;
    for (size_t j = 0; j < specs_.size(); ++j) {
      set_calibration_parameter(profile, specs_[j].name, theta[static_cast<Eigen::Index>(j)]);
    }
    return profile;
  }

  // Predicted step seconds of the runs in `subset` at theta.
  std::vector<double> predict(const VectorXd& theta, const std::vector<size_t>& subset) {
    const DeviceProfile profile = profile_at(theta);
    const TimingModel timing(profile);
    std::vector<double> out;
    out.reserve(subset.size());
    for (const size_t i : subset) {
      poll();
      estimate_into(runs_[i].config, timing, StepKind::train, scratch_, estimate_);
      apply_parallel_model(runs_[i].config, timing, StepKind::train, estimate_);
      ++estimates_;
      out.push_back(estimate_.time.step_s);
    }
    return out;
  }

  VectorXd residuals(const VectorXd& theta, const std::vector<size_t>& subset) {
    const std::vector<double> predicted = predict(theta, subset);
    VectorXd r(static_cast<Eigen::Index>(subset.size()));
    for (size_t k = 0; k < subset.size(); ++k) {
      if (!(predicted[k] > 0.0) || !std::isfinite(predicted[k])) {
        throw ConfigError("calibrate: run '" + runs_[subset[k]].name + "' (line " +
                          std::to_string(runs_[subset[k]].line) +
                          ") has no finite predicted step time at these parameters");
      }
      r[static_cast<Eigen::Index>(k)] = std::log(predicted[k]) - log_measured_[subset[k]];
    }
    return r;
  }

  // Central differences (one-sided at a bound), column j = d r / d theta_j.
  MatrixXd jacobian(const VectorXd& theta, const std::vector<size_t>& subset, const VectorXd& r0,
                    double relative_step = kRelativeStep) {
    const Eigen::Index n = static_cast<Eigen::Index>(subset.size());
    MatrixXd J(n, static_cast<Eigen::Index>(specs_.size()));
    for (size_t j = 0; j < specs_.size(); ++j) {
      const Eigen::Index c = static_cast<Eigen::Index>(j);
      const double h = relative_step * scale(j, theta[c]);
      VectorXd up = theta, down = theta;
      up[c] = std::min(theta[c] + h, specs_[j].max);
      down[c] = std::max(theta[c] - h, specs_[j].min);
      const bool has_up = up[c] > theta[c], has_down = down[c] < theta[c];
      const VectorXd r_up = has_up ? residuals(up, subset) : r0;
      const VectorXd r_down = has_down ? residuals(down, subset) : r0;
      const double width = up[c] - down[c];
      J.col(c) = width > 0.0 ? VectorXd((r_up - r_down) / width) : VectorXd::Zero(n);
    }
    return J;
  }

  void poll() const {
    throw_if_interrupted("calibrate");
    if (options_.should_stop && options_.should_stop()) {
      throw Interrupted("interrupted during calibrate");
    }
  }

  void progress(const std::string& message) const {
    if (options_.progress) {
      options_.progress(message);
    }
  }

 private:
  const std::vector<CalibrationRun>& runs_;
  const DeviceProfile& base_;
  const CalibrateOptions& options_;
  std::vector<CalibrationParameter> specs_;
  std::vector<double> base_values_;
  std::vector<double> floor_;
  std::vector<double> log_measured_;
  int64_t estimates_ = 0;
  OpList scratch_;
  Estimate estimate_;
};

struct Solution {
  VectorXd theta;
  VectorXd r;
  MatrixXd J;  // at theta (the last Jacobian computed)
  int iterations = 0;
  bool converged = false;
};

// Which parameters may move: determined ones, not held at a bound by a
// gradient that points outward.
std::vector<Eigen::Index> free_set(const Problem& problem, const VectorXd& theta,
                                   const VectorXd& gradient, const std::vector<bool>& determined) {
  std::vector<Eigen::Index> free;
  for (size_t j = 0; j < problem.parameters(); ++j) {
    const Eigen::Index c = static_cast<Eigen::Index>(j);
    if (!determined[j]) {
      continue;
    }
    const bool at_min = theta[c] <= problem.spec(j).min && gradient[c] > 0.0;
    const bool at_max = theta[c] >= problem.spec(j).max && gradient[c] < 0.0;
    if (!at_min && !at_max) {
      free.push_back(c);
    }
  }
  return free;
}

// One damped Gauss-Newton step on the free parameters, projected into the bounds.
VectorXd damped_step(const Problem& problem, const VectorXd& theta, const MatrixXd& J,
                     const VectorXd& r, const std::vector<Eigen::Index>& free, double lambda) {
  const Eigen::Index f = static_cast<Eigen::Index>(free.size());
  MatrixXd Jf(J.rows(), f);
  for (Eigen::Index k = 0; k < f; ++k) {
    Jf.col(k) = J.col(free[static_cast<size_t>(k)]);
  }
  MatrixXd A = Jf.transpose() * Jf;
  const VectorXd g = Jf.transpose() * r;
  const double largest = A.diagonal().cwiseAbs().maxCoeff();
  for (Eigen::Index k = 0; k < f; ++k) {
    A(k, k) += lambda * std::max(A(k, k), 1e-12 * largest + 1e-300);
  }
  const VectorXd delta = A.ldlt().solve(-g);
  VectorXd next = theta;
  for (Eigen::Index k = 0; k < f; ++k) {
    const Eigen::Index c = free[static_cast<size_t>(k)];
    const CalibrationParameter& spec = problem.spec(static_cast<size_t>(c));
    next[c] = std::clamp(theta[c] + delta[k], spec.min, spec.max);
  }
  return next;
}

bool small_move(const Problem& problem, const VectorXd& a, const VectorXd& b, double tolerance) {
  for (size_t j = 0; j < problem.parameters(); ++j) {
    const Eigen::Index c = static_cast<Eigen::Index>(j);
    if (std::abs(a[c] - b[c]) > tolerance * problem.scale(j, a[c])) {
      return false;
    }
  }
  return true;
}

// Levenberg-Marquardt from `start` on `subset` with central differences of
// `relative_step`.
Solution lm_pass(Problem& problem, const VectorXd& start, const std::vector<size_t>& subset,
                 const std::vector<bool>& determined, int max_iterations, bool report,
                 double relative_step) {
  Solution s;
  s.theta = start;
  s.r = problem.residuals(s.theta, subset);
  double cost = s.r.squaredNorm();
  double lambda = 1e-3;
  for (s.iterations = 0; s.iterations < max_iterations; ++s.iterations) {
    s.J = problem.jacobian(s.theta, subset, s.r, relative_step);
    const VectorXd gradient = s.J.transpose() * s.r;
    const std::vector<Eigen::Index> free = free_set(problem, s.theta, gradient, determined);
    if (free.empty()) {
      s.converged = true;
      break;
    }
    bool accepted = false;
    VectorXd next;
    VectorXd r_next;
    double cost_next = cost;
    while (lambda < 1e12) {
      next = damped_step(problem, s.theta, s.J, s.r, free, lambda);
      r_next = problem.residuals(next, subset);
      cost_next = r_next.squaredNorm();
      if (cost_next < cost) {
        accepted = true;
        lambda = std::max(lambda * 0.1, 1e-12);
        break;
      }
      lambda *= 10.0;
    }
    if (!accepted) {
      s.converged = true;  // no decrease left at this precision
      break;
    }
    const bool tiny = small_move(problem, s.theta, next, 1e-9) ||
                      cost - cost_next <= 1e-10 * std::max(cost, 1e-300);
    s.theta = next;
    s.r = r_next;
    cost = cost_next;
    if (report) {
      char line[120];
      std::snprintf(line, sizeof line, "fit: iteration %d, rms %.3g%%", s.iterations + 1,
                    100.0 * std::sqrt(cost / static_cast<double>(subset.size())));
      problem.progress(line);
    }
    if (tiny) {
      s.converged = true;
      ++s.iterations;
      break;
    }
  }
  return s;
}

// The fit: a coarse pass, then a fine one from where it stopped.
Solution levenberg_marquardt(Problem& problem, const VectorXd& start,
                             const std::vector<size_t>& subset, const std::vector<bool>& determined,
                             int max_iterations, bool report) {
  Solution coarse =
      lm_pass(problem, start, subset, determined, max_iterations, report, kRelativeStep);
  Solution fine =
      lm_pass(problem, coarse.theta, subset, determined, kFineIterations, false, kFineRelativeStep);
  fine.iterations += coarse.iterations;
  return fine;  // converged: the fine pass found no further decrease
}

// Leave run `out` out: chord iterations with the full fit's Jacobian (cheap:
// fresh residuals only) bring theta near the refit; a fine Levenberg-
// Marquardt pass with fresh Jacobians then settles it (the chord iterations
// alone solve J0^T r(theta) = 0, not the refit's J(theta)^T r(theta) = 0).
VectorXd leave_one_out(Problem& problem, const Solution& full, size_t out,
                       const std::vector<bool>& determined, int max_iterations) {
  std::vector<size_t> subset;
  std::vector<Eigen::Index> rows;
  for (size_t i = 0; i < problem.runs(); ++i) {
    if (i != out) {
      subset.push_back(i);
      rows.push_back(static_cast<Eigen::Index>(i));
    }
  }
  MatrixXd J(static_cast<Eigen::Index>(rows.size()), full.J.cols());
  VectorXd r(static_cast<Eigen::Index>(rows.size()));
  for (size_t k = 0; k < rows.size(); ++k) {
    J.row(static_cast<Eigen::Index>(k)) = full.J.row(rows[k]);
    r[static_cast<Eigen::Index>(k)] = full.r[rows[k]];
  }
  VectorXd theta = full.theta;
  double cost = r.squaredNorm();
  bool settled = false;
  for (int k = 0; k < kChordIterations && !settled; ++k) {
    const std::vector<Eigen::Index> free = free_set(problem, theta, J.transpose() * r, determined);
    if (free.empty()) {
      break;
    }
    const VectorXd next = damped_step(problem, theta, J, r, free, 1e-9);
    const VectorXd r_next = problem.residuals(next, subset);
    const double cost_next = r_next.squaredNorm();
    if (!(cost_next < cost)) {
      break;
    }
    settled = small_move(problem, theta, next, 1e-6);
    theta = next;
    r = r_next;
    cost = cost_next;
  }
  const Solution fine =
      settled
          ? lm_pass(problem, theta, subset, determined, kFineIterations, false, kFineRelativeStep)
          : levenberg_marquardt(problem, theta, subset, determined, max_iterations, false);
  return fine.theta;
}

void fill_standard_errors(const Solution& s, const std::vector<bool>& determined,
                          const std::vector<bool>& at_bound, CalibrationResult& result) {
  std::vector<Eigen::Index> free;
  for (size_t j = 0; j < determined.size(); ++j) {
    if (determined[j] && !at_bound[j]) {
      free.push_back(static_cast<Eigen::Index>(j));
    }
  }
  const Eigen::Index n = s.r.size();
  const Eigen::Index p = static_cast<Eigen::Index>(free.size());
  if (p == 0) {
    return;
  }
  if (n <= p) {
    result.notes.push_back("standard errors: not estimable with " + std::to_string(n) +
                           " runs for " + std::to_string(p) + " free parameters (need more runs)");
    return;
  }
  MatrixXd Jf(n, p);
  for (Eigen::Index k = 0; k < p; ++k) {
    Jf.col(k) = s.J.col(free[static_cast<size_t>(k)]);
  }
  const Eigen::JacobiSVD<MatrixXd> svd(Jf, Eigen::ComputeThinV);
  const VectorXd sigma = svd.singularValues();
  if (!(sigma.minCoeff() > 1e-10 * sigma.maxCoeff())) {
    result.notes.push_back(
        "standard errors: the runs cannot tell some fitted parameters apart (J^T J is "
        "singular); fit fewer parameters or add runs that differ in what they stress");
    return;
  }
  const double s2 = s.r.squaredNorm() / static_cast<double>(n - p);
  const MatrixXd V = svd.matrixV();
  for (Eigen::Index k = 0; k < p; ++k) {
    double variance = 0.0;
    for (Eigen::Index m = 0; m < p; ++m) {
      variance += V(k, m) * V(k, m) / (sigma[m] * sigma[m]);
    }
    result.parameters[static_cast<size_t>(free[static_cast<size_t>(k)])].standard_error =
        std::sqrt(s2 * variance);
  }
}

std::string percent(double fraction) {
  char text[32];
  std::snprintf(text, sizeof text, "%+.2f%%", 100.0 * fraction);
  return text;
}

void write_provenance(const std::vector<CalibrationRun>& runs, CalibrationResult& result) {
  auto& p = result.profile.provenance;
  for (auto it = p.begin(); it != p.end();) {  // a re-calibration replaces the old record
    it = it->first.rfind("calibration", 0) == 0 ? p.erase(it) : std::next(it);
  }
  // The base's own account of how it was made describes the base: say so.
  const auto how = p.find("how");
  if (how != p.end() && how->second.rfind("base profile '", 0) != 0) {
    how->second = "base profile '" + result.base_name + "': " + how->second +
                  "; then fitted to measured runs by modar calibrate (calibration_command)";
  }
  p["calibration"] = "modar calibrate: " + std::to_string(runs.size()) + " runs fitted to the " +
                     "base profile '" + result.base_name + "' (docs/calibrate.md); " +
                     std::to_string(result.iterations) + " iterations" +
                     (result.converged ? "" : " (not converged)");
  char line[256];
  std::snprintf(line, sizeof line,
                "rms log residual %.4g (base %.4g); |error| median %.2f%%, "
                "max %.2f%%",
                result.rms_log_residual, result.base_rms_log_residual,
                100.0 * result.median_abs_error, 100.0 * result.max_abs_error);
  p["calibration_residuals"] = line;
  if (result.loo_median_abs_error) {
    std::snprintf(line, sizeof line, "leave-one-out |error| median %.2f%%, max %.2f%%",
                  100.0 * *result.loo_median_abs_error, 100.0 * *result.loo_max_abs_error);
    p["calibration_leave_one_out"] = line;
  }
  for (const FittedParameter& f : result.parameters) {
    std::string text = format_number(f.value) + " " + f.unit;
    if (!f.determined) {
      text += " (not determined by these runs: kept at the base value)";
    } else {
      text += f.standard_error ? " +- " + format_number(*f.standard_error) : " (no standard error)";
      text += " (base " + format_number(f.base_value) + (f.at_bound ? "; at its bound)" : ")");
    }
    p["calibration_parameter." + f.name] = text;
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    const CalibratedRun& run = result.runs[i];
    std::string text =
        "line " + std::to_string(run.line) + ": config '" + runs[i].config_path + "'";
    if (!runs[i].overrides.empty()) {
      text += ", overrides '";
      for (size_t k = 0; k < runs[i].overrides.size(); ++k) {
        text += (k ? " " : "") + runs[i].overrides[k];
      }
      text += "'";
    }
    text += "; measured " + format_number(run.measured_s) + " s, predicted " +
            format_number(run.predicted_s) + " s (" + percent(run.error) + ")";
    if (run.loo_error) {
      text += ", leave-one-out " + percent(*run.loo_error);
    }
    std::string number = std::to_string(i + 1);
    number.insert(0, number.size() < 4 ? 4 - number.size() : 0, '0');
    p["calibration_run." + number] = run.name + ": " + text;
  }
}

}  // namespace

CalibrateOptions resolve_calibrate_options(const CalibrateRequest& request,
                                           const DeviceProfile& base) {
  CalibrateOptions options;
  options.parameters = request.parameters.value_or(default_calibration_parameters());
  if (options.parameters.empty()) {
    throw ConfigError("parameters: empty; allowed: one or more profile parameters (" +
                      std::to_string(calibration_parameters().size()) + " exist)");
  }
  for (size_t i = 0; i < options.parameters.size(); ++i) {
    calibration_parameter_value(base, options.parameters[i]);  // ConfigError naming it
    for (size_t k = 0; k < i; ++k) {
      if (options.parameters[k] == options.parameters[i]) {
        throw ConfigError("parameters: '" + options.parameters[i] + "' is named twice");
      }
    }
  }
  options.leave_one_out = request.leave_one_out.value_or(true);
  options.max_iterations = request.max_iterations.value_or(50);
  if (options.max_iterations < 1 || options.max_iterations > 10000) {
    throw ConfigError("max_iterations = " + std::to_string(options.max_iterations) +
                      ": must be in [1, 10000]");
  }
  options.name = request.name.value_or(base.name + "-calibrated");
  if (options.name.empty() || options.name.find_first_of("\n\r\"\\") != std::string::npos) {
    throw ConfigError("name = '" + shown_value(options.name) +
                      "': must be a non-empty name without quotes, backslashes or newlines");
  }
  return options;
}

std::vector<double> predicted_step_times(const std::vector<CalibrationRun>& runs,
                                         const DeviceProfile& profile) {
  const TimingModel timing(profile);
  OpList scratch;
  Estimate estimate;
  std::vector<double> out;
  for (const CalibrationRun& run : runs) {
    estimate_into(run.config, timing, StepKind::train, scratch, estimate);
    apply_parallel_model(run.config, timing, StepKind::train, estimate);
    out.push_back(estimate.time.step_s);
  }
  return out;
}

CalibrationResult calibrate(const std::vector<CalibrationRun>& runs, const DeviceProfile& base,
                            const CalibrateOptions& options) {
  if (runs.empty()) {
    throw ConfigError("calibrate: no runs; allowed: one or more measured runs");
  }
  Problem problem(runs, base, options);
  const size_t n = runs.size();
  std::vector<size_t> all(n);
  for (size_t i = 0; i < n; ++i) {
    all[i] = i;
  }
  CalibrationResult result;
  result.base_name = base.name;
  // Which parameters the runs' step times depend on.
  const VectorXd start = problem.base_theta();
  const VectorXd r0 = problem.residuals(start, all);
  const MatrixXd J0 = problem.jacobian(start, all, r0);
  std::vector<bool> determined(problem.parameters());
  size_t free_count = 0;
  for (size_t j = 0; j < problem.parameters(); ++j) {
    const double slope = J0.col(static_cast<Eigen::Index>(j)).cwiseAbs().maxCoeff() *
                         problem.scale(j, start[static_cast<Eigen::Index>(j)]);
    determined[j] = slope > kDeterminedSlope;
    free_count += determined[j] ? 1 : 0;
    if (!determined[j]) {
      result.notes.push_back(problem.spec(j).name +
                             ": no run's step time depends on it; kept at the base value");
    }
  }
  if (free_count == 0) {
    throw ConfigError(
        "parameters: none of them changes any run's predicted step time; allowed: "
        "parameters the runs exercise (e.g. a GEMM rate for compute-bound runs)");
  }
  if (n < free_count) {
    throw ConfigError("calibrate: " + std::to_string(n) + " runs for " +
                      std::to_string(free_count) +
                      " free parameters; allowed: at least as many runs as fitted parameters "
                      "(add runs, or name fewer parameters)");
  }
  problem.progress("fit: " + std::to_string(n) + " runs, " + std::to_string(free_count) +
                   " free parameters");
  Solution fit = levenberg_marquardt(problem, start, all, determined, options.max_iterations, true);
  // The Jacobian at the solution: standard errors and the leave-one-out start.
  fit.J = problem.jacobian(fit.theta, all, fit.r);
  result.iterations = fit.iterations;
  result.converged = fit.converged;
  result.profile = problem.profile_at(fit.theta);
  result.profile.name = options.name;
  std::vector<bool> at_bound(problem.parameters());
  for (size_t j = 0; j < problem.parameters(); ++j) {
    const Eigen::Index c = static_cast<Eigen::Index>(j);
    const CalibrationParameter& spec = problem.spec(j);
    FittedParameter f;
    f.name = spec.name;
    f.unit = spec.unit;
    f.min = spec.min;
    f.max = spec.max;
    f.base_value = start[c];
    f.value = fit.theta[c];
    f.determined = determined[j];
    f.at_bound = determined[j] && (fit.theta[c] <= spec.min || fit.theta[c] >= spec.max);
    at_bound[j] = f.at_bound;
    result.parameters.push_back(f);
  }
  fill_standard_errors(fit, determined, at_bound, result);

  const std::vector<double> base_predicted = problem.predict(start, all);
  const std::vector<double> predicted = problem.predict(fit.theta, all);
  const DeviceProfile& calibrated = result.profile;
  std::vector<double> abs_errors, loo_abs_errors;
  const bool loo = options.leave_one_out && n - 1 >= free_count;
  if (options.leave_one_out && !loo) {
    result.notes.push_back("leave-one-out: skipped (" + std::to_string(n - 1) + " runs left for " +
                           std::to_string(free_count) + " free parameters)");
  }
  for (size_t i = 0; i < n; ++i) {
    CalibratedRun run;
    run.name = runs[i].name;
    run.line = runs[i].line;
    run.measured_s = runs[i].step_s;
    run.base_predicted_s = base_predicted[i];
    run.predicted_s = predicted[i];
    run.error = predicted[i] / runs[i].step_s - 1.0;
    abs_errors.push_back(std::abs(run.error));
    if (loo) {
      problem.progress("leave-one-out: run " + std::to_string(i + 1) + " of " + std::to_string(n));
      const VectorXd theta = leave_one_out(problem, fit, i, determined, options.max_iterations);
      run.loo_predicted_s = problem.predict(theta, {i}).front();
      run.loo_error = *run.loo_predicted_s / runs[i].step_s - 1.0;
      loo_abs_errors.push_back(std::abs(*run.loo_error));
    }
    run.measured_peak_gib = runs[i].peak_memory_gib;
    run.predicted_peak_gib = estimate(runs[i].config, calibrated).memory.peak / double(1 << 30);
    result.runs.push_back(run);
  }
  result.rms_log_residual = std::sqrt(fit.r.squaredNorm() / static_cast<double>(n));
  result.base_rms_log_residual =
      std::sqrt(problem.residuals(start, all).squaredNorm() / static_cast<double>(n));
  result.median_abs_error = median_of(abs_errors);
  result.max_abs_error = *std::max_element(abs_errors.begin(), abs_errors.end());
  if (loo) {
    result.loo_median_abs_error = median_of(loo_abs_errors);
    result.loo_max_abs_error = *std::max_element(loo_abs_errors.begin(), loo_abs_errors.end());
  }
  result.estimates = problem.estimates();
  write_provenance(runs, result);
  return result;
}

std::string to_json(const CalibrationResult& result) {
  JsonWriter json(2);
  json.begin_object();
  json.field("profile", result.profile.name);
  json.field("base_profile", result.base_name);
  json.key("parameters").begin_array();
  for (const FittedParameter& f : result.parameters) {
    json.begin_object();
    json.field("name", f.name).field("unit", f.unit).field("base", f.base_value);
    json.field("value", f.value);
    json.key("standard_error");
    f.standard_error ? json.value(*f.standard_error) : json.null();
    json.field("determined", f.determined).field("at_bound", f.at_bound);
    json.field("min", f.min).field("max", f.max);
    json.end_object();
  }
  json.end_array();
  json.key("runs").begin_array();
  for (const CalibratedRun& r : result.runs) {
    json.begin_object();
    json.field("name", r.name).field("line", r.line).field("measured_s", r.measured_s);
    json.field("base_predicted_s", r.base_predicted_s).field("predicted_s", r.predicted_s);
    json.field("error", r.error);
    json_optional(json, "loo_predicted_s", r.loo_predicted_s);
    json_optional(json, "loo_error", r.loo_error);
    json_optional(json, "measured_peak_gib", r.measured_peak_gib);
    json.field("predicted_peak_gib", r.predicted_peak_gib);
    json.end_object();
  }
  json.end_array();
  json.key("summary").begin_object();
  json.field("runs", static_cast<int64_t>(result.runs.size()));
  json.field("rms_log_residual", result.rms_log_residual);
  json.field("base_rms_log_residual", result.base_rms_log_residual);
  json.field("median_abs_error", result.median_abs_error);
  json.field("max_abs_error", result.max_abs_error);
  json_optional(json, "loo_median_abs_error", result.loo_median_abs_error);
  json_optional(json, "loo_max_abs_error", result.loo_max_abs_error);
  json.field("iterations", result.iterations).field("converged", result.converged);
  json.field("estimates", result.estimates);
  json.end_object();
  json.field("notes", result.notes);
  json.end_object();
  return json.str() + "\n";
}

std::string to_text(const CalibrationResult& result) {
  std::string out = "calibrated '" + result.base_name + "' to " +
                    std::to_string(result.runs.size()) + " measured runs -> '" +
                    result.profile.name + "'\n\n";
  char line[512];
  std::snprintf(line, sizeof line, "%-28s %12s %12s %9s %12s %9s %10s\n", "run", "measured s",
                "base pred s", "base err", "predicted s", "error", "LOO error");
  out += line;
  for (const CalibratedRun& r : result.runs) {
    std::snprintf(line, sizeof line, "%-28.28s %12.4g %12.4g %9s %12.4g %9s %10s\n", r.name.c_str(),
                  r.measured_s, r.base_predicted_s,
                  percent(r.base_predicted_s / r.measured_s - 1.0).c_str(), r.predicted_s,
                  percent(r.error).c_str(), r.loo_error ? percent(*r.loo_error).c_str() : "-");
    out += line;
  }
  out += "\n";
  std::snprintf(line, sizeof line, "%-36s %14s %14s %14s  %s\n", "parameter", "base", "fitted",
                "std error", "unit");
  out += line;
  for (const FittedParameter& f : result.parameters) {
    char se_text[32];
    std::snprintf(se_text, sizeof se_text, "%.4g", f.standard_error.value_or(0.0));
    const std::string se = !f.determined      ? "not determined"
                           : f.standard_error ? std::string(se_text)
                                              : "n/a";
    std::snprintf(line, sizeof line, "%-36s %14.6g %14.6g %14s  %s%s\n", f.name.c_str(),
                  f.base_value, f.value, se.c_str(), f.unit.c_str(),
                  f.at_bound ? " (at its bound)" : "");
    out += line;
  }
  std::snprintf(line, sizeof line,
                "\n|error| median %.2f%%, max %.2f%% (base profile: rms log residual %.4g, "
                "calibrated %.4g)\n",
                100.0 * result.median_abs_error, 100.0 * result.max_abs_error,
                result.base_rms_log_residual, result.rms_log_residual);
  out += line;
  if (result.loo_median_abs_error) {
    std::snprintf(line, sizeof line, "leave-one-out |error| median %.2f%%, max %.2f%%\n",
                  100.0 * *result.loo_median_abs_error, 100.0 * *result.loo_max_abs_error);
    out += line;
  }
  std::snprintf(line, sizeof line, "%d iterations%s, %lld estimates\n", result.iterations,
                result.converged ? "" : " (not converged: raise max_iterations)",
                static_cast<long long>(result.estimates));
  out += line;
  for (const std::string& note : result.notes) {
    out += "note: " + note + "\n";
  }
  return out;
}

}  // namespace modar
