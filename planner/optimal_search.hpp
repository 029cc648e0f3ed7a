// The search behind `modar optimal` and `modar sweep` (planner/optimal_search.cpp):
// the lazily evaluated shape space of one architecture, the cost of a shape
// on the hardware (one device, or its best layout on a cluster), and the
// three selection rules: the isoFLOP argmin, the fastest shape at parity
// with the optimal baseline, and the unknown-prior FLOPs match.
//
// The optimum is the argmin of the predicted loss over EVERY shape the search
// space allows (docs/planner.md "Choosing configurations"), not over a pruned
// curve.  It is found without evaluating the whole space: every shape has
// D <= C_bound / (6 N_f) (F_train = 3 (2 N_f + attention) >= 6 N_f, and under
// a wall-clock budget a step never beats the device's peak FLOP rate), so
//     L(shape) >= g(N_f) = t (E + s_p A / N_f^alpha + s_d B (C_bound / (6 N_f))^-beta),
// a convex function of log N_f.  Once some shape reaches loss L, no shape
// with g(N_f) > L can beat it; the search enumerates every shape in the N_f
// interval where g <= L (widening until the interval is covered), so its
// argmin is the argmin of the whole space.  The parity search prunes the
// same way, and orders its step-time evaluations by a FLOP lower bound on the
// step time.
//
// Not a public header.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "modar/layout_search.hpp"
#include "modar/planner.hpp"

namespace modar::detail {

// Rough MFU used only to centre the first window of a wall-clock budget (the
// window is widened until the bound above proves the argmin, so this never
// decides).
constexpr double kGridCentreMfu = 0.4;
// The unknown-prior rule (MoD paper section 4.1): shapes whose forward FLOPs
// per token are within this relative distance of the optimal baseline's tie;
// the deepest wins.
constexpr double kFlopsTieRelative = 0.02;

// One shape of the space with what has been computed for it so far.
struct Point {
  ShapeCandidate candidate;
  std::optional<double> tokens;           // what the budget buys (lazy)
  std::optional<MemoryBreakdown> memory;  // lazy, cheap (counts only)
  std::optional<Estimate> estimate;       // lazy: memory + step time
  std::optional<Config> layout;           // gpus > 1: the shape with its chosen layout
  std::optional<bool> layout_fits;        // gpus > 1: some layout fits (memory screen)
  // gpus > 1 under a wall-clock budget: the least step-time lower bound over
  // the shape's layouts (ShapeLayouts::step_floor_s) and their tokens per
  // step (lazy), and the layouts lowered for it until the layout search.
  std::optional<double> step_floor_s;
  double layout_tokens_per_step = 0.0;
  std::shared_ptr<ShapeLayouts> layouts;
};

// What a shape's tokens are bought with: training FLOPs, device-hours on the
// run's GPUs, or the tighter of both.
struct Budget {
  std::optional<double> train_flops;
  std::optional<double> gpu_hours;
};

// Cost of a candidate on the hardware.  cost_of() is the one place a
// candidate's memory per device and step time are computed (a multi-device
// layout search plugs in here: per candidate, its best layout's estimate).
// Costs do not depend on the budget: a sweep keeps one evaluator (and its
// spaces' estimates) over its budgets, set_budget() between them.
class Evaluator {
 public:
  Evaluator(const PlannerRun& run, const Budget& budget);
  // A new budget; the tokens cached in the points of every space built on
  // this evaluator must be forgotten (ArchSpace::forget_tokens).
  void set_budget(const Budget& budget) { budget_ = budget; }
  // Progress and Ctrl-C checks between costly evaluations (may be null).
  void set_reporter(RunReporter* reporter) { reporter_ = reporter; }

  const Estimate& cost_of(const Config& arch_base, Point& point);
  // The memory-only part of cost_of(), without lowering the step (cheap: it
  // screens every candidate).  A layout search must answer both consistently.
  // `computes`: what `arch_base`'s layout work shares (ArchSpace).
  bool fits(const Config& arch_base, Point& point,
            const std::shared_ptr<LayoutCache>& computes = nullptr);
  // Tokens the budget buys for this configuration.
  double tokens_for(const Config& arch_base, Point& point);
  // FLOPs C_bound with D <= C_bound / (6 N_f) for every shape (and D <=
  // C_bound / its training FLOPs per token: tokens_bound()).
  double token_bound_flops() const;
  // A bound on tokens_for(point) from above without costing it: its training
  // FLOPs per token at the budget's FLOP bound (a wall-clock step never runs
  // faster than the rate ceiling); equal to it for a FLOP budget.
  double tokens_bound(const Point& point) const {
    return token_bound_flops() / point.candidate.train_flops_per_token;
  }
  // A tighter bound on tokens_for(point) on a cluster under a wall-clock
  // budget: the budget's seconds at the shape's layouts' step floor (lowers
  // the shape's rank computes, no memory screen or full estimate); else
  // tokens_bound(); tokens_for() once the point is costed.
  // `computes`: the rank computes `arch_base`'s floors share (ArchSpace).
  double tokens_floor_bound(const Config& arch_base, Point& point,
                            const std::shared_ptr<LayoutCache>& computes);
  // The floor itself (nullopt where no layout search costs the point).
  std::optional<double> step_floor(const Config& arch_base, Point& point,
                                   const std::shared_ptr<LayoutCache>& computes);
  // Step time can be no shorter than the step's model FLOPs at the rate
  // ceiling (model_flop_rate_ceiling).
  double step_time_lower_bound(const Config& arch_base, const Point& point) const;
  LayoutSearchOptions layout_options() const;

