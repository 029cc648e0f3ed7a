// `modar layout` (rank_layouts, docs/cluster.md "modar layout") and expert
// parallelism in the planner's layout search: every ranked layout is the
// estimate() of its own configuration at the one global batch, the ranking
// is sorted, the space holds what the issue lists (TP with and without SP,
// CP, PP with schedules, EP and expert TP, ZeRO 0-3, micro-batch,
// recompute), and a large MoE picks EP because it is faster.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>

#include "../common/model_files.hpp"
#include "modar/base/errors.hpp"
#include "modar/cost_model.hpp"
#include "modar/layout_search.hpp"
#include "modar/parallel.hpp"

namespace modar {
namespace {

// d 1024, 8 layers, 16 heads, SwiGLU 2816, vocab 32000, s = 4096, bf16.
Config small_dense() {
  return modar_test::model_file("dense_swiglu_1024x8");
}

LayoutSearchOptions ranking_options(int64_t gpus, int64_t global_batch) {
  LayoutSearchOptions o;
  o.gpus = gpus;
  o.global_batch = global_batch;
  o.dimensions = layout_ranking_dimensions();
  return o;
}

TEST(LayoutRanking, EveryRowIsTheEstimateOfItsLayoutAtOneGlobalBatch) {
  DeviceProfile profile = load_profile("h100-80gb-dgx");
  profile.ceilings.memory_bytes = 6e9;  // some layouts fit, some do not
  const TimingModel timing(profile);
  const LayoutRanking r = rank_layouts(small_dense(), timing, ranking_options(4, 16));
  ASSERT_FALSE(r.fitting.empty());
  ASSERT_FALSE(r.not_fitting.empty());
  EXPECT_EQ(r.global_batch, 16);
  EXPECT_DOUBLE_EQ(r.tokens_per_step, 16.0 * 4096);
  std::set<std::string> seen;
  double previous = 0.0;
  for (const RankedLayout& row : r.fitting) {
    EXPECT_TRUE(seen.insert(row.summary).second) << "twice: " << row.summary;
    EXPECT_GE(row.step_s, previous);
    previous = row.step_s;
    EXPECT_EQ(row.config.train.global_batch, 16);
  }
  // Spot-check rows against the public estimate() of their configuration.
  for (size_t i = 0; i < r.fitting.size(); i += std::max<size_t>(1, r.fitting.size() / 7)) {
    const RankedLayout& row = r.fitting[i];
    const Estimate e = estimate(row.config, profile);
    EXPECT_NEAR(e.time.step_s, row.step_s, 1e-12 * row.step_s) << row.summary;
    EXPECT_NEAR(e.memory.peak, row.memory.peak, 1e-6 * row.memory.peak) << row.summary;
    EXPECT_NEAR(e.time.mfu, row.mfu, 1e-12) << row.summary;
    EXPECT_NEAR(e.flops.tokens_per_step, r.tokens_per_step, 1e-9) << row.summary;
  }
  // Not fitting: least memory first, each with its binding constraint.
  for (size_t i = 0; i < r.not_fitting.size(); ++i) {
    const RankedLayout& row = r.not_fitting[i];
    EXPECT_GT(row.memory.peak, profile.ceilings.memory_bytes);
    EXPECT_EQ(row.binding.rfind("memory: ", 0), 0u) << row.binding;
    if (i > 0) {
      EXPECT_GE(row.memory.peak, r.not_fitting[i - 1].memory.peak);
    }
  }
}

TEST(LayoutRanking, TheSpaceHoldsEveryListedDimension) {
  const DeviceProfile profile = load_profile("h100-80gb-dgx");
  const TimingModel timing(profile);
  const LayoutRanking r = rank_layouts(small_dense(), timing, ranking_options(8, 32));
  bool tp_sp = false, tp_no_sp = false, cp = false, pp = false, interleaved = false,
       zero[4] = {false, false, false, false}, mb8 = false;
  bool recompute[3] = {false, false, false};
  for (const auto* rows : {&r.fitting, &r.not_fitting}) {
    for (const RankedLayout& row : *rows) {
      const ParallelConfig& p = row.config.parallel;
      tp_sp |= p.tensor > 1 && p.sequence_parallel;
      tp_no_sp |= p.tensor > 1 && !p.sequence_parallel;
      cp |= p.context > 1;
      pp |= p.pipeline > 1;
      interleaved |= p.virtual_stages > 1;
      zero[p.zero] = true;
      mb8 |= row.config.train.micro_batch == 8;
      recompute[static_cast<int>(row.config.train.recompute)] = true;
      EXPECT_EQ(row.config.device.count, 8);
    }
  }
  EXPECT_TRUE(tp_sp && tp_no_sp && cp && pp && interleaved && mb8);
  EXPECT_TRUE(zero[0] && zero[1] && zero[2] && zero[3]);
  EXPECT_TRUE(recompute[0] && recompute[1] && recompute[2]);
  // TP 8 is the largest the node allows; 32 = 2^5 sequences: micro-batch 8
  // x DP 8 = 64 does not divide it (listed).
  EXPECT_NE(std::find_if(r.skipped.begin(), r.skipped.end(),
                         [](const std::string& s) {
                           return s.find("micro-batch 8 x data 8") != std::string::npos;
                         }),
            r.skipped.end());
}

// A MoE of 32 experts (width 2048), top-2, d 2048, 16 layers: on 8 GPUs the
// ranking holds expert-parallel layouts with expert TP apart from TP
// (TP 2 x EP 8 x expert TP 1, valid in Megatron-Core).
TEST(LayoutRanking, ExpertLayoutsAreRanked) {
  Config c = small_dense();
  c.model.d_model = 2048;
  c.model.n_layers = 16;
  c.model.seq_len = 2048;
  c.moe = {.experts = 32, .top_k = 2, .expert_ffn = 2048};
  const DeviceProfile profile = load_profile("h100-80gb-dgx");
  const TimingModel timing(profile);  // holds a pointer: the profile outlives it
  const LayoutRanking r = rank_layouts(c, timing, ranking_options(8, 64));
  bool folded = false, expert = false;
  for (const auto* rows : {&r.fitting, &r.not_fitting}) {
    for (const RankedLayout& row : *rows) {
      const ParallelConfig& p = row.config.parallel;
      expert |= p.expert > 1;
      folded |= p.tensor == 2 && p.expert == 8 && p.resolved_expert_tensor() == 1;
    }
  }
  EXPECT_TRUE(expert);
  EXPECT_TRUE(folded);
}

// The planner's layout search picks EP for a large MoE on 256 GPUs, and the
// EP layout it picks is faster than every layout without EP.
TEST(LayoutRanking, LargeMoeOn256GpusPicksExpertParallelism) {
  // d 6144, 32 layers, 48 heads (8 KV heads), 32 experts of width 6144
  // (SwiGLU), top-2: ~120B parameters (the 122B case), s = 4096.
  const Config c = modar_test::model_file("moe_122b_6144x32");
  const double total = count_params(c).total;
  EXPECT_GT(total, 115e9);
  EXPECT_LT(total, 130e9);
  const DeviceProfile profile = load_profile("h100-80gb-dgx");
  const TimingModel timing(profile);  // holds a pointer: the profile outlives it
  LayoutSearchOptions with_ep;
  with_ep.gpus = 256;
  const LayoutSearchResult found = search_layout(c, timing, with_ep);
  ASSERT_TRUE(found.fits);
  EXPECT_GT(found.config.parallel.expert, 1) << found.summary;
  LayoutSearchOptions without_ep = with_ep;
  without_ep.dimensions.expert = false;
  const LayoutSearchResult dense_only = search_layout(c, timing, without_ep);
  EXPECT_LT(found.estimate.time.step_s, dense_only.estimate.time.step_s)
      << found.summary << " vs " << dense_only.summary;
}

TEST(LayoutRanking, BadRequestsNameTheField) {
  const DeviceProfile profile = load_profile("h100-80gb-dgx");
  const TimingModel timing(profile);  // holds a pointer: the profile outlives it
  LayoutSearchOptions o = ranking_options(0, 0);
  try {
    rank_layouts(small_dense(), timing, o);
    ADD_FAILURE() << "gpus 0 accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), "gpus = 0: must be >= 1");
  }
}

}  // namespace
}  // namespace modar
