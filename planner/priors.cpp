// Architecture efficiency priors eps in L = E + eps A / N_f^alpha + B / D^beta
// (MoD: L = E + eps (A / N_f^alpha + B / D^beta)).
//
// Each published prior is DERIVED under the active fit from numbers the papers
// report, and the derivation is returned as text (printed by the CLI, copied
// into docs/planner.md):
//
//  * MoD, capacity 12.5 %, every 2 (Raposo et al. 2024, section 4.1, figure 4):
//    isoFLOP minima baseline -> MoD read off the figure: 6e18 3.13 -> 3.09,
//    2e19 2.86 -> 2.83, 1e20 2.59 -> 2.56.  The paper finds the optimal MoD
//    uses the optimal baseline's forward FLOPs per token; N_f counts forward
//    FLOPs per token (capacity-weighted), so the prior acts on the WHOLE
//    reducible loss, L = E + eps (A / N_f^alpha + B / D^beta): a common
//    factor does not move the argmin over N_f under C = 6 N_f D, and scales
//    the minimum's reducible loss by eps exactly, so
//    eps_i = (L_mod - E) / (L_base - E); the prior is the geometric mean over
//    the three budgets (docs/planner.md "Where the MoD prior acts").
//  * DAR, two streams (DAR paper, "Other model sizes", table 3 text): validation
//    loss -2.03 %, -2.22 %, -5.12 % at 0.1B, 0.3B, 0.5B non-vocabulary
//    parameters trained on 20 tokens per parameter.  With the fit's baseline
//    loss L_b(N, 20N), the loss drop p L_b must come from the parameter term:
//    eps_i = 1 - p L_b / (A / N^alpha).  The 0.1B and 0.3B numbers are Block
//    DAR (the paper's best variant there) and give the Block prior (geometric
//    mean); the 0.5B number is Full DAR (K = 1) and is the Full prior.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "modar/base/errors.hpp"
#include "modar/base/text.hpp"
#include "modar/planner.hpp"

