// modar/layout_search.hpp: the fastest memory-feasible parallel layout of one
// model shape on N GPUs (planner/layout_search.cpp; docs/cluster.md).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "modar/base/run_control.hpp"
#include "modar/config.hpp"
#include "modar/cost_model.hpp"

namespace modar {

// The dimensions a search varies beyond TP (with SP), PP, interleaving, ZeRO
// 1-3 (0 on one replica), micro-batch and recompute.  The planner's default;
// `modar layout` widens it (layout_ranking_dimensions()).
struct LayoutDimensions {
  bool tensor_without_sequence = false;  // also TP > 1 without sequence parallelism
  bool context = false;                  // context parallelism (seq_len % 2 c t == 0, flash)
  bool expert = true;                    // EP x expert TP (t or 1) for models with experts
  bool zero_zero_with_data = false;      // ZeRO 0 also with data parallelism
  std::vector<int64_t> micro_batches = {1, 2, 4};
  std::vector<int64_t> virtual_stages = {1, 2};
  // Tried per layout in this order; the search keeps the first that fits.
  // One entry when the user fixed train.recompute (the planner's
  // --recompute) or train.micro_batch (micro_batches = {it}).
  std::vector<Recompute> recomputes = {Recompute::none, Recompute::selective, Recompute::full};
};

struct LayoutSearchOptions {
  int64_t gpus = 1;
  int64_t gpus_per_node = 0;  // 0: the profile's network (8 without one)
  // Sequences per optimizer step; 0: config.train.global_batch, or when that
  // is 0 the sequences of ~4M tokens (GPT-3's 3.2M rounded up to a power of
  // two), at least one per data-parallel rank.
  int64_t global_batch = 0;
  LayoutDimensions dimensions;
  // search_layout: skip the layouts whose step-time lower bound
  // (cluster_step_lower_bound) cannot beat the fastest found; the answer is
  // the same either way (false: time every layout, the reference the tests
  // compare against).
  bool prune = true;
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
// replica; 1, 2 or 3 otherwise), micro-batch in {1, 2, 4}, for models with
// experts EP (dividing the experts, folded as Megatron-Core does) with expert
// TP = t or 1, and recompute (none, then selective, then full: the first
// that fits) for the fastest step whose peak memory per device fits
// (options.dimensions widens the space).  Model-parallel sizes t x p are
// visited from the smallest; the search stops two doublings past the first
// size that fits.
// `config` must be valid on its own (any [parallel] in it is replaced).
// Layouts whose memory screen (cluster_memory_bound) rules them out are not
// timed; the lowered rank compute is shared by layouts with the same tensor
// size, micro-batch and recompute.
LayoutSearchResult search_layout(const Config& config, const TimingModel& timing,
                                 const LayoutSearchOptions& options);

struct RankCompute;

// What the layout work of one architecture's shapes shares (the planner
// keeps one per architecture it searches), for configurations of one
// architecture base (with_shape + a layout):
// - the layout spaces: shapes with the same depth whose heads, KV heads,
//   d_ff (and expert width) the same tensor sizes divide have the same space;
// - the step bounds' rank computes.  A lowering's per-layer
// times do not depend on the layer count (a model is L copies of its layers
// plus the embedding and the head), so shapes that differ only in depth share
// one lowering per (width, heads, d_ff, tensor size, SP, micro-batch,
// recompute, context and expert layout), lowered at the fewest layers with
// the same kinds of layer (a full one; a MoD-routed one where the shape has
// both).  With DAR (block reads that grow with the depth) or experts (a
// per-layer average over dense and MoE layers) only equal depths share.  For
// step-time bounds only: their per-layer sums differ from the whole model's
// lowering in the last bits, which the bounds' slack (1e-9) covers; the full
// estimates of a layout search lower the whole model as before.
class LayoutCache {
 public:
  LayoutCache();
  ~LayoutCache();
  LayoutCache(const LayoutCache&) = delete;
  LayoutCache& operator=(const LayoutCache&) = delete;
  // rank_compute() of `config` with `layers` layers (shared_layers(config)),
  // lowered once.
  const RankCompute& lowered(const Config& config, int64_t layers, const TimingModel& timing);
  // The layer count `config`'s shape is lowered at.
  static int64_t shared_layers(const Config& config);
  int64_t lowerings() const;

 private:
  friend struct LayoutCacheAccess;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// search_layout() in two steps, for a caller that may not need the second:
// step_floor_s() bounds from below the step time search() will return
// (fitting or not) from the memory screen and the lowered rank computes
// alone, without full estimates; search() then shares those computes.  The
// planner prunes shapes whose floor already rules them out.
class ShapeLayouts {
 public:
  // `shared`: the step bounds' rank computes come from it (null: this
  // shape's own lowerings, shared with the search's estimates).
  ShapeLayouts(const Config& config, const TimingModel& timing, const LayoutSearchOptions& options,
               std::shared_ptr<LayoutCache> shared = nullptr);
  ~ShapeLayouts();
  ShapeLayouts(const ShapeLayouts&) = delete;
  ShapeLayouts& operator=(const ShapeLayouts&) = delete;

