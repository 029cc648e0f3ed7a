// Memory items of small configurations, computed by hand from the formulas of
// docs/cost_model.md (Megatron's 18 bytes / parameter family, Korthikanti's
// activation inventory with FlashAttention, docs/dar_math.md 4.4 for the bank).
#include <gtest/gtest.h>

#include "modar/cost_model.hpp"

namespace modar {
namespace {

// tiny: d = 64, L = 2, H = 4 (d_h 16), GELU d_ff 256, V = 256 untied, s = 32,
// b = 2 (T = 64), fp32 (4 bytes per element).
Config tiny() {
  Config c;
  c.model = {.d_model = 64, .n_layers = 2, .n_heads = 4, .vocab_size = 256, .seq_len = 32};
  c.train = {.micro_batch = 2, .dtype = DType::fp32};
  return c;
}

DeviceProfile profile_with_memory(double bytes) {
  DeviceProfile p = load_profile("cpu-generic");
  p.ceilings.memory_bytes = bytes;
  return p;
}

TEST(Memory, TinyTrainingByHand) {
  const Config c = tiny();
  // Parameters: per layer attention 64 x (4 + 8) x 16 + 64 x 64 = 16384, MLP
  // 2 x 64 x 256 = 32768, norms 128 -> 49280; x 2 layers + final norm 64 =
  // 98624; + embedding 16384 + head 16384 = 131392.
  const double P = 131392;
  EXPECT_EQ(count_params(c).total, P);
  const MemoryBreakdown m = estimate_memory(c, profile_with_memory(1e12));
  EXPECT_EQ(m.weights, 4 * P);    // fp32 weights
  EXPECT_EQ(m.gradients, 4 * P);  // fp32 gradients
  EXPECT_EQ(m.optimizer, 8 * P);  // AdamW m + v (fp32 training: no separate master)
  // Saved per layer (no recompute), 64 rows x 4 bytes x (4d norms in/out 256
  // + QKV 192 + attention output 64 + up 256 + GELU output 256 = 1024)
  // = 262144, two fp32 rstd 8 x 64 = 512, lse 4 x b x H x s = 1024.
  const double layer = 262144 + 512 + 1024;
  // Head: final norm input and output 2 x 4 x 64 x 64 = 32768, rstd 256, token ids 256.
  EXPECT_EQ(m.activations, 2 * layer + 32768 + 256 + 256);
  EXPECT_EQ(m.dar_bank, 0.0);
  EXPECT_EQ(m.kv_cache, 0.0);
  EXPECT_EQ(m.router_buffers, 0.0);
  // Workspace: logits T V (4 + 4) = 131072 beats one layer's backward
  // transients 2 x 4 x 64 x 64 + 4 x 64 x 256 = 98304.
  EXPECT_EQ(m.workspace, 131072.0);
  EXPECT_EQ(m.peak, 16 * P + m.activations + 131072.0);
  EXPECT_TRUE(m.fits);
  EXPECT_FALSE(estimate_memory(c, profile_with_memory(1e6)).fits);
}

TEST(Memory, BfloatSixteenIsEighteenBytesPerParameter) {
  Config c = tiny();
  c.train.dtype = DType::bf16;
  const double P = count_params(c).total;
  const MemoryBreakdown m = estimate_memory(c, profile_with_memory(1e12));
  // Megatron: bf16 weight 2 + fp32 grad 4 + fp32 master 4 + Adam m, v 8.
  EXPECT_EQ(m.weights + m.gradients + m.optimizer, 18 * P);
}

TEST(Memory, FullRecomputeKeepsOnlyLayerInputs) {
  Config c = tiny();
  c.train.recompute = Recompute::full;
  const MemoryBreakdown m = estimate_memory(c, profile_with_memory(1e12));
  // 2 layers x T d x 4 bytes + the head's 32768 + 256 + 256.
  EXPECT_EQ(m.activations, 2 * 64 * 64 * 4 + 32768 + 256 + 256);
  // Backward of one layer re-materialises its activations: 2 x 4 x 64 x 64
  // residual grads + 4 x 64 x 256 widest grad + one layer's saved set 263680.
  EXPECT_EQ(m.workspace, 32768 + 65536 + 263680.0);
}

TEST(Memory, RoutedLayersSaveOnlyTheirTokens) {
  Config c = tiny();
  c.mod = {.capacity = 0.25, .every = 2, .offset = 1};  // k = 8 of 32, R = 16 rows
  const MemoryBreakdown m = estimate_memory(c, profile_with_memory(1e12));
  const double full_layer = 262144 + 512 + 1024;
  // Routed layer: 16 rows x 4 x 1024 = 65536, rstd 8 x 16 = 128, lse 4 x 2 x 4 x 8 = 256;
  // plus its input x (64 x 64 x 4 = 16384, router gradient) and delta (16 x 64 x 4 = 4096).
  const double routed_layer = 65536 + 128 + 256 + 16384 + 4096;
  EXPECT_EQ(m.activations, full_layer + routed_layer + 32768 + 256 + 256);
  // Router buffers: fp32 logits 4 T = 256, int32 index + fp32 g 8 R = 128.
  EXPECT_EQ(m.router_buffers, 256 + 128.0);
}

TEST(Memory, DarBankMatchesDarMath44) {
  // docs/dar_math.md 4.4 example, bf16, d = 2048, T = 4096 (one sequence), L = 16, K = 2:
  // bank (N+1) n T d x 2 bytes = 151 MB (AttnRes), 302 MB (DAR); Full DAR 570 MB.
  Config c;
  c.model = {.d_model = 2048, .n_layers = 16, .n_heads = 16, .seq_len = 4096};
  c.dar.block_layers = 2;
  c.train.micro_batch = 1;
  const double T = 4096, d = 2048, L = 16;
  const DeviceProfile p = profile_with_memory(1e12);
  struct Case {
    DarVariant variant;
    int64_t K;
    double n, N, bank_mb;
  } cases[] = {{DarVariant::attnres, 2, 1, 8, 151},
               {DarVariant::dar, 2, 2, 8, 302},
               {DarVariant::dar, 1, 2, 16, 570}};
  for (const Case& k : cases) {
    c.dar.variant = k.variant;
    c.dar.block_layers = k.K;
    const MemoryBreakdown m = estimate_memory(c, p);
    const double bank = (k.N + 1) * k.n * T * d * 2;
    EXPECT_NEAR(bank / 1e6, k.bank_mb, 1.0);
    // Plus fp32 rstd per entry and stream, and fp32 scalars per token for each
    // of the 2L + 1 = 33 reads (32 branches + the output read): lse (n per read);
    // for DAR also alpha, beta (n each) and the coefficient-head rstd (1), i.e.
    // 2n + 1 = 5 per read, and rho (1 for n = 2) at the 2L - N branches that are
    // not first in their block.  AttnRes: 33 x 1 = 33 scalars; DAR K = 2
    // (N = 8): 33 x 2 + 33 x 5 + 24 = 255; DAR K = 1 (N = 16): 66 + 165 + 16 = 247.
    const double reads = 2 * L + 1;
    const double dar_scalars = k.n >= 2 ? reads * (2 * k.n + 1) + (2 * L - k.N) * 1 : 0;
    const double scalars = reads * k.n + dar_scalars;
    EXPECT_EQ(scalars, k.n == 1 ? 33 : (k.N == 8 ? 255 : 247));
    const double stats = (k.N + 1) * k.n * T * 4 + T * 4 * scalars;
    EXPECT_EQ(m.dar_bank, bank + stats);
  }
}

TEST(Memory, DepthResidualSavesPartialsAndOutputsAndHoldsBankGradient) {
  // tiny (d = 64, L = 2, T = 64, fp32) with block_layers = 1: S = 2 branches
  // per block, N = 2 blocks, 2L = 4 branches, 2L - N = 2 of them at i >= 1.
  const Config plain = tiny();
  const DeviceProfile p = profile_with_memory(1e12);
  const MemoryBreakdown base = estimate_memory(plain, p);
  Config dar = plain;
  dar.dar.variant = DarVariant::dar;  // n = 2
  dar.dar.block_layers = 1;
  const MemoryBreakdown m = estimate_memory(dar, p);
  // Saved on top of the plain residual (docs/dar_math.md 5.5), each its own
  // named part: P^{i-1} + fp32 rstd at the 2 branches not first in their block:
  // 2 x n 2 x T 64 x (64 x 4 + 4) = 66560; each branch's y: 4 x 64 x 64 x 4 =
  // 65536.  The branches' own saved tensors are the plain residual's.
  EXPECT_EQ(m.dar_partials, 66560.0);
  EXPECT_EQ(m.dar_branch_outputs, 65536.0);
  EXPECT_EQ(m.activations, base.activations);
  // Bank (N+1) n T (d B + 4) = 3 x 2 x 64 x 260 = 99840; fp32 scalars per token:
  // 5 reads x (lse 2 + alpha 2 + beta 2 + z rstd 1) + rho at 2 branches = 37,
  // x 64 tokens x 4 bytes = 9472.
  EXPECT_EQ(m.dar_bank, 99840 + 9472.0);
  // Workspace: head T V (B + 4) = 64 x 256 x 8 = 131072; one layer's backward
  // 2 x 64 x 64 x 4 + 64 x 256 x 4 = 98304, plus the DAR block backward: bank
  // gradient 3 x 2 x 64 x 64 x 4 = 98304, d o-bar / d lse and recomputed o-bar
  // S 2 x n 2 x 64 x (2 x 256 + 4) = 132096, dP^i, dP^{i-1}, R, dR
  // 4 x 2 x 64 x 256 = 131072: 98304 + 361472 = 459776 > 131072.
  EXPECT_EQ(m.workspace, 459776.0);

  // AttnRes (n = 1) has no beta, so no y: only P^{i-1} + rstd, 2 x 64 x 260.
  Config attnres = dar;
  attnres.dar.variant = DarVariant::attnres;
  const MemoryBreakdown a = estimate_memory(attnres, p);
  EXPECT_EQ(a.dar_partials, 33280.0);
  EXPECT_EQ(a.dar_branch_outputs, 0.0);
  EXPECT_EQ(a.activations, base.activations);
}

TEST(Memory, DecodeKvCacheHoldsOnlyRoutedTokensInRoutedLayers) {
  Config c = tiny();
  c.model.n_kv_heads = 2;
  c.mod = {.capacity = 0.25, .every = 2, .offset = 1};
  const MemoryBreakdown m = estimate_memory(c, profile_with_memory(1e12), StepKind::decode);
  // Per cached token per layer: K and V, G = 2 heads x d_h 16 x 4 bytes -> 256 bytes.
  // Layer 0 caches s = 32 tokens, layer 1 (routed) k = 8, for b = 2 sequences.
  EXPECT_EQ(m.kv_cache, 256.0 * 2 * (32 + 8));
  EXPECT_EQ(m.gradients, 0.0);
  EXPECT_EQ(m.optimizer, 0.0);
  EXPECT_EQ(m.activations, 0.0);
  EXPECT_EQ(m.peak, m.weights + m.kv_cache + m.router_buffers + m.workspace);
}

}  // namespace
}  // namespace modar