  bool bound_holds() const { return bound_holds_ && peak_rate_ > 0; }
  bool wall_clock() const { return budget_.gpu_hours.has_value(); }
  const Budget& budget() const { return budget_; }
  const LossFitParams& law() const { return run_.fit.params; }
  const PlannerRun& run() const { return run_; }
  int64_t cost_evaluations() const { return cost_evaluations_; }
  int64_t layouts_evaluated() const { return layouts_evaluated_; }
  int64_t layouts_timed() const { return layouts_timed_; }
  void count_candidates(int64_t n) { candidates_ += n; }
  int64_t candidates() const { return candidates_; }

 private:
  void check() {
    if (reporter_ != nullptr) {
      reporter_->tick();
    }
  }

  const PlannerRun& run_;
  Budget budget_;
  const TimingModel timing_;  // the profile pre-indexed once for every point
  OpList scratch_;
  RunReporter* reporter_ = nullptr;
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
  // `prior` says where an eps acts (loss_scale: the parameter term, or MoD's
  // whole reducible loss).
  ArchSpace(const Config& arch_base, const ShapeSearchOptions& options, Evaluator& evaluator,
            const EfficiencyPrior& prior);

  // Make sure every shape with N_f in [low, high] is in points().  Points are
  // appended, never reordered: indices into points() stay valid.
  void cover(double low, double high);
  void cover_everything() { cover(0.0, INFINITY); }
  bool complete() const { return covered_ && low_ <= smallest_ && high_ >= largest_; }

  // The prior's eps (or an end of its range) where the prior acts.
  LossScale scale(double eps) const { return loss_scale(prior_, eps); }
  double loss(Point& point, double eps);
  // A bound on loss(point, eps) from below without costing the point (its
  // tokens at Evaluator::tokens_bound; the loss falls with tokens); equal to
  // it for a FLOP budget.
  double loss_bound(const Point& point, double eps) const {
    return predicted_loss(evaluator_.law(), scale(eps), point.candidate.params.flop_active,
                          evaluator_.tokens_bound(point));
  }
  // The loss of `point`, or nullopt when its layouts' step floor already puts
  // it above `limit` (Evaluator::tokens_floor_bound: no layout search).
  std::optional<double> loss_unless_above(Point& point, double eps, double limit);
  // After Evaluator::set_budget: what the points' budget bought is stale.
  void forget_tokens();
  // Indices of points() in order of N_f.
  std::vector<int> by_n_f() const;

  std::vector<Point>& points() { return points_; }
  const Config& arch_base() const { return arch_base_; }
  // The rank computes this architecture's step floors share.
  const std::shared_ptr<LayoutCache>& computes() const { return computes_; }
  Evaluator& evaluator() { return evaluator_; }
  double smallest() const { return smallest_; }
  double largest() const { return largest_; }

 private:
  Config arch_base_;
  std::shared_ptr<LayoutCache> computes_ = std::make_shared<LayoutCache>();
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
                                                        double bound_flops, double loss);

struct Argmin {
  int index = -1;               // the recommendation
  int unconstrained = -1;       // argmin ignoring memory
  bool fits = true;             // some shape fits
  bool memory_decided = false;  // the unconstrained argmin does not fit
};

// The argmin of the predicted loss at `eps` over every shape of the space
// that fits in memory (over all shapes when none fits).
Argmin isoflop_argmin(ArchSpace& space, double eps, double centre_flops);

// Where a budget's compute-optimal N_f (the closed form at `scale`) lies
// against the shapes of an architecture: outside them no shape answers.
struct SearchRange {
  double n_opt = 0.0;     // the closed form's N_f* at the budget
  double smallest = 0.0;  // N_f of the smallest / largest shape of the space
  double largest = 0.0;
  double min_flops = 0.0;  // the budgets whose N_f* reaches them
  double max_flops = 0.0;
  bool too_small() const { return n_opt < smallest; }
  bool too_large() const { return n_opt > largest; }
};
SearchRange search_range(const Config& arch_base, const ShapeSearchOptions& shapes,
                         const LossFitParams& law, LossScale scale, double flops);

// Size of a candidate in the prior's measure.
double prior_size(const EfficiencyPrior& prior, const ParamCounts& params);

// The fastest-stepping shape whose predicted loss at `eps` is <= target_loss.
// With `supported`, only shapes no smaller than the smallest model the prior
// was measured at and within the fit's tokens-per-parameter band count
// (docs/planner.md "Sanity bound").  -1: none.
int fastest_at_parity(ArchSpace& space, double eps, double target_loss,
                      const EfficiencyPrior& prior, bool supported);

// The unknown-prior rule: the shape whose forward FLOPs per token match the
// optimal baseline's (within kFlopsTieRelative; deepest wins), among shapes
// that fit.
int flops_match(ArchSpace& space, double target_forward_flops, double baseline_n_f);

}  // namespace modar::detail
