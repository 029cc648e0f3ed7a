// `modar optimal`: for a FLOP budget (or a wall-clock budget on a profiled
// device) the isoFLOP-optimal configuration per architecture and, for
// architectures with an efficiency prior, the fastest-stepping configuration
// whose predicted loss matches the optimal baseline (docs/planner.md).
//
// This file is the orchestration: check the request, solve the baseline (the
// reference of every ratio and of the parity rule), then each architecture,
// then the same-shape comparison and the notes.  The search is
// optimal_search.cpp, the trust flags optimal_trust.cpp, the renderers
// optimal_json.cpp and optimal_table.cpp.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "isoflop_vertex.hpp"
#include "modar/base/errors.hpp"
#include "modar/base/text.hpp"
#include "modar/planner.hpp"
#include "optimal_internal.hpp"
#include "optimal_search.hpp"
#include "planner_internal.hpp"

namespace modar {

namespace {

using detail::ArchSpace;
using detail::Argmin;
using detail::Evaluator;
using detail::Point;

// The minimum of `space`'s isoFLOP curve at `eps` (FLOP budgets only: under a
// wall-clock budget every point's loss is a costed step).  The first window
// of the argmin (N_f within 1/3 .. 2x the closed form) holds the depths.
void set_curve_minimum(Recommendation& rec, ArchSpace& space, double eps,
                       const OptimalSettings& settings) {
  if (!settings.flops || settings.gpu_hours || !rec.prior.known) {
    return;
  }
  std::vector<detail::IsoflopPoint> points;
  points.reserve(space.points().size());
  for (Point& point : space.points()) {
    points.push_back({point.candidate.shape.n_layers, point.candidate.forward_flops_per_token,
                      space.loss(point, eps)});
  }
  if (const auto vertex = detail::isoflop_curve_vertex(points)) {
    rec.curve_forward_flops = vertex->forward_flops_per_token;
  }
}

void set_curve_ratio(Recommendation& rec, const Recommendation& baseline) {
  if (rec.curve_forward_flops && baseline.curve_forward_flops) {
    rec.ratio_curve_forward_flops = *rec.curve_forward_flops / *baseline.curve_forward_flops;
  }
}

// A budget whose compute-optimal dense model lies outside the shape search's
// sizes is an error naming the budget range that would work.
void check_budget_in_search_range(const OptimalSettings& settings, double centre_flops) {
  const PlannerRun& run = settings.run;
  const detail::SearchRange range =
      detail::search_range(run.base, run.shapes, run.fit.params, LossScale{}, centre_flops);
  if (!range.too_small() && !range.too_large()) {
    return;
  }
  // The budget that decided, as the user gave it, and the allowed end in its unit.
  const bool flops_decide =
      settings.flops && (!settings.gpu_hours || centre_flops == *settings.flops);
  const std::string what = flops_decide    ? "flops = " + format_number(*settings.flops)
                           : settings.days ? "days = " + format_number(*settings.days)
                                           : "gpu_hours = " + format_number(*settings.gpu_hours);
  const auto budget_text = [&](double flops) {
    if (flops_decide) {
      return format_sci(flops, 1) + " FLOPs";
    }
    const double gpu_hours =
        flops / (3600.0 * run.profile.ceilings.peak_flops_bf16 * detail::kGridCentreMfu);
    return settings.days ? format_sci(gpu_hours / 24.0 / double(run.gpus), 1) + " days on " +
                               std::to_string(run.gpus) + " GPUs"
                         : format_sci(gpu_hours, 1) + " GPU-hours";
  };
  if (range.too_small()) {
    throw ConfigError(
        what + ": too small for any shape: the compute-optimal N_f is " + format_sci(range.n_opt, 2) +
        " but the smallest shape (" + std::to_string(run.shapes.min_layers) + " layers, d_model " +
        std::to_string(run.shapes.d_model_multiple) + "+) has N_f " + format_sci(range.smallest, 2) +
        "; allowed: a budget of at least ~" + budget_text(range.min_flops));
  }
  throw ConfigError(what + ": too large for the shape search: the compute-optimal N_f " +
                    format_sci(range.n_opt, 2) + " exceeds the largest shape's (" +
                    std::to_string(run.shapes.max_layers) + " layers) " + format_sci(range.largest, 2) +
                    "; allowed: a budget of at most ~" + budget_text(range.max_flops));
}

// What one optimal() call shares between its architectures.
struct Solve {
  const OptimalSettings& settings;
  OptimalResult& result;
  Evaluator& evaluator;
  RunReporter& reporter;
  double centre_flops = 0.0;
  std::string memory_text;        // "device memory (141.0 GiB, micro-batch 8, recompute none)"
  Recommendation baseline;        // the optimal baseline (after solve_baseline)
  ShapeCandidate baseline_shape;  // its point of the search

