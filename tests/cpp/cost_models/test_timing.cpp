// Time prediction: roofline by hand, and log-space interpolation exactness on
// a synthetic measured profile (a power law is linear in log-log space, so
// multilinear interpolation of log(time) in log(dims) reproduces it exactly).
#include <gtest/gtest.h>

#include <cmath>

#include "modar/cost_model.hpp"

namespace modar {
namespace {

DeviceProfile synthetic_profile() {
  DeviceProfile p;
  p.name = "synthetic";
  p.backend = "test";
  p.measured = true;
  p.ceilings = {.peak_flops_bf16 = 1e12,
                .peak_flops_fp32 = 1e12,
                .launch_overhead_s = 0.0,
                .memory_bytes = 1e12};
  p.ceilings.memory_bandwidth = 1e18;  // GEMMs compute-bound
  for (int64_t m : {128, 512, 2048}) {
    for (int64_t n : {128, 512, 2048}) {
      for (int64_t k : {128, 512, 2048}) {
        OpMeasurement meas;
        meas.shape.kind = OpKind::gemm;
        meas.shape.dtype = DType::bf16;
        meas.shape.dims = {m, n, k, 1, 0, 0, 0};
        // time = 3e-12 x m n k: an "efficiency" of 2 / (3e-12 x 1e12) = 2/3.
        meas.median_s = 3e-12 * static_cast<double>(m * n * k);
        meas.repeats = 10;
        p.measurements.push_back(meas);
      }
    }
  }
  return p;
}

OpShape gemm(int64_t m, int64_t n, int64_t k) {
  OpShape s;
  s.kind = OpKind::gemm;
  s.dtype = DType::bf16;
  s.dims = {m, n, k, 1, 0, 0, 0};
  return s;
}

TEST(Timing, InterpolationIsExactForAPowerLaw) {
  const DeviceProfile p = synthetic_profile();
  const TimingModel timing(p);
  TimingModel::Source source;
  for (auto [m, n, k] : {std::tuple{128, 128, 128}, std::tuple{300, 1000, 700},
                         std::tuple{2048, 129, 1500}, std::tuple{512, 2048, 200}}) {
    const double t = timing.op_time_s(gemm(m, n, k), Pass::forward, &source);
    EXPECT_EQ(source, TimingModel::Source::interpolated);
    EXPECT_NEAR(t / (3e-12 * m * n * k), 1.0, 1e-12);
  }
  // A GEMM is a GEMM in backward too (dgrad / wgrad).
  timing.op_time_s(gemm(300, 300, 300), Pass::backward, &source);
  EXPECT_EQ(source, TimingModel::Source::interpolated);
}

TEST(Timing, OutsideTheGridUsesFittedEfficiencyTimesRoofline) {
  const DeviceProfile p = synthetic_profile();
  const TimingModel timing(p);
  TimingModel::Source source;
  const double t = timing.op_time_s(gemm(8192, 4096, 64), Pass::forward, &source);
  EXPECT_EQ(source, TimingModel::Source::extrapolated);
  // Roofline 2 m n k / 1e12; every measurement was 1.5x its roofline.
  EXPECT_NEAR(t / (1.5 * 2.0 * 8192.0 * 4096.0 * 64.0 / 1e12), 1.0, 1e-12);
  bool extrapolated = false;
  OpRecord op;
  op.shape = gemm(8192, 4096, 64);
  predict_op_time_s(op, p, &extrapolated);
  EXPECT_TRUE(extrapolated);
  // A kind never measured: plain roofline, not flagged as extrapolated.
  OpShape norm;
  norm.kind = OpKind::rmsnorm;
  norm.dims = {1000, 1000, 0, 0, 0, 0, 0};
  timing.op_time_s(norm, Pass::forward, &source);
  EXPECT_EQ(source, TimingModel::Source::roofline);
}

TEST(Timing, RooflineByHand) {
  DeviceProfile p;
  p.name = "hand";
  p.ceilings = {.peak_flops_bf16 = 1000e12,
                .peak_flops_fp32 = 50e12,
                .memory_bandwidth = 5e12,
                .launch_overhead_s = 2e-6,
                .achievable_flops_bf16 = 800e12,
                .achievable_bandwidth = 4e12};
  const TimingModel timing(p);
  TimingModel::Source source;
  // Compute-bound GEMM 4096^3: 2 x 4096^3 / 800e12 + 2 us.
  const double g = timing.op_time_s(gemm(4096, 4096, 4096), Pass::forward, &source);
  EXPECT_NEAR(g, 2.0 * 4096.0 * 4096.0 * 4096.0 / 800e12 + 2e-6, 1e-15);
  // Memory-bound GEMV-like GEMM 1 x 4096 x 4096: bytes 2 (4096 + 4096^2 + 4096) / 4e12 + 2 us.
  const double v = timing.op_time_s(gemm(1, 4096, 4096), Pass::forward, &source);
  EXPECT_NEAR(v, 2.0 * (4096.0 + 4096.0 * 4096.0 + 4096.0) / 4e12 + 2e-6, 1e-15);
  // Timing uses the executed (flash) attention FLOPs whatever the convention.
  OpShape attention;
  attention.kind = OpKind::attention;
  attention.dims = {1, 16, 16, 8192, 8192, 128, 1};
  const double a = timing.op_time_s(attention, Pass::forward, &source);
  EXPECT_NEAR(a, 4.0 * 16 * 128 * 8192.0 * 8192.0 / 2.0 / 800e12 + 2e-6, 1e-12);
}

TEST(Timing, EstimateSumsOpsIntoStepTimeAndMfu) {
  Config c;
  c.model = {.d_model = 1024, .n_layers = 4, .n_heads = 8, .seq_len = 512};
  c.train.micro_batch = 4;
  c.train.global_batch = 16;  // 4 accumulation steps on one device
  const DeviceProfile p = load_profile("h200");
  const Estimate e = estimate(c, p);
  EXPECT_EQ(e.time.accumulation_steps, 4);
  double sum = 0;
  for (const OpKindTime& kind : e.time.by_kind) {
    sum += kind.time_s;
  }
  // The ops, plus the per-step gradient norm and host time named apart.
  EXPECT_NEAR((sum + e.time.grad_norm_s + e.time.step_overhead_s) / e.time.step_s, 1.0, 1e-12);
  EXPECT_GT(e.time.grad_norm_s, 0.0);
  EXPECT_NEAR(
      e.time.step_s,
      4 * e.time.micro_batch_s + e.time.optimizer_s + e.time.grad_norm_s + e.time.step_overhead_s,
      1e-15);
  EXPECT_NEAR(e.time.tokens_per_s, 16.0 * 512.0 / e.time.step_s, 1e-6);
  EXPECT_NEAR(e.time.mfu, e.flops.train_per_step / (e.time.step_s * 989e12), 1e-12);
  EXPECT_GT(e.time.mfu, 0.0);
  // Cannot beat the largest GEMMs' rate (kernel.gemm_efficiency, MSMF 755 / 989).
  EXPECT_LT(e.time.mfu, 755.0 / 989.0);
  EXPECT_FALSE(e.time.calibrated);
  EXPECT_NE(e.conventions.find("causal"), std::string::npos);
}

TEST(Timing, EstimateIntoReusesBuffersAndMatchesEstimate) {
  Config c;
  c.mod.every = 2;
  c.dar.variant = DarVariant::dar;
  const DeviceProfile p = load_profile("h200");
  const TimingModel timing(p);
  OpList scratch;
  Estimate fast;
  estimate_into(c, timing, StepKind::train, scratch, fast);
  const Estimate slow = estimate(c, p);
  EXPECT_EQ(fast.time.step_s, slow.time.step_s);
  EXPECT_EQ(fast.memory.peak, slow.memory.peak);
  EXPECT_EQ(fast.params.flop_active, slow.params.flop_active);
  EXPECT_EQ(fast.conventions, slow.conventions);
}

}  // namespace
}  // namespace modar
