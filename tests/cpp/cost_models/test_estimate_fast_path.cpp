// estimate_into() streams the lowering into its sums through a directly
// called (templated, inlined) consumer.  Reference: the straightforward path
// written here from the public API: lower() the step into a list, time every
// record with TimingModel::op_time_s(shape, pass) (its own op_cost), and sum
// multiplicity x time per micro-batch, plus the optimizer update once.  A few
// hundred random valid configurations, roofline and measured profiles.
#include <gtest/gtest.h>

#include <random>

#include "modar/cost_model.hpp"

namespace modar {
namespace {

DeviceProfile measured_profile() {
  DeviceProfile p = load_profile("h200");
  p.name = "synthetic-measured";
  p.measured = true;
  for (int64_t m : {512, 4096, 32768}) {
    for (int64_t n : {256, 2048, 16384, 65536}) {
      for (int64_t k : {256, 2048, 16384}) {
        OpMeasurement meas;
        meas.shape.kind = OpKind::gemm;
        meas.shape.dims = {m, n, k, 1, 0, 0, 0};
        meas.median_s = 2.0 * double(m) * double(n) * double(k) / 650e12 + 3e-6;
        p.measurements.push_back(meas);
      }
    }
  }
  for (int64_t s : {256, 1024, 4096}) {
    for (Pass pass : {Pass::forward, Pass::backward}) {
      OpMeasurement meas;
      meas.shape.kind = OpKind::attention;
      meas.shape.dims = {8, 16, 16, s, s, 64, 1};
      meas.pass = pass;
      meas.median_s = 1e-11 * double(s) * double(s) * (pass == Pass::backward ? 2.6 : 1.0);
      p.measurements.push_back(meas);
    }
  }
  return p;
}

Config random_config(std::mt19937_64& rng) {
  const auto pick = [&](std::initializer_list<int64_t> values) {
    return *(values.begin() + rng() % values.size());
  };
  Config c;
  c.model.d_model = pick({256, 512, 1024, 2048});
  c.model.n_layers = pick({2, 3, 5, 8, 12, 24});
  c.model.n_heads = c.model.d_model / pick({64, 128});
  c.model.seq_len = pick({256, 1024, 2048});
  if (rng() % 2 == 0) {
    c.model.mlp = MlpKind::gelu;
  }
  c.train.micro_batch = pick({1, 2, 8});
  c.train.global_batch = c.train.micro_batch * pick({1, 4});
  c.train.recompute = static_cast<Recompute>(rng() % 3);
  c.attention_flops = static_cast<AttentionFlops>(rng() % 3);
  if (rng() % 2 == 0) {
    c.mod.every = pick({1, 2, 3});
    c.mod.capacity = 0.125 * static_cast<double>(pick({1, 2, 4}));
    c.mod.causal_router = static_cast<CausalRouter>(rng() % 3);
  }
  if (rng() % 2 == 0) {
    c.dar.variant = rng() % 2 == 0 ? DarVariant::dar : DarVariant::attnres;
    c.dar.block_layers = pick({1, 2, 3});
    c.dar.streams = pick({2, 3});
  }
  return c;
}

TEST(EstimateFastPath, MatchesTheStraightforwardSumOverLoweredOps) {
  const DeviceProfile roofline = load_profile("h200");
  const DeviceProfile measured = measured_profile();
  std::mt19937_64 rng(20261129);
  OpList scratch;
  Estimate fast;
  int checked = 0;
  while (checked < 300) {
    const Config config = random_config(rng);
    try {
      validate(config);
    } catch (const std::exception&) {
      continue;
    }
    ++checked;
    for (const DeviceProfile* profile : {&roofline, &measured}) {
      const TimingModel timing(*profile);
      estimate_into(config, timing, StepKind::train, scratch, fast);
      double micro_batch_s = 0.0, optimizer_s = 0.0;
      double forward_flops = 0.0, backward_flops = 0.0;
      int64_t records = 0;
      for (const OpRecord& op : lower(config, StepKind::train)) {
        TimingModel::Source source = TimingModel::Source::roofline;
        const double one_s = timing.op_time_s(op.shape, op.pass, &source);
        const double m = static_cast<double>(op.multiplicity);
        (op.shape.kind == OpKind::optimizer_update ? optimizer_s : micro_batch_s) += one_s * m;
        if (is_counted_kind(op.shape.kind) && op.pass == Pass::forward) {
          forward_flops += op.flops * m;
        } else if (is_counted_kind(op.shape.kind) && op.pass == Pass::backward) {
          backward_flops += op.flops * m;
        }
        ++records;
      }
      const double tokens = static_cast<double>(config.train.micro_batch * config.model.seq_len);
      // Sums taken in a different order: equal to rounding.
      EXPECT_NEAR(fast.time.micro_batch_s, micro_batch_s, 1e-12 * micro_batch_s);
      EXPECT_NEAR(fast.time.optimizer_s, optimizer_s, 1e-12 * optimizer_s);
      EXPECT_NEAR(fast.flops.forward_per_token, forward_flops / tokens, 1e-12 * forward_flops);
      EXPECT_NEAR(fast.flops.backward_per_token, backward_flops / tokens, 1e-12 * backward_flops);
      EXPECT_EQ(fast.time.ops_interpolated + fast.time.ops_extrapolated + fast.time.ops_roofline +
                    fast.time.ops_kernel_model,
                records);
      // And estimate() (its own TimingModel) is the same computation, bit for bit.
      const Estimate convenience = estimate(config, *profile);
      EXPECT_EQ(convenience.time.step_s, fast.time.step_s);
      EXPECT_EQ(convenience.memory.peak, fast.memory.peak);
      EXPECT_EQ(convenience.flops.train_per_step, fast.flops.train_per_step);
    }
  }
}

}  // namespace
}  // namespace modar
