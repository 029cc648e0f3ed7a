// FLOP counts against independently derived formulas (docs/cost_model.md counting,
// Hoffmann et al. 2022 App. F, Megatron-LM's FLOP count, docs/dar_math.md 4.3).
// Every expected value below is written from the papers' formulas, not from modar's output.
#include <gtest/gtest.h>

#include <cmath>

#include "../common/dar_hand_count.hpp"
#include "../common/expect_relative.hpp"
#include "../common/model_files.hpp"
#include "modar/cost_model.hpp"

namespace modar {
namespace {

// d 2048, 24 layers, 16 heads, GELU, V 50304 untied, s 2048, micro-batch 1, no
// recompute (tests/data/models/gpt_1p3b_narayanan.toml).
Config fixture() {
  return modar_test::model_file("gpt_1p3b_narayanan");
}

using modar_test::expect_relative;

TEST(Flops, NarayananFixtureUnderFullAttention) {
  Config c = fixture();
  c.attention_flops = AttentionFlops::full;
  const double L = 24, d = 2048, s = 2048, V = 50304;
  // Narayanan et al. 2021, no recompute: 72 L d^2 (1 + s/(6d) + V/(12 L d)) per token.
  const double expected = 72.0 * L * d * d * (1.0 + s / (6.0 * d) + V / (12.0 * L * d));
  const FlopCounts flops = count_flops(c);
  expect_relative(flops.train_per_token, expected);
  EXPECT_NEAR(flops.train_per_token, 9.0739e9, 0.00005e9);  // Narayanan et al.'s printed value
  // Forward is a third of training; backward twice forward.
  expect_relative(flops.forward_per_token, expected / 3.0);
  expect_relative(flops.backward_per_token, 2.0 * expected / 3.0);
  EXPECT_EQ(flops.recompute_per_token, 0.0);
  expect_relative(flops.hardware_per_step, flops.train_per_step);
}

TEST(Flops, CausalAndFlashConventions) {
  Config c = fixture();
  const double L = 24, d = 2048, s = 2048, V = 50304;
  // Megatron-LM (num_floating_point_operations): per token forward 24 L d^2 + L (QK^T + AV
  // over half the square: 2 * 2 * s/2 * d) + 2 V d.
  const double causal_forward = 24.0 * L * d * d + 2.0 * L * s * d + 2.0 * V * d;
  c.attention_flops = AttentionFlops::causal;
  FlopCounts flops = count_flops(c);
  expect_relative(flops.forward_per_token, causal_forward);
  expect_relative(flops.train_per_token, 3.0 * causal_forward);
  expect_relative(flops.forward_attention_per_token, 2.0 * L * s * d);
  // FlashAttention: half square forward, backward 2.5x forward (fwd + bwd = 7/2).
  c.attention_flops = AttentionFlops::flash;
  flops = count_flops(c);
  const double attention_forward = 2.0 * L * s * d;
  expect_relative(flops.train_per_token,
                  3.0 * (causal_forward - attention_forward) + 3.5 * attention_forward);
}

// The per-step FLOPs in both attention conventions, whatever counting.
// attention_flops says: full = Narayanan et al.'s 72 L d^2 (1 + s/(6d) +
// V/(12 L d)) per token (the whole square, as MosaicML's 6 N + 12 L d s and
// the FlashAttention-2 paper count), causal = 3 x Megatron-LM's causal
// forward (half the square); 8 sequences of 2048 tokens per step.
TEST(Flops, PerStepInBothAttentionConventionsWhateverTheCounting) {
  const double L = 24, d = 2048, s = 2048, V = 50304, tokens = 8.0 * 2048.0;
  const double full_per_token = 72.0 * L * d * d * (1.0 + s / (6.0 * d) + V / (12.0 * L * d));
  const double causal_per_token = 3.0 * (24.0 * L * d * d + 2.0 * L * s * d + 2.0 * V * d);
  // The difference is the other half of the square, forward + backward: 3 x 2 L s d.
  expect_relative(full_per_token - causal_per_token, 6.0 * L * s * d);
  for (const AttentionFlops counting :
       {AttentionFlops::causal, AttentionFlops::full, AttentionFlops::flash}) {
    Config c = fixture();
    c.train.global_batch = 8;
    c.attention_flops = counting;
    const FlopCounts flops = count_flops(c);
    expect_relative(flops.train_per_step_full_attention, full_per_token * tokens);
    expect_relative(flops.train_per_step_causal_attention, causal_per_token * tokens);
  }
}

TEST(Flops, PerStepUsesTheGlobalBatch) {
  Config c = fixture();
  c.train.micro_batch = 4;
  c.device.count = 8;
  c.train.global_batch = 256;
  const FlopCounts flops = count_flops(c);
  EXPECT_EQ(flops.tokens_per_step, 256.0 * 2048.0);
  expect_relative(flops.train_per_step, flops.train_per_token * 256.0 * 2048.0);
}

TEST(Flops, GqaAndSwigluByHand) {
  // d 512, 3 layers, 8 heads over 2 KV heads, SwiGLU, V 1000 tied, s 256,
  // micro-batch 2 (tests/data/models/gqa_swiglu_tied_512x3.toml).
  const Config c = modar_test::model_file("gqa_swiglu_tied_512x3");
  // d_head = 512 / 8 = 64.  SwiGLU default width: 8 * 512 / 3 = 1365.3 ->
  // next multiple of 64 = 1408 (22 * 64).
  EXPECT_EQ(c.model.resolved_d_ff(), 1408);
  // Per layer: Q (512 x 512) + K, V (512 x 128 each) + O (512 x 512) =
  // 262144 + 131072 + 262144 = 655360; SwiGLU 3 x 512 x 1408 = 2162688;
  // two RMSNorm weights 1024.
  const double layer = 655360.0 + 2162688.0 + 1024.0;
  const double embedding = 1000.0 * 512.0;  // tied: no separate head
  const ParamCounts params = count_params(c);
  EXPECT_EQ(params.total, 3.0 * layer + 512.0 + embedding);
  EXPECT_EQ(params.non_embedding, 3.0 * layer + 512.0);
  // Forward per token: 2 x (GEMM weights) + causal attention 2 s d per layer
  // (H d_h = d) + the (tied) head 2 V d.
  const double gemm = 2.0 * 3.0 * (655360.0 + 2162688.0) + 2.0 * 1000.0 * 512.0;
  const double attention = 3.0 * 2.0 * 256.0 * 512.0;
  const FlopCounts flops = count_flops(c);
  EXPECT_DOUBLE_EQ(flops.forward_per_token, gemm + attention);
  // N_f = forward without attention / 2 = GEMM weights + head.
  EXPECT_DOUBLE_EQ(params.flop_active, gemm / 2.0);
}

TEST(Flops, ModCapacityOneEveryOneIsDensePlusRouter) {
  Config dense = fixture();
  Config mod = dense;
  mod.mod.capacity = 1.0;
  mod.mod.every = 1;
  mod.mod.offset = 0;
  const FlopCounts a = count_flops(dense);
  const FlopCounts b = count_flops(mod);
  const double L = 24, d = 2048;
  // Router: r = x . w_r, 2d per token per layer forward; backward dw and dx 4d.
  expect_relative(b.forward_per_token - a.forward_per_token, 2.0 * d * L, 1e-9);
  expect_relative(b.train_per_token - a.train_per_token, 6.0 * d * L, 1e-9);
  EXPECT_DOUBLE_EQ(b.forward_attention_per_token, a.forward_attention_per_token);
  EXPECT_DOUBLE_EQ(b.forward_router_per_token, 2.0 * d * L);
  // Parameters: one router vector per layer; N_f gains the router.
  const ParamCounts pa = count_params(dense);
  const ParamCounts pb = count_params(mod);
  EXPECT_EQ(pb.total - pa.total, d * L);
}

TEST(Flops, RoutedLayerLinearScalesWithCapacityAttentionWithItsSquare) {
  Config c = fixture();
  c.model.n_layers = 2;
  c.model.seq_len = 1024;
  c.mod = {.every = 2, .offset = 1};  // layer 1 routed, layer 0 full
  const double d = 2048, s = 1024, V = 50304;
  for (double capacity : {1.0, 0.5, 0.25, 0.125}) {
    c.mod.capacity = capacity;
    const double k = capacity * s;  // exact for these capacities
    const FlopCounts flops = count_flops(c);
    // Full layer: 24 d^2 + 2 s d.  Routed layer per token of the sequence:
    // linear 24 d^2 k / s (c x), attention over the k x k causal square
    // 2 k^2 d / s (c^2 x), router 2 d.  Head 2 V d.
    const double expected = 24.0 * d * d + 2.0 * s * d + 24.0 * d * d * k / s +
                            2.0 * k * k * d / s + 2.0 * d + 2.0 * V * d;
    expect_relative(flops.forward_per_token, expected, 1e-12);
    expect_relative(flops.forward_attention_per_token, 2.0 * s * d + 2.0 * k * k * d / s, 1e-12);
  }
}

TEST(Flops, RoutedTokensRoundAndClamp) {
  ModConfig mod;
  mod.capacity = 0.125;
  EXPECT_EQ(mod.routed_tokens_per_sequence(2048), 256);
  mod.capacity = 0.001;
  EXPECT_EQ(mod.routed_tokens_per_sequence(100), 1);  // clamp to >= 1
  mod.capacity = 0.3;
  EXPECT_EQ(mod.routed_tokens_per_sequence(10), 3);
  mod.capacity = 1.0;
  EXPECT_EQ(mod.routed_tokens_per_sequence(7), 7);
}

TEST(Flops, FullRecomputeAddsTheLayersForwardAsHardwareFlops) {
  Config c = fixture();
  c.train.recompute = Recompute::full;
  const FlopCounts flops = count_flops(c);
  const double d = 2048, V = 50304;
  // Every layer op runs again in backward; the head (2 V d) does not.
  expect_relative(flops.recompute_per_token, flops.forward_per_token - 2.0 * V * d);
  expect_relative(flops.hardware_per_step,
                  (flops.train_per_token + flops.recompute_per_token) * 2048.0);
  // Model FLOPs are unchanged by recompute.
  Config none = fixture();
  expect_relative(flops.train_per_token, count_flops(none).train_per_token);
  // Selective recompute re-runs only uncounted ops (norms, activations, RoPE).
  c.train.recompute = Recompute::selective;
  EXPECT_EQ(count_flops(c).recompute_per_token, 0.0);
}

TEST(Flops, DarAndAttnResExtrasFollowDarMath43) {
  for (int64_t L : {6, 5, 16}) {
    for (int64_t K : {1, 2, 4}) {
      if (K > L) {
        continue;
      }
      Config dense;
      dense.model = {.d_model = 256, .n_layers = L, .n_heads = 4, .vocab_size = 512, .seq_len = 64};
      dense.train.micro_batch = 2;
      Config attnres = dense;
      attnres.dar.variant = DarVariant::attnres;
      attnres.dar.block_layers = K;
      Config dar = attnres;
      dar.dar.variant = DarVariant::dar;
      dar.dar.streams = 2;
      const double base = count_flops(dense).forward_per_token;
      const FlopCounts a = count_flops(attnres);
      const FlopCounts b = count_flops(dar);
      SCOPED_TRACE("L=" + std::to_string(L) + " K=" + std::to_string(K));
      expect_relative(a.forward_per_token - base, dar_extra_flops_per_token(256, L, K, 1, true),
                      1e-9);
      expect_relative(b.forward_per_token - base, dar_extra_flops_per_token(256, L, K, 2, false),
                      1e-9);
      expect_relative(b.forward_dar_per_token, dar_extra_flops_per_token(256, L, K, 2, false),
                      1e-12);
    }
  }
}

TEST(Flops, DarMathWorkedExample) {
  // docs/dar_math.md 4.3 example: d = 2048, L = 16, K = 2: AttnRes ~ 1.6 MFLOP and
  // DAR ~ 6.1 MFLOP extra per token (the table's rounded approximations).
  Config c;
  c.model = {.d_model = 2048, .n_layers = 16, .n_heads = 16, .seq_len = 4096};
  c.dar = {.variant = DarVariant::attnres, .block_layers = 2};
  c.train.micro_batch = 1;
  EXPECT_NEAR(count_flops(c).forward_dar_per_token / 1.6e6, 1.0, 0.06);
  c.dar.variant = DarVariant::dar;
  EXPECT_NEAR(count_flops(c).forward_dar_per_token / 6.1e6, 1.0, 0.08);
  // The per-layer approximation 8 d (N+1) + 108 d for n = 2, m = 1.
  const double per_layer = 8.0 * 2048 * 9 + 108.0 * 2048;
  EXPECT_NEAR(count_flops(c).forward_dar_per_token / (16 * per_layer), 1.0, 0.05);
}

TEST(Flops, LoweringMergesIdenticalLayers) {
  Config c = fixture();
  const size_t ops_24 = lower(c).size();
  c.model.n_layers = 96;
  EXPECT_EQ(lower(c).size(), ops_24);  // evaluation cost does not grow with depth
  for (const OpRecord& op : lower(c)) {
    if (op.shape.kind == OpKind::attention) {
      EXPECT_EQ(op.multiplicity, 96);
    }
  }
}

TEST(Flops, DecodeStepByHand) {
  Config c = fixture();
  c.train.micro_batch = 4;
  const Estimate e = estimate(c, load_profile("h200"), StepKind::decode);
  const double L = 24, d = 2048, s = 2048, V = 50304;
  // One new token attends to s cached keys: 4 s d per layer (no causal halving).
  const double expected = 24.0 * L * d * d + 4.0 * L * s * d + 2.0 * V * d;
  expect_relative(e.flops.forward_per_token, expected);
  EXPECT_EQ(e.flops.tokens_per_step, 4.0);
}

}  // namespace
}  // namespace modar

namespace modar {
namespace {

TEST(Flops, ModPlusDarIsModPlusTheDepthReadExtras) {
  // With MoD + DAR the depth-read ops run on all T tokens (docs/cost_model.md),
  // so the combined count is the MoD count plus the docs/dar_math.md 4.3 extras.
  Config mod;
  mod.model = {.d_model = 256, .n_layers = 6, .n_heads = 4, .vocab_size = 512, .seq_len = 64};
  mod.mod = {.capacity = 0.25, .every = 2};
  mod.train.micro_batch = 2;
  Config both = mod;
  both.dar.variant = DarVariant::dar;
  both.dar.block_layers = 2;
  both.dar.streams = 2;
  const double extras = dar_extra_flops_per_token(256, 6, 2, 2, false);
  EXPECT_NEAR((count_flops(both).forward_per_token - count_flops(mod).forward_per_token) / extras,
              1.0, 1e-12);
}

}  // namespace
}  // namespace modar
