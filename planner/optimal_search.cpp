// The search of `modar optimal` and `modar sweep`: the lazily evaluated
// shape space, the cost of a shape on the hardware, and the selection rules
// (planner/optimal_search.hpp says why the pruned search is exact).
#include "optimal_search.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "modar/kernel_model.hpp"
#include "planner_internal.hpp"

namespace modar::detail {

namespace {

// The highest rate at which the profile's time model runs any op of a
// training step, in FLOP/s (model FLOPs / time never above it, so a step of
// F model FLOPs per device takes at least F / ceiling).  A datasheet profile
// times GEMMs with the kernel model's tiles (no tile faster than
// kernel.gemm_efficiency x peak), attention with the flash model at its
// head-dimension asymptote (the shape space's heads are at most 128 wide;
// masks and short sequences only slow it) and everything else by the
// roofline at those rates.  A measured profile's grids are not bounded by
// construction: the largest datasheet ceiling, and the planner checks every
// step it costs against the bound (Evaluator::bound_holds).
double model_flop_rate_ceiling(const DeviceProfile& profile) {
  const DeviceCeilings& c = profile.ceilings;
  if (!profile.measurements.empty()) {
    return std::max({c.peak_flops_bf16, c.peak_flops_fp32, c.achievable_flops_bf16,
                     c.achievable_flops_fp32});
  }
  const KernelRates rates = kernel_rates(profile);
  AttentionShape widest;
  widest.d_head = 128;
  widest.s_q = widest.s_k = int64_t{1} << 40;  // the sequence factor's limit, 1
  widest.causal = false;
  const double attention_factor =
      std::max({1.0, flash_attention_shape_factor(widest, Pass::forward),
                flash_attention_shape_factor(widest, Pass::backward)});
  return std::max({rates.gemm_flops, rates.fp32_flops, rates.attention_flops * attention_factor});
}

}  // namespace

Evaluator::Evaluator(const PlannerRun& run, const Budget& budget)
    : run_(run), budget_(budget), timing_(run.profile),
      peak_rate_(model_flop_rate_ceiling(run.profile)) {}

const Estimate& Evaluator::cost_of(const Config& arch_base, Point& point) {
  if (!point.estimate) {
    // Points come from the shape search, which validated their configs.
    check();
    point.estimate.emplace();
    const Config config = with_shape(arch_base, point.candidate.shape);
    if (run_.gpus > 1) {
      // Cluster (planner/layout_search.cpp): the fastest layout that fits.
      // The layouts the step floor lowered, if it was asked for.
      LayoutSearchResult layout = point.layouts ? point.layouts->search()
                                                : search_layout(config, timing_, layout_options());
      point.layouts.reset();
      point.layout = std::move(layout.config);
      *point.estimate = std::move(layout.estimate);
      layouts_evaluated_ += layout.evaluated;
      layouts_timed_ += layout.timed;
    } else {
      estimate_into(config, timing_, StepKind::train, scratch_, *point.estimate);
    }
    ++cost_evaluations_;
    // The pruning bound assumes no step beats the peak FLOP rate; if the
    // profile says otherwise, stop pruning (evaluate everything).
    if (point.estimate->time.step_s > 0 &&
        point.estimate->time.step_s <
            step_time_lower_bound(point.layout ? *point.layout : arch_base, point) *
                (1 - 1e-9)) {
      bound_holds_ = false;
    }
  }
  return *point.estimate;
}

bool Evaluator::fits(const Config& arch_base, Point& point,
                     const std::shared_ptr<LayoutCache>& computes) {
  if (point.estimate) {
    return point.estimate->memory.fits;
  }
  if (run_.gpus > 1) {
    // Some layout fits: the memory screen of the layout search (exactly
    // search_layout's answer, without timing every layout).
    if (!point.layout_fits) {
      check();
      const LayoutFeasibility screen =
          layout_fits(with_shape(arch_base, point.candidate.shape), timing_, layout_options(),
                      computes);
      point.layout_fits = screen.fits;
      layouts_evaluated_ += screen.screened;
      layouts_timed_ += screen.timed;
    }
    return *point.layout_fits;
  }
  if (!point.memory) {
    point.memory = estimate_memory(with_shape(arch_base, point.candidate.shape), run_.profile,
                                   StepKind::train);
  }
  return point.memory->fits;
}

double Evaluator::tokens_for(const Config& arch_base, Point& point) {
  if (!point.tokens) {
    double tokens = INFINITY;
    if (budget_.train_flops) {
      tokens = *budget_.train_flops / point.candidate.train_flops_per_token;
    }
    if (budget_.gpu_hours) {
      const double wall_s = *budget_.gpu_hours / double(run_.gpus) * 3600.0;
      tokens = std::min(tokens, wall_s * cost_of(arch_base, point).time.tokens_per_s);
    }
    point.tokens = tokens;
  }
  return *point.tokens;
}

std::optional<double> Evaluator::step_floor(const Config& arch_base, Point& point,
                                            const std::shared_ptr<LayoutCache>& computes) {
  if (run_.gpus <= 1 || !wall_clock()) {
    return std::nullopt;
  }
  if (!point.step_floor_s) {
    check();
    point.layouts = std::make_shared<ShapeLayouts>(with_shape(arch_base, point.candidate.shape),
                                                   timing_, layout_options(), computes);
    point.step_floor_s = point.layouts->step_floor_s();
    point.layout_tokens_per_step = point.layouts->tokens_per_step();
  }
  return point.step_floor_s;
}

double Evaluator::tokens_floor_bound(const Config& arch_base, Point& point,
                                     const std::shared_ptr<LayoutCache>& computes) {
  if (point.tokens) {
    return *point.tokens;
  }
  const std::optional<double> floor_s = step_floor(arch_base, point, computes);
  if (!floor_s) {
    return tokens_bound(point);
  }
  // tokens_for()'s expression at the floor (no slower a step: no fewer tokens).
  const double wall_s = *budget_.gpu_hours / double(run_.gpus) * 3600.0;
  return std::min(tokens_bound(point), wall_s * (point.layout_tokens_per_step / *floor_s));
}

double Evaluator::token_bound_flops() const {
  double bound = INFINITY;
  if (budget_.train_flops) {
    bound = *budget_.train_flops;
  }
  if (budget_.gpu_hours) {
    bound = std::min(bound, *budget_.gpu_hours * 3600.0 * peak_rate_);
  }
  return bound;
}

double Evaluator::step_time_lower_bound(const Config& arch_base, const Point& point) const {
  Config config = arch_base;
  if (run_.gpus > 1) {
    // The step the layout search sizes (its global batch), not the base's.
    config.train.global_batch = layout_global_batch(config, layout_options());
  }
  const double tokens_per_device =
      tokens_per_step(config) / double(std::max<int64_t>(1, config.device.count));
  return point.candidate.train_flops_per_token * tokens_per_device / peak_rate_;
}

LayoutSearchOptions Evaluator::layout_options() const {
  LayoutSearchOptions options;
  options.gpus = run_.gpus;
  options.gpus_per_node = run_.gpus_per_node;
  options.global_batch = run_.global_batch;
  if (run_.micro_batch_fixed) {
    options.dimensions.micro_batches = {run_.base.train.micro_batch};
  }
  if (run_.recompute_fixed) {
    options.dimensions.recomputes = {run_.base.train.recompute};
  }
  return options;
}

ArchSpace::ArchSpace(const Config& arch_base, const ShapeSearchOptions& options, Evaluator& evaluator,
                     const EfficiencyPrior& prior)
    : arch_base_(arch_base), options_(options), evaluator_(evaluator), prior_(prior) {
  smallest_ = smallest_shape_n_f(arch_base, options);
  largest_ = largest_shape_n_f(arch_base, options);
}

void ArchSpace::cover(double low, double high) {
  low = std::max(low, smallest_ * (1 - 1e-12));
  high = std::min(high, largest_ * (1 + 1e-12));
  if (covered_ && low >= low_ && high <= high_) {
    return;
  }
  const double new_low = covered_ ? std::min(low, low_) : low;
  const double new_high = covered_ ? std::max(high, high_) : high;
  std::vector<Point> added;
  const auto add = [&](double a, double b, bool skip_a, bool skip_b) {
    for (ShapeCandidate& c : enumerate_shapes(arch_base_, a, b, options_)) {
      const double n = c.params.flop_active;
      if ((skip_a && n <= a) || (skip_b && n >= b)) {
        continue;  // already in points()
      }
      Point point;
      point.candidate = std::move(c);
      added.push_back(std::move(point));
    }
  };
  if (!covered_) {
    add(new_low, new_high, false, false);
  } else {
    if (new_low < low_) {
      add(new_low, low_, false, true);
    }
    if (new_high > high_) {
      add(high_, new_high, true, false);
    }
  }
  evaluator_.count_candidates(static_cast<int64_t>(added.size()));
  // Appended, never reordered: indices into points() stay valid.
  for (Point& p : added) {
    points_.push_back(std::move(p));
  }
  low_ = new_low;
  high_ = new_high;
  covered_ = true;
}

void ArchSpace::forget_tokens() {
  for (Point& point : points_) {
    point.tokens.reset();
  }
}

std::vector<int> ArchSpace::by_n_f() const {
  std::vector<int> order(points_.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int l, int r) {
    return points_[static_cast<size_t>(l)].candidate.params.flop_active <
           points_[static_cast<size_t>(r)].candidate.params.flop_active;
  });
  return order;
}