  const PlannerRun& run() const { return settings.run; }

  EfficiencyPrior prior_of(const Config& arch_base) const {
    return efficiency_prior(arch_base, result.fit, run().eps);
  }

  std::string argmin_selection(const EfficiencyPrior& prior, bool fits) const {
    const std::string budget_text =
        settings.flops && settings.gpu_hours
            ? "the tighter of C = 3 F_fwd D and the wall-clock budget"
            : (settings.flops ? "C = 3 F_fwd D (D = C / F_train per token)"
                              : "the wall-clock budget (D = hours x tokens/s)");
    return std::string("argmin of predicted loss (eps ") + format_fixed(prior.eps, 4) + ", fit " +
           result.fit.name + ") under " + budget_text + " over every shape of the search space (" +
           detail::space_text(run().shapes) + ")" + (fits ? " that fits in " + memory_text : "") +
           "; losses within " + format_number(100 * kLossTieRelative) +
           "% of the minimum tie and the deepest wins" +
           (fits ? "" : "; NO shape fits the device memory (not recommended)");
  }

  // Flag a recommendation that memory, not the loss, chose.
  void flag_memory(Recommendation& rec, const Argmin& argmin, ArchSpace& space, double eps) const {
    if (argmin.memory_decided && argmin.unconstrained >= 0) {
      Point& best = space.points()[static_cast<size_t>(argmin.unconstrained)];
      detail::add_flag(rec, "memory_decided",
                       "device memory, not the loss, picked this shape: the loss argmin " +
                           std::to_string(best.candidate.shape.n_layers) + " x " +
                           std::to_string(best.candidate.shape.d_model) + " (loss " +
                           format_fixed(space.loss(best, eps), 4) + ") does not fit");
    }
  }

