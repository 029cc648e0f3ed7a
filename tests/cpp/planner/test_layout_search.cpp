// Cluster planning (docs/cluster.md): the layout search returns the fastest
// memory-feasible layout (checked against brute force through estimate()),
// `optimal --gpus 1024` lands near the closed-form optimum with a layout, and
// on one GPU the loss-optimal model that does not fit is named, not hidden.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "modar/cost_model.hpp"
#include "modar/base/errors.hpp"
#include "modar/layout_search.hpp"
#include "modar/parallel.hpp"
#include "modar/planner.hpp"

namespace modar {
namespace {

// d 1024, 8 layers, 8 heads, vocabulary 8192, s 512 on an A100 (the
// brute-force and screen tests' dense shape).
Config small_dense() {
  Config c;
  c.model = {.d_model = 1024, .n_layers = 8, .n_heads = 8, .vocab_size = 8192, .seq_len = 512};
  c.device.profile = "a100-80gb-dgx";
  return c;
}

// An A100 whose device memory is `memory_bytes` (a tight one forces model
// parallelism or sharding), with its timing model (which holds a reference
// to the profile, hence the pair).
struct A100WithMemory {
  explicit A100WithMemory(double memory_bytes)
      : profile(with_memory(load_profile("a100-80gb-dgx"), memory_bytes)), timing(profile) {}
  static DeviceProfile with_memory(DeviceProfile p, double memory_bytes) {
    p.ceilings.memory_bytes = memory_bytes;
    return p;
  }
  DeviceProfile profile;
  TimingModel timing;
};

LayoutSearchOptions search_options(int64_t gpus, int64_t global_batch) {
  LayoutSearchOptions options;
  options.gpus = gpus;
  options.global_batch = global_batch;
  return options;
}

TEST(LayoutSearch, FastestFeasibleLayoutMatchesBruteForce) {
  Config c = small_dense();
  const A100WithMemory tight(1.2e9);  // tight: forces model parallelism or sharding
  const TimingModel& timing = tight.timing;
  const LayoutSearchOptions options = search_options(4, 16);
  const LayoutSearchResult found = search_layout(c, timing, options);
  ASSERT_TRUE(found.fits);
  // Brute force over the same space through the public estimate().
  double best = INFINITY;
  for (int64_t t : {1, 2, 4}) {
    for (int64_t p : {1, 2, 4}) {
      if (t * p > 4) {
        continue;
      }
      const int64_t dp = 4 / (t * p);
      for (int64_t v : {1, 2}) {
        if (v == 2 && p == 1) {
          continue;
        }
        for (int64_t mb : {1, 2, 4}) {
          if (16 % (mb * dp) != 0) {
            continue;
          }
          for (int64_t zero : {0, 1, 2, 3}) {  // the searched stages
            if ((dp == 1) != (zero == 0)) {
              continue;
            }
            for (Recompute r : {Recompute::none, Recompute::selective, Recompute::full}) {
              Config k = c;
              k.device.count = 4;
              k.cluster.gpus_per_node = 8;
              k.parallel.tensor = t;
              k.parallel.sequence_parallel = t > 1;
              k.parallel.pipeline = p;
              k.parallel.schedule =
                  v > 1 ? PipelineSchedule::interleaved : PipelineSchedule::one_f_one_b;
              k.parallel.virtual_stages = v;
              k.parallel.zero = zero;
              k.train.micro_batch = mb;
              k.train.global_batch = 16;
              k.train.recompute = r;
              const Estimate e = estimate(k, tight.profile);
              if (e.memory.fits) {
                best = std::min(best, e.time.step_s);
              }
            }
          }
        }
      }
    }
  }
  EXPECT_NEAR(found.estimate.time.step_s, best, 1e-9 * best);
  EXPECT_FALSE(found.summary.empty());
}

// The shapes the screen tests run on: dense, MoD, DAR and MoD + DAR, with an
// odd layer count (uneven chunks) for the dense one.
std::vector<Config> screen_shapes() {
  const Config dense = small_dense();
  Config odd = dense;
  odd.model.n_layers = 7;
  Config mod = dense;
  mod.mod.every = 2;
  Config dar = dense;
  dar.dar.variant = DarVariant::dar;
  dar.dar.block_layers = 2;
  Config both = mod;
  both.dar = dar.dar;
  both.model.n_layers = 10;
  return {dense, odd, mod, dar, both};
}

// screen_shapes() and a MoE one (8 experts, top-2; expert parallelism).
std::vector<Config> screen_shapes_with_moe() {
  std::vector<Config> shapes = screen_shapes();
  Config moe = shapes.front();
  moe.moe.experts = 8;
  moe.moe.top_k = 2;
  moe.moe.expert_ffn = 1024;
  shapes.push_back(moe);
  return shapes;
}

// The memory screen against the full cluster model on a grid of shapes and
// layouts: exact where it says so, never above the full peak elsewhere, and
// never rejecting a layout the full model accepts (capacity = its peak).
TEST(LayoutSearch, MemoryScreenNeverRejectsWhatTheFullModelAccepts) {
  const DeviceProfile a100 = load_profile("a100-80gb-dgx");
  int64_t checked = 0, exact = 0, bounded = 0;
  for (const Config& shape : screen_shapes()) {
    for (int64_t t : {1, 2}) {
      for (int64_t p : {1, 2, 4}) {
        for (int64_t v : {1, 2}) {
          if (v == 2 && (p == 1 || shape.model.n_layers < 2 * p)) {
            continue;
          }
          for (int64_t zero : {0, 1, 2, 3}) {
            for (int64_t mb : {1, 2}) {
              for (Recompute r : {Recompute::none, Recompute::selective, Recompute::full}) {
                for (bool sp : {false, true}) {
                  if (sp && t == 1) {
                    continue;
                  }
                  for (bool balance : {true, false}) {
                    Config c = shape;
                    c.device.count = t * p * 2;
                    c.cluster.gpus_per_node = 8;
                    c.parallel.tensor = t;
                    c.parallel.sequence_parallel = sp;
                    c.parallel.pipeline = p;
                    c.parallel.schedule = v > 1 ? PipelineSchedule::interleaved
                                                : PipelineSchedule::one_f_one_b;
                    c.parallel.virtual_stages = v;
                    c.parallel.zero = zero;
                    c.parallel.balance_stages = balance;
                    c.train.micro_batch = mb;
                    c.train.global_batch = 8;
                    c.train.recompute = r;
                    validate(c);
                    const double full = estimate(c, a100).memory.peak;
                    DeviceProfile tight = a100;
                    tight.ceilings.memory_bytes = full;  // the full model just fits
                    const ClusterMemoryBound bound = cluster_memory_bound(c, tight);
                    SCOPED_TRACE(layout_summary(c) + " L " + std::to_string(c.model.n_layers) +
                                 " mod " + std::to_string(c.mod.every) + " dar " +
                                 std::to_string(c.dar.enabled()) + " balance " +
                                 std::to_string(balance));
                    ++checked;
                    EXPECT_TRUE(bound.may_fit());
                    if (bound.exact) {
                      ++exact;
                      EXPECT_NEAR(bound.peak, full, 1e-12 * full);
                      EXPECT_TRUE(bound.fits());
                    } else {
                      ++bounded;
                      EXPECT_LE(bound.peak, full * (1 + 1e-12));
                      EXPECT_GT(bound.peak, 0.5 * full);  // a bound that screens something
                      tight.ceilings.memory_bytes = full * (1 - 1e-6);
                      EXPECT_FALSE(cluster_memory_bound(c, tight).fits());
                    }
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(exact, 100);
  EXPECT_GT(bounded, 100);
  EXPECT_EQ(checked, exact + bounded);
}

// The step-time lower bound the search prunes with, against the full
// cluster estimate on a grid of shapes (dense, odd layer count, MoD, DAR,
// MoE with EP), layouts and ZeRO stages (2 and 3 reduce per micro-batch, 3
// shares the data-parallel channel with its layer gathers): never above the
// step of the layout, nor of the same layout with more recompute.  Without
// the overlapped reduction the bound leaves the data-parallel channel out:
// the channel term must raise it somewhere (it binds).
TEST(LayoutSearch, StepLowerBoundNeverExceedsTheStep) {
  const std::vector<Config> shapes = screen_shapes_with_moe();
  const DeviceProfile a100 = load_profile("a100-80gb-dgx");
  const TimingModel timing(a100);
  int64_t checked = 0, one_stage = 0, tight = 0, channel_binds = 0;
  for (const Config& shape : shapes) {
    for (int64_t t : {1, 2}) {
      for (int64_t p : {1, 2, 4}) {
        for (int64_t v : {1, 2}) {
          if (v == 2 && (p == 1 || shape.model.n_layers < 2 * p)) {
            continue;
          }
          for (int64_t ep : {1, 2}) {
            if (ep > 1 && !shape.moe.enabled()) {
              continue;
            }
            for (int64_t zero : {int64_t{-1}, int64_t{2}, int64_t{3}}) {
              if (zero > 0 && t * p == 8) {
                continue;  // ZeRO needs two data-parallel ranks
              }
              Config c = shape;
              c.device.count = 8;
              c.cluster.gpus_per_node = 4;  // some groups cross nodes
              c.parallel.tensor = t;
              c.parallel.sequence_parallel = t > 1;
              c.parallel.pipeline = p;
              c.parallel.virtual_stages = v;
              c.parallel.schedule =
                  v > 1 ? PipelineSchedule::interleaved : PipelineSchedule::one_f_one_b;
              c.parallel.expert = ep;
              c.parallel.zero = zero >= 0 ? zero : (t * p < 8 ? 1 : 0);
              c.train.global_batch = 64;
              c.train.recompute = Recompute::none;
              try {
                validate(c);
              } catch (const ConfigError&) {
                continue;  // an expert group the stage's ranks cannot fold
              }
              const RankCompute compute = rank_compute(c, timing);
              const double bound = cluster_step_lower_bound(c, timing, compute);
              Config unoverlapped = c;
              unoverlapped.parallel.overlap_grad_reduce = false;
              channel_binds +=
                  bound > cluster_step_lower_bound(unoverlapped, timing, compute) * (1.0 + 1e-9)
                      ? 1
                      : 0;
              for (Recompute r : {Recompute::none, Recompute::selective, Recompute::full}) {
                c.train.recompute = r;
                const Estimate e = estimate(c, a100);
                ASSERT_NE(e.cluster, nullptr);
                SCOPED_TRACE("t " + std::to_string(t) + " p " + std::to_string(p) + " v " +
                             std::to_string(v) + " ep " + std::to_string(ep) + " zero " +
                             std::to_string(c.parallel.zero) + " recompute " + to_string(r) +
                             " L " + std::to_string(shape.model.n_layers));
                EXPECT_LE(bound, e.cluster->step_s * (1.0 + 1e-12));
                ++checked;
                if (r == Recompute::none && p == 1) {
                  // One stage: what the bound leaves out is the data-parallel
                  // tail and the optimizer only (a quarter of these small
                  // steps at most), so the bound is not a trivial one.
                  ++one_stage;
                  tight += bound > 0.6 * e.cluster->step_s ? 1 : 0;
                }
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 500);
  EXPECT_GT(one_stage, 40);
  EXPECT_EQ(tight, one_stage);
  EXPECT_GT(channel_binds, 20);
}

// The pruned search returns exactly the unpruned one's layout and step (the
// bound only skips what could not win), over shapes, device memories and
// GPU counts, with expert parallelism and the ranking's wider space; the
// planner's ShapeLayouts floor never exceeds that step (fitting or not) and
// its search after the floor is the same search.
TEST(LayoutSearch, PrunedSearchEqualsTimingEveryLayout) {
  const std::vector<Config> shapes = screen_shapes_with_moe();
  int64_t compared = 0, skipped = 0, floors_without_fit = 0, floors_within_10_percent = 0;
  for (const Config& shape : shapes) {
    for (const double capacity : {0.6e9, 1.2e9, 80e9}) {
      for (int64_t gpus : {4, 8}) {
        for (const bool wide : {false, true}) {
          const A100WithMemory a100(capacity);
          const TimingModel& timing = a100.timing;
          LayoutSearchOptions options = search_options(gpus, 32);
          if (wide) {
            options.dimensions = layout_ranking_dimensions();
          }
          options.prune = false;
          const LayoutSearchResult every = search_layout(shape, timing, options);
          options.prune = true;
          const LayoutSearchResult pruned = search_layout(shape, timing, options);
          SCOPED_TRACE("capacity " + std::to_string(capacity) + " gpus " + std::to_string(gpus) +
                       " L " + std::to_string(shape.model.n_layers) + (wide ? " wide" : ""));
          EXPECT_EQ(pruned.fits, every.fits);
          EXPECT_EQ(pruned.summary, every.summary);
          EXPECT_EQ(config_values(pruned.config), config_values(every.config));
          EXPECT_EQ(pruned.estimate.time.step_s, every.estimate.time.step_s);
          EXPECT_LE(pruned.timed, every.timed);
          skipped += every.timed - pruned.timed;
          // The planner's two steps: the step floor (the bounds of the layouts
          // the memory screen leaves, every layout's without a proven fit),
          // then the search on the same lowered computes.
          ShapeLayouts layouts(shape, timing, options);
          const double floor_s = layouts.step_floor_s();
          const LayoutSearchResult after_floor = layouts.search();
          EXPECT_LE(floor_s, every.estimate.time.step_s);
          EXPECT_EQ(layouts.tokens_per_step(), every.estimate.flops.tokens_per_step);
          EXPECT_EQ(after_floor.summary, every.summary);
          EXPECT_EQ(after_floor.estimate.time.step_s, every.estimate.time.step_s);
          EXPECT_EQ(after_floor.timed, pruned.timed);
          floors_without_fit += every.fits ? 0 : 1;
          floors_within_10_percent += floor_s > 0.9 * every.estimate.time.step_s ? 1 : 0;
          ++compared;
        }
      }
    }
  }
  EXPECT_EQ(compared, 72);
  EXPECT_GT(skipped, 0);             // the bound does prune
  EXPECT_GT(floors_without_fit, 0);  // the floor bounds the least-memory answer too
  EXPECT_GT(floors_within_10_percent, 0);
}

// The planner's shared layout work (LayoutCache, one per architecture):
// shapes of one architecture base at several depths and head counts, visited
// through one cache, get the floors and searches of unshared ShapeLayouts
// (the reference: every shape lowered whole, its own layout space).  The
// floors of dense and MoD shapes come from a lowering at fewer layers: equal
// to the last bits; DAR and MoE share only equal depths: equal.  A dense
// architecture lowers once per width and layout whatever the depths.
TEST(LayoutSearch, SharedLayoutWorkGivesTheUnsharedFloorsAndSearches) {
  int64_t compared = 0, searched_model_parallel = 0;
  for (const Config& base : screen_shapes_with_moe()) {
    for (const double capacity : {0.35e9, 80e9}) {
      const A100WithMemory a100(capacity);
      const TimingModel& timing = a100.timing;
      const LayoutSearchOptions options = search_options(8, 32);
      const auto cache = std::make_shared<LayoutCache>();
      for (const int64_t heads : {4, 8}) {  // TP 8 divides the heads of one only
        for (const int64_t layers : {8, 3, 12, 4}) {
          Config shape = base;
          shape.model.n_layers = layers;
          shape.model.n_heads = heads;
          SCOPED_TRACE("capacity " + std::to_string(capacity) + " heads " +
                       std::to_string(heads) + " L " + std::to_string(layers) + " mod " +
                       std::to_string(base.mod.every) + " dar " +
                       std::to_string(base.dar.enabled()) + " moe " +
                       std::to_string(base.moe.enabled()));
          EXPECT_EQ(layout_fits(shape, timing, options, cache).fits,
                    layout_fits(shape, timing, options).fits);
          ShapeLayouts own(shape, timing, options);
          ShapeLayouts shared(shape, timing, options, cache);
          const double own_floor = own.step_floor_s();
          const double shared_floor = shared.step_floor_s();
          if (base.dar.enabled() || base.moe.enabled()) {
            EXPECT_EQ(shared_floor, own_floor);
          } else {
            EXPECT_NEAR(shared_floor, own_floor, 1e-12 * own_floor);
          }
          const LayoutSearchResult a = own.search();
          const LayoutSearchResult b = shared.search();
          EXPECT_EQ(b.fits, a.fits);
          EXPECT_EQ(b.summary, a.summary);
          EXPECT_EQ(config_values(b.config), config_values(a.config));
          EXPECT_EQ(b.estimate.time.step_s, a.estimate.time.step_s);
          EXPECT_EQ(b.timed, a.timed);
          EXPECT_LE(shared_floor, b.estimate.time.step_s);
          searched_model_parallel += b.config.parallel.tensor * b.config.parallel.pipeline > 1;
          ++compared;
        }
      }
      if (!base.dar.enabled() && !base.moe.enabled() && base.mod.every == 0) {
        // Bounds lower recompute none only: per head count at most 4 tensor
        // sizes x 3 micro-batches, whatever the 4 depths.
        EXPECT_LE(cache->lowerings(), 2 * 4 * 3);
        EXPECT_GT(cache->lowerings(), 0);
      }
    }
  }
  EXPECT_EQ(compared, 6 * 2 * 2 * 4);
  EXPECT_GT(searched_model_parallel, 0);
}

// layout_fits() answers exactly what search_layout() finds, over shapes and
// device memories from "everything fits" to "nothing fits".
TEST(LayoutSearch, LayoutFitsAgreesWithTheFullSearch) {
  int agreed_fit = 0, agreed_no_fit = 0;
  for (const Config& shape : screen_shapes()) {
    for (const double capacity : {0.3e9, 0.45e9, 0.6e9, 0.8e9, 1.2e9, 2e9, 80e9}) {
      for (int64_t gpus : {2, 4, 8}) {
        const A100WithMemory a100(capacity);
        const TimingModel& timing = a100.timing;
        const LayoutSearchOptions options = search_options(gpus, 16);
        const LayoutSearchResult full = search_layout(shape, timing, options);
        const LayoutFeasibility screen = layout_fits(shape, timing, options);
        SCOPED_TRACE("capacity " + std::to_string(capacity) + " gpus " + std::to_string(gpus) +
                     " L " + std::to_string(shape.model.n_layers));
        EXPECT_EQ(screen.fits, full.fits);
        EXPECT_EQ(full.fits, full.estimate.memory.fits);
        (full.fits ? agreed_fit : agreed_no_fit) += screen.fits == full.fits ? 1 : 0;
      }
    }
  }
  EXPECT_GT(agreed_fit, 10);
  EXPECT_GT(agreed_no_fit, 10);
}

TEST(LayoutSearch, ChinchillaBudgetOn1024GpusFitsNearTheClosedForm) {
  OptimalRequest request;
  request.flops = 5.76e23;
  request.gpus = 1024;
  request.arch = {"baseline"};
  request.profile = "a100-80gb-dgx";
  const OptimalResult result = optimal(request);
  const Recommendation& rec = result.recommendations.front();
  const ClosedFormOptimum closed = closed_form_optimum(result.fit.params, 5.76e23);
  EXPECT_NEAR(closed.n_opt, 7.22e10, 0.01e10);  // docs/planner.md fixture
  EXPECT_LT(std::fabs(rec.params.flop_active / closed.n_opt - 1.0), 0.1);
  EXPECT_TRUE(rec.memory.fits);
  EXPECT_GT(rec.config.parallel.data(rec.config.device.count) * rec.config.parallel.tensor *
                rec.config.parallel.pipeline,
            1023);
  EXPECT_GT(result.layouts_evaluated, 0);
  bool noted = false;
  for (const std::string& note : result.notes) {
    noted = noted || note.find("with layout TP") != std::string::npos;
  }
  EXPECT_TRUE(noted);
  // The text table shows the layout in short rows (one column per
  // recommendation stays narrow); the one-line summary is in the note.
  const std::string table = to_table(result);
  const ParallelConfig& par = rec.config.parallel;
  const std::string sizes = std::to_string(par.tensor) + " x " + std::to_string(par.pipeline) +
                            " x " + std::to_string(par.data(rec.config.device.count));
  const size_t row = table.find("layout TP x PP x DP");
  ASSERT_NE(row, std::string::npos);
  const std::string line = table.substr(row, table.find('\n', row) - row);
  EXPECT_NE(line.find(sizes), std::string::npos) << line;
  EXPECT_LT(line.size(), 60u) << line;
  EXPECT_NE(table.find("ZeRO / mb / recompute"), std::string::npos);
  EXPECT_NE(to_json(result).find("\"layout\""), std::string::npos);
}

// The parity-fastest MoD on a cluster is the fastest of every shape that
// reaches the optimal baseline's loss and fits, by brute force (each shape's
// own layout search).  On 1024 GPUs the base config's step (micro-batch 8 x
// 1024 sequences) is 4x the layout search's (2048 sequences): a step-time
// bound sized on the former pruned faster shapes.
TEST(LayoutSearch, ParityFastestOnAClusterMatchesBruteForce) {
  OptimalRequest request;
  request.flops = 1e21;
  request.gpus = 1024;
  request.arch = {"baseline", "mod"};
  request.profile = "a100-80gb-dgx";
  const OptimalResult result = optimal(request);
  const Recommendation* baseline = nullptr;
  const Recommendation* parity = nullptr;
  for (const Recommendation& rec : result.recommendations) {
    if (rec.arch == "baseline") {
      baseline = &rec;
    }
    if (rec.arch == "mod" && rec.role == "parity_fastest") {
      parity = &rec;
    }
  }
  ASSERT_NE(baseline, nullptr);
  ASSERT_NE(parity, nullptr);
  ASSERT_TRUE(baseline->loss.has_value());
  const double target = *baseline->loss;
  const double eps = parity->prior.eps;
  const DeviceProfile a100 = load_profile("a100-80gb-dgx");
  const TimingModel timing(a100);  // holds a reference to the profile
  LayoutSearchOptions options;
  options.gpus = 1024;
  const Config arch = parity->config;  // MoD settings; search_layout replaces the layout
  double fastest = INFINITY;
  int at_parity = 0;
  const double n = parity->params.flop_active;
  for (const ShapeCandidate& c : enumerate_shapes(arch, n / 8.0, n * 8.0, request.shapes)) {
    const double tokens = 1e21 / c.train_flops_per_token;
    const double tokens_per_param = tokens / c.params.flop_active;
    // MoD: the prior scales both reducible terms (docs/planner.md).
    if (predicted_loss(result.fit.params, LossScale{eps, eps}, c.params.flop_active, tokens) >
            target * (1 + 1e-12) ||
        tokens_per_param > kFitTokensPerParamMax || tokens_per_param < kFitTokensPerParamMin ||
        c.params.total < parity->prior.measured_size_min) {
      continue;
    }
    ++at_parity;
    const LayoutSearchResult found = search_layout(with_shape(arch, c.shape), timing, options);
    if (found.fits) {
      fastest = std::min(fastest, found.estimate.time.step_s);
    }
  }
  ASSERT_GT(at_parity, 20);
  EXPECT_NEAR(parity->time.step_s, fastest, 1e-12 * fastest);
}

// `sweep --gpus N` uses the cluster model: each timed row carries the layout
// the search chose, and the public estimate() of the row's shape with that
// layout reproduces its step time and memory; its CSV line has the layout
// columns; on one device the row has no layout and empty layout cells.
TEST(LayoutSearch, SweepOnAClusterCarriesTheLayoutOfEachRow) {
  SweepRequest request;
  request.flops = {1e21};
  request.arch = {"baseline", "mod"};
  request.gpus = 64;
  request.profile = "a100-80gb-dgx";
  const DeviceProfile a100 = load_profile("a100-80gb-dgx");
  const std::vector<SweepRow> rows = sweep(request);
  ASSERT_GT(rows.size(), 10u);
  int distributed = 0;
  for (const SweepRow& row : rows) {
    ASSERT_TRUE(row.has_layout);
    ASSERT_TRUE(row.fits);
    Config c = request.base;
    c.device.count = 64;
    c.device.profile = "a100-80gb-dgx";
    c.cluster.gpus_per_node = 8;
    if (row.arch == "mod") {
      c.mod.every = row.every;
      c.mod.capacity = row.capacity;
    }
    c = with_shape(c, row.shape);
    c.parallel = row.parallel;
    c.train.micro_batch = row.micro_batch;
    c.train.recompute = row.recompute;
    c.train.global_batch = 2048;  // the search's default: ~4M tokens of 2048
    const Estimate e = estimate(c, a100);
    EXPECT_NEAR(e.time.step_s, row.step_s, 1e-9 * row.step_s) << row.layout;
    EXPECT_NEAR(e.memory.peak, row.peak_memory_bytes, 1e-9 * row.peak_memory_bytes);
    EXPECT_EQ(row.data_parallel * row.parallel.tensor * row.parallel.pipeline, 64);
    EXPECT_EQ(row.layout, layout_summary(c));
    distributed += row.parallel.zero > 0 ? 1 : 0;
    const std::string csv = to_csv_line(row);
    const std::string header = sweep_csv_header();
    EXPECT_EQ(std::count(csv.begin(), csv.end(), ','),
              std::count(header.begin(), header.end(), ','));
    EXPECT_NE(csv.find("," + std::to_string(row.data_parallel) + ","), std::string::npos);
    EXPECT_NE(to_json_line(row).find("\"layout\":"), std::string::npos);
  }
  EXPECT_GT(distributed, 0);
  request.gpus = 1;
  request.profile = "h200";
  for (const SweepRow& row : sweep(request)) {
    EXPECT_FALSE(row.has_layout);
    EXPECT_EQ(to_csv_line(row).substr(to_csv_line(row).size() - 8), ",,,,,,,,");
    EXPECT_EQ(to_json_line(row).find("\"layout\""), std::string::npos);
  }
}

TEST(LayoutSearch, OneGpuSaysTheLossOptimalModelDoesNotFit) {
  OptimalRequest request;
  request.flops = 1e22;
  request.arch = {"baseline"};
  const OptimalResult result = optimal(request);
  const ClosedFormOptimum closed = closed_form_optimum(result.fit.params, 1e22);
  const Recommendation& rec = result.recommendations.front();
  ASSERT_LT(rec.params.flop_active, 0.8 * closed.n_opt);  // shrunk to fit one device
  bool noted = false;
  for (const std::string& note : result.notes) {
    noted = noted || (note.find("loss-optimal") != std::string::npos &&
                      note.find("does not fit") != std::string::npos);
  }
  EXPECT_TRUE(noted);
}

}  // namespace
}  // namespace modar
