// `modar fit`: fit L(N, D) = E + A / N^alpha + B / D^beta to a user's runs the
// way Hoffmann et al. 2022 (appendix D.2) and Besiroglu et al. 2024 do:
// parameters (a, b, e) = log (A, B, E) and (alpha, beta); log L_hat =
// LSE(a - alpha log N, b - beta log D, e); objective = SUM of
// Huber_delta(log L_hat - log L) with delta = 1e-3; a grid of starting points;
// a quasi-Newton optimiser (BFGS with an Armijo backtracking line search);
// uncertainty from a nonparametric bootstrap over runs.
#include <Eigen/Dense>
#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "modar/base/errors.hpp"
#include "modar/base/files.hpp"
#include "modar/base/interrupt.hpp"
#include "modar/base/json.hpp"
#include "modar/base/text.hpp"
#include "modar/planner.hpp"

namespace modar {

namespace {

using Vec5 = Eigen::Matrix<double, 5, 1>;
using Mat5 = Eigen::Matrix<double, 5, 5>;
// x = (a, b, e, alpha, beta)

struct LogRun {
  double log_n;
  double log_d;
  double log_loss;
};

double huber(double r, double delta) {
  const double abs_r = std::abs(r);
  return abs_r <= delta ? 0.5 * r * r : delta * (abs_r - 0.5 * delta);
}

double huber_slope(double r, double delta) {
  return std::abs(r) <= delta ? r : (r > 0 ? delta : -delta);
}

// Objective and gradient over runs (indices into `runs`, with repetition for
// bootstrap samples).
double objective(const Vec5& x, const std::vector<LogRun>& runs, const std::vector<int>& sample,
                 double delta, Vec5* gradient) {
  double total = 0.0;
  if (gradient != nullptr) {
    gradient->setZero();
  }
  for (const int index : sample) {
    const LogRun& run = runs[index];
    const double t1 = x[0] - x[3] * run.log_n;
    const double t2 = x[1] - x[4] * run.log_d;
    const double t3 = x[2];
    const double top = std::max(t1, std::max(t2, t3));
    const double w1 = std::exp(t1 - top);
    const double w2 = std::exp(t2 - top);
    const double w3 = std::exp(t3 - top);
    const double sum = w1 + w2 + w3;
    const double residual = top + std::log(sum) - run.log_loss;
    total += huber(residual, delta);
    if (gradient != nullptr) {
      const double slope = huber_slope(residual, delta) / sum;
      (*gradient)[0] += slope * w1;
      (*gradient)[1] += slope * w2;
      (*gradient)[2] += slope * w3;
      (*gradient)[3] -= slope * w1 * run.log_n;
      (*gradient)[4] -= slope * w2 * run.log_d;
    }
  }
  return total;
}

struct Minimum {
  Vec5 x;
  double value;
  bool converged;
};

// The summed objective's gradient grows with the number of runs: the
// tolerance is 1e-12 per 300 runs (unchanged below that size).
double gradient_tolerance(size_t runs) {
  return 1e-12 * std::max(1.0, static_cast<double>(runs) / 300.0);
}

Minimum bfgs(Vec5 x, const std::vector<LogRun>& runs, const std::vector<int>& sample,
             double delta, RunReporter& reporter) {
  Vec5 g;
  double f = objective(x, runs, sample, delta, &g);
  Mat5 h = Mat5::Identity();
  bool converged = false;
  const double tolerance = gradient_tolerance(sample.size());
  for (int iteration = 0; iteration < 2000; ++iteration) {
    if (sample.size() > 300) {
      reporter.check();  // a large fit's single BFGS run can take seconds
    }
    if (g.lpNorm<Eigen::Infinity>() < tolerance) {
      converged = true;
      break;
    }
    Vec5 direction = -h * g;
    double slope = g.dot(direction);
    if (slope >= 0) {  // not a descent direction: restart from steepest descent
      h.setIdentity();
      direction = -g;
      slope = -g.squaredNorm();
    }
    double step = 1.0;
    Vec5 x_new;
    Vec5 g_new;
    double f_new = f;
    bool accepted = false;
    for (int halving = 0; halving < 60; ++halving) {
      x_new = x + step * direction;
      f_new = objective(x_new, runs, sample, delta, &g_new);
      if (std::isfinite(f_new) && f_new <= f + 1e-4 * step * slope) {
        accepted = true;
        break;
      }
      step *= 0.5;
    }
    if (!accepted) {
      converged = true;  // no further decrease possible at double precision
      break;
    }
    const Vec5 s = x_new - x;
    const Vec5 y = g_new - g;
    const double sy = s.dot(y);
    const double previous = f;
    x = x_new;
    g = g_new;
    f = f_new;
    if (sy > 1e-300) {
      const double rho = 1.0 / sy;
      const Mat5 identity = Mat5::Identity();
      h = (identity - rho * s * y.transpose()) * h * (identity - rho * y * s.transpose()) +
          rho * s * s.transpose();
    }
    if (std::abs(previous - f) <= 1e-16 * std::max(1.0, std::abs(f)) &&
        s.lpNorm<Eigen::Infinity>() < 1e-12) {
      converged = true;
      break;
    }
  }
  return {x, f, converged};
}

LossFitParams to_params(const Vec5& x) {
  return {std::exp(x[2]), std::exp(x[0]), std::exp(x[1]), x[3], x[4]};
}

FitParamSummary summarise(double estimate, std::vector<double> samples) {
  FitParamSummary out;
  out.estimate = estimate;
  if (samples.size() < 2) {
    return out;
  }
  double mean = 0.0;
  for (const double v : samples) {
    mean += v;
  }
  mean /= double(samples.size());
  double variance = 0.0;
  for (const double v : samples) {
    variance += (v - mean) * (v - mean);
  }
  out.standard_error = std::sqrt(variance / double(samples.size() - 1));
  std::sort(samples.begin(), samples.end());
  const auto quantile = [&](double q) {
    const double position = q * double(samples.size() - 1);
    const auto low = static_cast<size_t>(std::floor(position));
    const size_t high = std::min(low + 1, samples.size() - 1);
    const double frac = position - double(low);
    return samples[low] * (1 - frac) + samples[high] * frac;
  };
  out.ci_low = quantile(0.025);
  out.ci_high = quantile(0.975);
  return out;
}

std::string lower_ascii(std::string text) {
  for (char& c : text) {
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return text;
}

// "loss" -> loss (spreadsheets quote header cells); inner "" -> ".
std::string unquote(const std::string& cell) {
  if (cell.size() >= 2 && cell.front() == '"' && cell.back() == '"') {
    std::string out;
    for (size_t i = 1; i + 1 < cell.size(); ++i) {
      out += cell[i];
      if (cell[i] == '"' && i + 2 < cell.size() && cell[i + 1] == '"') {
        ++i;
      }
    }
    return trim(out);
  }
  return cell;
}

// Runs CSVs of a million rows are ~40 MB; 1 GiB bounds a mistyped path.
constexpr uint64_t kMaxRunsBytes = uint64_t{1} << 30;

// Large fits (docs/hardening.md).  Above kGridRuns runs the 675 BFGS starts
// run on a random kGridRuns-run subsample (a BFGS run costs ~150 objective
// evaluations, so the grid costs ~1e5 evaluations whatever the data size);
// the best 4 minima are refined on a kRefineRuns-run subsample (all runs when
// fewer) and, above kRefineRuns runs, the best of them on all runs.
constexpr size_t kGridRuns = 300;
constexpr size_t kRefineRuns = 20000;
// Above this many runs the bootstrap draws this many runs per resample, refits
// from the optimum and rescales the deviation by sqrt(m / n) (m-out-of-n
// bootstrap, Bickel, Goetze & van Zwet 1997).
constexpr size_t kBootstrapRuns = 2000;
// The grid of BFGS starts (alpha x beta x e x a x b, below) and how many of
// its best minima a large fit refines.
constexpr int64_t kGridStarts = 3 * 3 * 3 * 5 * 5;
constexpr int64_t kRefineMinima = 4;
constexpr int64_t kMaxBootstrapSamples = 100000;

// `count` distinct indices of [0, n) drawn with `rng`, sorted.
std::vector<int> random_subsample(size_t n, size_t count, std::mt19937_64& rng) {
  std::vector<int> all(n);
  for (size_t i = 0; i < n; ++i) {
    all[i] = static_cast<int>(i);
  }
  for (size_t i = 0; i < count; ++i) {  // partial Fisher-Yates
    std::uniform_int_distribution<size_t> pick_rest(i, n - 1);
    std::swap(all[i], all[pick_rest(rng)]);
  }
  all.resize(count);
  std::sort(all.begin(), all.end());
  return all;
}

}  // namespace

std::vector<RunRecord> parse_runs_csv(const std::string& text, const std::string& source_name,
                                      const std::string& base_dir) {
  std::istringstream in(text);
  std::string line;
  int64_t line_number = 0;
  std::vector<std::string> header;
  int column_n = -1, column_d = -1, column_loss = -1, column_config = -1;
  std::vector<RunRecord> runs;
  const auto where = [&](int64_t number) {
    return source_name + ":" + std::to_string(number) + ": ";
  };
  while (std::getline(in, line)) {
    ++line_number;
    if (line_number == 1 && line.compare(0, 3, "\xEF\xBB\xBF") == 0) {
      line.erase(0, 3);  // UTF-8 byte-order mark (Excel's "CSV UTF-8")
    }
    const std::string trimmed = trim(line);
    if (trimmed.empty() || trimmed[0] == '#') {
      continue;
    }
    std::vector<std::string> fields = split_trimmed(trimmed, ',');
    for (std::string& field : fields) {
      field = unquote(field);
    }
    if (header.empty()) {
      header = fields;
      for (size_t i = 0; i < header.size(); ++i) {
        const std::string name = lower_ascii(header[i]);
        const int index = static_cast<int>(i);
        if (name == "n" || name == "n_flop_active" || name == "params") {
          column_n = index;
        } else if (name == "d" || name == "tokens") {
          column_d = index;
        } else if (name == "loss") {
          column_loss = index;
        } else if (name == "config") {
          column_config = index;
        }
      }
      if (column_loss < 0 || column_d < 0 || (column_n < 0 && column_config < 0)) {
        throw FileError(where(line_number) + "header '" + shown_value(trimmed) +
                        "' lacks required columns; need loss, D (or tokens), and N (or "
                        "n_flop_active, params) or config");
      }
      continue;
    }
    if (fields.size() != header.size()) {
      throw FileError(where(line_number) + std::to_string(fields.size()) +
                      " fields, but the header has " + std::to_string(header.size()));
    }
    const auto number = [&](int column) {
      const std::string& cell = fields[static_cast<size_t>(column)];
      double value = 0.0;
      // The one number grammar of every modar input (decimal, no hex / inf / nan).
      if (!parse_finite_number_text(cell, &value) || value <= 0) {
        throw FileError(where(line_number) + "column '" +
                        shown_value(header[static_cast<size_t>(column)]) + "' = '" +
                        shown_value(cell) + "': must be a positive finite decimal number");
      }
      return value;
    };
    RunRecord run;
    run.line = line_number;
    run.tokens = number(column_d);
    run.loss = number(column_loss);
    if (column_n >= 0) {
      run.n_flop_active = number(column_n);
    } else {
      const std::string& cell = fields[static_cast<size_t>(column_config)];
      std::filesystem::path path(cell);
      if (path.is_relative()) {
        path = std::filesystem::path(base_dir) / path;
      }
      try {
        run.n_flop_active = count_params(load_config_file(path.string())).flop_active;
      } catch (const std::exception& e) {
        throw FileError(where(line_number) + "config '" + shown_value(cell) + "': " + e.what());
      }
    }
    runs.push_back(run);
  }
  if (header.empty()) {
    throw FileError(source_name + ": empty; expected a header line with loss, D and N columns");
  }
  if (runs.size() < 5) {
    throw FileError(source_name + ": " + std::to_string(runs.size()) +
                    " runs; a fit of 5 parameters needs at least 5 runs");
  }
  return runs;
}

std::vector<RunRecord> load_runs_csv(const std::string& path) {
  const std::string text = read_input_file(path, "runs file", kMaxRunsBytes);
  const std::string base_dir = std::filesystem::path(path).parent_path().string();
  return parse_runs_csv(text, shown_value(path, 200), base_dir.empty() ? "." : base_dir);
}

std::vector<RunRecord> runs_from_law(const LossFitParams& law, int64_t count, double noise_sigma,
                                     uint64_t seed) {
  std::vector<RunRecord> runs;
  runs.reserve(static_cast<size_t>(std::max<int64_t>(0, count)));
  uint64_t state = seed;
  const auto uniform = [&] {  // splitmix64, mapped into (0, 1)
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double(z >> 11) + 0.5) / 9007199254740992.0;
  };
  for (int64_t i = 0; i < count; ++i) {
    const double n = std::exp(std::log(2e7) + uniform() * std::log(50.0));
    const double d = std::exp(std::log(2e9) + uniform() * std::log(25.0));
    const double normal =
        std::sqrt(-2.0 * std::log(uniform())) * std::cos(6.283185307179586 * uniform());
    runs.push_back({n, d, predicted_loss(law, 1.0, n, d) * std::exp(noise_sigma * normal), i + 2});
  }
  return runs;
}

FitOptions resolve_fit_options(const FitRequest& request) {
  FitOptions options;
  if (request.huber_delta) {
    options.huber_delta = *request.huber_delta;
  }
  if (!(options.huber_delta > 0) || !std::isfinite(options.huber_delta)) {
    throw ConfigError("huber_delta = " + format_number(options.huber_delta) +
                      ": must be a finite number > 0");
  }
  if (request.bootstrap_samples) {
    if (*request.bootstrap_samples < 0 || *request.bootstrap_samples > kMaxBootstrapSamples) {
      throw ConfigError("bootstrap_samples = " + std::to_string(*request.bootstrap_samples) +
                        ": must be an integer in [0, " + std::to_string(kMaxBootstrapSamples) +
                        "]");
    }
    options.bootstrap_samples = static_cast<int>(*request.bootstrap_samples);
  }
  if (request.seed) {
    if (*request.seed < 0) {
      throw ConfigError("seed = " + std::to_string(*request.seed) + ": must be an integer >= 0");
    }
    options.seed = static_cast<uint64_t>(*request.seed);
  }
  return options;
}

FitResult fit_runs(const std::vector<RunRecord>& input, const FitRequest& request,
                   const RunControl& control) {
  return fit_runs(input, resolve_fit_options(request), control);
}

FitResult fit_runs(const std::vector<RunRecord>& input, const FitOptions& options,
                   const RunControl& control) {
  if (input.size() < 5) {
    throw ConfigError("fit: " + std::to_string(input.size()) +
                      " runs; a fit of 5 parameters needs at least 5 runs");
  }
  // A FitOptions built by hand gets the request's checks.
  resolve_fit_options(FitRequest{options.huber_delta, options.bootstrap_samples, std::nullopt});
  if (input.size() > size_t{100000000}) {
    throw ConfigError("fit: " + std::to_string(input.size()) + " runs: must be <= 1e8");
  }
  // Units of work: the grid's BFGS starts, the refinements, the bootstrap.
  const bool large = input.size() > kGridRuns;
  const bool huge = input.size() > kRefineRuns;
  RunReporter reporter(control, "fit", "BFGS fits",
                       kGridStarts + (large ? kRefineMinima + (huge ? 1 : 0) : 0) +
                           options.bootstrap_samples);
  const auto report = [&](const std::string& stage) { reporter.set_stage(stage); };
  std::vector<LogRun> runs;
  runs.reserve(input.size());
  for (const RunRecord& r : input) {
    if (!(r.n_flop_active > 0 && r.tokens > 0 && r.loss > 0) || !std::isfinite(r.n_flop_active) ||
        !std::isfinite(r.tokens) || !std::isfinite(r.loss)) {
      throw ConfigError("fit: run at line " + std::to_string(r.line) +
                        ": N, D and loss must be positive finite numbers");
    }
    runs.push_back({std::log(r.n_flop_active), std::log(r.tokens), std::log(r.loss)});
  }
  std::vector<int> all(runs.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    all[i] = static_cast<int>(i);
  }
  // The grid of starts runs on all runs, or (large fits) on a random subsample.
  std::mt19937_64 subsample_rng(options.seed ^ 0x9e3779b97f4a7c15ULL);
  const std::vector<int> grid_sample =
      large ? random_subsample(runs.size(), kGridRuns, subsample_rng) : all;
  if (large) {
    report("fitting " + std::to_string(runs.size()) + " runs: " + std::to_string(kGridStarts) +
           " BFGS starts on a random " +
           std::to_string(kGridRuns) + "-run subsample");
  }

  // Grid of starting points (a coarser version of Hoffmann et al.'s grid).
  std::vector<Minimum> minima;
  int64_t starts = 0;
  for (const double alpha : {0.25, 0.5, 1.0}) {
    for (const double beta : {0.25, 0.5, 1.0}) {
      for (const double e : {-1.0, 0.0, 1.0}) {
        for (const double a : {0.0, 5.0, 10.0, 15.0, 20.0}) {
          for (const double b : {0.0, 5.0, 10.0, 15.0, 20.0}) {
            Vec5 x;
            x << a, b, e, alpha, beta;
            minima.push_back(bfgs(x, runs, grid_sample, options.huber_delta, reporter));
            ++starts;
            reporter.advance();
          }
        }
      }
    }
  }
  std::sort(minima.begin(), minima.end(),
            [](const Minimum& l, const Minimum& r) { return l.value < r.value; });
  if (large) {
    // Refine the best few subsample minima on more runs, then the best on all.
    const std::vector<int> refine_sample =
        huge ? random_subsample(runs.size(), kRefineRuns, subsample_rng) : all;
    report("refining the best " + std::to_string(kRefineMinima) + " minima on " +
           std::to_string(refine_sample.size()) + " runs");
    std::vector<Minimum> refined;
    for (size_t i = 0; i < std::min(static_cast<size_t>(kRefineMinima), minima.size()); ++i) {
      refined.push_back(bfgs(minima[i].x, runs, refine_sample, options.huber_delta, reporter));
      reporter.advance();
    }
    std::sort(refined.begin(), refined.end(),
              [](const Minimum& l, const Minimum& r) { return l.value < r.value; });
    if (huge) {
      report("refining the best minimum on all " + std::to_string(runs.size()) + " runs");
      refined.front() = bfgs(refined.front().x, runs, all, options.huber_delta, reporter);
      reporter.advance();
    }
    minima = std::move(refined);
  }
  const Minimum best = minima.front();

  FitResult result;
  result.runs = static_cast<int64_t>(runs.size());
  result.starts = starts;
  result.objective = best.value;
  const LossFitParams p = to_params(best.x);
  double squares = 0.0;
  for (const LogRun& r : runs) {
    const double predicted = std::log(predicted_loss(p, 1.0, std::exp(r.log_n), std::exp(r.log_d)));
    squares += (predicted - r.log_loss) * (predicted - r.log_loss);
  }
  result.rms_log_residual = std::sqrt(squares / double(runs.size()));

  // Bootstrap: resample runs with replacement; refit from the best few minima.
  // Large fits: m-out-of-n bootstrap (m = kBootstrapRuns runs per resample,
  // refit from the optimum, deviations scaled by sqrt(m / n)).
  const bool subsampled_bootstrap = runs.size() > kBootstrapRuns;
  const size_t resample_size = subsampled_bootstrap ? kBootstrapRuns : runs.size();
  const double scale =
      subsampled_bootstrap ? std::sqrt(double(resample_size) / double(runs.size())) : 1.0;
  std::array<std::vector<double>, 5> samples;
  std::mt19937_64 rng(options.seed);
  std::uniform_int_distribution<int> pick(0, static_cast<int>(runs.size()) - 1);
  // Small fits refit each resample from the best 4 grid minima (as Hoffmann
  // et al.); large fits (whose minima were refined on many runs) from the best.
  const size_t warm_starts = large ? 1 : std::min<size_t>(4, minima.size());
  for (int s = 0; s < options.bootstrap_samples; ++s) {
    if (s == 0) {
      report("bootstrap");
    }
    std::vector<int> sample(resample_size);
    for (int& index : sample) {
      index = pick(rng);
    }
    Minimum refit = bfgs(best.x, runs, sample, options.huber_delta, reporter);
    for (size_t w = 1; w < warm_starts; ++w) {
      const Minimum other = bfgs(minima[w].x, runs, sample, options.huber_delta, reporter);
      if (other.value < refit.value) {
        refit = other;
      }
    }
    const Vec5 draw = subsampled_bootstrap ? Vec5(best.x + scale * (refit.x - best.x)) : refit.x;
    const LossFitParams q = to_params(draw);
    samples[0].push_back(q.E);
    samples[1].push_back(q.A);
    samples[2].push_back(q.B);
    samples[3].push_back(q.alpha);
    samples[4].push_back(q.beta);
    reporter.advance();
  }
  result.bootstrap_samples = options.bootstrap_samples;
  result.E = summarise(p.E, samples[0]);
  result.A = summarise(p.A, samples[1]);
  result.B = summarise(p.B, samples[2]);
  result.alpha = summarise(p.alpha, samples[3]);
  result.beta = summarise(p.beta, samples[4]);

  result.fit.name = "fit";
  result.fit.source =
      std::to_string(runs.size()) + " runs, Huber(delta=" + format_number(options.huber_delta) +
      ") on log-loss, BFGS from " + std::to_string(starts) + " starts" +
      (large ? " on a " + std::to_string(kGridRuns) + "-run subsample, best 4 refined" +
                   (runs.size() > kRefineRuns ? " on " + std::to_string(kRefineRuns) +
                                                    " runs, the best on all runs"
                                              : std::string(" on all runs"))
             : std::string()) +
      ", " + std::to_string(options.bootstrap_samples) + " bootstrap samples" +
      (subsampled_bootstrap && options.bootstrap_samples > 0
           ? " (m-out-of-n, m = " + std::to_string(resample_size) + ")"
           : std::string());
  result.fit.params = p;
  if (options.bootstrap_samples >= 2) {
    result.fit.standard_errors =
        LossFitParams{result.E.standard_error, result.A.standard_error, result.B.standard_error,
                      result.alpha.standard_error, result.beta.standard_error};
  }
  // A fit `modar optimal --fit` would refuse (NaN, alpha = 1200, ...) is not
  // a success: the same checks as reading the fit back.
  if (!std::isfinite(result.objective)) {
    throw ConfigError("fit: the objective is " + format_number(result.objective) +
                      " at the optimum; the runs do not determine L(N, D)");
  }
  LossFit point = result.fit;
  point.standard_errors.reset();  // bootstrap spreads may be huge; the law itself must be sane
  try {
    parse_fit_toml(to_toml(point), "the fitted law");
  } catch (const std::exception& e) {
    throw ConfigError(std::string(e.what()) +
                      "; the runs do not determine L(N, D) = E + A/N^alpha + B/D^beta (need "
                      "several distinct N and D, with the loss falling as both grow)");
  }
  reporter.finish();
  return result;
}

namespace {

// The five constants' summaries with their names, in the order of the law.
std::array<std::pair<const char*, const FitParamSummary*>, 5> param_summaries(
    const FitResult& result) {
  return {{{"E", &result.E},
           {"A", &result.A},
           {"B", &result.B},
           {"alpha", &result.alpha},
           {"beta", &result.beta}}};
}

}  // namespace

std::string to_json(const FitResult& result) {
  JsonWriter json;
  json.begin_object();
  json.field("runs", result.runs).field("starts", result.starts);
  json.field("bootstrap_samples", result.bootstrap_samples);
  json.field("objective", result.objective).field("rms_log_residual", result.rms_log_residual);
  json.field("source", result.fit.source);
  json.key("params").begin_object();
  for (const auto& [name, summary] : param_summaries(result)) {
    json.key(name)
        .begin_object()
        .field("estimate", summary->estimate)
        .field("standard_error", summary->standard_error)
        .field("ci95_low", summary->ci_low)
        .field("ci95_high", summary->ci_high)
        .end_object();
  }
  json.end_object().end_object();
  return json.str();
}

std::string to_text(const FitResult& result) {
  std::string out = "L(N, D) = E + A / N^alpha + B / D^beta fitted to " +
                    std::to_string(result.runs) + " runs (" + result.fit.source + ")\n";
  char line[200];
  std::snprintf(line, sizeof line, "%-6s %14s %14s %14s %14s\n", "param", "estimate",
                "bootstrap SE", "2.5%", "97.5%");
  out += line;
  for (const auto& [name, s] : param_summaries(result)) {
    std::snprintf(line, sizeof line, "%-6s %14.6g %14.4g %14.6g %14.6g\n", name, s->estimate,
                  s->standard_error, s->ci_low, s->ci_high);
    out += line;
  }
  std::snprintf(line, sizeof line, "summed Huber loss %.6g, rms log residual %.4g\n",
                result.objective, result.rms_log_residual);
  out += line;
  return out;
}

}  // namespace modar