  // Every shape of the space was scored and none fits: what would.
  void note_no_fit(const Recommendation& rec) {
    if (!rec.memory.fits) {
      result.notes.push_back(rec.arch + ": no shape fits the device memory; the shown shape: " +
                             memory_advice(rec.config, run().profile));
    }
  }
};

// The isoFLOP-optimal baseline: the reference of every ratio and of parity.
void solve_baseline(Solve& solve) {
  solve.reporter.set_stage("baseline: isoFLOP argmin");
  const Config& base = solve.run().base;
  const Config arch_base = detail::arch_config(base, make_arch("baseline"));
  const EfficiencyPrior prior = solve.prior_of(arch_base);
  ArchSpace space(arch_base, solve.run().shapes, solve.evaluator, prior);
  const Argmin argmin = detail::isoflop_argmin(space, prior.eps, solve.centre_flops);
  if (argmin.index < 0) {
    throw ConfigError("no shape in the search space (" + detail::space_text(solve.run().shapes) +
                      ")");
  }
  Point& point = space.points()[static_cast<size_t>(argmin.index)];
  const double tokens = solve.evaluator.tokens_for(space.arch_base(), point);
  const double step_tokens = double(solve.run().global_batch) * double(base.model.seq_len);
  if (tokens < step_tokens) {
    throw ConfigError("budget too small: the optimal baseline gets " + format_sci(tokens, 2) +
                      " tokens, less than one optimizer step (" + format_sci(step_tokens, 2) + " tokens)");
  }
  Recommendation rec =
      detail::make_recommendation("baseline", "isoflop_optimal",
                                  solve.argmin_selection(prior, argmin.fits), space, point, prior);
  detail::set_ratios(rec, rec);
  set_curve_minimum(rec, space, prior.eps, solve.settings);
  set_curve_ratio(rec, rec);
  detail::set_ranges(rec, space, argmin.index, argmin.index, rec.time.step_s,
                     rec.flops.forward_per_token);
  solve.result.conventions = solve.evaluator.cost_of(space.arch_base(), point).conventions;
  solve.flag_memory(rec, argmin, space, prior.eps);
  detail::flag_trust(rec);
  solve.baseline = rec;
  solve.baseline_shape = point.candidate;
  solve.reporter.advance();
}

// An architecture without a prior: the optimal baseline's forward FLOPs.
void solve_unknown_prior(Solve& solve, const ArchSpec& arch, ArchSpace& space,
                         const EfficiencyPrior& prior) {
  const Recommendation& baseline = solve.baseline;
  // The baseline shape's own counts (as modar sweep matches them).
  const int index = detail::flops_match(space, solve.baseline_shape.forward_flops_per_token,
                                        solve.baseline_shape.params.flop_active);
  if (index < 0) {
    throw ConfigError("no shape in the search space (" + detail::space_text(solve.run().shapes) +
                      ") for " + arch.name);
  }
  Recommendation rec = detail::make_recommendation(
      arch.name, "isoflop_optimal",
      "loss unknown (no prior): among shapes that fit in " + solve.memory_text +
          ", the one with the optimal baseline's forward FLOPs per token (MoD paper "
          "section 4.1 rule; within " +
          format_number(100 * detail::kFlopsTieRelative) + "% the deepest wins)",
      space, space.points()[static_cast<size_t>(index)], prior);
  detail::set_ratios(rec, baseline);
  detail::set_ranges(rec, space, index, index, baseline.time.step_s,
                     baseline.flops.forward_per_token);
  detail::flag_trust(rec);
  solve.result.recommendations.push_back(rec);
  solve.result.notes.push_back(arch.name +
                               ": no published prior, loss not predicted; shape chosen with the "
                               "optimal baseline's forward FLOPs per token; an eps override "
                               "(eps[" +
                               arch.name + "], --eps " + arch.name + "=V) predicts it");
  solve.note_no_fit(rec);
  solve.reporter.advance();
}

// The fastest shape whose predicted loss matches the optimal baseline's.
void solve_parity(Solve& solve, const ArchSpec& arch, ArchSpace& space,
                  const EfficiencyPrior& prior) {
  const Recommendation& baseline = solve.baseline;
  const double baseline_loss = *baseline.loss;
  // Restricted to where the prior is supported; outside it only when nothing
  // inside reaches parity (flagged).
  bool restricted = true;
  int parity = detail::fastest_at_parity(space, prior.eps, baseline_loss, prior, true);
  if (parity < 0) {
    restricted = false;
    parity = detail::fastest_at_parity(space, prior.eps, baseline_loss, prior, false);
  }
  if (parity < 0) {
    solve.result.notes.push_back(
        arch.name + ": no shape that fits reaches the optimal baseline's predicted loss");
    solve.reporter.advance(3);
    return;
  }
  solve.reporter.advance();
  const int parity_low =
      detail::fastest_at_parity(space, prior.eps_low, baseline_loss, prior, restricted);
  solve.reporter.advance();
  const int parity_high =
      detail::fastest_at_parity(space, prior.eps_high, baseline_loss, prior, restricted);
  solve.reporter.advance();
  const std::string selection =
      "fastest step (cost model on profile " + solve.run().profile.name +
      ") among shapes that fit in " + solve.memory_text + " whose predicted loss (eps " +
      format_fixed(prior.eps, 4) + ") <= the optimal baseline's " + format_fixed(baseline_loss, 4) +
      (restricted
           ? ", restricted to the prior's support (" +
                 (prior.measured_size_min > 0
                      ? std::string(prior.size_measure == "non_embedding" ? "non-vocab " : "") +
                            "parameters >= " + format_sci(prior.measured_size_min, 1) +
                            ", the smallest model it was measured at; "
                      : std::string()) +
                 "tokens per parameter in " + format_number(kFitTokensPerParamMin) + ".." +
                 format_number(kFitTokensPerParamMax) + ", the fit's band)"
           : "; NO shape inside the prior's support reaches parity: searched outside it");
  Recommendation rec =
      detail::make_recommendation(arch.name, "parity_fastest", selection, space,
                                  space.points()[static_cast<size_t>(parity)], prior);
  detail::set_ratios(rec, baseline);
  detail::set_ranges(rec, space, parity_low, parity_high, baseline.time.step_s,
                     baseline.flops.forward_per_token);
  detail::flag_trust(rec);
  if (!restricted) {
    detail::add_flag(rec, "parity_outside_support",
                     "no shape inside the prior's support reaches the baseline's loss");
  }
  if (prior.measured_size_min > 0 &&
      detail::prior_size(prior, rec.params) < prior.measured_size_min * (1 - 1e-9)) {
    detail::add_flag(rec, "parity_smaller_than_measured",
                     "smaller (" + format_sci(detail::prior_size(prior, rec.params), 2) +
                         ") than any model the prior was measured at (" +
                         format_sci(prior.measured_size_min, 1) + ")");
  }
  if (parity_high < 0) {
    solve.result.notes.push_back(arch.name + " parity-fastest: at eps " + format_fixed(prior.eps_high, 4) +
                                 " (the prior's pessimistic end) no shape reaches the baseline's "
                                 "loss; its range's high end is null");
  }
  solve.result.recommendations.push_back(rec);
}

// One architecture: its isoFLOP-optimal shape and, with a prior, its
// parity-fastest shape.
void solve_architecture(Solve& solve, const ArchSpec& arch) {
  const Config arch_base = detail::arch_config(solve.run().base, arch);
  const EfficiencyPrior prior = solve.prior_of(arch_base);
  solve.result.priors.push_back(prior);
  if (arch.name == "baseline") {
    solve.result.recommendations.push_back(solve.baseline);
    solve.note_no_fit(solve.baseline);
    return;
  }
  ArchSpace space(arch_base, solve.run().shapes, solve.evaluator, prior);
  if (!prior.known) {
    solve.reporter.set_stage(arch.name + ": the baseline's FLOPs per token");
    solve_unknown_prior(solve, arch, space, prior);
    return;
  }
  solve.reporter.set_stage(arch.name + ": isoFLOP argmin");
  const Argmin argmin = detail::isoflop_argmin(space, prior.eps, solve.centre_flops);
  solve.reporter.advance();
  const Argmin argmin_low = detail::isoflop_argmin(space, prior.eps_low, solve.centre_flops);
  solve.reporter.advance();
  const Argmin argmin_high = detail::isoflop_argmin(space, prior.eps_high, solve.centre_flops);
  solve.reporter.advance();
  Recommendation rec = detail::make_recommendation(
      arch.name, "isoflop_optimal", solve.argmin_selection(prior, argmin.fits), space,
      space.points()[static_cast<size_t>(argmin.index)], prior);
  detail::set_ratios(rec, solve.baseline);
  set_curve_minimum(rec, space, prior.eps, solve.settings);
  set_curve_ratio(rec, solve.baseline);
  detail::set_ranges(rec, space, argmin_low.index, argmin_high.index, solve.baseline.time.step_s,
                     solve.baseline.flops.forward_per_token);
  solve.flag_memory(rec, argmin, space, prior.eps);
  detail::flag_trust(rec);
  solve.result.recommendations.push_back(rec);
  solve.note_no_fit(rec);
  solve.reporter.set_stage(arch.name + ": fastest at parity");
  solve_parity(solve, arch, space, prior);
}

// Each architecture at exactly the optimal baseline's shape (the MoD paper's
// figure-3 comparison: same size, same FLOP budget).
SameShapeComparison same_shape_as_baseline(Solve& solve, const ArchSpec& arch) {
  const Recommendation& baseline = solve.baseline;
  const Config arch_base = detail::arch_config(solve.run().base, arch);
  const EfficiencyPrior prior = solve.prior_of(arch_base);
  ArchSpace one(arch_base, solve.run().shapes, solve.evaluator, prior);
  Point point;
  const ParamAndFlopCounts counts = count_params_and_flops(with_shape(arch_base, baseline.shape));
  point.candidate.shape = baseline.shape;
  point.candidate.params = counts.params;
  point.candidate.forward_flops_per_token = counts.flops.forward_per_token;
  point.candidate.train_flops_per_token = counts.flops.train_per_token;
  SameShapeComparison same;
  same.arch = arch.name;
  same.shape = baseline.shape;
  same.tokens = solve.evaluator.tokens_for(arch_base, point);
  same.baseline_loss = *baseline.loss;
  if (prior.known) {
    same.loss = ValueRange{one.loss(point, prior.eps), one.loss(point, prior.eps_low),
                           one.loss(point, prior.eps_high)};
  }
  const Estimate& est = solve.evaluator.cost_of(arch_base, point);
  same.ratio_step_time = baseline.time.step_s > 0 ? est.time.step_s / baseline.time.step_s : 0.0;
  same.ratio_forward_flops = est.flops.forward_per_token / baseline.flops.forward_per_token;
  same.fits = est.memory.fits;
  solve.reporter.advance();
  return same;
}

// The notes every result ends with (what the budget rule was, what the
// search did).
void add_closing_notes(Solve& solve, const std::vector<ArchSpec>& archs) {
  const OptimalSettings& settings = solve.settings;
  OptimalResult& result = solve.result;
  const bool dar_requested =
      std::any_of(archs.begin(), archs.end(), [](const ArchSpec& a) { return a.dar.enabled(); });
  if (dar_requested && !settings.gpu_hours) {
    result.notes.push_back(
        "DAR costs time and memory, not FLOPs: under a FLOP budget it looks "
        "free; compare under a wall-clock budget (gpu_hours or days) for its price");
  }
  if (settings.run.experts.enabled()) {
    // Say the experts came from the user, and what the loss model makes of them.
    for (const ArchSpec& arch : archs) {
      if (arch.moe.enabled()) {
        result.notes.push_back(
            arch.name + ": experts as set (moe.*): " +
            experts_summary(detail::arch_config(settings.run.base, arch)) +
            " (the default is 8 experts of the dense width, top-1); they change the FLOPs, "
            "parameters, memory and time of every shape, while the loss prior stays the MoD "
            "paper's figure-7 reading (8 experts, top-1)");
      }
    }
  }
  if (settings.gpu_hours) {
    result.notes.push_back(
        "wall-clock budget: tokens = gpu_hours / gpus * 3600 * tokens/s of "
        "each configuration on profile " +
        settings.run.profile.name + (settings.flops ? " (capped by the FLOP budget)" : ""));
  }
  if (!solve.evaluator.bound_holds()) {
    result.notes.push_back(
        "the profile predicts a step faster than its peak FLOP rate for some shape: the search "
        "evaluated the whole space instead of pruning");
  }
  result.candidates_evaluated = solve.evaluator.candidates();
  result.cost_evaluations = solve.evaluator.cost_evaluations();
  result.layouts_evaluated = solve.evaluator.layouts_evaluated();
  result.layouts_timed = solve.evaluator.layouts_timed();
  detail::append_fit_notes(result, solve.evaluator.law(), solve.centre_flops);
}

// Units of progress: the baseline's argmin; per architecture with a prior
// its three argmins (eps and both ends) and three parity searches, one for
// an architecture without; one same-shape comparison per non-baseline one.
int64_t progress_units(const std::vector<ArchSpec>& archs, const OptimalSettings& settings,
                       const LossFit& fit) {
  int64_t units = 1;
  for (const ArchSpec& arch : archs) {
    if (arch.name == "baseline") {
      continue;
    }
    const EfficiencyPrior prior =
        efficiency_prior(detail::arch_config(settings.run.base, arch), fit, settings.run.eps);
    units += (prior.known ? 6 : 1) + 1;
  }
  return units;
}

}  // namespace

OptimalResult optimal(const OptimalRequest& request, const RunControl& control) {
  OptimalResult result;
  result.settings = resolve_optimal(request);
  const OptimalSettings& settings = result.settings;
  if (!settings.flops && !settings.gpu_hours) {
    throw ConfigError(
        "no budget: give flops (training FLOPs), gpu_hours (device-hours on the profile) or days "
        "(wall-clock on gpus devices)");
  }
  const PlannerRun& run = settings.run;
  result.fit = run.fit;
  result.profile_name = run.profile.name;
  RunReporter reporter(control, "optimal", "steps",
                       progress_units(settings.archs, settings, run.fit));
  Evaluator evaluator(run, detail::Budget{settings.flops, settings.gpu_hours});
  evaluator.set_reporter(&reporter);
  Solve solve{settings, result, evaluator, reporter, 0.0, "", Recommendation{}, ShapeCandidate{}};
  // Centre of the first window: the dense closed form at the FLOP budget (or
  // at the FLOPs the device-hours buy at a typical MFU).
  solve.centre_flops = INFINITY;
  if (settings.flops) {
    solve.centre_flops = *settings.flops;
  }
  if (settings.gpu_hours) {
    solve.centre_flops = std::min(solve.centre_flops, *settings.gpu_hours * 3600.0 *
                                                          run.profile.ceilings.peak_flops_bf16 *
                                                          detail::kGridCentreMfu);
  }
  check_budget_in_search_range(settings, solve.centre_flops);
  solve.memory_text = detail::memory_text(run);

  solve_baseline(solve);
  for (const ArchSpec& arch : settings.archs) {
    solve_architecture(solve, arch);
  }
  solve.reporter.set_stage("same-shape comparison");
  for (const ArchSpec& arch : settings.archs) {
    if (arch.name != "baseline") {
      result.same_shape.push_back(same_shape_as_baseline(solve, arch));
    }
  }
  add_closing_notes(solve, settings.archs);
  reporter.finish();
  return result;
}

}  // namespace modar
