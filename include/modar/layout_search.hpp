// modar/layout_search.hpp: the fastest memory-feasible parallel layout of one
// model shape on N GPUs (planner/layout_search.cpp; docs/cluster.md).
#pragma once

#include <cstdint>
#include <string>

#include "modar/config.hpp"
#include "modar/cost_model.hpp"

namespace modar {

struct LayoutSearchOptions {
  int64_t gpus = 1;
  int64_t gpus_per_node = 0;  // 0: the profile's network (8 without one)
  // Sequences per optimizer step; 0: config.train.global_batch, or when that
  // is 0 the sequences of ~4M tokens (GPT-3's 3.2M rounded up to a power of
  // two), at least one per data-parallel rank.
  int64_t global_batch = 0;
};

struct LayoutSearchResult {
  Config config;      // the shape with the chosen [parallel], micro-batch, recompute
  Estimate estimate;  // its cluster estimate
  bool fits = false;  // false: no layout fits; the least-memory one is returned
  int64_t evaluated = 0;
  std::string summary;  // "TP 8 (SP) x PP 4 (v 2) x DP 32, ZeRO 1, mb 1, recompute selective"
};

// Searches TP (dividing heads, KV heads and d_ff; <= GPUs per node), PP
// (dividing GPUs / TP, <= layers), interleaving (v in {1, 2}), ZeRO (0 on one
// replica; 1 or 3 otherwise), micro-batch in {1, 2, 4} and recompute (none,
// then selective, then full: the first that fits) for the fastest step whose
// peak memory per device fits.  Model-parallel sizes t x p are visited from
// the smallest; the search stops two doublings past the first size that fits.
// `config` must be valid on its own (any [parallel] in it is replaced).
LayoutSearchResult search_layout(const Config& config, const TimingModel& timing,
                                 const LayoutSearchOptions& options);

// The one-line layout text of a configuration.
std::string layout_summary(const Config& config);

}  // namespace modar
