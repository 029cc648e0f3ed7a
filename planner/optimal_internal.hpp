// The pieces `modar optimal` assembles a result from (planner/optimal_trust.cpp):
// a recommendation built from a chosen point of the search, its ratios and
// eps ranges against the optimal baseline, the flags and notes that say how
// far to trust it.
// Not a public header.
#pragma once

#include <string>

#include "modar/planner.hpp"
#include "optimal_search.hpp"

namespace modar::detail {

// The recommendation of `point` (its estimate, tokens, loss at the prior and
// at both ends of the prior's range).
Recommendation make_recommendation(const std::string& arch, const std::string& role,
                                   const std::string& selection, ArchSpace& space, Point& point,
                                   const EfficiencyPrior& prior);
// Ratios of `rec` to the optimal baseline.
void set_ratios(Recommendation& rec, const Recommendation& baseline);
// Where the rule lands at both ends of the prior's range (the points the rule
// chose at eps_low / eps_high; -1: no answer there).
void set_ranges(Recommendation& rec, ArchSpace& space, int low_index, int high_index,
                double baseline_step_s, double baseline_forward_flops);
void add_flag(Recommendation& rec, const std::string& code, const std::string& message);
// Flags that depend only on the recommendation and its prior.
void flag_trust(Recommendation& rec);
// The shape search space in one line.
std::string space_text(const ShapeSearchOptions& options);
// Loss-optimal (scaling law alone) vs the recommended model that fits: say so,
// and which constraint binds, when they differ (never shrink silently).
void append_fit_notes(OptimalResult& result, const LossFitParams& law, double centre_flops);
// "device memory (141.0 GiB, micro-batch 8, recompute none)": what a shape
// must fit in, for the selection texts.
std::string memory_text(const PlannerRun& run);

}  // namespace modar::detail
