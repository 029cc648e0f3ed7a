// modar/layout_search.hpp: the fastest memory-feasible parallel layout of one
// model shape on N GPUs (planner/layout_search.cpp; docs/cluster.md).
#pragma once

#include <cstdint>
#include <optional>
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
  // Fixed by the user instead of searched: the micro-batch (0: search 1, 2,
  // 4) and the recompute mode (nullopt: the least of none, selective, full
  // that fits).
  int64_t micro_batch = 0;
  std::optional<Recompute> recompute;
};

struct LayoutSearchResult {
  Config config;      // the shape with the chosen [parallel], micro-batch, recompute
  Estimate estimate;  // its cluster estimate
  bool fits = false;  // false: no layout fits; the least-memory one is returned
  int64_t evaluated = 0;  // layouts considered (memory screened, or estimated)
  int64_t timed = 0;      // of them, estimated in full (lowered and timed)
  std::string summary;  // "TP 8 (SP) x PP 4 (v 2) x DP 32, ZeRO 1, mb 1, recompute selective"
};

// Searches TP (dividing heads, KV heads and d_ff; <= GPUs per node), PP
// (dividing GPUs / TP, <= layers), interleaving (v in {1, 2}), ZeRO (0 on one
// replica; 1, 2 or 3 otherwise), micro-batch in {1, 2, 4} and recompute (none,
// then selective, then full: the first that fits) for the fastest step whose
// peak memory per device fits.  Model-parallel sizes t x p are visited from
// the smallest; the search stops two doublings past the first size that fits.
// `config` must be valid on its own (any [parallel] in it is replaced).
// Layouts whose memory screen (cluster_memory_bound) rules them out are not
// timed; the lowered rank compute is shared by layouts with the same tensor
// size, micro-batch and recompute.
LayoutSearchResult search_layout(const Config& config, const TimingModel& timing,
                                 const LayoutSearchOptions& options);

struct LayoutFeasibility {
  bool fits = false;     // exactly search_layout(...).fits
  int64_t screened = 0;  // layouts whose memory was screened
  int64_t timed = 0;     // layouts estimated in full (the screen was not exact)
};
// Does some layout of search_layout()'s space fit the device memory?  Memory
// only: exact per-device memory where the stage partition does not depend on
// time (one pipeline chunk), a lower bound elsewhere, confirmed by a full
// estimate of that layout only when the bound cannot decide.  What the
// planner asks of every candidate shape (docs/cluster.md "Memory screen").
LayoutFeasibility layout_fits(const Config& config, const TimingModel& timing,
                              const LayoutSearchOptions& options);

// Sequences per optimizer step the search sizes its layouts for (the
// options', else the config's, else ~4M tokens; see LayoutSearchOptions).
int64_t layout_global_batch(const Config& config, const LayoutSearchOptions& options);

// The one-line layout text of a configuration.
std::string layout_summary(const Config& config);

}  // namespace modar