double ArchSpace::loss(Point& point, double eps) {
  const ParamCounts& p = point.candidate.params;
  return predicted_loss(evaluator_.law(), scale(eps), p.flop_active,
                        evaluator_.tokens_for(arch_base_, point));
}

std::optional<double> ArchSpace::loss_unless_above(Point& point, double eps, double limit) {
  if (!point.tokens && std::isfinite(limit)) {
    const double bound =
        predicted_loss(evaluator_.law(), scale(eps), point.candidate.params.flop_active,
                       evaluator_.tokens_floor_bound(arch_base_, point, computes_));
    if (bound > limit) {
      point.layouts.reset();  // no layout search for this shape (its floor is kept)
      return std::nullopt;
    }
  }
  return loss(point, eps);
}

std::optional<std::pair<double, double>> bound_interval(const LossFitParams& law, LossScale scale,
                                                        double bound_flops, double loss) {
  if (!std::isfinite(bound_flops)) {
    return std::make_pair(0.0, INFINITY);
  }
  const auto g = [&](double x) {
    const double n = std::exp(x);
    return scale.total * (law.E + scale.params * law.A * std::exp(-law.alpha * x) +
                          scale.data * law.B * std::pow(bound_flops / (6.0 * n), -law.beta));
  };
  const double centre = std::log(closed_form_optimum(law, bound_flops, scale).n_opt);
  if (g(centre) > loss) {
    return std::nullopt;
  }
  const auto edge = [&](double direction) {
    double distance = 1.0;
    while (g(centre + direction * distance) <= loss && distance < 200.0) {
      distance *= 2.0;
    }
    double inside = centre;
    double outside = centre + direction * distance;
    for (int i = 0; i < 200 && std::abs(outside - inside) > 1e-12; ++i) {
      const double mid = 0.5 * (inside + outside);
      (g(mid) <= loss ? inside : outside) = mid;
    }
    return outside;  // g(outside) > loss (or the search limit): a safe edge
  };
  return std::make_pair(std::exp(edge(-1.0)), std::exp(edge(1.0)));
}