  // <= search().estimate.time.step_s: the least step-time lower bound
  // (cluster_step_lower_bound) over the layouts the memory screen
  // (cluster_memory_bound) leaves once it proves that one fits, else over
  // every layout of the space (the least-memory answer may be any).
  double step_floor_s();
  // Tokens per step of every layout (search().estimate.flops.tokens_per_step).
  double tokens_per_step() const;
  LayoutSearchResult search();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

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
                              const LayoutSearchOptions& options,
                              const std::shared_ptr<LayoutCache>& shared = nullptr);

// Sequences per optimizer step the search sizes its layouts for (the
// options', else the config's, else ~4M tokens; see LayoutSearchOptions).
int64_t layout_global_batch(const Config& config, const LayoutSearchOptions& options);

// The one-line layout text of a configuration.
std::string layout_summary(const Config& config);

// ---- `modar layout`: every layout of one model and global batch, ranked ------

// The space `modar layout` ranks: the planner's plus TP without SP, context
// parallelism, ZeRO 0 with data parallelism, micro-batch 8 and interleaving
// v = 4.
LayoutDimensions layout_ranking_dimensions();

struct RankedLayout {
  Config config;        // the model with this layout, micro-batch and recompute
  std::string summary;  // layout_summary()
  bool fits = false;
  double step_s = 0.0;
  double tokens_per_s = 0.0;
  double mfu = 0.0;                // model FLOPs / (step x peak x GPUs)
  double compute_s = 0.0;          // m x the slowest stage's compute
  double exposed_comm_s = 0.0;     // communication on the critical path
  double bubble_s = 0.0;           // pipeline bubble
  MemoryBreakdown memory;          // per device, busiest stage
  std::string binding;             // not fitting: what exceeds the device memory, by how much
};

struct LayoutRanking {
  int64_t gpus = 1;
  int64_t gpus_per_node = 8;
  int64_t global_batch = 0;         // sequences per step, the same for every layout
  std::string global_batch_source;  // "--global-batch", "train.global_batch" or the default's rule
  double tokens_per_step = 0.0;
  double device_memory_bytes = 0.0;
  std::string profile_name;
  std::vector<RankedLayout> fitting;      // fastest step first
  std::vector<RankedLayout> not_fitting;  // least memory per device first
  int64_t considered = 0;  // layouts of the space (every recompute choice counted)
  // Sizes of the space that cannot run this global batch or model, once each
  // ("micro-batch 4 x data 8 = 32 does not divide the global batch 48", ...).
  std::vector<std::string> skipped;
};

// Every valid layout of `config`'s model on options.gpus devices (the space
// of options.dimensions; layout_ranking_dimensions() for `modar layout`),
// each estimated in full with recompute none, selective and full, at one
// global batch (layout_global_batch()).  Library errors name request fields
// ("gpus", "global_batch").  `control` reports progress (layouts done of
// `considered`, with an ETA) and stops the ranking (Interrupted) between
// layouts.
LayoutRanking rank_layouts(const Config& config, const TimingModel& timing,
                           const LayoutSearchOptions& options, const RunControl& control = {});
// ---- the request of `modar layout` / modar.layout (planner/layout_request.cpp) --

constexpr int64_t kMaxLayoutGpus = int64_t{1} << 24;   // device.count's bound
constexpr int64_t kMaxGpusPerNode = 1024;
constexpr int64_t kMaxGlobalBatch = int64_t{1} << 40;  // sequences per step
constexpr int64_t kDefaultLayoutTop = 20;
constexpr int64_t kMaxLayoutTop = 100000;

// What the user asked (the CLI's flags, Python's arguments), nothing filled
// in; resolve_layout() applies the defaults and checks every field, its
// errors naming these fields ("gpus = 0: must be in [1, 16777216]").
struct LayoutRequest {
  std::optional<int64_t> gpus;           // required; [1, 2^24]
  std::optional<int64_t> gpus_per_node;  // [1, 1024]; default the profile's network (8 without)
  std::optional<int64_t> global_batch;   // sequences per step, [1, 2^40]; default
                                         // train.global_batch, else ~4M tokens
  std::optional<int64_t> top;            // rows of each table, [1, 100000]; default 20
};
struct LayoutSettings {
  LayoutSearchOptions options;  // the request's sizes; layout_ranking_dimensions()
  size_t top = 20;
};
LayoutSettings resolve_layout(const LayoutRequest& request);

// The JSON document `modar layout --json` prints (every layout).
std::string to_json(const LayoutRanking& ranking);
// The text table: the `top` fastest layouts that fit, then up to `top` that
// do not with their binding constraint.
std::string to_table(const LayoutRanking& ranking, size_t top);

}  // namespace modar
