// The calibration loop's noise: the drift sentinel's arithmetic on hand-worked
// times, interleaved rounds pooled into one measurement, a machine that slows
// down in the middle of a run (a backend double whose GEMMs start costing
// three times the work) caught by the sentinel, the run bounded by
// max_seconds, and validate's noise floor and host check.  No assertion
// depends on how fast this machine is.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>

#include "modar/base/errors.hpp"
#include "modar/runtime/backend.hpp"
#include "modar/runtime/forwarding_backend.hpp"
#include "modar/runtime/op_args.hpp"
#include "modar/runtime/profiler.hpp"
#include "modar/runtime/validate.hpp"

namespace modar::runtime {
namespace {

namespace fs = std::filesystem;

OpShape shape_of(OpKind kind, std::initializer_list<int64_t> dims) {
  OpShape shape;
  shape.kind = kind;
  shape.dtype = DType::fp32;
  size_t i = 0;
  for (int64_t v : dims) {
    shape.dims[i++] = v;
  }
  return shape;
}

std::string temp_path(const std::string& name) {
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  return std::string(::testing::TempDir()) + "/modar_noise_" + std::to_string(::getpid()) + "_" +
         test->name() + "_" + name;
}

ProfileOptions tiny_run(const std::string& out) {
  ProfileOptions options;
  options.backend_name = "cpu";
  options.out_path = out;
  options.measure_ceilings = false;
  // One thread timed by CPU time, the CPU default (with more threads the CPU
  // clock also counts OpenMP's spin-waiting, which swings the sentinel).
  options.threads = 1;
  options.timing.clock = Clock::cpu;
  options.timing.budget_s = 0.003;
  options.timing.min_repeats = 5;
  options.timing.max_repeats = 5;
  options.timing.min_sample_s = 0.0;
  options.timing.rotation_bytes = 1 << 16;
  options.timing.max_copies = 2;
  options.points = {{shape_of(OpKind::rmsnorm, {16, 8}), Pass::forward},
                    {shape_of(OpKind::rmsnorm, {16, 8}), Pass::backward},
                    {shape_of(OpKind::rmsnorm, {64, 8}), Pass::forward}};
  return options;
}

// |x / y - 1| with the larger over the smaller, worked by hand.
TEST(DriftSentinel, DriftIsTheLargestRelativeChange) {
  EXPECT_DOUBLE_EQ(sentinel_drift(1.0, 1.0, 1.0), 0.0);
  EXPECT_NEAR(sentinel_drift(1.0, 1.2, 1.2), 0.2, 1e-12);              // both slower than the start
  EXPECT_NEAR(sentinel_drift(1.0, 1.0, 0.8), 0.25, 1e-12);             // 1 / 0.8 - 1
  EXPECT_NEAR(sentinel_drift(1.0, 1.1, 0.9), 1.1 / 0.9 - 1.0, 1e-12);  // within the batch
  EXPECT_NEAR(sentinel_drift(2.0, 1.0, 1.0), 1.0, 1e-12);              // twice as fast: 100 %
  EXPECT_DOUBLE_EQ(sentinel_drift(0.0, 1.0, 2.0), 0.0);                // no reference: no verdict
}

// rounds = 3 with 5 samples per point: each round takes at least
// ceil(5 / 3) = 2 samples, so a point pools >= 6; the file keeps the rounds.
TEST(ProfilerNoise, RoundsArePooledAndRecorded) {
  auto backend = make_cpu_backend();
  const std::string out = temp_path("rounds.toml");
  ProfileOptions options = tiny_run(out);
  options.rounds = 3;
  options.batch_points = 2;
  const DeviceProfile written = run_profile(*backend, options);
  ASSERT_EQ(written.measurements.size(), 3u);
  for (const OpMeasurement& m : written.measurements) {
    EXPECT_EQ(m.rounds, 3);
    EXPECT_GE(m.repeats, 6);
    EXPECT_GE(m.round_spread, 0.0);
    EXPECT_FALSE(m.drift);
  }
  EXPECT_EQ(written.provenance.at("rounds"), "3");
  EXPECT_EQ(written.provenance.count("sentinel"), 0u);  // drift_tolerance 0: no sentinel
  const DeviceProfile read = load_measured_profile(out, "cpu");
  for (size_t i = 0; i < read.measurements.size(); ++i) {
    EXPECT_EQ(read.measurements[i].rounds, 3);
    EXPECT_NEAR(read.measurements[i].round_spread, written.measurements[i].round_spread,
                1e-12 + 1e-12 * written.measurements[i].round_spread);
  }
  fs::remove(out);
}

// A machine that slows down mid-run: once the second point (rmsnorm
// backward) has run, every GEMM (the sentinel is one) does twenty GEMMs' work,
// i.e. the sentinel takes 20x as long (far beyond what load does to it: on
// this shared 2-core host its CPU time moved by up to ~60 %).  The first batch is clean; the second
// is measured again and, the machine staying slow, its point is marked.
class SlowingBackend final : public ForwardingBackend {
 public:
  explicit SlowingBackend(Backend& inner) : ForwardingBackend(inner) {}

