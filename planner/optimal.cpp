// `modar optimal`: for a FLOP budget (or a wall-clock budget on a profiled
// device) the isoFLOP-optimal configuration per architecture and, for
// architectures with an efficiency prior, the fastest-stepping configuration
// whose predicted loss matches the optimal baseline (docs/planner.md).
//
// The optimum is the argmin of the predicted loss over EVERY shape the search
// space allows (docs/planner.md "Choosing configurations"), not over a pruned
// curve.  It is found without evaluating the whole space: every shape has
// D <= C_bound / (6 N_f) (F_train = 3 (2 N_f + attention) >= 6 N_f, and under
// a wall-clock budget a step never beats the device's peak FLOP rate), so
//     L(shape) >= g(N_f) = E + s_p A / N_f^alpha + s_d B (C_bound / (6 N_f))^-beta,
// a convex function of log N_f.  Once some shape reaches loss L, no shape
// with g(N_f) > L can beat it; the search enumerates every shape in the N_f
// interval where g <= L (widening until the interval is covered), so its
// argmin is the argmin of the whole space.  The parity search prunes the
// same way, and orders its step-time evaluations by a FLOP lower bound on the
// step time.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <utility>

#include "modar/base/errors.hpp"
#include "modar/base/json.hpp"
#include "modar/base/text.hpp"
#include "modar/estimate_json.hpp"
#include "modar/kernel_model.hpp"
#include "modar/layout_search.hpp"
#include "modar/planner.hpp"
#include "planner_internal.hpp"

namespace modar {

namespace {

// Rough MFU used only to centre the first window of a wall-clock budget (the
// window is widened until the bound above proves the argmin, so this never
// decides).
constexpr double kGridCentreMfu = 0.4;
// The unknown-prior rule (MoD paper section 4.1): shapes whose forward FLOPs
// per token are within this relative distance of the optimal baseline's tie;
// the deepest wins.
constexpr double kFlopsTieRelative = 0.02;

struct Point {
  ShapeCandidate candidate;
  std::optional<double> tokens;            // what the budget buys (lazy)
  std::optional<MemoryBreakdown> memory;   // lazy, cheap (counts only)
  std::optional<Estimate> estimate;        // lazy: memory + step time
  std::optional<Config> layout;            // gpus > 1: the shape with its chosen layout
  std::optional<bool> layout_fits;         // gpus > 1: some layout fits (memory screen)
};

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

struct Budget {
  std::optional<double> train_flops;
  std::optional<double> gpu_hours;
  int64_t gpus = 1;
  int64_t gpus_per_node = 0;  // 0: the profile's network
};

// Cost of a candidate on the hardware.  cost_of() is the one place a
// candidate's memory per device and step time are computed (a multi-device
// layout search plugs in here: per candidate, its best layout's estimate).
class Evaluator {
 public:
  Evaluator(const Budget& budget, const DeviceProfile& profile, const LossFit& fit)
      : budget_(budget), profile_(profile), timing_(profile), fit_(fit),
        peak_rate_(model_flop_rate_ceiling(profile)) {}