namespace {

// Deepest shape among `eligible` with loss <= best * (1 + kLossTieRelative),
// then the lowest loss.
int deepest_tie(ArchSpace& space, const std::vector<int>& eligible, double eps, double best) {
  int chosen = -1;
  double chosen_loss = INFINITY;
  for (const int i : eligible) {
    Point& point = space.points()[static_cast<size_t>(i)];
    const double loss = space.loss(point, eps);
    if (loss > best * (1.0 + kLossTieRelative)) {
      continue;
    }
    const int64_t layers = point.candidate.shape.n_layers;
    if (chosen < 0 || layers > space.points()[static_cast<size_t>(chosen)].candidate.shape.n_layers ||
        (layers == space.points()[static_cast<size_t>(chosen)].candidate.shape.n_layers &&
         loss < chosen_loss)) {
      chosen = i;
      chosen_loss = loss;
    }
  }
  return chosen;
}

}  // namespace

Argmin isoflop_argmin(ArchSpace& space, double eps, double centre_flops) {
  Evaluator& evaluator = space.evaluator();
  const LossFitParams& law = evaluator.law();
  const double bound_flops = evaluator.token_bound_flops();
  const double centre = closed_form_optimum(law, centre_flops, space.scale(eps)).n_opt;
  space.cover(centre / 3.0, centre * 2.0);
  Argmin result;
  for (;;) {
    std::vector<Point>& points = space.points();
    // Points in the order of their loss bound (free to compute); a point's
    // loss is computed (under a wall-clock budget: its layout search) only
    // while its bound could still tie the best fitting loss found, which
    // every later point's bound exceeds.  Losses left at infinity are
    // provably above the tie limit.  Under a FLOP budget the bound is the
    // loss.
    std::vector<double> bounds(points.size());
    for (size_t i = 0; i < points.size(); ++i) {
      bounds[i] = space.loss_bound(points[i], eps);
    }
    std::vector<int> order(points.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int l, int r) {
      return bounds[static_cast<size_t>(l)] < bounds[static_cast<size_t>(r)];
    });
    std::vector<double> losses(points.size(), INFINITY);
    int best_fit = -1;
    int unconstrained = -1;
    bool pruned = false;
    for (const int i : order) {
      const size_t at = static_cast<size_t>(i);
      if (best_fit >= 0 && evaluator.bound_holds() &&
          bounds[at] > losses[static_cast<size_t>(best_fit)] * (1.0 + kLossTieRelative)) {
        pruned = true;
        break;
      }
      // A point whose layouts' step floor already puts it above the tie limit
      // is not costed: its loss stays at infinity (above the limit, as it is).
      const std::optional<double> loss = space.loss_unless_above(
          points[at], eps,
          best_fit >= 0 ? losses[static_cast<size_t>(best_fit)] * (1.0 + kLossTieRelative)
                        : INFINITY);
      if (!loss) {
        continue;
      }
      losses[at] = *loss;
      if (unconstrained < 0 || losses[at] < losses[static_cast<size_t>(unconstrained)]) {
        unconstrained = i;
      }
      if ((best_fit < 0 || losses[at] < losses[static_cast<size_t>(best_fit)]) &&
          evaluator.fits(space.arch_base(), points[at], space.computes())) {
        best_fit = i;
      }
    }
    if (pruned && !evaluator.bound_holds()) {
      continue;  // a costed step beat the rate ceiling: walk again without the bound
    }
    if (best_fit < 0 && !space.complete()) {
      // Nothing in the window fits: a fitting shape may lie anywhere (the
      // smallest shapes fit almost any device), so score the whole space.
      space.cover_everything();
      continue;
    }
    result.unconstrained = unconstrained;
    result.fits = best_fit >= 0;
    const int reference = result.fits ? best_fit : result.unconstrained;
    const size_t before = points.size();
    if (!evaluator.bound_holds() || reference < 0) {
      // The profile beats its own peak (no bound), or nothing in the first
      // window (a narrow aspect band): evaluate the whole space.
      space.cover_everything();
      if (points.empty()) {
        return result;
      }
    } else {
      const double target = losses[static_cast<size_t>(reference)] * (1.0 + kLossTieRelative);
      if (const auto interval = bound_interval(law, space.scale(eps), bound_flops, target)) {
        space.cover(interval->first, interval->second);
      }
    }
    if (points.size() != before) {
      continue;  // new shapes: recompute the order
    }
    std::vector<int> eligible;
    const double tie_limit = losses[static_cast<size_t>(reference)] * (1.0 + kLossTieRelative);
    for (size_t i = 0; i < points.size(); ++i) {
      if (losses[i] > tie_limit) {
        continue;  // deepest_tie() ignores it: spare its memory check (a layout search on a cluster)
      }
      if (!result.fits || evaluator.fits(space.arch_base(), points[i], space.computes())) {
        eligible.push_back(static_cast<int>(i));
      }
    }
    result.index =
        deepest_tie(space, eligible, eps, losses[static_cast<size_t>(reference)]);
    result.memory_decided =
        result.fits && losses[static_cast<size_t>(result.unconstrained)] <
                           losses[static_cast<size_t>(reference)] * (1.0 - kLossTieRelative);
    return result;
  }
}

