// Experts in the cost model (docs/model.md experts): parameters total vs active, FLOPs of
// the router, routed experts (top-k, capacity slots, null experts), shared
// experts, MoDE staged, expert-parallel shards and the grouped GEMM's time.
// Every expected value is written from the shapes by hand, not from modar's
// own output.
#include <gtest/gtest.h>

#include <cmath>

#include "../common/expect_relative.hpp"
#include "../common/model_files.hpp"
#include "modar/cost_model.hpp"
#include "modar/profile.hpp"

namespace modar {
namespace {

// d = 512, L = 4, H = 8, GELU (d_ff = 4d = 2048), V = 1000, s = 128, b = 1.
// Causal attention FLOPs (tests/data/models/gelu_512x4.toml).
Config base() {
  return modar_test::model_file("gelu_512x4");
}

using modar_test::expect_relative;

constexpr double d = 512, s = 128, V = 1000, f = 2048;
// Per layer: attention 4 d^2, GELU FFN 2 d f, two norms 2 d.
constexpr double kAttention = 4 * d * d, kFfn = 2 * d * f, kNorms = 2 * d;

TEST(MoeCounts, TotalVersusActiveAndTopKFlops) {
  Config c = base();
  c.moe = {.experts = 8, .top_k = 2, .interval = 2, .first_dense = 1};  // MoE layers 1 and 3
  const ParamAndFlopCounts counts = count_params_and_flops(c);
  const double moe_layer_ffn = 8 * d + 8 * kFfn;  // router d x E + 8 experts
  const double total =
      4 * (kAttention + kNorms) + 2 * kFfn + 2 * moe_layer_ffn + d + 2 * V * d;
  expect_relative(counts.params.total, total);
  expect_relative(counts.params.experts, 2 * 8 * kFfn);
  // A token touches 2 of the 8 experts.
  const double active = total - 2 * 8 * kFfn + 2 * 2 * kFfn;
  expect_relative(counts.params.active, active);
  // Forward per token: 2 x the GEMM weights a token meets (router, k experts),
  // causal attention 2 s d per layer, head 2 V d.
  const double forward = 2 * (4 * kAttention + 2 * kFfn + 2 * (8 * d + 2 * kFfn)) +
                         4 * 2 * s * d + 2 * V * d;
  expect_relative(counts.flops.forward_per_token, forward);
  expect_relative(counts.flops.train_per_token, 3 * forward);
  // N_f = the active parameters less the embedding lookup and the norms.
  expect_relative(counts.params.flop_active, active - V * d - (4 * kNorms + d));
  // Dense: active = total, no experts.
  const ParamCounts dense = count_params(base());
  EXPECT_EQ(dense.experts, 0.0);
  EXPECT_EQ(dense.active, dense.total);
}

TEST(MoeCounts, CapacityFactorSetsTheExpertSlots) {
  Config c = base();
  c.moe = {.experts = 16, .top_k = 1};  // every layer MoE
  auto expert_forward = [&](double capacity_factor) {
    Config x = c;
    x.moe.capacity_factor = capacity_factor;
    // Forward less everything but the experts: attention 4 layers, router,
    // head and the attention GEMMs are the same for every factor.
    const double others = 2 * (4 * kAttention + 4 * 16 * d) + 4 * 2 * s * d + 2 * V * d;
    return count_flops(x).forward_per_token * s - others * s;
  };
  // Dropless: 128 tokens x top-1 = 128 slots per layer, 2 x 2 d f FLOPs each.
  expect_relative(expert_forward(0.0), 4 * 128 * 2 * kFfn, 1e-9);
  // cf 1.25: ceil(1.25 x 128 x 1 / 16) = 10 slots per expert, 160 in all.
  expect_relative(expert_forward(1.25), 4 * 160 * 2 * kFfn, 1e-9);
  // cf 1.0: 8 per expert = 128 (no padding); cf 0.5: 4 per expert = 64 (half dropped).
  expect_relative(expert_forward(1.0), 4 * 128 * 2 * kFfn, 1e-9);
  expect_relative(expert_forward(0.5), 4 * 64 * 2 * kFfn, 1e-9);
  // Parameters do not depend on the capacity factor.
  Config dropped = c;
  dropped.moe.capacity_factor = 0.5;
  expect_relative(count_params(dropped).total, count_params(c).total);
}

TEST(MoeCounts, IntegratedNullExpertsSkipTheirShareOfTheFfn) {
  Config c = base();
  c.moe = {.experts = 8, .top_k = 1, .mode = MoeMode::integrated, .null_experts = 8};
  const ParamAndFlopCounts counts = count_params_and_flops(c);
  // Router d -> 16 choices; 8 real experts per layer, no parameters for null ones.
  const double total = 4 * (kAttention + kNorms) + 4 * (16 * d + 8 * kFfn) + d + 2 * V * d;
  expect_relative(counts.params.total, total);
  // Expected real-expert share of the choices: 8 / 16 = 1/2 expert per token.
  expect_relative(counts.params.active, total - 4 * 8 * kFfn + 4 * 0.5 * kFfn);
  const double forward =
      2 * (4 * kAttention + 4 * (16 * d + 0.5 * kFfn)) + 4 * 2 * s * d + 2 * V * d;
  expect_relative(counts.flops.forward_per_token, forward);
  // With capacity factor 1: ceil(128 / 16) = 8 slots for each of the 8 real
  // experts = 64 = half the tokens, the same FLOPs.
  c.moe.capacity_factor = 1.0;
  expect_relative(count_flops(c).forward_per_token, forward);
  // No null experts: exactly the plain top-1 MoE.
  Config plain = base();
  plain.moe.experts = 8;
  Config no_null = plain;
  no_null.moe.mode = MoeMode::integrated;
  expect_relative(count_flops(no_null).forward_per_token, count_flops(plain).forward_per_token);
  expect_relative(count_params(no_null).active, count_params(plain).active);
}

TEST(MoeCounts, SharedExpertsSeeEveryToken) {
  Config c = base();
  c.moe = {.experts = 4, .top_k = 1, .expert_ffn = 1024, .shared_experts = 2};
  const double e = 2 * d * 1024;  // one expert of width 1024
  const ParamAndFlopCounts counts = count_params_and_flops(c);
  const double total = 4 * (kAttention + kNorms) + 4 * (4 * d + 4 * e + 2 * e) + d + 2 * V * d;
  expect_relative(counts.params.total, total);
  expect_relative(counts.params.active, total - 4 * 4 * e + 4 * e);
  const double forward =
      2 * (4 * kAttention + 4 * (4 * d + e + 2 * e)) + 4 * 2 * s * d + 2 * V * d;
  expect_relative(counts.flops.forward_per_token, forward);
}

// Shared experts of their own width with a gate (Qwen2-MoE): 1 shared
// expert of width 1536 beside 4 routed of width 512, sigmoid(u . w_g) gate.
TEST(MoeCounts, SharedExpertsOfTheirOwnWidthAndAGate) {
  Config c = base();
  c.moe = {.experts = 4,
           .top_k = 2,
           .expert_ffn = 512,
           .shared_experts = 1,
           .shared_expert_ffn = 1536,
           .shared_expert_gate = true};
  const double routed = 2 * d * 512;   // one routed expert (GELU: up + down)
  const double shared = 2 * d * 1536;  // the shared expert
  const ParamAndFlopCounts counts = count_params_and_flops(c);
  // Per MoE layer: router d x 4, 4 routed experts, the shared expert, gate d.
  const double layer_ffn = 4 * d + 4 * routed + shared + d;
  const double total = 4 * (kAttention + kNorms) + 4 * layer_ffn + d + 2 * V * d;
  expect_relative(counts.params.total, total);
  expect_relative(counts.params.active, total - 4 * 2 * routed);
  // Forward per token: the router, 2 routed experts, the shared expert and
  // the gate GEMM (d -> 1) are 2 x their weights.
  const double forward =
      2 * (4 * kAttention + 4 * (4 * d + 2 * routed + shared + d)) + 4 * 2 * s * d + 2 * V * d;
  expect_relative(counts.flops.forward_per_token, forward);
  // Two shared experts of width 768 are the same FFN as one of 1536.
  Config two = c;
  two.moe.shared_experts = 2;
  two.moe.shared_expert_ffn = 768;
  expect_relative(count_params(two).total, total);
  // Without the gate: d parameters per MoE layer fewer.
  Config ungated = c;
  ungated.moe.shared_expert_gate = false;
  expect_relative(count_params(ungated).total, total - 4 * d);
}

TEST(MoeCounts, StagedModeExpertsRunOnTheRoutedTokensOnly) {
  Config c = base();
  c.mod = {.capacity = 0.125, .every = 2, .offset = 1};  // k = 16 of 128 tokens in layers 1 and 3
  c.moe = {.experts = 4, .top_k = 1, .mode = MoeMode::staged};
  const double k = 16;
  const FlopCounts flops = count_flops(c);
  // Full layers 0, 2: all 128 tokens; routed 1, 3: 16 tokens, attention over
  // the 16 x 16 square (causal half); MoD router GEMV 2 d on all tokens.
  const double per_layer_full = 2 * (kAttention + 4 * d + kFfn) * s + 2 * s * d * s;
  const double per_layer_routed = 2 * (kAttention + 4 * d + kFfn) * k + 2 * k * d * k + 2 * d * s;
  const double forward_total = 2 * per_layer_full + 2 * per_layer_routed + 2 * V * d * s;
  expect_relative(flops.forward_per_token * s, forward_total);
}

TEST(MoeCounts, ExpertParallelShardsTheGroupedGemms) {
  Config c = base();
  c.moe = {.experts = 8, .top_k = 2};
  c.parallel.expert = 4;
  c.device.count = 4;
  int64_t grouped = 0;
  for (const OpRecord& op : lower(c, StepKind::train)) {
    if (op.shape.kind == OpKind::expert_gemm) {
      ++grouped;
      const ExpertGemmDims dims = op.shape.as<ExpertGemmDims>();
      EXPECT_EQ(dims.groups, 2) << op.label;  // 8 experts / EP 4 on this rank
      EXPECT_EQ(dims.rows, 256) << op.label;  // 128 tokens x top-2
    }
  }
  EXPECT_EQ(grouped, 6);  // up, down: forward, dgrad, wgrad
}

TEST(MoeCounts, GroupedGemmTimeIsThePerExpertGemmAtTheBusiestExpert) {
  ExpertGemmDims grouped{.groups = 8,
                         .rows = 1000,
                         .n = 2048,
                         .k = 512,
                         .imbalance_permille = 1500,
                         .ragged_inner = 0};
  const GemmDims gemm = expert_gemm_timing_dims(grouped);
  // 1000 / 8 = 125 mean rows, x 1.5 = 187.5 -> 188 rows, batch of 8 experts.
  EXPECT_EQ(gemm.m, 188);
  EXPECT_EQ(gemm.n, 2048);
  EXPECT_EQ(gemm.k, 512);
  EXPECT_EQ(gemm.batch, 8);
  grouped.ragged_inner = 1;  // weight gradient: the ragged dim is the inner one
  const GemmDims wgrad = expert_gemm_timing_dims(grouped);
  EXPECT_EQ(wgrad.m, 2048);
  EXPECT_EQ(wgrad.n, 512);
  EXPECT_EQ(wgrad.k, 188);
  // On a roofline profile (the H200 without its [kernel] section) a
  // compute-bound grouped GEMM takes 2 x 188 x 8 x 2048 x 512 / peak + launch.
  DeviceProfile h200 = load_profile("h200");
  h200.kernel = KernelParams{};
  const TimingModel timing(h200);
  const OpShape large = OpShape::of(ExpertGemmDims{.groups = 8,
                                                   .rows = 8000,
                                                   .n = 4096,
                                                   .k = 4096,
                                                   .imbalance_permille = 1500,
                                                   .ragged_inner = 0},
                                    DType::bf16);
  TimingModel::Source source = TimingModel::Source::interpolated;
  const double seconds = timing.op_time_s(large, Pass::forward, &source);
  const double flops = 2.0 * 1500 * 8 * 4096 * 4096;
  expect_relative(seconds, flops / h200.ceilings.roofline_flops(DType::bf16) +
                               h200.ceilings.launch_overhead_s);
  EXPECT_EQ(source, TimingModel::Source::roofline);
}

TEST(MoeCounts, ExpertStatesAreInTheSingleDeviceMemory) {
  Config dense = base();
  Config moe = base();
  moe.moe = {.experts = 8,
             .top_k = 2,
             .router_weights = RouterWeights::output};  // modar's runtime: an int32 permutation map
  const DeviceProfile h200 = load_profile("h200");
  const MemoryBreakdown a = estimate_memory(dense, h200);
  const MemoryBreakdown b = estimate_memory(moe, h200);
  // 4 layers gain a router (8 d) and 7 more FFNs; bf16 weights 2 B, fp32
  // gradients 4 B, AdamW 12 B per parameter.
  const double extra = 4 * (8 * d + 7 * kFfn);
  expect_relative(b.weights - a.weights, 2 * extra);
  expect_relative(b.gradients - a.gradients, 4 * extra);
  expect_relative(b.optimizer - a.optimizer, 12 * extra);
  // Router buffers per layer: fp32 probabilities 4 T E, index + gate 8 T k,
  // permutation map 4 S (S = 256 slots).
  expect_relative(b.router_buffers - a.router_buffers, 4 * (4 * s * 8 + 8 * s * 2 + 4 * 256));
}

}  // namespace
}  // namespace modar