 protected:
  void execute(const OpArgs& call, const OpGeometry&) override {
    if (op_id(call) == OpId::rmsnorm_backward) {
      slow_ = true;
    }
    inner().run(call);
    for (int extra = 0; slow_ && op_id(call) == OpId::gemm && extra < 19; ++extra) {
      inner().run(call);
    }
  }

 private:
  bool slow_ = false;
};

TEST(ProfilerNoise, TheSentinelCatchesAMachineThatSlowsDown) {
  auto cpu = make_cpu_backend();
  SlowingBackend backend(*cpu);
  const std::string out = temp_path("slowing.toml");
  ProfileOptions options = tiny_run(out);
  options.points.pop_back();
  options.batch_points = 1;
  options.drift_tolerance = 4.0;  // a 20x change is +1900 %
  const DeviceProfile written = run_profile(backend, options);
  ASSERT_EQ(written.measurements.size(), 2u);
  EXPECT_FALSE(written.measurements[0].drift);
  EXPECT_TRUE(written.measurements[1].drift);
  EXPECT_EQ(written.provenance.at("drift_remeasured_batches"), "1");
  EXPECT_EQ(written.provenance.at("drift_marked_points"), "1");
  EXPECT_GT(std::stod(written.provenance.at("drift")), 8.0);  // (20 t - t) / t = 19, roughly
  EXPECT_NE(written.provenance.at("sentinel").find("gemm 256x256x256 fp32"), std::string::npos);
  EXPECT_TRUE(load_measured_profile(out, "cpu").measurements[1].drift);  // in the file
  fs::remove(out);
}

// A 4096^3 GEMM is ~137 GFLOP: seconds of one core, far past a 2 s bound,
// while the two small points cost their budgets.  The bound leaves the
// expensive point out, before measuring, and says so.
TEST(ProfilerNoise, MaxSecondsLeavesOutTheMostExpensivePoints) {
  auto backend = make_cpu_backend();
  const std::string out = temp_path("bounded.toml");
  ProfileOptions options = tiny_run(out);
  options.points.insert(options.points.begin() + 1,
                        {shape_of(OpKind::gemm, {4096, 4096, 4096, 1}), Pass::forward});
  options.max_seconds = 2.0;
  const ProfileDurationEstimate estimate =
      estimate_profile_duration(*backend, options, options.points);
  ASSERT_EQ(estimate.left_out.size(), 1u);
  EXPECT_EQ(estimate.left_out[0].shape.kind, OpKind::gemm);
  EXPECT_EQ(estimate.kept.size(), 3u);
  EXPECT_LE(estimate.total_s, options.max_seconds);
  EXPECT_GT(estimate.left_out_s, 2.0);

  const DeviceProfile written = run_profile(*backend, options);
  EXPECT_EQ(written.measurements.size(), 3u);
  EXPECT_EQ(written.provenance.at("unmeasured_count"), "1");
  EXPECT_NE(written.provenance.at("unmeasured.0001").find("gemm forward fp32 [4096, 4096, 4096"),
            std::string::npos);
  EXPECT_NE(written.provenance.at("unmeasured.0001").find("max_seconds = 2 s"), std::string::npos);
  fs::remove(out);
}

TEST(ProfilerNoise, SettingsDefaultsAndFieldNamedErrors) {
  auto backend = make_cpu_backend();
  ProfileRequest request;
  request.out_path = temp_path("settings.toml");
  const ProfileOptions options = resolve_profile_options(request, *backend);
  EXPECT_EQ(options.rounds, 3);
  EXPECT_EQ(options.batch_points, 32);
  EXPECT_DOUBLE_EQ(options.drift_tolerance, 0.10);
  EXPECT_DOUBLE_EQ(options.max_seconds, 0.0);
  const std::pair<std::function<void(ProfileRequest&)>, std::string> bad[] = {
      {[](ProfileRequest& r) { r.rounds = 0; }, "rounds = 0: must be an integer in [1, 20]"},
      {[](ProfileRequest& r) { r.drift_tolerance = -0.1; }, "drift_tolerance = -0.1: must be in"},
      {[](ProfileRequest& r) { r.max_seconds = 0.0; }, "max_seconds = 0: must be in (0, 1e7]"},
      {[](ProfileRequest& r) { r.max_seconds = std::nan(""); }, "max_seconds = nan"},
  };
  for (const auto& [change, expected] : bad) {
    ProfileRequest wrong = request;
    change(wrong);
    try {
      resolve_profile_options(wrong, *backend);
      ADD_FAILURE() << "accepted: " << expected;
    } catch (const ConfigError& e) {
      EXPECT_EQ(std::string(e.what()).rfind(expected, 0), 0u) << e.what();
    }
  }
}

// ---- validate ------------------------------------------------------------------------

TEST(ValidateNoise, NoiseFloorFromHandWorkedSpreads) {
  EXPECT_NEAR(error_noise_floor(0.10, 0.02), 0.07, 1e-12);  // half of 10 % + 2 %
  DeviceProfile profile;
  const auto add = [&](OpKind kind, int64_t rounds, double round_spread) {
    OpMeasurement m;
    m.shape.kind = kind;
    m.median_s = 1e-3;
    m.rounds = rounds;
    m.round_spread = round_spread;
    profile.measurements.push_back(m);
  };
  add(OpKind::gemm, 3, 0.2);
  add(OpKind::gemm, 3, 0.4);
  add(OpKind::gemm, 3, 0.3);
  add(OpKind::rmsnorm, 1, 5.0);  // one round: no round spread to speak of
  std::array<double, kOpKindCount> by_kind{};
  by_kind[static_cast<size_t>(OpKind::gemm)] = 3.0;
  by_kind[static_cast<size_t>(OpKind::rmsnorm)] = 1.0;
  // gemm: median round spread 0.3, half 0.15, share 3/4 -> 0.1125; rmsnorm 0.
  EXPECT_NEAR(predicted_noise(profile, by_kind), 0.1125, 1e-12);
}

Config tiny_dense(int64_t d) {
  Config c;
  c.model = {.d_model = d, .n_layers = 1, .n_heads = 2, .vocab_size = 48, .seq_len = 8};
  c.dar.block_layers = 1;
  c.train = {.micro_batch = 2, .dtype = DType::fp32};
  return c;
}

DeviceProfile tiny_profile(Backend& backend, const std::string& out) {
  ProfileOptions options = tiny_run(out);
  options.points = {{shape_of(OpKind::gemm, {32, 32, 32, 1}), Pass::forward}};
  options.rounds = 2;
  options.drift_tolerance = 10.0;  // the sentinel is timed and recorded, never acted on
  return run_profile(backend, options);
}

// Repeats: each case's repeat medians, its run-to-run spread and floor are the
// stated functions of them, and no error is claimed below its floor.
TEST(ValidateNoise, RepeatsGiveTheRunToRunSpreadAndTheFloor) {
  auto backend = make_cpu_backend();
  const DeviceProfile profile = tiny_profile(*backend, temp_path("p.toml"));
  ValidationOptions options;
  options.clock = Clock::cpu;  // the profile's, so the sentinels compare
  options.rounds = 2;
  options.repeats = 3;
  options.warmup_steps = 0;
  options.cases = {{"dense-24", "layer", tiny_dense(24)}, {"dense-40", "layer", tiny_dense(40)}};
  const ValidationReport report = run_validation(*backend, profile, options);
  ASSERT_EQ(report.cases.size(), 2u);
  ASSERT_EQ(report.step_median_abs_error_by_repeat.size(), 3u);
  for (const CaseResult& r : report.cases) {
    ASSERT_EQ(r.repeat_step_s.size(), 3u);
    EXPECT_EQ(r.rounds, 6);
    const double low = *std::min_element(r.repeat_step_s.begin(), r.repeat_step_s.end());
    const double high = *std::max_element(r.repeat_step_s.begin(), r.repeat_step_s.end());
    EXPECT_NEAR(r.run_to_run_spread, (high - low) / r.measured_step_s, 1e-12);
    EXPECT_NEAR(r.noise_floor, 0.5 * r.run_to_run_spread + r.predicted_noise, 1e-12);
    EXPECT_EQ(r.within_noise, std::abs(r.step_error) <= r.noise_floor);
  }
  // Two cases: the median is the mean of the two claims, each max(|e|, floor).
  const auto claim = [](const CaseResult& r) {
    return std::max(std::abs(r.step_error), r.noise_floor);
  };
  EXPECT_NEAR(report.step_median_abs_error, 0.5 * (claim(report.cases[0]) + claim(report.cases[1])),
              1e-12);
  EXPECT_GE(report.step_median_abs_error, report.step_median_abs_error_raw);
  EXPECT_GT(report.sentinel_s, 0.0);
  EXPECT_GT(report.sentinel_profile_s, 0.0);  // the profile recorded its sentinel (same threads)
}

// A profile whose recorded sentinel time is 1000x off: the machine does not
// match it.  Flagged by default; refused (before measuring) on request.
TEST(ValidateNoise, AMachineThatDoesNotMatchIsFlaggedOrRefused) {
  auto backend = make_cpu_backend();
  DeviceProfile profile = tiny_profile(*backend, temp_path("p.toml"));
  const double recorded = std::stod(profile.provenance.at("sentinel_reference_s"));
  char thousandth[32];
  std::snprintf(thousandth, sizeof(thousandth), "%.6g", recorded / 1000.0);
  profile.provenance["sentinel_reference_s"] = thousandth;
  ValidationOptions options;
  options.clock = Clock::cpu;
  options.rounds = 1;
  options.warmup_steps = 0;
  options.cases = {{"dense-24", "layer", tiny_dense(24)}};
  const ValidationReport report = run_validation(*backend, profile, options);
  ASSERT_FALSE(report.host_flags.empty());
  EXPECT_NE(report.host_flags.front().find("does not match the profile"), std::string::npos)
      << report.host_flags.front();
  EXPECT_NE(validation_text(report).find("WARNING: the machine does not match"), std::string::npos);
  EXPECT_NE(validation_json(report).find("\"valid\": false"), std::string::npos);

  options.refuse_under_load = true;
  options.should_stop = [] {
    ADD_FAILURE() << "refused before measuring: nothing is built";
    return false;
  };
  try {
    run_validation(*backend, profile, options);
    ADD_FAILURE() << "not refused";
  } catch (const HostBusyError& e) {
    EXPECT_NE(std::string(e.what()).find("re-run on a quiet machine"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace modar::runtime