  const Estimate& cost_of(const Config& arch_base, Point& point) {
    if (!point.estimate) {
      // Points come from the shape search, which validated their configs.
      point.estimate.emplace();
      const Config config = with_shape(arch_base, point.candidate.shape);
      if (budget_.gpus > 1) {
        // Cluster (planner/layout_search.cpp): the fastest layout that fits.
        LayoutSearchResult layout = search_layout(config, timing_, layout_options());
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

  // The memory-only part of cost_of(), without lowering the step (cheap: it
  // screens every candidate).  A layout search must answer both consistently.
  bool fits(const Config& arch_base, Point& point) {
    if (point.estimate) {
      return point.estimate->memory.fits;
    }
    if (budget_.gpus > 1) {
      // Some layout fits: the memory screen of the layout search (exactly
      // search_layout's answer, without timing every layout).
      if (!point.layout_fits) {
        const LayoutFeasibility screen =
            layout_fits(with_shape(arch_base, point.candidate.shape), timing_, layout_options());
        point.layout_fits = screen.fits;
        layouts_evaluated_ += screen.screened;
        layouts_timed_ += screen.timed;
      }
      return *point.layout_fits;
    }
    if (!point.memory) {
      point.memory = estimate_memory(with_shape(arch_base, point.candidate.shape), profile_,
                                     StepKind::train);
    }
    return point.memory->fits;
  }

  // Tokens the budget buys for this configuration.
  double tokens_for(const Config& arch_base, Point& point) {
    if (!point.tokens) {
      double tokens = INFINITY;
      if (budget_.train_flops) {
        tokens = *budget_.train_flops / point.candidate.train_flops_per_token;
      }
      if (budget_.gpu_hours) {
        const double wall_s = *budget_.gpu_hours / double(budget_.gpus) * 3600.0;
        tokens = std::min(tokens, wall_s * cost_of(arch_base, point).time.tokens_per_s);
      }
      point.tokens = tokens;
    }
    return *point.tokens;
  }

  // FLOPs C_bound with D <= C_bound / (6 N_f) for every shape (and D <=
  // C_bound / its training FLOPs per token: tokens_bound()).
  double token_bound_flops() const {
    double bound = INFINITY;
    if (budget_.train_flops) {
      bound = *budget_.train_flops;
    }
    if (budget_.gpu_hours) {
      bound = std::min(bound, *budget_.gpu_hours * 3600.0 * peak_rate_);
    }
    return bound;
  }

  // A bound on tokens_for(point) from above without costing it: its training
  // FLOPs per token at the budget's FLOP bound (a wall-clock step never runs
  // faster than the rate ceiling); equal to it for a FLOP budget.
  double tokens_bound(const Point& point) const {
    return token_bound_flops() / point.candidate.train_flops_per_token;
  }

  // Step time can be no shorter than the step's model FLOPs at the rate
  // ceiling.
  double step_time_lower_bound(const Config& arch_base, const Point& point) const {
    Config config = arch_base;
    if (budget_.gpus > 1) {
      // The step the layout search sizes (its global batch), not the base's.
      config.train.global_batch = layout_global_batch(config, layout_options());
    }
    const double tokens_per_device =
        detail::tokens_per_step(config) / double(std::max<int64_t>(1, config.device.count));
    return point.candidate.train_flops_per_token * tokens_per_device / peak_rate_;
  }

  LayoutSearchOptions layout_options() const {
    LayoutSearchOptions options;
    options.gpus = budget_.gpus;
    options.gpus_per_node = budget_.gpus_per_node;
    return options;
  }

  bool bound_holds() const { return bound_holds_ && peak_rate_ > 0; }
  bool wall_clock() const { return budget_.gpu_hours.has_value(); }
  const LossFitParams& law() const { return fit_.params; }
  int64_t cost_evaluations() const { return cost_evaluations_; }
  int64_t layouts_evaluated() const { return layouts_evaluated_; }
  int64_t layouts_timed() const { return layouts_timed_; }
  void count_candidates(int64_t n) { candidates_ += n; }
  int64_t candidates() const { return candidates_; }

 private:
  Budget budget_;
  const DeviceProfile& profile_;
  const TimingModel timing_;  // the profile pre-indexed once for every point
  OpList scratch_;
  const LossFit& fit_;
  double peak_rate_ = 0.0;  // model_flop_rate_ceiling()
  bool bound_holds_ = true;
  int64_t cost_evaluations_ = 0;
  int64_t layouts_evaluated_ = 0;
  int64_t layouts_timed_ = 0;
  int64_t candidates_ = 0;
};

// Every shape of one architecture with N_f in [low, high] (grown on demand),
// sorted by N_f, with its lazily computed tokens / memory / time.
class ArchSpace {
 public:
  ArchSpace(const Config& arch_base, const ShapeSearchOptions& options, Evaluator& evaluator,
            const EfficiencyPrior& prior)
      : arch_base_(arch_base), options_(options), evaluator_(evaluator), prior_(prior) {
    smallest_ = detail::smallest_shape_n_f(arch_base, options);
    largest_ = detail::largest_shape_n_f(arch_base, options);
  }

  // Make sure every shape with N_f in [low, high] is in points().
  void cover(double low, double high) {
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
  void cover_everything() { cover(0.0, INFINITY); }
  bool complete() const { return covered_ && low_ <= smallest_ && high_ >= largest_; }

  // The prior's eps (or an end of its range) where the prior acts.
  LossScale scale(double eps) const { return loss_scale(prior_, eps); }
  double loss(Point& point, double eps) {
    const ParamCounts& p = point.candidate.params;
    return predicted_loss(evaluator_.law(), scale(eps), p.flop_active,
                          evaluator_.tokens_for(arch_base_, point));
  }
  // A bound on loss(point, eps) from below without costing the point (its
  // tokens at Evaluator::tokens_bound; the loss falls with tokens); equal to
  // it for a FLOP budget.
  double loss_bound(const Point& point, double eps) const {
    return predicted_loss(evaluator_.law(), scale(eps), point.candidate.params.flop_active,
                          evaluator_.tokens_bound(point));
  }

  std::vector<Point>& points() { return points_; }
  const Config& arch_base() const { return arch_base_; }
  Evaluator& evaluator() { return evaluator_; }
  double smallest() const { return smallest_; }
  double largest() const { return largest_; }

 private:
  Config arch_base_;
  ShapeSearchOptions options_;
  Evaluator& evaluator_;
  EfficiencyPrior prior_;
  std::vector<Point> points_;
  double smallest_ = 0.0, largest_ = 0.0;
  double low_ = 0.0, high_ = 0.0;
  bool covered_ = false;
};

// The N_f interval where g(N_f) = E + s_p A N^-alpha + s_d B (C/(6N))^-beta <= L
// (g is convex in log N with its minimum at the closed form); nullopt when
// empty.
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

struct Argmin {
  int index = -1;              // the recommendation
  int unconstrained = -1;      // argmin ignoring memory
  bool fits = true;            // some shape fits
  bool memory_decided = false; // the unconstrained argmin does not fit
};

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

// The argmin of the predicted loss at `eps` over every shape of the space
// that fits in memory (over all shapes when none fits).
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
      losses[at] = space.loss(points[at], eps);
      if (unconstrained < 0 || losses[at] < losses[static_cast<size_t>(unconstrained)]) {
        unconstrained = i;
      }
      if ((best_fit < 0 || losses[at] < losses[static_cast<size_t>(best_fit)]) &&
          evaluator.fits(space.arch_base(), points[at])) {
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
      if (!result.fits || evaluator.fits(space.arch_base(), points[i])) {
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

// Size of a candidate in the prior's measure.
double prior_size(const EfficiencyPrior& prior, const ParamCounts& params) {
  return prior.size_measure == "non_embedding" ? params.non_embedding : params.total;
}

struct Parity {
  int index = -1;
  bool restricted = true;  // found inside the supported region
};

// The fastest-stepping shape whose predicted loss at `eps` is <= target_loss.
// With `supported`, only shapes no smaller than the smallest model the prior
// was measured at and within the fit's tokens-per-parameter band count
// (docs/planner.md "Sanity bound").
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
        !evaluator.fits(space.arch_base(), point)) {
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

// The unknown-prior rule: the shape whose forward FLOPs per token match the
// optimal baseline's (within kFlopsTieRelative; deepest wins), among shapes
// that fit.
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
    if (!evaluator.fits(space.arch_base(), point)) {
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

Recommendation make_recommendation(const std::string& arch, const std::string& role,
                                   const std::string& selection, ArchSpace& space, Point& point,
                                   const EfficiencyPrior& prior) {
  Evaluator& evaluator = space.evaluator();
  Recommendation rec;
  rec.arch = arch;
  rec.role = role;
  rec.selection = selection;
  rec.config = with_shape(space.arch_base(), point.candidate.shape);
  rec.shape = point.candidate.shape;
  const Estimate& est = evaluator.cost_of(space.arch_base(), point);
  if (point.layout) {
    rec.config = *point.layout;  // with the chosen layout on a cluster
  }
  rec.params = est.params;
  rec.flops = est.flops;
  rec.tokens = evaluator.tokens_for(space.arch_base(), point);
  rec.train_flops_total = point.candidate.train_flops_per_token * rec.tokens;
  const double hardware_ratio =
      est.flops.train_per_step > 0 ? est.flops.hardware_per_step / est.flops.train_per_step : 1.0;
  rec.hardware_flops_total = rec.train_flops_total * hardware_ratio;
  if (prior.known) {
    rec.loss = space.loss(point, prior.eps);
    rec.loss_range = ValueRange{*rec.loss, space.loss(point, prior.eps_low),
                                space.loss(point, prior.eps_high)};
  }
  rec.prior = prior;
  rec.eps_range = prior.known ? ValueRange{prior.eps, prior.eps_low, prior.eps_high}
                              : ValueRange{1.0, std::nullopt, std::nullopt};
  rec.memory = est.memory;
  rec.time = est.time;
  rec.train_hours = est.time.tokens_per_s > 0 ? rec.tokens / est.time.tokens_per_s / 3600.0 : 0;
  return rec;
}

void set_ratios(Recommendation& rec, const Recommendation& baseline) {
  const auto ratio = [](double a, double b) { return b != 0 ? a / b : 0.0; };
  rec.ratio_params_total = ratio(rec.params.total, baseline.params.total);
  rec.ratio_params_flop_active = ratio(rec.params.flop_active, baseline.params.flop_active);
  rec.ratio_forward_flops = ratio(rec.flops.forward_per_token, baseline.flops.forward_per_token);
  rec.ratio_step_time = ratio(rec.time.step_s, baseline.time.step_s);
  rec.ratio_tokens = ratio(rec.tokens, baseline.tokens);
  rec.ratio_train_hours = ratio(rec.train_hours, baseline.train_hours);
}

// Where the rule lands at both ends of the prior's range: N_f, total
// parameters, tokens, step time relative to the baseline's.
void set_ranges(Recommendation& rec, ArchSpace& space, int low_index, int high_index,
                double baseline_step_s, double baseline_forward_flops) {
  const auto value_at = [&](int index, auto get) -> std::optional<double> {
    if (index < 0) {
      return std::nullopt;
    }
    return get(space.points()[static_cast<size_t>(index)]);
  };
  // low / high: the smaller and the larger of the values at the two ends
  // (and this one); null where the eps_high end has no answer (no shape
  // reaches parity there), since the range is then open on that side.
  const auto fill = [&](ValueRange& range, double value, auto get) {
    range.value = value;
    const std::optional<double> at_low = value_at(low_index, get);
    const std::optional<double> at_high = value_at(high_index, get);
    if (at_low && at_high) {
      range.low = std::min({value, *at_low, *at_high});
      range.high = std::max({value, *at_low, *at_high});
    } else {
      range.low = at_low ? std::optional<double>(std::min(value, *at_low)) : std::nullopt;
      range.high = at_high ? std::optional<double>(std::max(value, *at_high)) : std::nullopt;
    }
  };
  fill(rec.n_flop_active_range, rec.params.flop_active,
       [](Point& p) { return p.candidate.params.flop_active; });
  fill(rec.params_total_range, rec.params.total,
       [](Point& p) { return p.candidate.params.total; });
  fill(rec.tokens_range, rec.tokens,
       [&](Point& p) { return space.evaluator().tokens_for(space.arch_base(), p); });
  fill(rec.forward_flops_ratio_range, rec.ratio_forward_flops, [&](Point& p) {
    return p.candidate.forward_flops_per_token / baseline_forward_flops;
  });
  fill(rec.step_time_ratio_range, rec.ratio_step_time, [&](Point& p) {
    return baseline_step_s > 0
               ? space.evaluator().cost_of(space.arch_base(), p).time.step_s / baseline_step_s
               : 0.0;
  });
}

void add_flag(Recommendation& rec, const std::string& code, const std::string& message) {
  rec.flags.push_back({code, message});
}

// Flags that depend only on the recommendation and its prior.
void flag_trust(Recommendation& rec) {
  const EfficiencyPrior& prior = rec.prior;
  const double tokens_per_param = rec.tokens / rec.params.flop_active;
  if (tokens_per_param < kFitTokensPerParamMin || tokens_per_param > kFitTokensPerParamMax) {
    add_flag(rec, "tokens_per_param_outside_fit",
             format_fixed(tokens_per_param, 0) + " tokens per FLOP-active parameter, outside the " +
                 format_number(kFitTokensPerParamMin) + ".." +
                 format_number(kFitTokensPerParamMax) +
                 " band the fits were made on: the loss law is extrapolated");
  }
  if (prior.known && prior.points == 1) {
    add_flag(rec, "prior_single_point",
             "eps " + format_fixed(prior.eps, 4) + " rests on a single published point; range " +
                 format_fixed(prior.eps_low, 4) + ".." + format_fixed(prior.eps_high, 4));
  }
  if (prior.known && prior.measured_size_max > 0) {
    const double size = prior_size(prior, rec.params);
    const std::string measure =
        prior.size_measure == "non_embedding" ? "non-vocab parameters" : "parameters";
    if (size < prior.measured_size_min * (1 - 1e-9) || size > prior.measured_size_max * (1 + 1e-9)) {
      add_flag(rec, "prior_outside_measured_sizes",
               format_sci(size, 2) + " " + measure + ", outside the " +
                   format_sci(prior.measured_size_min, 1) +
                   (prior.measured_size_max > prior.measured_size_min
                        ? ".." + format_sci(prior.measured_size_max, 1)
                        : std::string()) +
                   " the prior was measured at");
    }
  }
  if (prior.known && prior.measured_budget_max > 0 &&
      (rec.train_flops_total < prior.measured_budget_min * (1 - 1e-9) ||
       rec.train_flops_total > prior.measured_budget_max * (1 + 1e-9))) {
    add_flag(rec, "prior_outside_measured_budgets",
             "training FLOPs " + format_sci(rec.train_flops_total, 1) + ", outside the " +
                 format_sci(prior.measured_budget_min, 1) + ".." +
                 format_sci(prior.measured_budget_max, 1) + " budgets the prior was measured at");
  }
  if (prior.known && prior.measured_tokens_per_param > 0 &&
      (tokens_per_param > prior.measured_tokens_per_param * kPriorTokensPerParamFactor ||
       tokens_per_param < prior.measured_tokens_per_param / kPriorTokensPerParamFactor)) {
    add_flag(rec, "prior_outside_measured_tokens_per_param",
             format_fixed(tokens_per_param, 0) +
                 " tokens per parameter; the prior was measured at " +
                 format_number(prior.measured_tokens_per_param));
  }
  if (rec.time.extrapolated) {
    add_flag(rec, "op_time_extrapolated",
             std::to_string(rec.time.ops_extrapolated) +
                 " op records timed outside the profile's measured grid (fitted efficiency x "
                 "roofline)");
  }
  if (rec.time.mfu_beyond_published) {
    add_flag(rec, "mfu_beyond_published",
             "MFU " + format_fixed(100.0 * rec.time.mfu, 1) +
                 "% is above the best published for this device class (" +
                 format_fixed(100.0 * rec.time.published_mfu, 1) +
                 "%: " + rec.time.published_mfu_source + "): the predicted speed is optimistic");
  }
  if (!rec.memory.fits) {
    add_flag(rec, "no_fit",
             "peak " + format_fixed(rec.memory.peak / (1024.0 * 1024.0 * 1024.0), 1) + " GiB > " +
                 format_fixed(rec.memory.capacity / (1024.0 * 1024.0 * 1024.0), 1) +
                 " GiB device memory: no shape of the search space fits; not recommended");
  }
}

// The "nothing fits" advice (every shape of the space was scored and none
// fits): only changes that would help, given what is already set.
std::string no_fit_advice(const Config& config, const DeviceProfile& profile) {
  std::vector<std::string> options;
  Config relaxed = config;
  if (config.train.micro_batch > 1) {
    options.push_back("--micro-batch 1 (now " + std::to_string(config.train.micro_batch) + ")");
    relaxed.train.micro_batch = 1;
  }
  if (config.train.recompute != Recompute::full) {
    options.push_back(std::string("--recompute full (now ") + to_string(config.train.recompute) +
                      ")");
    relaxed.train.recompute = Recompute::full;
  }
  const MemoryBreakdown best = estimate_memory(relaxed, profile, StepKind::train);
  const double gib = 1024.0 * 1024.0 * 1024.0;
  std::string joined;
  for (size_t i = 0; i < options.size(); ++i) {
    joined += (i ? " and " : "") + options[i];
  }
  if (!options.empty() && best.fits) {
    return "try " + joined + " (then the shown shape needs " + format_fixed(best.peak / gib, 1) +
           " GiB)";
  }
  const double state = best.weights + best.gradients + best.optimizer;
  std::string text = (options.empty() ? std::string("the shown shape needs ")
                                      : "even with " + joined + " the shown shape needs ") +
                     format_fixed(best.peak / gib, 1) + " GiB of " +
                     format_fixed(best.capacity / gib, 1) +
                     " GiB (weights, gradients and optimizer " + format_fixed(state / gib, 1) +
                     ", activations " + format_fixed(best.activations / gib, 1) + ", workspace " +
                     format_fixed(best.workspace / gib, 1) + " incl. the logits)";
  return text + (state > best.capacity
                     ? ": a device with more memory (--profile) is needed"
                     : ": a shorter --seq-len or a device with more memory (--profile) would help");
}

std::string space_text(const ShapeSearchOptions& o) {
  return std::to_string(o.min_layers) + "-" + std::to_string(o.max_layers) +
         " layers, d_model a multiple of " + std::to_string(o.d_model_multiple) + " up to " +
         std::to_string(o.max_d_model) + ", aspect d/L in [" + format_number(o.aspect_min) +
         ", " + format_number(o.aspect_max) + "]";
}

// Loss-optimal (scaling law alone) vs the recommended model that fits: say so,
// and which constraint binds, when they differ (never shrink silently).
void append_fit_notes(OptimalResult& result, const LossFitParams& law, double centre_flops,
                      const OptimalRequest& request) {
  if (!request.train_flops || result.recommendations.empty()) {
    return;
  }
  const ClosedFormOptimum dense = closed_form_optimum(law, centre_flops);
  for (const Recommendation& rec : result.recommendations) {
    if (rec.arch != "baseline" || rec.role != "isoflop_optimal") {
      continue;
    }
    const double ratio = rec.params.flop_active / dense.n_opt;
    std::string note = "loss-optimal baseline (closed form, scaling law alone): N_f " +
                       format_sci(dense.n_opt, 2) + ", D " + format_sci(dense.tokens_opt, 2) +
                       "; recommended: N_f " + format_sci(rec.params.flop_active, 2) + " (" +
                       format_fixed(ratio, 2) + "x)";
    if (!rec.memory.fits) {
      note += "; it does NOT fit " + std::to_string(request.gpus) +
              " GPU(s): device memory binds (add --gpus, or see the layout)";
    } else if (ratio < 0.8) {
      note += ": the loss-optimal model does not fit " + std::to_string(request.gpus) +
              " GPU(s) (device memory binds); this is the best model that fits";
    } else {
      note += ": fits " + std::to_string(request.gpus) + " GPU(s)";
      if (request.gpus > 1) {
        note += " with layout " + layout_summary(rec.config);
      }
    }
    result.notes.push_back(note);
  }
}

}  // namespace

OptimalResult optimal(const OptimalRequest& request) {
  detail::check_budget("--flops", request.train_flops);
  detail::check_budget("--gpu-hours", request.gpu_hours);
  if (!request.train_flops && !request.gpu_hours) {
    throw ConfigError(
        "no budget: give --flops C (training FLOPs) and/or --gpu-hours H "
        "(device-hours on --profile)");
  }
  if (request.gpus < 1) {
    throw ConfigError("--gpus " + std::to_string(request.gpus) + ": must be >= 1");
  }
  if (!(request.grid_step > 1.0) || !(request.grid_half_width > 1.0)) {
    throw ConfigError("grid step / half width: must be > 1");
  }
  if (request.archs.empty()) {
    throw ConfigError("--arch: empty; allowed: baseline, mod, dar, mod+dar");
  }
  check_experts_used(request.base.moe, request.archs);
  std::vector<ArchSpec> archs;
  for (const std::string& name : request.archs) {
    ArchSpec arch = make_arch(name, request.capacity, request.every, request.dar_block_layers,
                              request.dar_streams);
    arch.moe = planned_experts(arch, request.base.moe);  // the user's moe.* settings
    const bool duplicate =
        std::any_of(archs.begin(), archs.end(), [&](const ArchSpec& a) { return a.name == name; });
    if (!duplicate) {
      archs.push_back(arch);
    }
  }

  OptimalResult result;
  result.request = request;
  result.fit = load_fit(request.fit);
  const DeviceProfile profile = load_profile(request.profile);
  result.profile_name = profile.name;

  Config base = request.base;
  base.device.count = request.gpus;
  base.device.profile = request.profile;
  // MoD is set per architecture; how it samples causally stays the user's.
  const ModConfig routing = base.mod;
  base.mod = ModConfig{};
  base.mod.causal_router = routing.causal_router;
  base.mod.predictor_hidden = routing.predictor_hidden;
  base.dar = DarConfig{};
  base.moe = MoeConfig{};
  validate(base);

  const Budget budget{request.train_flops, request.gpu_hours, request.gpus,
                      request.gpus_per_node};
  Evaluator evaluator(budget, profile, result.fit);
  const LossFitParams& law = result.fit.params;

  // Centre of the first window: the dense closed form at the FLOP budget (or
  // at the FLOPs the device-hours buy at a typical MFU).
  double centre_flops = INFINITY;
  if (request.train_flops) {
    centre_flops = *request.train_flops;
  }
  if (request.gpu_hours) {
    centre_flops = std::min(centre_flops, *request.gpu_hours * 3600.0 *
                                              profile.ceilings.peak_flops_bf16 * kGridCentreMfu);
  }
  const ClosedFormOptimum dense = closed_form_optimum(law, centre_flops);
  const double smallest = detail::smallest_shape_n_f(base, request.shapes);
  const double largest = detail::largest_shape_n_f(base, request.shapes);
  const double exponent = (law.alpha + law.beta) / law.beta;
  if (dense.n_opt < smallest) {
    const double minimum_flops = 6.0 * std::pow(smallest / dense.G, exponent);
    const std::string what = request.train_flops
                                 ? "--flops " + format_number(*request.train_flops)
                                 : "--gpu-hours " + format_number(*request.gpu_hours);
    throw ConfigError(what + ": too small for any shape: the compute-optimal N_f is " +
                      format_sci(dense.n_opt, 2) + " but the smallest shape (" +
                      std::to_string(request.shapes.min_layers) + " layers, d_model " +
                      std::to_string(request.shapes.d_model_multiple) + "+) has N_f " +
                      format_sci(smallest, 2) + "; allowed: a budget of at least ~" +
                      (request.train_flops
                           ? format_sci(minimum_flops, 1) + " FLOPs"
                           : format_sci(minimum_flops / (3600.0 * profile.ceilings.peak_flops_bf16 *
                                                         kGridCentreMfu),
                                        1) +
                                 " GPU-hours"));
  }
  if (dense.n_opt > largest) {
    const double maximum_flops = 6.0 * std::pow(largest / dense.G, exponent);
    throw ConfigError("budget " + format_sci(centre_flops, 2) +
                      " FLOPs: too large for the shape search: the compute-optimal N_f " +
                      format_sci(dense.n_opt, 2) + " exceeds the largest shape's (" +
                      std::to_string(request.shapes.max_layers) + " layers) " +
                      format_sci(largest, 2) + "; allowed: a budget of at most ~" +
                      format_sci(maximum_flops, 1) + " FLOPs");
  }

  const std::string budget_text =
      request.train_flops && request.gpu_hours
          ? "the tighter of C = 3 F_fwd D and the wall-clock budget"
          : (request.train_flops ? "C = 3 F_fwd D (D = C / F_train per token)"
                                 : "the wall-clock budget (D = hours x tokens/s)");
  const std::string memory_text =
      "device memory (" +
      format_fixed(profile.ceilings.memory_bytes / (1024.0 * 1024.0 * 1024.0), 1) +
      " GiB, micro-batch " + std::to_string(base.train.micro_batch) + ", recompute " +
      to_string(base.train.recompute) + ")";
  const auto argmin_selection = [&](const EfficiencyPrior& prior, bool fits) {
    return std::string("argmin of predicted loss (eps ") + format_fixed(prior.eps, 4) + ", fit " +
           result.fit.name + ") under " + budget_text + " over every shape of the search space (" +
           space_text(request.shapes) + ")" + (fits ? " that fits in " + memory_text : "") +
           "; losses within " + format_number(100 * kLossTieRelative) +
           "% of the minimum tie and the deepest wins" +
           (fits ? "" : "; NO shape fits the device memory (not recommended)");
  };

  // The baseline is always solved: it is the reference of every ratio and of
  // the parity rule.
  const ArchSpec baseline_arch = make_arch("baseline");
  const EfficiencyPrior baseline_prior =
      efficiency_prior(detail::arch_config(base, baseline_arch), result.fit, request.eps_overrides);
  ArchSpace baseline_space(detail::arch_config(base, baseline_arch), request.shapes, evaluator,
                           baseline_prior);
  const Argmin baseline_argmin = isoflop_argmin(baseline_space, baseline_prior.eps, centre_flops);
  if (baseline_argmin.index < 0) {
    throw ConfigError("no shape in the search space (" + space_text(request.shapes) + ")");
  }
  const auto baseline_index = static_cast<size_t>(baseline_argmin.index);
  if (evaluator.tokens_for(baseline_space.arch_base(), baseline_space.points()[baseline_index]) <
      detail::tokens_per_step(base)) {
    throw ConfigError("budget too small: the optimal baseline gets " +
                      format_sci(evaluator.tokens_for(baseline_space.arch_base(),
                                                      baseline_space.points()[baseline_index]),
                                 2) +
                      " tokens, less than one optimizer step (" +
                      format_sci(detail::tokens_per_step(base), 2) + " tokens)");
  }
  // Copies: later covers of the same space would invalidate references.
  Recommendation baseline_rec = make_recommendation(
      "baseline", "isoflop_optimal", argmin_selection(baseline_prior, baseline_argmin.fits),
      baseline_space, baseline_space.points()[baseline_index], baseline_prior);
  set_ratios(baseline_rec, baseline_rec);
  set_ranges(baseline_rec, baseline_space, baseline_argmin.index, baseline_argmin.index,
             baseline_rec.time.step_s, baseline_rec.flops.forward_per_token);
  const double baseline_loss = *baseline_rec.loss;
  const double baseline_step_s = baseline_rec.time.step_s;
  result.conventions =
      evaluator.cost_of(baseline_space.arch_base(), baseline_space.points()[baseline_index])
          .conventions;

  const auto flag_memory = [&](Recommendation& rec, const Argmin& argmin, ArchSpace& space,
                               double eps) {
    if (argmin.memory_decided && argmin.unconstrained >= 0) {
      Point& best = space.points()[static_cast<size_t>(argmin.unconstrained)];
      add_flag(rec, "memory_decided",
               "device memory, not the loss, picked this shape: the loss argmin " +
                   std::to_string(best.candidate.shape.n_layers) + " x " +
                   std::to_string(best.candidate.shape.d_model) + " (loss " +
                   format_fixed(space.loss(best, eps), 4) + ") does not fit");
    }
  };
  flag_memory(baseline_rec, baseline_argmin, baseline_space, baseline_prior.eps);
  flag_trust(baseline_rec);

  for (const ArchSpec& arch : archs) {
    const Config arch_base = detail::arch_config(base, arch);
    const EfficiencyPrior prior = efficiency_prior(arch_base, result.fit, request.eps_overrides);
    result.priors.push_back(prior);
    if (arch.name == "baseline") {
      result.recommendations.push_back(baseline_rec);
      if (!baseline_rec.memory.fits) {
        result.notes.push_back("baseline: no shape fits the device memory: " +
                               no_fit_advice(baseline_rec.config, profile));
      }
      continue;
    }
    ArchSpace space(arch_base, request.shapes, evaluator, prior);
    if (!prior.known) {
      const int index = flops_match(space, baseline_rec.flops.forward_per_token,
                                    baseline_rec.params.flop_active);
      if (index < 0) {
        throw ConfigError("no shape in the search space (" + space_text(request.shapes) +
                          ") for " + arch.name);
      }
      Recommendation rec = make_recommendation(
          arch.name, "isoflop_optimal",
          "loss unknown (no prior): among shapes that fit in " + memory_text +
              ", the one with the optimal baseline's forward FLOPs per token (MoD paper "
              "section 4.1 rule; within " +
              format_number(100 * kFlopsTieRelative) + "% the deepest wins)",
          space, space.points()[static_cast<size_t>(index)], prior);
      set_ratios(rec, baseline_rec);
      set_ranges(rec, space, index, index, baseline_step_s, baseline_rec.flops.forward_per_token);
      flag_trust(rec);
      result.recommendations.push_back(rec);
      result.notes.push_back(arch.name +
                             ": no published prior, loss not predicted; shape chosen with the "
                             "optimal baseline's forward FLOPs per token; --eps " +
                             arch.name + "=V predicts it");
      if (!rec.memory.fits) {
        result.notes.push_back(arch.name + ": no shape fits the device memory: " +
                               no_fit_advice(rec.config, profile));
      }
      continue;
    }
    const Argmin argmin = isoflop_argmin(space, prior.eps, centre_flops);
    const Argmin argmin_low = isoflop_argmin(space, prior.eps_low, centre_flops);
    const Argmin argmin_high = isoflop_argmin(space, prior.eps_high, centre_flops);
    Recommendation rec = make_recommendation(arch.name, "isoflop_optimal",
                                             argmin_selection(prior, argmin.fits), space,
                                             space.points()[static_cast<size_t>(argmin.index)],
                                             prior);
    set_ratios(rec, baseline_rec);
    set_ranges(rec, space, argmin_low.index, argmin_high.index, baseline_step_s,
               baseline_rec.flops.forward_per_token);
    flag_memory(rec, argmin, space, prior.eps);
    flag_trust(rec);
    result.recommendations.push_back(rec);
    if (!rec.memory.fits) {
      result.notes.push_back(arch.name + ": no shape fits the device memory: " +
                             no_fit_advice(rec.config, profile));
    }

    // Parity: restricted to where the prior is supported; outside it only
    // when nothing inside reaches parity (flagged).
    bool restricted = true;
    int parity = fastest_at_parity(space, prior.eps, baseline_loss, prior, true);
    if (parity < 0) {
      restricted = false;
      parity = fastest_at_parity(space, prior.eps, baseline_loss, prior, false);
    }
    if (parity < 0) {
      result.notes.push_back(arch.name +
                             ": no shape that fits reaches the optimal baseline's predicted loss");
      continue;
    }
    const int parity_low = fastest_at_parity(space, prior.eps_low, baseline_loss, prior, restricted);
    const int parity_high =
        fastest_at_parity(space, prior.eps_high, baseline_loss, prior, restricted);
    const std::string parity_selection =
        "fastest step (cost model on profile " + profile.name + ") among shapes that fit in " +
        memory_text + " whose predicted loss (eps " + format_fixed(prior.eps, 4) +
        ") <= the optimal baseline's " + format_fixed(baseline_loss, 4) +
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
    Recommendation parity_rec =
        make_recommendation(arch.name, "parity_fastest", parity_selection, space,
                            space.points()[static_cast<size_t>(parity)], prior);
    set_ratios(parity_rec, baseline_rec);
    set_ranges(parity_rec, space, parity_low, parity_high, baseline_step_s,
               baseline_rec.flops.forward_per_token);
    flag_trust(parity_rec);
    if (!restricted) {
      add_flag(parity_rec, "parity_outside_support",
               "no shape inside the prior's support reaches the baseline's loss");
    }
    if (prior.measured_size_min > 0 &&
        prior_size(prior, parity_rec.params) < prior.measured_size_min * (1 - 1e-9)) {
      add_flag(parity_rec, "parity_smaller_than_measured",
               "smaller (" + format_sci(prior_size(prior, parity_rec.params), 2) +
                   ") than any model the prior was measured at (" +
                   format_sci(prior.measured_size_min, 1) + ")");
    }
    if (parity_high < 0) {
      result.notes.push_back(arch.name + " parity-fastest: at eps " +
                             format_fixed(prior.eps_high, 4) +
                             " (the prior's pessimistic end) no shape reaches the baseline's "
                             "loss; its range's high end is null");
    }
    result.recommendations.push_back(parity_rec);
  }

  // Same shape as the optimal baseline (the MoD paper's figure-3 comparison).
  for (const ArchSpec& arch : archs) {
    if (arch.name == "baseline") {
      continue;
    }
    const Config arch_base = detail::arch_config(base, arch);
    const EfficiencyPrior prior = efficiency_prior(arch_base, result.fit, request.eps_overrides);
    ArchSpace one(arch_base, request.shapes, evaluator, prior);
    Point point;
    const Config config = with_shape(arch_base, baseline_rec.shape);
    const ParamAndFlopCounts counts = count_params_and_flops(config);
    point.candidate.shape = baseline_rec.shape;
    point.candidate.params = counts.params;
    point.candidate.forward_flops_per_token = counts.flops.forward_per_token;
    point.candidate.train_flops_per_token = counts.flops.train_per_token;
    SameShapeComparison same;
    same.arch = arch.name;
    same.shape = baseline_rec.shape;
    same.tokens = evaluator.tokens_for(arch_base, point);
    same.baseline_loss = baseline_loss;
    if (prior.known) {
      same.loss = ValueRange{one.loss(point, prior.eps), one.loss(point, prior.eps_low),
                             one.loss(point, prior.eps_high)};
    }
    const Estimate& est = evaluator.cost_of(arch_base, point);
    same.ratio_step_time = baseline_step_s > 0 ? est.time.step_s / baseline_step_s : 0.0;
    same.ratio_forward_flops =
        est.flops.forward_per_token / baseline_rec.flops.forward_per_token;
    same.fits = est.memory.fits;
    result.same_shape.push_back(same);
  }

  const bool dar_requested =
      std::any_of(archs.begin(), archs.end(), [](const ArchSpec& a) { return a.dar.enabled(); });
  if (dar_requested && !request.gpu_hours) {
    result.notes.push_back(
        "DAR costs time and memory, not FLOPs: under a FLOP budget it looks "
        "free; compare under a wall-clock budget (--gpu-hours) for its price");
  }
  if (request.base.moe.enabled()) {
    // Say the experts came from the user, and what the loss model makes of them.
    for (const ArchSpec& arch : archs) {
      if (arch.moe.enabled()) {
        result.notes.push_back(
            arch.name +
            ": experts as set (moe.*): " + experts_summary(detail::arch_config(base, arch)) +
            " (the default is 8 experts of the dense width, top-1); they change the FLOPs, "
            "parameters, memory and time of every shape, while the loss prior stays the MoD "
            "paper's figure-7 reading (8 experts, top-1)");
      }
    }
  }
  if (request.gpu_hours) {
    result.notes.push_back(
        "wall-clock budget: tokens = gpu_hours / gpus * 3600 * tokens/s of "
        "each configuration on profile " +
        profile.name + (request.train_flops ? " (capped by the FLOP budget)" : ""));
  }
  if (!evaluator.bound_holds()) {
    result.notes.push_back(
        "the profile predicts a step faster than its peak FLOP rate for some shape: the search "
        "evaluated the whole space instead of pruning");
  }
  result.candidates_evaluated = evaluator.candidates();
  result.cost_evaluations = evaluator.cost_evaluations();
  result.layouts_evaluated = evaluator.layouts_evaluated();
  result.layouts_timed = evaluator.layouts_timed();
  append_fit_notes(result, law, centre_flops, request);
  return result;
}

namespace {

void json_range(JsonWriter& json, const char* key, const ValueRange& range) {
  json.key(key).begin_object();
  json.field("value", range.value);
  json_optional(json, "low", range.low);
  json_optional(json, "high", range.high);
  json.end_object();
}

}  // namespace

std::string to_json(const OptimalResult& result) {
  const OptimalRequest& request = result.request;
  JsonWriter json;
  json.begin_object();
  json.key("budget").begin_object();
  json_optional(json, "train_flops", request.train_flops);
  json_optional(json, "gpu_hours", request.gpu_hours);
  json.field("gpus", request.gpus);
  json.field("profile", result.profile_name);
  json.end_object();
  json.key("fit").begin_object();
  json.field("name", result.fit.name).field("source", result.fit.source);
  json.field("E", result.fit.params.E).field("A", result.fit.params.A);
  json.field("B", result.fit.params.B).field("alpha", result.fit.params.alpha);
  json.field("beta", result.fit.params.beta);
  json.end_object();
  json.field("loss_model",
             "L = E + eps * A / N_f^alpha + B / D^beta (MoD: E + eps * (A / N_f^alpha + "
             "B / D^beta)); N_f = FLOP-active parameters; D = tokens; C = F_train_per_token * "
             "D = 3 F_fwd D");
  json.key("eps").begin_object();
  for (const EfficiencyPrior& prior : result.priors) {
    if (prior.known) {
      json.field(prior.key, prior.eps);
    } else {
      json.key(prior.key).null();
    }
  }
  json.end_object();
  json.key("eps_range").begin_object();
  for (const EfficiencyPrior& prior : result.priors) {
    if (prior.known) {
      json_range(json, prior.key.c_str(), ValueRange{prior.eps, prior.eps_low, prior.eps_high});
    } else {
      json.key(prior.key).null();
    }
  }
  json.end_object();
  json.key("priors").begin_array();
  for (const EfficiencyPrior& prior : result.priors) {
    json.begin_object();
    json.field("arch", prior.key).field("known", prior.known);
    json_optional(json, "eps", prior.known ? std::optional<double>(prior.eps) : std::nullopt);
    json_optional(json, "eps_low",
                  prior.known ? std::optional<double>(prior.eps_low) : std::nullopt);
    json_optional(json, "eps_high",
                  prior.known ? std::optional<double>(prior.eps_high) : std::nullopt);
    json.field("points", prior.points);
    json.key("measured").begin_object();
    json.field("size_measure", prior.size_measure);
    json.field("size_min", prior.measured_size_min).field("size_max", prior.measured_size_max);
    json.field("budget_min", prior.measured_budget_min);
    json.field("budget_max", prior.measured_budget_max);
    json.field("tokens_per_param", prior.measured_tokens_per_param);
    json.end_object();
    json.field("source", prior.source).field("derivation", prior.derivation);
    json.field("interval", prior.interval);
    json.end_object();
  }
  json.end_array();
  json.field("conventions", result.conventions);
  json.key("shape_search").begin_object();
  json.field("aspect_min", request.shapes.aspect_min);
  json.field("aspect_max", request.shapes.aspect_max);
  json.field("d_model_multiple", request.shapes.d_model_multiple);
  json.field("gqa_group", request.shapes.gqa_group);
  json.field("seq_len", request.base.model.seq_len);
  json.field("micro_batch", request.base.train.micro_batch);
  json.field("recompute", to_string(request.base.train.recompute));
  json.field("max_layers", request.shapes.max_layers);
  json.field("max_d_model", request.shapes.max_d_model);
  json.field("loss_tie_relative", kLossTieRelative);
  json.key("fit_tokens_per_param").begin_array();
  json.value(kFitTokensPerParamMin).value(kFitTokensPerParamMax);
  json.end_array();
  json.end_object();
  json.field("candidates_evaluated", result.candidates_evaluated);
  json.field("cost_evaluations", result.cost_evaluations);
  json.key("recommendations").begin_array();
  for (const Recommendation& rec : result.recommendations) {
    json.begin_object();
    json.field("arch", rec.arch).field("role", rec.role).field("selection", rec.selection);
    json.key("shape").begin_object();
    json.field("n_layers", rec.shape.n_layers).field("d_model", rec.shape.d_model);
    json.field("n_heads", rec.shape.n_heads).field("n_kv_heads", rec.shape.n_kv_heads);
    json.field("d_head", rec.shape.d_head).field("d_ff", rec.shape.d_ff);
    json.field("aspect_ratio", rec.shape.aspect_ratio());
    json.end_object();
    json.field("layout", layout_summary(rec.config));
    // The whole configuration ({dotted key: value}): what `modar export` reads.
    json.key("config").begin_object();
    for (const auto& [key, literal] : config_values(rec.config)) {
      json.key(key).raw(literal);
    }
    json.end_object();
    json.key("parallel").begin_object();
    write_parallel_layout_json(json, parallel_layout_json(rec.config));
    json.field("global_batch", rec.config.train.global_batch);
    json.field("recompute", to_string(rec.config.train.recompute));
    json.end_object();
    json.key("mod").begin_object();
    json.field("capacity", rec.config.mod.enabled() ? rec.config.mod.capacity : 1.0);
    json.field("every", rec.config.mod.every);
    json.end_object();
    json.key("moe").begin_object();
    json.field("experts", rec.config.moe.experts).field("top_k", rec.config.moe.top_k);
    json.field("expert_ffn", rec.config.moe.enabled()
                                 ? rec.config.moe.resolved_expert_ffn(rec.config.model)
                                 : int64_t{0});
    json.field("shared_experts", rec.config.moe.shared_experts);
    json.end_object();
    json.key("dar").begin_object();
    json.field("variant", to_string(rec.config.dar.variant));
    json.field("block_layers", rec.config.dar.enabled() ? rec.config.dar.block_layers : 0);
    json.field("streams", rec.config.dar.resolved_streams());
    json.end_object();
    write_params_json(json, rec.params);
    json.field("tokens", rec.tokens);
    json.field("tokens_per_param", rec.tokens / rec.params.flop_active);
    json.key("flops").begin_object();
    json.field("forward_per_token", rec.flops.forward_per_token);
    json.field("train_per_token", rec.flops.train_per_token);
    json.field("train_total", rec.train_flops_total);
    json.field("hardware_total", rec.hardware_flops_total);
    json.end_object();
    json_optional(json, "loss", rec.loss);
    json_optional(json, "eps",
                  rec.prior.known ? std::optional<double>(rec.prior.eps) : std::nullopt);
    json.key("memory").begin_object();
    json.field("peak_bytes", rec.memory.peak).field("fits", rec.memory.fits);
    write_memory_parts_json(json, rec.memory, "_bytes");
    json.end_object();
    json.key("time").begin_object();
    write_time_rates_json(json, rec.time);
    json.field("train_hours", rec.train_hours);
    json.field("gpu_hours", rec.train_hours * double(request.gpus));
    json.field("extrapolated", rec.time.extrapolated);
    json.end_object();
    json.key("ratios_to_baseline").begin_object();
    json.field("params_total", rec.ratio_params_total);
    json.field("params_flop_active", rec.ratio_params_flop_active);
    json.field("forward_flops_per_token", rec.ratio_forward_flops);
    json.field("step_time", rec.ratio_step_time);
    json.field("tokens", rec.ratio_tokens);
    json.field("train_hours", rec.ratio_train_hours);
    json.end_object();
    json.key("ranges").begin_object();
    json_range(json, "eps", rec.eps_range);
    if (rec.loss_range) {
      json_range(json, "loss", *rec.loss_range);
    } else {
      json.key("loss").null();
    }
    json_range(json, "n_flop_active", rec.n_flop_active_range);
    json_range(json, "params_total", rec.params_total_range);
    json_range(json, "tokens", rec.tokens_range);
    json_range(json, "step_time_ratio", rec.step_time_ratio_range);
    json_range(json, "forward_flops_ratio", rec.forward_flops_ratio_range);
    json.end_object();
    json.key("flags").begin_array();
    for (const PlannerFlag& flag : rec.flags) {
      json.begin_object().field("code", flag.code).field("message", flag.message).end_object();
    }
    json.end_array();
    json.end_object();
  }
  json.end_array();
  json.key("same_shape").begin_array();
  for (const SameShapeComparison& same : result.same_shape) {
    json.begin_object();
    json.field("arch", same.arch);
    json.field("n_layers", same.shape.n_layers).field("d_model", same.shape.d_model);
    json.field("tokens", same.tokens);
    if (same.loss) {
      json_range(json, "loss", *same.loss);
    } else {
      json.key("loss").null();
    }
    json.field("baseline_loss", same.baseline_loss);
    json.field("step_time_ratio", same.ratio_step_time);
    json.field("forward_flops_ratio", same.ratio_forward_flops);
    json.field("fits", same.fits);
    json.end_object();
  }
  json.end_array();
  json.key("notes").begin_array();
  for (const std::string& note : result.notes) {
    json.value(note);
  }
  json.end_array();
  json.end_object();
  return json.str();
}

namespace {

// "low-high" of a range, each end with `format`; "-" for a missing end.
template <typename Format>
std::string range_text(const ValueRange& range, Format format) {
  if (range.low && range.high && *range.low == range.value && *range.high == range.value) {
    return "same";
  }
  const auto end = [&](const std::optional<double>& v) { return v ? format(*v) : std::string("?"); };
  return end(range.low) + ".." + end(range.high);
}

// "%.2g": the eps ranges of the table.
std::string short_sci(double value) {
  return format_general(value, 2);
}

}  // namespace

std::string to_table(const OptimalResult& result) {
  const OptimalRequest& request = result.request;
  std::string out;
  out += "budget: ";
  if (request.train_flops) {
    out += format_sci(*request.train_flops, 2) + " training FLOPs";
  }
  if (request.gpu_hours) {
    out += std::string(request.train_flops ? ", " : "") + format_number(*request.gpu_hours) +
           " GPU-hours";
  }
  out += " on " + std::to_string(request.gpus) + " x " + result.profile_name + "\n";
  const LossFitParams& p = result.fit.params;
  out +=
      "loss model: L = E + eps*A/N_f^alpha + B/D^beta (MoD: E + eps*(A/N_f^alpha + "
      "B/D^beta)), fit '" +
      result.fit.name + "' (E " + format_number(p.E) + ", A " + format_number(p.A) + ", B " +
      format_number(p.B) + ", alpha " + format_number(p.alpha) + ", beta " + format_number(p.beta) +
      ")\n\n";

  const std::vector<Recommendation>& recs = result.recommendations;
  std::vector<std::pair<std::string, std::vector<std::string>>> rows;
  const auto add = [&](const std::string& label, auto cell) {
    std::vector<std::string> cells;
    for (const Recommendation& rec : recs) {
      cells.push_back(cell(rec));
    }
    rows.emplace_back(label, cells);
  };
  add("architecture", [](const Recommendation& r) { return r.arch; });
  add("role", [](const Recommendation& r) {
    return std::string(r.role == "isoflop_optimal" ? "optimal" : "parity-fastest");
  });
  add("layers x d_model", [](const Recommendation& r) {
    return std::to_string(r.shape.n_layers) + " x " + std::to_string(r.shape.d_model);
  });
  add("heads / kv / d_head", [](const Recommendation& r) {
    return std::to_string(r.shape.n_heads) + "/" + std::to_string(r.shape.n_kv_heads) + "/" +
           std::to_string(r.shape.d_head);
  });
  add("d_ff", [](const Recommendation& r) { return std::to_string(r.shape.d_ff); });
  add("aspect d/L",
      [](const Recommendation& r) { return format_fixed(r.shape.aspect_ratio(), 1); });
  add("MoD c / every", [](const Recommendation& r) {
    return r.config.mod.enabled()
               ? format_fixed(r.config.mod.capacity, 3) + " / " + std::to_string(r.config.mod.every)
               : std::string("-");
  });
  add("DAR K / n", [](const Recommendation& r) {
    return r.config.dar.enabled() ? std::to_string(r.config.dar.block_layers) + " / " +
                                        std::to_string(r.config.dar.resolved_streams())
                                  : std::string("-");
  });
  if (std::any_of(recs.begin(), recs.end(),
                  [](const Recommendation& r) { return r.config.moe.enabled(); })) {
    add("experts E x width, top-k",
        [](const Recommendation& r) { return experts_summary(r.config); });
  }
  add("params total", [](const Recommendation& r) { return format_sci(r.params.total, 2); });
  add("params FLOP-active N_f",
      [](const Recommendation& r) { return format_sci(r.params.flop_active, 2); });
  add("  range (eps)", [](const Recommendation& r) {
    return range_text(r.n_flop_active_range, short_sci);
  });
  add("tokens D", [](const Recommendation& r) { return format_sci(r.tokens, 2); });
  add("  range (eps)",
      [](const Recommendation& r) { return range_text(r.tokens_range, short_sci); });
  add("tokens / N_f",
      [](const Recommendation& r) { return format_fixed(r.tokens / r.params.flop_active, 1); });
  add("fwd FLOPs / token",
      [](const Recommendation& r) { return format_sci(r.flops.forward_per_token, 2); });
  add("training FLOPs", [](const Recommendation& r) { return format_sci(r.train_flops_total, 2); });
  add("eps", [](const Recommendation& r) {
    return r.prior.known ? format_fixed(r.prior.eps, 4) : std::string("unknown");
  });
  add("  range", [](const Recommendation& r) {
    return r.prior.known ? range_text(r.eps_range, [](double v) { return format_fixed(v, 3); })
                         : std::string("-");
  });
  add("predicted loss", [](const Recommendation& r) {
    return r.loss ? format_fixed(*r.loss, 4) : std::string("unknown");
  });
  add("  range (eps)", [](const Recommendation& r) {
    return r.loss_range ? range_text(*r.loss_range, [](double v) { return format_fixed(v, 3); })
                        : std::string("-");
  });
  if (request.gpus > 1) {
    // The layout in short rows (the one-line summary is in the note and JSON).
    add("layout TP x PP x DP", [](const Recommendation& r) {
      const ParallelConfig& p = r.config.parallel;
      return std::to_string(p.tensor) + " x " + std::to_string(p.pipeline) + " x " +
             std::to_string(std::max<int64_t>(1, p.data(r.config.device.count)));
    });
    add("  SP / v", [](const Recommendation& r) {
      const ParallelConfig& p = r.config.parallel;
      return std::string(p.sequence_parallel ? "SP" : "-") + " / " +
             std::to_string(p.virtual_stages);
    });
    add("  ZeRO / mb / recompute", [](const Recommendation& r) {
      return std::to_string(r.config.parallel.zero) + " / " +
             std::to_string(r.config.train.micro_batch) + " / " +
             to_string(r.config.train.recompute);
    });
  }
  add("peak memory / device", [](const Recommendation& r) {
    return format_fixed(r.memory.peak / (1024.0 * 1024.0 * 1024.0), 1) + " GiB" +
           (r.memory.fits ? "" : " NO FIT");
  });
  add("step time", [](const Recommendation& r) {
    return format_fixed(r.time.step_s * 1e3, 1) + " ms" + (r.time.extrapolated ? "*" : "");
  });
  add("tokens / s", [](const Recommendation& r) { return format_sci(r.time.tokens_per_s, 2); });
  add("MFU", [](const Recommendation& r) { return format_fixed(100 * r.time.mfu, 1) + "%"; });
  add("wall-clock", [](const Recommendation& r) { return format_fixed(r.train_hours, 1) + " h"; });
  add("x params (vs baseline)",
      [](const Recommendation& r) { return format_fixed(r.ratio_params_total, 2); });
  add("x fwd FLOPs / token",
      [](const Recommendation& r) { return format_fixed(r.ratio_forward_flops, 2); });
  add("x step time", [](const Recommendation& r) { return format_fixed(r.ratio_step_time, 2); });
  add("  range (eps)", [](const Recommendation& r) {
    return range_text(r.step_time_ratio_range, [](double v) { return format_fixed(v, 2); });
  });
  add("x wall-clock", [](const Recommendation& r) { return format_fixed(r.ratio_train_hours, 2); });
  std::vector<std::string> flag_lines;
  {
    std::vector<std::string> cells;
    for (const Recommendation& rec : recs) {
      std::string cell;
      for (const PlannerFlag& flag : rec.flags) {
        std::string line = "[";
        line += std::to_string(flag_lines.size() + 1);
        line += "] ";
        line += rec.arch;
        line += rec.role == "isoflop_optimal" ? " optimal: " : " parity-fastest: ";
        line += flag.code;
        line += ": ";
        line += flag.message;
        flag_lines.push_back(line);
        if (!cell.empty()) {
          cell += ",";
        }
        cell += std::to_string(flag_lines.size());
      }
      cells.push_back(cell.empty() ? "-" : "[" + cell + "]");
    }
    rows.emplace_back("flags", cells);
  }

  size_t label_width = 0;
  std::vector<size_t> widths(recs.size(), 0);
  for (const auto& [label, cells] : rows) {
    label_width = std::max(label_width, label.size());
    for (size_t i = 0; i < cells.size(); ++i) {
      widths[i] = std::max(widths[i], cells[i].size());
    }
  }
  for (const auto& [label, cells] : rows) {
    std::string line = label + std::string(label_width - label.size(), ' ');
    for (size_t i = 0; i < cells.size(); ++i) {
      line += "  " + std::string(widths[i] - cells[i].size(), ' ') + cells[i];
    }
    out += line + "\n";
  }
  out += "\n(* = some op time extrapolated outside the profile's measured grid; ranges: the rule "
         "re-run at both ends of the prior's eps range)\n";
  if (!flag_lines.empty()) {
    out += "\nflags:\n";
    for (const std::string& line : flag_lines) {
      out += "  " + line + "\n";
    }
  }
  if (!result.same_shape.empty()) {
    out += "\nsame shape as the optimal baseline (" +
           std::to_string(recs.front().shape.n_layers) + " x " +
           std::to_string(recs.front().shape.d_model) + ", same FLOP budget):\n";
    for (const SameShapeComparison& same : result.same_shape) {
      out +=
          "  " + same.arch + ": loss " +
          (same.loss ? format_fixed(same.loss->value, 4) + " (" +
                           range_text(*same.loss, [](double v) { return format_fixed(v, 4); }) + ")"
                     : std::string("unknown")) +
          " vs baseline " + format_fixed(same.baseline_loss, 4) + ", x fwd FLOPs/token " +
          format_fixed(same.ratio_forward_flops, 2) + ", x step time " +
          format_fixed(same.ratio_step_time, 2) + (same.fits ? "" : " (NO FIT)") + "\n";
    }
  }
  out += "\npriors:\n";
  for (const EfficiencyPrior& prior : result.priors) {
    out += "  " + prior.key + ": " +
           (prior.known ? "eps = " + format_fixed(prior.eps, 4) : std::string("unknown")) + " -- " +
           prior.source + "\n";
    if (prior.key != "baseline") {
      std::string indented = "    ";
      const std::string text =
          prior.interval.empty() ? prior.derivation : prior.derivation + "\n" + prior.interval;
      for (const char c : text) {
        indented += c;
        if (c == '\n') {
          indented += "    ";
        }
      }
      out += indented + "\n";
    }
  }
  for (const std::string& note : result.notes) {
    out += "note: " + note + "\n";
  }
  // Wrap the conventions at 100 columns, continuation lines indented.
  std::string line = "conventions:";
  for (const std::string& word : split_trimmed(result.conventions, ' ')) {
    if (line.size() + 1 + word.size() > 100) {
      out += line + "\n";
      line = "  ";
    }
    line += (line == "  " ? "" : " ") + word;
  }
  out += line + "\n";
  out += "search: every shape with " + std::to_string(request.shapes.min_layers) + "-" +
         std::to_string(request.shapes.max_layers) + " layers, d_model a multiple of " +
         std::to_string(request.shapes.d_model_multiple) + " (d_head 64 below 2048, else 128), " +
         "aspect d/L in [" + format_number(request.shapes.aspect_min) + ", " +
         format_number(request.shapes.aspect_max) + "]; losses within " +
         format_number(100 * kLossTieRelative) + "% tie, deepest wins; " +
         std::to_string(result.candidates_evaluated) + " shapes scored (the rest provably worse), " +
         std::to_string(result.cost_evaluations) + " timed\n";
  return out;
}

}  // namespace modar
