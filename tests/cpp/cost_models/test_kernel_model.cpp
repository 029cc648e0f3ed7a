// The GPU kernel model (kernel_model.hpp, docs/kernel_model.md) against
// hand derivations: GEMM tile and wave counts for a few shapes (the tile the
// model picks, its waves, its time), a memory-bound skinny GEMM, FlashAttention
// shape factors by the documented formula and against the FlashAttention-3
// paper's published H100 figures, and the timing model using all of it on a
// profile with kernel.sm_count.
#include <gtest/gtest.h>

#include <cmath>

#include "modar/base/errors.hpp"
#include "modar/kernel_model.hpp"

namespace modar {
namespace {

// An A100-like device: 108 SMs, 267.9 TFLOP/s large-GEMM rate, 1.733 TB/s.
KernelRates a100_rates(double launch_s = 0.0) {
  KernelRates r;
  r.gemm_flops = 267.9e12;
  r.attention_flops = 0.73 * 312e12;
  r.fp32_flops = 19.5e12;
  r.bandwidth = 1.733e12;
  r.family_bandwidth.fill(1.733e12);
  r.launch_overhead_s = launch_s;
  r.params.sm_count = 108;
  return r;
}

constexpr double kSmRate = 267.9e12 / 108.0;  // one SM's share of the GEMM rate

// One tile's time: 2 tm tn depth at the SM rate x the tile's relative rate.
double tile_s(double tm, double tn, double depth, double relative = 1.0) {
  return 2.0 * tm * tn * depth / (kSmRate * relative);
}

TEST(KernelModelGemm, FullWavesReachTheAsymptote) {
  // 2048 x 6912 x 2304 (GPT 1.7B's QKV projection, micro-batch 1, s 2048):
  // 256 x 128 tiles: 8 x 54 = 432 = 4 x 108, four full waves, so the time is
  // exactly 2 m n k / 267.9 TFLOP/s.
  const GemmTiming t = gpu_gemm_time({2048, 6912, 2304, 1, DType::bf16}, a100_rates());
  EXPECT_EQ(t.tiles, 432);
  EXPECT_EQ(t.waves, 4);
  EXPECT_EQ(t.split_k, 1);
  EXPECT_NEAR(t.seconds, 2.0 * 2048.0 * 6912.0 * 2304.0 / 267.9e12, 1e-12);
  EXPECT_FALSE(t.memory_bound);
}

TEST(KernelModelGemm, PartialLastWave) {
  // 4096^3: 256 x 128 tiles 16 x 32 = 512 -> 5 waves (4.74 full): 5 tile times.
  // The alternatives: 128 x 128, 1024 tiles -> 10 waves of half tiles at 0.92
  // = 5.43 tile times; 128 x 64, 2048 -> 19 waves of quarter tiles at 0.80 =
  // 5.94; 64 x 64, 4096 -> 38 eighths at 0.65 = 7.31; split-K 2: 1024 tiles
  // -> 10 waves of half-depth tiles = 5 tile times + the partial sums.
  const GemmTiming t = gpu_gemm_time({4096, 4096, 4096, 1, DType::bf16}, a100_rates(3e-6));
  EXPECT_EQ(t.tile_m * t.tile_n, 256 * 128);
  EXPECT_EQ(t.waves, 5);
  EXPECT_NEAR(t.seconds, 5.0 * tile_s(256, 128, 4096) + 3e-6, 1e-12);
  // 254 TFLOP/s: 512 / 540 of the asymptote.
  EXPECT_NEAR(2.0 * 4096.0 * 4096.0 * 4096.0 / (t.seconds - 3e-6) / 1e12, 267.9 * 512.0 / 540.0,
              1e-6);
}

TEST(KernelModelGemm, QuantizationShareScalesTheLossAboveTheAsymptote) {
  // 4096^3 as above: 5 tile times with the loss in full; the asymptote is
  // 2 m n k / 267.9 TFLOP/s = 512 / 108 tile times.  kernel.gemm_quantization
  // q pays q of the difference: q = 0.5 -> (512 / 108 + 5) / 2 tile times,
  // q = 0 -> the asymptote.
  const double full_s = 5.0 * tile_s(256, 128, 4096);
  const double asymptote_s = 512.0 / 108.0 * tile_s(256, 128, 4096);
  EXPECT_NEAR(asymptote_s, 2.0 * 4096.0 * 4096.0 * 4096.0 / 267.9e12, 1e-12);
  KernelRates rates = a100_rates();
  rates.params.gemm_quantization = 0.5;
  EXPECT_NEAR(gpu_gemm_time({4096, 4096, 4096, 1, DType::bf16}, rates).seconds,
              asymptote_s + 0.5 * (full_s - asymptote_s), 1e-12);
  rates.params.gemm_quantization = 0.0;
  EXPECT_NEAR(gpu_gemm_time({4096, 4096, 4096, 1, DType::bf16}, rates).seconds, asymptote_s, 1e-12);
  // Unset (negative) is the loss in full.
  rates.params.gemm_quantization = -1.0;
  EXPECT_NEAR(gpu_gemm_time({4096, 4096, 4096, 1, DType::bf16}, rates).seconds, full_s, 1e-12);
}

TEST(KernelModelGemm, SmallerTilesWinPastAWaveCliff) {
  // 2048 x 6944 x 2304 (32 columns more than the full-wave shape): 256 x 128
  // needs 8 x 55 = 440 tiles -> 5 waves (5 tile times); 128 x 128 needs
  // 16 x 55 = 880 -> 9 waves of half tiles at 0.92 = 4.891 tile times; 256 x 64:
  // 8 x 109 = 872 -> 9 waves at 0.88 = 5.11; 64 x 128: 32 x 55 = 1760 -> 17
  // quarter waves at 0.80 = 5.31; split-K 2 of 256 x 128: 880 -> 9 half-depth
  // waves = 4.5 tile times + 2 x 8 m n bytes of partial sums (131 us, 2.2 tile
  // times).  The model picks 128 x 128.
  const GemmTiming t = gpu_gemm_time({2048, 6944, 2304, 1, DType::bf16}, a100_rates());
  EXPECT_EQ(t.tile_m, 128);
  EXPECT_EQ(t.tile_n, 128);
  EXPECT_EQ(t.tiles, 880);
  EXPECT_EQ(t.waves, 9);
  EXPECT_NEAR(t.seconds, 9.0 * tile_s(128, 128, 2304, 0.92), 1e-12);
}

TEST(KernelModelGemm, SplitKFillsAShortWideProblem) {
  // 2048 x 2304 x 9216 (GPT 1.7B's MLP down projection): 256 x 128 tiles
  // 8 x 18 = 144 -> 2 waves (1.33 full): 2 full-depth tile times.  Split-K 3:
  // 432 tiles -> exactly 4 waves of depth 3072 = 1.333 tile times + the fp32
  // partial sums, 8 x 3 x m n bytes at 1.733 TB/s.  128 x 128 without split:
  // 288 tiles -> 3 waves of half tiles at 0.92 = 1.630 tile times.
  const GemmTiming t = gpu_gemm_time({2048, 2304, 9216, 1, DType::bf16}, a100_rates());
  EXPECT_EQ(t.split_k, 3);
  EXPECT_EQ(t.tiles, 432);
  EXPECT_EQ(t.waves, 4);
  const double expected = 4.0 * tile_s(256, 128, 3072) + 8.0 * 3.0 * 2048.0 * 2304.0 / 1.733e12;
  EXPECT_NEAR(t.seconds, expected, 1e-12);
  EXPECT_LT(t.seconds, 2.0 * tile_s(256, 128, 9216));
  EXPECT_LT(t.seconds, 3.0 * tile_s(128, 128, 9216, 0.92));
}

TEST(KernelModelGemm, SkinnyGemmIsMemoryBound) {
  // 16 x 4096 x 4096 (a decode step's projection): 2 (16 x 4096 + 4096^2 +
  // 16 x 4096) bytes = 33.8 MB at 1.733 TB/s = 19.5 us; the tiles need at
  // least one wave of 64-row tiles over the whole weight, which the split-K
  // slices bring under that.
  const GemmTiming t = gpu_gemm_time({16, 4096, 4096, 1, DType::bf16}, a100_rates(2e-6));
  const double bytes = 2.0 * (16.0 * 4096.0 + 4096.0 * 4096.0 + 16.0 * 4096.0);
  EXPECT_TRUE(t.memory_bound);
  EXPECT_NEAR(t.seconds, bytes / 1.733e12 + 2e-6, 1e-15);
}

TEST(KernelModelGemm, BatchedGemmQuantizesOverTheBatch) {
  // 8 experts of 512 x 1024 x 1024 in one grouped launch: 256 x 128 tiles
  // 2 x 8 per expert, 128 over the batch -> 2 waves on 108 SMs; 128 x 128:
  // 256 -> 3 waves of half tiles at 0.92 = 1.63; 256 x 64: 256 -> 3 at 0.88 =
  // 1.70; 128 x 64: 512 -> 5 quarter waves at 0.8 = 1.5625; 64 x 64: 1024 ->
  // 10 eighths at 0.65 = 1.923.  The model picks 128 x 64 (and 64 x 128, the
  // same count).
  const GemmTiming t = gpu_gemm_time({512, 1024, 1024, 8, DType::bf16}, a100_rates());
  EXPECT_EQ(t.tile_m * t.tile_n, 128 * 64);
  EXPECT_EQ(t.tiles, 512);
  EXPECT_EQ(t.waves, 5);
  EXPECT_NEAR(t.seconds, 5.0 * tile_s(128, 64, 1024, 0.80), 1e-12);
}

TEST(KernelModelAttention, ShapeFactorsByTheDocumentedFormula) {
  // Forward, head dim 128, no mask, s 16384: 128 key blocks,
  // S = 1 / (1 + (2.23 / 128)^1.225), H = 1.
  const AttentionShape long_full{1, 16, 16, 16384, 16384, 128, false, DType::bf16};
  EXPECT_NEAR(flash_attention_shape_factor(long_full, Pass::forward),
              1.0 / (1.0 + std::pow(2.23 / 128.0, 1.225)), 1e-12);
  // Causal, head dim 64, s 2048: N = 16 query blocks read (16 + 1) / 2 = 8.5
  // key blocks on average; mask 16 / 17 x 0.935; H = (64 / 114.8) / (128 / 178.8).
  const AttentionShape causal{8, 32, 32, 2048, 2048, 64, true, DType::bf16};
  const double head = (64.0 / 114.8) / (128.0 / 178.8);
  EXPECT_NEAR(flash_attention_shape_factor(causal, Pass::forward),
              head / (1.0 + std::pow(2.23 / 8.5, 1.225)) * 16.0 / 17.0 * 0.935, 1e-12);
  // Backward: its own asymptote 0.874 and constants (d0 28.1, n0 3.31, p 1.247).
  const AttentionShape mid{4, 16, 16, 4096, 4096, 128, false, DType::bf16};
  EXPECT_NEAR(flash_attention_shape_factor(mid, Pass::backward),
              0.874 / (1.0 + std::pow(3.31 / 32.0, 1.247)), 1e-12);
}

TEST(KernelModelAttention, MatchesTheFlashAttention3Figures) {
  // FlashAttention-3 (Shah et al. 2024) FP16 forward on H100, TFLOP/s as
  // printed on its figure 5 bars (batch x s = 16k, H x d = 2048), against the
  // model at its fitted asymptote 651.5 TFLOP/s: within 12% everywhere.
  struct Row {
    int64_t d;
    bool causal;
    double tflops[6];
  };
  const Row rows[] = {
      {64, false, {333, 392, 460, 476, 496, 497}},  {64, true, {197, 265, 371, 420, 460, 473}},
      {128, false, {467, 565, 625, 638, 646, 648}}, {128, true, {292, 423, 521, 579, 602, 616}},
      {256, false, {482, 628, 707, 736, 746, 756}}, {256, true, {286, 427, 537, 612, 628, 642}},
  };
  const int64_t lengths[] = {512, 1024, 2048, 4096, 8192, 16384};
  for (const Row& row : rows) {
    for (int i = 0; i < 6; ++i) {
      const int64_t s = lengths[i];
      const AttentionShape shape{16384 / s, 2048 / row.d, 2048 / row.d, s,
                                 s,         row.d,        row.causal,   DType::bf16};
      const double model = 651.5 * flash_attention_shape_factor(shape, Pass::forward);
      EXPECT_NEAR(model / row.tflops[i], 1.0, 0.12)
          << "d " << row.d << (row.causal ? " causal" : "") << " s " << s;
    }
  }
}

// train.attention_kernel = a named FlashAttention generation times the
// profile's FlashAttention at that generation's published rate.  By hand
// from the sources: on h200 (its "flash" is FlashAttention-3, fitted
// asymptote 651.5 TFLOP/s, Shah et al. 2024) FlashAttention-2 runs at 35% of
// 989 TFLOP/s (the same paper), the Triton kernel and FlashAttention at half
// of FlashAttention-2 (Dao 2023 "around 2x"; the Triton kernel's header:
// slightly slower than FlashAttention); on the A100 (its "flash" is
// FlashAttention-2) flash1 and triton at half its rate.  So each step equals
// the "flash" step on a copy of the profile whose kernel.attention_efficiency
// is scaled by that factor.
TEST(KernelModelAttention, NamedGenerationIsTheProfileAtItsPublishedRate) {
  struct Case {
    const char* profile;
    AttentionKernel kernel;
    double factor;
  };
  const double fa2_over_fa3 = 0.35 * 989.0 / 651.5;
  for (const Case& c : {Case{"h200", AttentionKernel::flash2, fa2_over_fa3},
                        Case{"h200", AttentionKernel::triton, 0.5 * fa2_over_fa3},
                        Case{"h200", AttentionKernel::flash3, 1.0},
                        Case{"a100-80gb-dgx", AttentionKernel::flash1, 0.5},
                        Case{"a100-80gb-dgx", AttentionKernel::flash2, 1.0},
                        Case{"a100-80gb-dgx", AttentionKernel::triton, 0.5}}) {
    const DeviceProfile profile = load_profile(c.profile);
    Config config;
    config.model.seq_len = 8192;  // attention a large share of the step
    config.train.attention_kernel = c.kernel;
    const Estimate named = estimate(config, profile, StepKind::train);
    DeviceProfile scaled = profile;
    scaled.kernel.attention_efficiency =
        resolve_kernel_params(profile).attention_efficiency * c.factor;
    config.train.attention_kernel = AttentionKernel::flash;
    const Estimate by_hand = estimate(config, scaled, StepKind::train);
    EXPECT_NEAR(named.time.step_s / by_hand.time.step_s, 1.0, 1e-12)
        << c.profile << " " << to_string(c.kernel);
    const auto& attention = named.time.by_kind[static_cast<size_t>(OpKind::attention)];
    const auto flash = estimate(config, profile, StepKind::train)
                           .time.by_kind[static_cast<size_t>(OpKind::attention)];
    if (c.factor < 1.0) {
      EXPECT_GT(attention.time_s, flash.time_s) << c.profile << " " << to_string(c.kernel);
    } else {
      EXPECT_NEAR(attention.time_s / flash.time_s, 1.0, 1e-12) << c.profile;
    }
  }
}

// Where no rate is published the setting is refused in one line naming the
// field, the value and what is allowed.
TEST(KernelModelAttention, GenerationWithoutAPublishedRateIsRefused) {
  Config config;
  config.train.attention_kernel = AttentionKernel::flash3;
  try {
    estimate(config, load_profile("a100-80gb-dgx"), StepKind::train);
    ADD_FAILURE() << "flash3 on the A100 accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              "train.attention_kernel = \"flash3\": device.profile = \"a100-80gb-dgx\" "
              "(kernel.device_class \"a100\") has no published rate for it; allowed: \"flash\", "
              "\"unfused\", \"flash1\", \"flash2\", \"triton\"");
  }
  config.train.attention_kernel = AttentionKernel::triton;
  EXPECT_THROW(estimate(config, load_profile("cpu-generic"), StepKind::train), ConfigError);
}

TEST(KernelModelTiming, ProfileWithSmCountUsesTheModel) {
  DeviceProfile p;
  p.name = "gpu";
  p.ceilings = {.peak_flops_bf16 = 312e12,
                .peak_flops_fp32 = 19.5e12,
                .memory_bandwidth = 2.039e12,
                .launch_overhead_s = 4e-6,
                .memory_bytes = 80e9};
  p.kernel.gemm_efficiency = 267.9 / 312.0;
  p.kernel.memory_efficiency = 0.85;
  p.kernel.sm_count = 108;
  const TimingModel timing(p);
  ASSERT_TRUE(timing.shape_aware());
  TimingModel::Source source = TimingModel::Source::roofline;
  OpShape gemm;
  gemm.kind = OpKind::gemm;
  gemm.dims = {4096, 4096, 4096, 1, 0, 0, 0};
  const double seconds = timing.op_time_s(gemm, Pass::forward, &source);
  EXPECT_EQ(source, TimingModel::Source::kernel_model);
  EXPECT_NEAR(seconds, 5.0 * tile_s(256, 128, 4096) + 4e-6, 1e-9);
  // A memory-bound op: its bytes at 0.85 x 2.039 TB/s + the launch.
  OpShape add;
  add.kind = OpKind::elementwise;
  add.dims = {1 << 24, 2, 1, 0, 0, 0, 0};
  EXPECT_NEAR(timing.op_time_s(add, Pass::forward, &source),
              2.0 * 3.0 * double(1 << 24) / (0.85 * 2.039e12) + 4e-6, 1e-12);
  EXPECT_EQ(source, TimingModel::Source::kernel_model);
  // A grouped expert GEMM: the per-expert shape (busiest expert's rows) batched.
  OpShape experts;
  experts.kind = OpKind::expert_gemm;
  experts.dims = {8, 4096, 1024, 1024, 1000, 0, 0};
  EXPECT_NEAR(timing.op_time_s(experts, Pass::forward, &source),
              5.0 * tile_s(128, 64, 1024, 0.80) * (267.9e12 / (267.9 / 312.0 * 312e12)) + 4e-6,
              1e-9);
}

}  // namespace
}  // namespace modar