namespace modar {

namespace {

struct IsoflopMinimum {
  double budget_flops;
  double baseline_loss;
  double mod_loss;
};
// MoD paper figure 4 (left), minima read off the plot (docs/planner.md).
constexpr IsoflopMinimum kModFigure4[] = {
    {6e18, 3.13, 3.09}, {2e19, 2.86, 2.83}, {1e20, 2.59, 2.56}};

struct DarReduction {
  double non_vocab_params;
  double relative_loss_drop;
  const char* variant;
};
// DAR paper, "Other model sizes": best variant vs the residual baseline.
constexpr DarReduction kDarTable3[] = {
    {1e8, 0.0203, "Block DAR"}, {3e8, 0.0222, "Block DAR"}, {5e8, 0.0512, "Full DAR"}};

// Precision of the published numbers.  MoD: losses read off figure 4 to
// about +-0.01 (docs/planner.md); DAR: percentages printed to 0.01 %, i.e.
// +-0.005 percentage points.
constexpr double kModReadingHalfWidth = 0.01;
constexpr double kDarPrintHalfWidth = 0.00005;
// Two-sided 95 % normal quantile.
constexpr double kZ95 = 1.959963984540054;
// MoD paper 3.5: the causal auxiliary BCE router "affects the primary language
// modeling objective by approximately 0.2-0.3%"; the middle of the range.
constexpr double kAuxLossPenalty = 0.0025;

// MoD paper figure 4 caption: "models varying in size from 60M to 3B parameters".
constexpr double kModMeasuredParamsMin = 6e7;
constexpr double kModMeasuredParamsMax = 3e9;

std::string sci2(double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.2e", value);
  return buffer;
}

// Geometric mean of the per-budget MoD eps under (E, exponent); nullopt when a
// reading lies below E.
std::optional<double> mod_eps(double E, double exponent, std::string* text) {
  double log_sum = 0.0;
  for (const IsoflopMinimum& m : kModFigure4) {
    const double reducible_base = m.baseline_loss - E;
    const double reducible_mod = m.mod_loss - E;
    if (reducible_mod <= 0 || reducible_base <= 0) {
      if (text != nullptr) {
        *text += "C = " + format_number(m.budget_flops) +
                 ": paper loss below the fit's E; no prior under this fit";
      }
      return std::nullopt;
    }
    const double eps_i = std::pow(reducible_mod / reducible_base, exponent);
    log_sum += std::log(eps_i);
    if (text != nullptr) {
      *text += "  C = " + format_number(m.budget_flops) + ": (" + format_fixed(m.mod_loss, 2) +
               " - E) / (" + format_fixed(m.baseline_loss, 2) +
               " - E) = " + format_fixed(eps_i, 4) + "\n";
    }
  }
  return std::exp(log_sum / 3.0);
}

// The last part of each prior's range: the eps at the fit's E +- 1.96 SE (E is
// the one constant whose standard error means something alone: A, alpha and
// B, beta are strongly correlated in every published fit).  Widens the
// prior's [eps_low, eps_high] to both ends and notes them in `interval`;
// nothing without a standard error of E or where either end has no eps.
template <typename EpsAtE>
void widen_by_fit_e(const LossFit& fit, const EpsAtE& eps_at_e, EfficiencyPrior& prior,
                    std::string& interval) {
  if (!fit.standard_errors || fit.standard_errors->E <= 0) {
    return;
  }
  const double se = fit.standard_errors->E;
  const std::optional<double> up = eps_at_e(fit.params.E + kZ95 * se);
  const std::optional<double> down = eps_at_e(fit.params.E - kZ95 * se);
  if (!up || !down) {
    return;
  }
  const double lo = std::min(*up, *down);
  const double hi = std::max(*up, *down);
  prior.eps_low = std::min(prior.eps_low, lo);
  prior.eps_high = std::max(prior.eps_high, hi);
  interval += "fit E +- 1.96 SE (" + format_number(se) + "): " + format_fixed(lo, 4) + " .. " +
              format_fixed(hi, 4) + "\n";
}

EfficiencyPrior mod_prior(const LossFit& fit) {
  const LossFitParams& p = fit.params;
  EfficiencyPrior prior;
  prior.key = "mod";
  prior.source =
      "Raposo et al. 2024 (Mixture-of-Depths, arXiv 2404.02258) section 4.1, figure 4: isoFLOP "
      "minima for MoD capacity 12.5%, every 2";
  prior.acts_on = PriorTerm::reducible;
  // eps multiplies both reducible terms: the isoFLOP argmin stays at the
  // baseline's N_f and its reducible loss scales by eps (exponent 1).
  const double exponent = 1.0;
  std::string text = "fit " + fit.name + ": E = " + format_number(p.E) +
                     "; L = E + eps (A / N_f^alpha + B / D^beta): the optimum keeps the "
                     "baseline's N_f (forward FLOPs per token) and its reducible loss x eps\n";
  text += "eps_i = (L_mod - E) / (L_base - E)\n";
  const std::optional<double> eps = mod_eps(p.E, exponent, &text);
  if (!eps) {
    prior.known = false;
    prior.derivation = text;
    return prior;
  }
  prior.eps = *eps;
  prior.known = true;
  text += "eps_mod = geometric mean = " + format_fixed(prior.eps, 4);
  prior.derivation = text;
  prior.points = 3;
  prior.size_measure = "params_total";
  prior.measured_size_min = kModMeasuredParamsMin;
  prior.measured_size_max = kModMeasuredParamsMax;
  prior.measured_budget_min = kModFigure4[0].budget_flops;
  prior.measured_budget_max = kModFigure4[2].budget_flops;

  // (1) Reading precision: each of the six readings uniform within +-h,
  // independent.  log eps = (k/3) sum_i [ln(L_mod,i - E) - ln(L_base,i - E)],
  // so to first order Var(log eps) = (k/3)^2 sum_i (h^2/3) (1/(L_mod,i - E)^2
  // + 1/(L_base,i - E)^2); the 95 % range is eps exp(+-1.96 sd).
  double variance = 0.0;
  double point_low = INFINITY;
  double point_high = 0.0;
  const double h = kModReadingHalfWidth;
  for (const IsoflopMinimum& m : kModFigure4) {
    variance += h * h / 3.0 *
                (1.0 / std::pow(m.mod_loss - p.E, 2) + 1.0 / std::pow(m.baseline_loss - p.E, 2));
    const double eps_i = std::pow((m.mod_loss - p.E) / (m.baseline_loss - p.E), exponent);
    point_low = std::min(point_low, eps_i);
    point_high = std::max(point_high, eps_i);
  }
  const double sd = exponent / 3.0 * std::sqrt(variance);
  const double reading_low = prior.eps * std::exp(-kZ95 * sd);
  const double reading_high = prior.eps * std::exp(kZ95 * sd);
  prior.eps_low = std::min(reading_low, point_low);
  prior.eps_high = std::max(reading_high, point_high);
  std::string interval = "figure readings +-" + format_number(h) +
                         " each (independent, uniform): 95% range " + format_fixed(reading_low, 4) +
                         " .. " + format_fixed(reading_high, 4) + "\n";
  interval += "spread of the three budgets' eps_i: " + format_fixed(point_low, 4) + " .. " +
              format_fixed(point_high, 4) + "\n";
  // (3) The fit's E.
  widen_by_fit_e(
      fit, [&](double E) { return mod_eps(E, exponent, nullptr); }, prior, interval);
  interval += "eps_mod range (envelope) = " + format_fixed(prior.eps_low, 4) + " .. " +
              format_fixed(prior.eps_high, 4);
  prior.interval = interval;
  return prior;
}

// eps of one DAR point under the fit's constants with E replaced by `E`.
double dar_point_eps(const LossFitParams& p, double E, const DarReduction& r, double drop) {
  LossFitParams q = p;
  q.E = E;
  const double n = r.non_vocab_params;
  const double baseline = predicted_loss(q, 1.0, n, 20.0 * n);
  return 1.0 - drop * baseline / (q.A / std::pow(n, q.alpha));
}

// Block (block_layers >= 2) or Full (block_layers == 1) DAR prior.
EfficiencyPrior dar_prior(const LossFit& fit, bool full) {
  const LossFitParams& p = fit.params;
  EfficiencyPrior prior;
  prior.key = "dar";
  prior.source =
      std::string(
          "Dual Attention Residuals paper, 'Other model sizes' (table 3 text): "
          "validation loss -2.03%, -2.22%, -5.12% at 0.1B, 0.3B, 0.5B, 20 tokens "
          "per parameter; ") +
      (full ? "Full DAR (K = 1): the 0.5B point" : "Block DAR: the 0.1B and 0.3B points");
  std::string text =
      "fit " + fit.name + ": L_b = E + A/N^alpha + B/(20N)^beta, N = non-vocab params\n";
  text += "eps_i = 1 - p * L_b / (A / N^alpha)\n";
  double log_sum = 0.0;
  int used = 0;
  bool valid = true;
  double used_low = INFINITY, used_high = 0.0, all_low = INFINITY, all_high = 0.0;
  double print_low = INFINITY, print_high = 0.0;
  double size_min = INFINITY, size_max = 0.0;
  std::vector<const DarReduction*> selected_points;
  for (const DarReduction& r : kDarTable3) {
    const double n = r.non_vocab_params;
    const double baseline = predicted_loss(p, 1.0, n, 20.0 * n);
    const double parameter_term = p.A / std::pow(n, p.alpha);
    const double eps_i = 1.0 - r.relative_loss_drop * baseline / parameter_term;
    const bool selected = (full == (std::string(r.variant) == "Full DAR"));
    text += "  N = " + format_number(n) + " (" + r.variant +
            "): L_b = " + format_fixed(baseline, 4) +
            ", A/N^alpha = " + format_fixed(parameter_term, 4) +
            ", p = " + format_fixed(100 * r.relative_loss_drop, 2) +
            "% -> eps = " + format_fixed(eps_i, 4) + (selected ? "  [used]" : "") + "\n";
    all_low = std::min(all_low, eps_i);
    all_high = std::max(all_high, eps_i);
    if (selected) {
      valid = valid && eps_i > 0;
      log_sum += std::log(std::max(eps_i, 1e-300));
      ++used;
      used_low = std::min(used_low, eps_i);
      used_high = std::max(used_high, eps_i);
      size_min = std::min(size_min, n);
      size_max = std::max(size_max, n);
      selected_points.push_back(&r);
      // A larger drop means a smaller eps.
      print_low = std::min(
          print_low, dar_point_eps(p, p.E, r, r.relative_loss_drop + kDarPrintHalfWidth));
      print_high = std::max(
          print_high, dar_point_eps(p, p.E, r, r.relative_loss_drop - kDarPrintHalfWidth));
    }
  }
  if (!valid) {
    prior.known = false;
    prior.derivation = text + "the reported drop exceeds the fit's parameter term: no prior";
    return prior;
  }
  prior.known = true;
  prior.eps = std::exp(log_sum / used);
  text += std::string(full ? "eps_dar_full" : "eps_dar (Block)") +
          (used > 1 ? " = geometric mean of the used points = " : " = ") +
          format_fixed(prior.eps, 4);
  prior.derivation = text;
  prior.points = used;
  prior.size_measure = "non_embedding";
  prior.measured_size_min = size_min;
  prior.measured_size_max = size_max;
  prior.measured_tokens_per_param = 20.0;

  std::string interval =
      "percentages printed to 0.01% (+-0.005 points): " + format_fixed(print_low, 4) + " .. " +
      format_fixed(print_high, 4) + "\n";
  prior.eps_low = print_low;
  prior.eps_high = print_high;
  if (used > 1) {
    interval += "spread of the used points: " + format_fixed(used_low, 4) + " .. " +
                format_fixed(used_high, 4) + "\n";
    prior.eps_low = std::min(prior.eps_low, used_low);
    prior.eps_high = std::max(prior.eps_high, used_high);
  } else {
    // One point has no spread of its own: take the spread of all the paper's
    // DAR points (its gains vary that much between sizes and variants).
    interval += "single point: no spread of its own; the paper's three DAR points span " +
                format_fixed(all_low, 4) + " .. " + format_fixed(all_high, 4) +
                ", taken as the range\n";
    prior.eps_low = std::min(prior.eps_low, all_low);
    prior.eps_high = std::max(prior.eps_high, all_high);
  }
  widen_by_fit_e(
      fit,
      [&](double E) {
        double log_sum = 0.0;
        for (const DarReduction* r : selected_points) {
          log_sum += std::log(std::max(dar_point_eps(p, E, *r, r->relative_loss_drop), 1e-300));
        }
        return std::optional<double>(std::exp(log_sum / used));
      },
      prior, interval);
  interval += std::string(full ? "eps_dar_full" : "eps_dar (Block)") +
              " range (envelope) = " + format_fixed(prior.eps_low, 4) + " .. " +
              format_fixed(prior.eps_high, 4) + "; measured at " + sci2(size_min) +
              (size_max > size_min ? " .. " + sci2(size_max) : "") +
              " non-vocab params, 20 tokens/param";
  prior.interval = interval;
  return prior;
}

// ---- experts: MoD paper section 4.3, figure 7 (docs/moe.md) -----------------
// Figure 7 plots normalised loss against normalised FLOPs per FFN (both 1.0 at
// the isoFLOP-optimal baseline) for the baseline, MoE and MoDE, read from the
// plot at x = FLOPs per FFN / the optimal baseline's (precision assumed
// +-0.003, a third of the minor gridline spacing):
struct Figure7Point {
  double x;
  double baseline;
  double moe;
  double mode;  // 0: no MoDE point at this x
};
constexpr Figure7Point kFigure7[] = {{0.25, 1.035, 1.037, 0.0},
                                     {0.35, 1.018, 1.008, 0.995},
                                     {0.60, 1.007, 0.983, 0.969},
                                     {0.80, 1.004, 0.981, 0.0},
                                     {1.00, 1.000, 0.978, 0.957}};
constexpr double kFigure7ReadingHalfWidth = 0.003;

// Where the experts' prior acts: figure 7's gain over the baseline of the same
// FLOPs is about zero at the small end (MoE -0.2 % at 0.25x) and 2.2-2.4 % from
// 0.6x to 1.0x (MoDE 2.3 % at 0.35x, 4.3 % at 1.0x).  The figure is an isoFLOP
// sweep: at a budget C with the baseline's closed-form optimum N*, D*, a model
// of x N* trains on D* / x tokens, so a small x is a small model on many tokens
// (parameter term large) and a large x a large model on few tokens (data term
// large).  One constant factor on each reducible term,
//   L = E + eps_p A / N^alpha + eps_d B / D^beta,
// is the most general constant prior the loss model admits; the ratio the
// figure shows is then
//   q(x) = arch(x) / baseline(x) = 1 - (1 - eps_p) u(x) - (1 - eps_d) w(x),
//   u(x) = A (x N*)^-alpha / L(x),  w(x) = B (D* / x)^-beta / L(x),
// linear in (1 - eps_p, 1 - eps_d): ordinary least squares over the curve's
// points.  A factor on the data term alone (modar's earlier form) cannot reach
// zero gain at 0.25x (w(0.25) / w(1.0) = 0.58 under Epoch at 1e20); the fit
// finds eps_p > 1 (the routed model loses per active parameter where the
// parameter term dominates) and eps_d < 1 (it gains per token where the data
// term dominates).  eps (the range the planner carries) is eps_d; eps_p rides
// along as EfficiencyPrior::params_factor, printed with its own range.
// The figure gives ratios, not a budget; its baseline curve gives one: of the
// MoD paper's three isoFLOP budgets (figure 4: 6e18, 2e19, 1e20), the one whose
// baseline curve under the fit, L(x N*, D*/x) / L(N*, D*), passes nearest the
// figure's baseline readings (least squares; the MoE and MoDE readings play no
// part).  The fit is at that budget; the range adds the other two budgets'
// fits, the readings' precision (each reading uniform within +-0.003,
// independent, propagated through the least squares: 95 %) and the fit's
// E +- 1.96 SE.
struct Figure7Fit {
  double eps_params = 1.0;
  double eps_data = 1.0;
  double sd_params = 0.0;  // standard deviations from the readings' precision
  double sd_data = 0.0;
};

std::optional<Figure7Fit> figure7_fit_at(const LossFitParams& p, double budget_flops, bool mode) {
  const ClosedFormOptimum optimum = closed_form_optimum(p, budget_flops);
  // Normal equations of y = a u + b w (a = 1 - eps_p, b = 1 - eps_d).
  double uu = 0.0, uw = 0.0, ww = 0.0, uy = 0.0, wy = 0.0;
  struct Row {
    double u, w, variance;
  };
  std::vector<Row> rows;
  const double h2 = kFigure7ReadingHalfWidth * kFigure7ReadingHalfWidth / 3.0;
  for (const Figure7Point& point : kFigure7) {
    const double arch = mode ? point.mode : point.moe;
    if (arch <= 0.0) {
      continue;
    }
    const double n = point.x * optimum.n_opt;
    const double tokens = optimum.tokens_opt / point.x;
    const double loss = predicted_loss(p, 1.0, n, tokens);
    const double u = p.A / std::pow(n, p.alpha) / loss;
    const double w = p.B / std::pow(tokens, p.beta) / loss;
    const double y = 1.0 - arch / point.baseline;
    uu += u * u;
    uw += u * w;
    ww += w * w;
    uy += u * y;
    wy += w * y;
    // Var(arch / baseline) to first order, both readings uniform within +-h.
    const double variance =
        h2 * (1.0 / (point.baseline * point.baseline) +
              arch * arch / std::pow(point.baseline, 4));
    rows.push_back({u, w, variance});
  }
  const double det = uu * ww - uw * uw;
  if (!(det > 0.0) || rows.size() < 2) {
    return std::nullopt;
  }
  const double a = (ww * uy - uw * wy) / det;
  const double b = (uu * wy - uw * uy) / det;
  Figure7Fit fit;
  fit.eps_params = 1.0 - a;
  fit.eps_data = 1.0 - b;
  if (!(fit.eps_params > 0.0) || !(fit.eps_data > 0.0)) {
    return std::nullopt;
  }
  // (M^T M)^-1 M^T diag(var) M (M^T M)^-1, M's rows (u, w).
  double var_a = 0.0, var_b = 0.0;
  for (const Row& row : rows) {
    const double ka = (ww * row.u - uw * row.w) / det;
    const double kb = (uu * row.w - uw * row.u) / det;
    var_a += ka * ka * row.variance;
    var_b += kb * kb * row.variance;
  }
  fit.sd_params = std::sqrt(var_a);
  fit.sd_data = std::sqrt(var_b);
  return fit;
}

// Sum of squared misfits of the figure's baseline readings to the fit's
// isoFLOP curve at `budget_flops`, normalised at its closed-form optimum.
double figure7_baseline_misfit(const LossFitParams& p, double budget_flops) {
  const ClosedFormOptimum optimum = closed_form_optimum(p, budget_flops);
  const double at_optimum = predicted_loss(p, 1.0, optimum.n_opt, optimum.tokens_opt);
  double sum = 0.0;
  for (const Figure7Point& point : kFigure7) {
    const double ratio =
        predicted_loss(p, 1.0, point.x * optimum.n_opt, optimum.tokens_opt / point.x) / at_optimum;
    sum += (ratio - point.baseline) * (ratio - point.baseline);
  }
  return sum;
}

// The figure-4 budget whose baseline curve passes nearest figure 7's.
double figure7_budget(const LossFitParams& p) {
  double best = kModFigure4[0].budget_flops;
  for (const IsoflopMinimum& m : kModFigure4) {
    if (figure7_baseline_misfit(p, m.budget_flops) < figure7_baseline_misfit(p, best)) {
      best = m.budget_flops;
    }
  }
  return best;
}

struct Figure7Spread {
  double data_low = INFINITY, data_high = 0.0;
  double params_low = INFINITY, params_high = 0.0;
};

// The fit at figure7_budget(); `spread` collects the three budgets' fits.
std::optional<Figure7Fit> figure7_fit(const LossFitParams& p, bool mode, std::string* text,
                                      Figure7Spread* spread) {
  const double budget = figure7_budget(p);
  std::optional<Figure7Fit> chosen;
  for (const IsoflopMinimum& m : kModFigure4) {
    const std::optional<Figure7Fit> fit = figure7_fit_at(p, m.budget_flops, mode);
    if (!fit) {
      return std::nullopt;
    }
    if (m.budget_flops == budget) {
      chosen = fit;
    }
    if (spread != nullptr) {
      spread->data_low = std::min(spread->data_low, fit->eps_data);
      spread->data_high = std::max(spread->data_high, fit->eps_data);
      spread->params_low = std::min(spread->params_low, fit->eps_params);
      spread->params_high = std::max(spread->params_high, fit->eps_params);
    }
    if (text != nullptr) {
      *text += "  C = " + format_number(m.budget_flops) + ": baseline misfit (sum of squares) " +
               format_number(figure7_baseline_misfit(p, m.budget_flops)) +
               ", least squares over the points: eps_p = " + format_fixed(fit->eps_params, 4) +
               ", eps_d = " + format_fixed(fit->eps_data, 4) + "\n";
    }
  }
  return chosen;
}

EfficiencyPrior figure7_prior(const LossFit& fit, const std::string& key, bool mode) {
  const LossFitParams& p = fit.params;
  EfficiencyPrior prior;
  prior.key = key;
  prior.acts_on = PriorTerm::data;
  prior.source = std::string(
                     "Raposo et al. 2024 (Mixture-of-Depths) section 4.3, figure 7: normalised "
                     "loss against normalised FLOPs per forward pass, read from the plot "
                     "(+-0.003): ") +
                 (mode ? "MoDE 0.995 / 0.969 / 0.957 at 0.35 / 0.6 / 1.0x"
                       : "MoE 1.037 / 1.008 / 0.983 / 0.981 / 0.978 at 0.25 / 0.35 / 0.6 / "
                         "0.8 / 1.0x") +
                 " (baseline 1.035 / 1.018 / 1.007 / 1.004 / 1.000)";
  std::string text = "fit " + fit.name + ": E = " + format_number(p.E) +
                     "; L = E + eps_p A / N^alpha + eps_d B / D^beta (eps = eps_d)\n";
  text += "q(x) = " + std::string(mode ? "MoDE" : "MoE") +
          "(x) / baseline(x) read from figure 7; model: q(x) = 1 - (1 - eps_p) u(x) - (1 - eps_d) "
          "w(x), u = A (x N*)^-alpha / L(x), w = B (D*/x)^-beta / L(x) at the baseline's "
          "closed-form N*, D*\n";
  text +=
      "least squares for (1 - eps_p, 1 - eps_d) at the MoD paper's figure-4 budgets (the "
      "figure's budget: the one whose baseline curve fits figure 7's baseline readings best):\n";
  Figure7Spread spread;
  const std::optional<Figure7Fit> fitted = figure7_fit(p, mode, &text, &spread);
  if (!fitted) {
    prior.derivation = text + "no positive eps_p, eps_d under this fit";
    return prior;
  }
  prior.known = true;
  prior.eps = fitted->eps_data;
  prior.params_factor = fitted->eps_params;
  text += "eps_" + key + " = eps_d at C = " + format_number(figure7_budget(p)) + " = " +
          format_fixed(prior.eps, 4) + ", with eps_p = " + format_fixed(prior.params_factor, 4) +
          " on the parameter term";
  prior.derivation = text;
  prior.points = mode ? 3 : 5;
  prior.size_measure = "params_total";
  prior.measured_size_min = kModMeasuredParamsMin;
  prior.measured_size_max = kModMeasuredParamsMax;
  prior.measured_budget_min = kModFigure4[0].budget_flops;
  prior.measured_budget_max = kModFigure4[2].budget_flops;
  // Range of eps_d: the readings' 95 % band, the spread over the three
  // budgets, the fit's E +- 1.96 SE (eps_p held at its fit; its own range is
  // printed).
  const double reading_low = fitted->eps_data - kZ95 * fitted->sd_data;
  const double reading_high = fitted->eps_data + kZ95 * fitted->sd_data;
  prior.eps_low = std::max(1e-3, std::min(reading_low, spread.data_low));
  prior.eps_high = std::max(reading_high, spread.data_high);
  std::string interval =
      "readings +-" + format_fixed(kFigure7ReadingHalfWidth, 3) +
      " each (independent, uniform; through the least squares): 95% eps_d " +
      format_fixed(reading_low, 4) + " .. " + format_fixed(reading_high, 4) + ", eps_p " +
      format_fixed(fitted->eps_params - kZ95 * fitted->sd_params, 4) + " .. " +
      format_fixed(fitted->eps_params + kZ95 * fitted->sd_params, 4) + "\n";
  interval += "spread over the three budgets: eps_d " + format_fixed(spread.data_low, 4) + " .. " +
              format_fixed(spread.data_high, 4) + ", eps_p " + format_fixed(spread.params_low, 4) +
              " .. " + format_fixed(spread.params_high, 4) + "\n";
  widen_by_fit_e(
      fit,
      [&](double E) -> std::optional<double> {
        LossFitParams q = p;
        q.E = E;
        const std::optional<Figure7Fit> at_e = figure7_fit(q, mode, nullptr, nullptr);
        return at_e ? std::optional<double>(at_e->eps_data) : std::nullopt;
      },
      prior, interval);
  interval += "eps_" + key + " (eps_d) range (envelope) = " + format_fixed(prior.eps_low, 4) +
              " .. " + format_fixed(prior.eps_high, 4) + " (eps_p held at " +
              format_fixed(prior.params_factor, 4) + ")";
  prior.interval = interval;
  return prior;
}

// Staged MoDE (MoD routing around the whole block, experts inside it): the
// paper reports that "the performance improvements offered by MoD compound with
// those of MoE", so its prior is the two published ones together: the MoD
// prior on the whole reducible loss (figure 4) and the MoE prior (figure 7's
// MoE curve, one factor on each term):
//   L = E + eps_mod (eps_p A / N^alpha + eps_d B / D^beta).
// Integrated MoDE gets figure 7's MoDE curve (an assumption: the figure plots
// one MoDE curve and does not say which form; the text's one comparison is of
// the integrated form).
EfficiencyPrior staged_mode_prior(const LossFit& fit) {
  EfficiencyPrior prior = figure7_prior(fit, "mode-staged", false);
  const EfficiencyPrior mod = mod_prior(fit);
  if (!prior.known || !mod.known) {
    prior.known = false;
    return prior;
  }
  prior.reducible_factor = mod.eps;
  prior.source = "MoD paper section 4.3 ('the performance improvements offered by MoD compound "
                 "with those of MoE'): the MoD prior (figure 4) times the MoE prior (" +
                 prior.source + ")";
  prior.derivation = "staged MoDE = MoD routing with experts inside the routed blocks: "
                     "L = E + eps_mod (eps_p A / N^alpha + eps_d B / D^beta)\n" +
                     mod.derivation + "\n" + prior.derivation +
                     "\neps_mode-staged = eps_d above (MoE's), with eps_p = " +
                     format_fixed(prior.params_factor, 4) + " and eps_mod = " +
                     format_fixed(mod.eps, 4) + " on the whole reducible loss";
  prior.interval += "\n(eps_mod held at " + format_fixed(mod.eps, 4) + "; its own range: " +
                    format_fixed(mod.eps_low, 4) + " .. " + format_fixed(mod.eps_high, 4) + ")";
  prior.points += mod.points;
  return prior;
}

std::string moe_arch_name(const Config& config) {
  if (!config.moe.enabled()) {
    return "";
  }
  switch (config.moe.mode) {
    case MoeMode::staged:
      return "mode-staged";
    case MoeMode::integrated:
      return "mode-integrated";
    case MoeMode::none:
      break;
  }
  return "moe";
}

std::string arch_key(const Config& config) {
  const bool mod = config.mod.enabled();
  const bool dar = config.dar.enabled();
  std::string dar_name = dar ? to_string(config.dar.variant) : "";
  const std::string experts = moe_arch_name(config);
  if (!experts.empty()) {
    return dar ? experts + "+" + dar_name : experts;
  }
  if (mod && dar) {
    return "mod+" + dar_name;
  }
  if (mod) {
    return "mod";
  }
  if (dar) {
    return dar_name;
  }
  return "baseline";
}

}  // namespace

LossScale loss_scale(const EfficiencyPrior& prior, double eps) {
  const double params = prior.acts_on == PriorTerm::data ? 1.0 : eps;
  const double data = prior.acts_on == PriorTerm::parameters ? 1.0 : eps;
  return LossScale{prior.reducible_factor * prior.params_factor * params,
                   prior.reducible_factor * data,
                   1.0 + prior.loss_penalty};
}

void check_eps_key(const std::string& arch) {
  static const char* const kKeys[] = {"baseline",        "mod",
                                      "dar",             "mod+dar",
                                      "attnres",         "mod+attnres",
                                      "moe",             "moe+dar",
                                      "mode-staged",     "mode-staged+dar",
                                      "mode-integrated", "mode-integrated+dar"};
  for (const char* allowed : kKeys) {
    if (arch == allowed) {
      return;
    }
  }
  throw ConfigError("eps[" + shown_value(arch) +
                    "]: unknown architecture; allowed: baseline, mod, dar, mod+dar, attnres, "
                    "mod+attnres, moe, mode-staged, mode-integrated (each also +dar)");
}

void check_eps_override(const std::string& arch, double eps) {
  if (!std::isfinite(eps) || eps < kEpsMin || eps > kEpsMax) {
    throw ConfigError("eps[" + shown_value(arch) + "] = " + format_number(eps) +
                      ": an efficiency prior must be in [" + format_number(kEpsMin) + ", " +
                      format_number(kEpsMax) +
                      "] (1 = the dense baseline; the published priors lie in 0.55 .. 0.98; "
                      "docs/planner.md \"Architecture priors\")");
  }
}

EpsOverrides parse_eps_overrides(const std::string& text) {
  EpsOverrides overrides;
  if (trim(text).empty()) {
    return overrides;
  }
  for (const std::string& piece : split_trimmed(text, ',')) {
    const auto equals = piece.find('=');
    if (equals == std::string::npos) {
      throw ConfigError("eps = \"" + shown_value(text) + "\": '" + shown_value(piece) +
                        "' is not ARCH=VALUE; allowed: e.g. mod=0.94,dar=0.97");
    }
    const std::string key = trim(piece.substr(0, equals));
    const std::string value_text = trim(piece.substr(equals + 1));
    check_eps_key(key);
    double value = 0.0;  // the one number grammar of every modar input (no hex, inf, nan)
    if (!parse_finite_number_text(value_text, &value)) {
      throw ConfigError("eps[" + key + "] = " + shown_value(value_text) +
                        ": must be a number in [" + format_number(kEpsMin) + ", " +
                        format_number(kEpsMax) + "]");
    }
    check_eps_override(key, value);
    overrides[key] = value;
  }
  return overrides;
}

std::vector<EfficiencyPrior> published_priors(const LossFit& fit) {
  return {mod_prior(fit), dar_prior(fit, false), dar_prior(fit, true)};
}

namespace {

// The prior of the architecture as published (or overridden), before the
// causal router's penalty.
EfficiencyPrior published_prior(const Config& config, const LossFit& fit,
                                 const EpsOverrides& overrides) {
  const std::string key = arch_key(config);
  if (const auto it = overrides.find(key); it != overrides.end()) {
    EfficiencyPrior prior;
    prior.key = key;
    prior.known = true;
    prior.eps = it->second;
    prior.source = "eps override";
    prior.derivation = "given by the user: eps_" + key + " = " + format_number(it->second);
    prior.eps_low = prior.eps_high = prior.eps;
    const bool experts = key.rfind("moe", 0) == 0 || key.rfind("mode-", 0) == 0;
    prior.acts_on = experts                     ? PriorTerm::data
                    : key.rfind("mod", 0) == 0 ? PriorTerm::reducible
                                               : PriorTerm::parameters;
    prior.interval = "exact (given by the user)";
    return prior;
  }
  if (key == "baseline") {
    EfficiencyPrior prior;
    prior.key = key;
    prior.known = true;
    prior.eps = 1.0;
    prior.source = "definition (plain pre-norm transformer)";
    prior.derivation = "eps = 1 by definition";
    prior.interval = "exact (definition)";
    return prior;
  }
  if (key == "moe" || key == "mode-integrated") {
    return figure7_prior(fit, key, key == "mode-integrated");
  }
  if (key == "mode-staged") {
    return staged_mode_prior(fit);
  }
  if (key == "mod") {
    const bool paper_setting =
        std::abs(config.mod.capacity - 0.125) < 1e-9 && config.mod.every == 2;
    if (paper_setting) {
      return mod_prior(fit);
    }
    EfficiencyPrior prior;
    prior.key = key;
    prior.source = "none published";
    prior.derivation = "MoD capacity " + format_number(config.mod.capacity) + ", every " +
                       std::to_string(config.mod.every) +
                       ": no published prior (the paper gives numbers only for 12.5% every 2; "
                       "it reports 50% capacity slightly worse, routing every block worse, "
                       "random routing much worse); loss unknown unless eps[mod] is given (--eps mod=V)";
    return prior;
  }
  if (key == "dar" && config.dar.resolved_streams() == 2) {
    return dar_prior(fit, config.dar.block_layers == 1);
  }
  EfficiencyPrior prior;
  prior.key = key;
  prior.source = "none published";
  prior.derivation = key + " (streams " + std::to_string(config.dar.resolved_streams()) +
                     "): no published prior; loss unknown unless eps[" + key + "] is given (--eps " + key +
                     "=V)";
  return prior;
}

}  // namespace

EfficiencyPrior efficiency_prior(const Config& config, const LossFit& fit,
                                 const EpsOverrides& overrides) {
  EfficiencyPrior prior = published_prior(config, fit, overrides);
  if (!prior.known || !config.mod.enabled()) {
    return prior;
  }
  // MoD paper 3.5: the priors are top-k (non-causal) training losses; a model
  // that must sample causally either trains its router with an auxiliary BCE
  // loss, which "empirically affects the primary language modeling objective
  // by approximately 0.2-0.3%", or adds a predictor MLP, which "does not
  // affect the language modeling objective".
  switch (config.mod.causal_router) {
    case CausalRouter::aux_loss:
      prior.loss_penalty = kAuxLossPenalty;
      prior.derivation += "\nmod.causal_router = aux_loss: loss x " +
                          format_fixed(1.0 + kAuxLossPenalty, 4) +
                          " (MoD paper 3.5: the auxiliary BCE router costs ~0.2-0.3% of the "
                          "LM objective; the middle of the range)";
      break;
    case CausalRouter::predictor:
      prior.derivation += "\nmod.causal_router = predictor: no loss penalty (MoD paper 3.5: the "
                          "predictor MLP does not affect the LM objective)";
      break;
    case CausalRouter::none:
      break;
  }
  return prior;
}

std::vector<std::string> arch_names() {
  return {"baseline",    "mod",         "dar",     "mod+dar", "moe", "moe+dar", "mode-staged",
          "mode-staged+dar", "mode-integrated", "mode-integrated+dar"};
}

bool arch_has_mod(const std::string& name) {
  return name == "mod" || name == "mod+dar" || name == "mode-staged" ||
         name == "mode-staged+dar";
}

bool arch_has_dar(const std::string& name) {
  return name == "dar" || name == "mod+dar" ||
         (name.size() > 4 && name.compare(name.size() - 4, 4, "+dar") == 0);
}

ArchSpec make_arch(const std::string& name, double capacity, int64_t every,
                   int64_t dar_block_layers, int64_t dar_streams) {
  ArchSpec arch;
  arch.name = name;
  const std::vector<std::string> names = arch_names();
  if (std::find(names.begin(), names.end(), name) == names.end()) {
    throw ConfigError("arch = \"" + shown_value(name) +
                      "\": unknown architecture; allowed: baseline, mod, dar, "
                      "mod+dar, moe, mode-staged, mode-integrated (each also +dar)");
  }
  const bool mod = arch_has_mod(name);
  const bool dar = arch_has_dar(name);
  // Experts (docs/moe.md): the MoD paper's figure 7 setting as modar assumes
  // it: 8 experts of the dense width, top-1 (equal FLOPs per FFN as the
  // dense model), every layer, dropless; integrated MoDE adds 8 null experts
  // with capacity factor 1 (about half the tokens skip the FFN).
  if (name.rfind("moe", 0) == 0 || name.rfind("mode-", 0) == 0) {
    arch.moe.experts = 8;
    arch.moe.top_k = 1;
    if (name.rfind("mode-staged", 0) == 0) {
      arch.moe.mode = MoeMode::staged;
    } else if (name.rfind("mode-integrated", 0) == 0) {
      arch.moe.mode = MoeMode::integrated;
      arch.moe.null_experts = 8;
      arch.moe.capacity_factor = 1.0;
    }
  }
  if (mod) {
    if (!std::isfinite(capacity) || capacity <= 0 || capacity > 1) {
      throw ConfigError("capacity = " + format_number(capacity) + ": must be in (0, 1]");
    }
    if (every < 1) {
      throw ConfigError("every = " + std::to_string(every) + ": must be >= 1");
    }
    arch.mod.capacity = capacity;
    arch.mod.every = every;
    arch.mod.offset = every > 1 ? 1 : 0;
  }
  if (dar) {
    if (dar_block_layers < 1) {
      throw ConfigError("block_layers = " + std::to_string(dar_block_layers) + ": must be >= 1");
    }
    if (dar_streams < 2) {
      throw ConfigError("streams = " + std::to_string(dar_streams) + ": must be >= 2 for DAR");
    }
    arch.dar.variant = DarVariant::dar;
    arch.dar.block_layers = dar_block_layers;
    arch.dar.streams = dar_streams;
  }
  return arch;
}

MoeConfig planned_experts(const ArchSpec& arch, const MoeConfig& user) {
  if (!arch.moe.enabled() || !user.enabled()) {
    return arch.moe;
  }
  MoeConfig out = user;
  out.mode = arch.moe.mode;
  if (arch.moe.mode == MoeMode::integrated) {
    // Integrated MoDE needs null experts: the architecture's unless given.
    out.null_experts = user.null_experts > 0 ? user.null_experts : arch.moe.null_experts;
    if (user.capacity_factor == 0.0) {
      out.capacity_factor = arch.moe.capacity_factor;
    }
  } else {
    out.null_experts = 0;
  }
  return out;
}

std::string experts_summary(const Config& config) {
  const MoeConfig& e = config.moe;
  if (!e.enabled()) {
    return "-";
  }
  std::string out = std::to_string(e.experts);
  out += " x ";
  out += std::to_string(e.resolved_expert_ffn(config.model));
  out += ", top-";
  out += std::to_string(e.top_k);
  if (e.shared_experts > 0) {
    out += ", ";
    out += std::to_string(e.shared_experts);
    out += " shared";
  }
  if (e.null_experts > 0 && e.mode == MoeMode::integrated) {
    out += ", ";
    out += std::to_string(e.null_experts);
    out += " null";
  }
  return out;
}

void check_experts_used(const MoeConfig& user, const std::vector<std::string>& archs) {
  if (!user.enabled()) {
    return;
  }
  std::string names;
  for (const std::string& name : archs) {
    if (make_arch(name).moe.enabled()) {
      return;
    }
    names += (names.empty() ? "" : ", ") + name;
  }
  throw ConfigError("moe.experts = " + std::to_string(user.experts) +
                    ": set, but no planned architecture has experts (archs: " + names +
                    "); allowed: add moe, mode-staged or mode-integrated to the architectures, "
                    "or leave moe.* unset");
}

}  // namespace modar