SearchRange search_range(const Config& arch_base, const ShapeSearchOptions& shapes,
                         const LossFitParams& law, LossScale scale, double flops) {
  SearchRange range;
  const ClosedFormOptimum optimum = closed_form_optimum(law, flops, scale);
  range.n_opt = optimum.n_opt;
  range.smallest = smallest_shape_n_f(arch_base, shapes);
  range.largest = largest_shape_n_f(arch_base, shapes);
  // N* = G (C/6)^(beta/(alpha+beta))  =>  C = 6 (N* / G)^((alpha+beta)/beta).
  const double exponent = (law.alpha + law.beta) / law.beta;
  range.min_flops = 6.0 * std::pow(range.smallest / optimum.G, exponent);
  range.max_flops = 6.0 * std::pow(range.largest / optimum.G, exponent);
  return range;
}

double prior_size(const EfficiencyPrior& prior, const ParamCounts& params) {
  return prior.size_measure == "non_embedding" ? params.non_embedding : params.total;
}

int fastest_at_parity(ArchSpace& space, double eps, double target_loss,
                      const EfficiencyPrior& prior, bool supported) {
  Evaluator& evaluator = space.evaluator();
  if (!evaluator.bound_holds()) {
    space.cover_everything();
  } else if (const auto interval = bound_interval(evaluator.law(), space.scale(eps),
                                                  evaluator.token_bound_flops(), target_loss)) {
    space.cover(interval->first, interval->second);
  } else {
    return -1;
  }
  std::vector<Point>& points = space.points();
  const bool bounded = evaluator.bound_holds();
  // Whether the point may be the answer: its loss reaches the target, it
  // fits, and (`supported`) lies in the prior's sizes and the fit's band.
  const auto qualifies = [&](Point& point) {
    if (space.loss(point, eps) > target_loss * (1.0 + 1e-12) ||
        !evaluator.fits(space.arch_base(), point, space.computes())) {
      return false;
    }
    if (!supported) {
      return true;
    }
    const double tokens_per_param =
        evaluator.tokens_for(space.arch_base(), point) / point.candidate.params.flop_active;
    return !(prior.measured_size_min > 0 &&
             prior_size(prior, point.candidate.params) < prior.measured_size_min) &&
           tokens_per_param <= kFitTokensPerParamMax && tokens_per_param >= kFitTokensPerParamMin;
  };
  // Under a FLOP budget every test is cheap: the queue holds the qualifying
  // points.  Under a wall-clock budget a point's loss, memory and tokens
  // come from its layout search, so the queue holds every point the bounds
  // (loss from below, tokens from above) do not rule out, and each is
  // tested when reached: the points costed are those stepping no slower
  // than the step-time bound of the fastest qualifying one.
  const bool wall_clock = evaluator.wall_clock();
  std::vector<std::pair<double, int>> queue;  // (step-time lower bound, index)
  for (size_t i = 0; i < points.size(); ++i) {
    Point& point = points[i];
    if (wall_clock && bounded) {
      const double tokens_per_param_bound =
          evaluator.tokens_bound(point) / point.candidate.params.flop_active;
      if (space.loss_bound(point, eps) > target_loss * (1.0 + 1e-12) ||
          (supported && ((prior.measured_size_min > 0 && prior_size(prior, point.candidate.params) <
                                                             prior.measured_size_min) ||
                         tokens_per_param_bound < kFitTokensPerParamMin))) {
        continue;
      }
    } else if (!qualifies(point)) {
      continue;
    }
    queue.emplace_back(evaluator.step_time_lower_bound(space.arch_base(), point),
                       static_cast<int>(i));
  }
  std::sort(queue.begin(), queue.end());
  int fastest = -1;
  double fastest_s = INFINITY;
  for (const auto& [lower_bound, i] : queue) {
    if (lower_bound >= fastest_s && evaluator.bound_holds()) {
      break;  // no later shape can step faster
    }
    Point& point = points[static_cast<size_t>(i)];
    if (!point.estimate) {
      // On a cluster under a wall-clock budget, the layouts' step floor rules
      // out a shape that cannot step faster or reach the target loss.
      const std::optional<double> floor_s = evaluator.step_floor(space.arch_base(), point, space.computes());
      if (floor_s && *floor_s >= fastest_s) {
        point.layouts.reset();
        continue;
      }
      if (!space.loss_unless_above(point, eps, target_loss * (1.0 + 1e-12))) {
        continue;
      }
    }
    const Estimate& est = evaluator.cost_of(space.arch_base(), point);
    if (est.memory.fits && est.time.step_s < fastest_s && (!wall_clock || qualifies(point))) {
      fastest_s = est.time.step_s;
      fastest = i;
    }
  }
  if (bounded && !evaluator.bound_holds()) {
    // A costed step beat the rate ceiling the bounds assumed: again without them.
    return fastest_at_parity(space, eps, target_loss, prior, supported);
  }
  return fastest;
}

int flops_match(ArchSpace& space, double target_forward_flops, double baseline_n_f) {
  Evaluator& evaluator = space.evaluator();
  // F_fwd >= 2 N_f, so N_f <= target / 2; attention is taken to be at most 3/4
  // of the forward FLOPs at the baseline's sequence length.
  space.cover(baseline_n_f / 4.0, target_forward_flops / 2.0 * (1.0 + kFlopsTieRelative));
  std::vector<Point>& points = space.points();
  int closest = -1;
  double closest_distance = INFINITY;
  int deepest = -1;
  for (size_t i = 0; i < points.size(); ++i) {
    Point& point = points[i];
    if (!evaluator.fits(space.arch_base(), point, space.computes())) {
      continue;
    }
    const double distance =
        std::abs(std::log(point.candidate.forward_flops_per_token / target_forward_flops));
    if (distance < closest_distance) {
      closest_distance = distance;
      closest = static_cast<int>(i);
    }
    if (distance <= std::log1p(kFlopsTieRelative) &&
        (deepest < 0 || point.candidate.shape.n_layers >
                            points[static_cast<size_t>(deepest)].candidate.shape.n_layers)) {
      deepest = static_cast<int>(i);
    }
  }
  if (deepest >= 0) {
    return deepest;
  }
  if (closest >= 0) {
    return closest;
  }
  if (!space.complete()) {
    // Nothing in the window fits: look at the whole space.
    space.cover_everything();
    return flops_match(space, target_forward_flops, baseline_n_f);
  }
  return points.empty() ? -1 : 0;
}
}  // namespace modar::detail
