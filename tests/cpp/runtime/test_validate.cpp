// Validation: the held-out cases really are off the profile grid, the executed
// op trace counts what a hand calculation says, and the report's errors are
// the stated function of measured and predicted numbers.  No assertion depends
// on how fast anything runs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "modar/cost_model.hpp"
#include "modar/runtime/backend.hpp"
#include "modar/runtime/profiler.hpp"
#include "modar/runtime/validate.hpp"

namespace modar::runtime {
namespace {

TEST(ValidateCases, HeldOutShapesAreNotGridValues) {
  const auto grid = profile_grid(GridSize::quick, DeviceKind::cpu, DType::fp32);
  std::set<int64_t> token_axis, width_axis, gemm_axis;
  for (const ProfilePoint& p : grid) {
    if (p.shape.kind == OpKind::rmsnorm) {
      token_axis.insert(p.shape.dims[0]);
      width_axis.insert(p.shape.dims[1]);
    }
    if (p.shape.kind == OpKind::gemm) {
      gemm_axis.insert(p.shape.dims[0]);
    }
  }
  const auto full = validation_cases(false, DeviceKind::cpu, DType::fp32);
  const auto quick = validation_cases(true, DeviceKind::cpu, DType::fp32);
  EXPECT_LT(quick.size(), full.size());
  std::set<std::string> kinds;
  for (const ValidationCase& c : full) {
    const int64_t tokens = c.config.train.micro_batch * c.config.model.seq_len;
    EXPECT_EQ(token_axis.count(tokens), 0u) << c.name << " T = " << tokens;
    EXPECT_EQ(width_axis.count(c.config.model.d_model), 0u) << c.name;
    EXPECT_EQ(gemm_axis.count(c.config.model.d_model), 0u) << c.name;
    EXPECT_EQ(c.config.train.dtype, DType::fp32);
    EXPECT_NO_THROW(validate(c.config)) << c.name;
    kinds.insert(c.config.mod.enabled() ? "mod" : "");
    kinds.insert(to_string(c.config.dar.variant));
    kinds.insert(c.scope);
  }
  // Dense, MoD, AttnRes and DAR; single layers and whole steps.
  for (const char* wanted : {"mod", "none", "attnres", "dar", "layer", "step"}) {
    EXPECT_EQ(kinds.count(wanted), 1u) << wanted;
  }
  // MoD at several capacities.
  std::set<double> capacities;
  for (const ValidationCase& c : quick) {
    if (c.config.mod.enabled())
      capacities.insert(c.config.mod.capacity);
  }
  EXPECT_GE(capacities.size(), 2u);
}

// A measured profile small enough for a unit test (not a timing claim).
DeviceProfile tiny_profile(Backend& backend) {
  ProfileOptions options;
  options.backend_name = "cpu";
  // One file per test and process: ctest runs tests in parallel, and a second
  // writer of the same profile is refused (OUT.lock).
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  options.out_path = std::string(::testing::TempDir()) + "/modar_validate_tiny_" +
                     std::to_string(::getpid()) + "_" + test->name() + ".toml";
  options.measure_ceilings = false;
  options.timing.budget_s = 0.001;
  options.timing.min_repeats = 3;
  options.timing.max_repeats = 3;
  options.timing.rotation_bytes = 1;
  OpShape gemm;
  gemm.kind = OpKind::gemm;
  gemm.dtype = DType::fp32;
  gemm.dims = {32, 32, 32, 1, 0, 0, 0};
  options.points = {{gemm, Pass::forward}};
  return run_profile(backend, options);
}

// One dense GELU layer of width d over seq tokens, V = 64, micro-batch 2, fp32.
Config tiny_dense(int64_t d, int64_t seq) {
  Config c;
  c.model = {.d_model = d, .n_layers = 1, .n_heads = 2, .vocab_size = 64, .seq_len = seq};
  c.dar.block_layers = 1;
  c.train.micro_batch = 2;
  c.train.dtype = DType::fp32;
  return c;
}

TEST(ValidateRun, TraceCountsGemmFlopsAndErrorsAreConsistent) {
  auto backend = make_cpu_backend();
  const DeviceProfile profile = tiny_profile(*backend);
  // One dense GELU layer, d = 32, T = b s = 2 x 16, V = 64, untied head.
  Config c = tiny_dense(32, 16);
  ValidationOptions options;
  options.rounds = 3;
  options.warmup_steps = 1;
  options.cases = {{"tiny-dense", "layer", c}};
  const ValidationReport report = run_validation(*backend, profile, options);
  ASSERT_EQ(report.cases.size(), 1u);
  const CaseResult& r = report.cases[0];

  // GEMM FLOPs of one training step by hand: forward 2 T (d 3d + d d + d 4d +
  // 4d d + d V), backward twice that (dgrad + wgrad per linear layer).
  const double T = 32, d = 32, V = 64;
  const double forward = 2.0 * T * (3 * d * d + d * d + 4 * d * d + 4 * d * d + d * V);
  EXPECT_DOUBLE_EQ(r.executed.gemm_flops, 3.0 * forward);
  EXPECT_DOUBLE_EQ(r.lowered_gemm_flops, 3.0 * forward);
  // The cost model fuses Q, K, V into one GEMM (5 forward + 10 backward).
  EXPECT_EQ(r.lowered_gemm_ops, 15);
  EXPECT_GE(r.executed.gemm_calls, r.lowered_gemm_ops);
  EXPECT_EQ(r.executed.calls_by_kind[static_cast<size_t>(OpKind::attention)], 2);
  EXPECT_EQ(r.executed.calls_by_kind[static_cast<size_t>(OpKind::cross_entropy)], 2);

  EXPECT_EQ(r.rounds, 3);
  EXPECT_GT(r.measured_step_s, 0.0);
  EXPECT_GT(r.measured_peak_bytes, 0.0);
  EXPECT_DOUBLE_EQ(r.step_error, (r.predicted_step_s - r.measured_step_s) / r.measured_step_s);
  EXPECT_DOUBLE_EQ(r.memory_error,
                   (r.predicted_peak_bytes - r.measured_peak_bytes) / r.measured_peak_bytes);
  EXPECT_DOUBLE_EQ(report.step_median_abs_error, std::abs(r.step_error));
  EXPECT_DOUBLE_EQ(report.step_max_abs_error, std::abs(r.step_error));
  EXPECT_DOUBLE_EQ(report.memory_median_abs_error, std::abs(r.memory_error));

  const std::string json = validation_json(report);
  for (const char* key : {"\"cases\"", "\"step_time\"", "\"median_abs_error\"", "\"max_abs_error\"",
                          "\"memory\"", "\"tiny-dense\""}) {
    EXPECT_NE(json.find(key), std::string::npos) << key;
  }
  EXPECT_NE(validation_text(report).find("tiny-dense"), std::string::npos);
}

// The report's median and max |error| over an odd and an even number of
// cases, by hand from the per-case errors (type-7 median: the middle value,
// or the mean of the two middle values).
TEST(ValidateRun, MedianAndMaxOverSeveralCases) {
  auto backend = make_cpu_backend();
  const DeviceProfile profile = tiny_profile(*backend);
  for (const size_t count : {3u, 4u}) {
    ValidationOptions options;
    options.rounds = 1;
    options.warmup_steps = 0;
    const int64_t widths[] = {24, 32, 40, 48};
    for (size_t i = 0; i < count; ++i) {
      options.cases.push_back(
          {"dense-" + std::to_string(widths[i]), "layer", tiny_dense(widths[i], 8)});
    }
    const ValidationReport report = run_validation(*backend, profile, options);
    ASSERT_EQ(report.cases.size(), count);
    std::vector<double> step, memory;
    for (const CaseResult& r : report.cases) {
      step.push_back(std::abs(r.step_error));
      memory.push_back(std::abs(r.memory_error));
    }
    std::sort(step.begin(), step.end());
    std::sort(memory.begin(), memory.end());
    const auto median = [count](const std::vector<double>& v) {
      return count % 2 == 1 ? v[count / 2] : 0.5 * (v[count / 2 - 1] + v[count / 2]);
    };
    EXPECT_DOUBLE_EQ(report.step_median_abs_error, median(step)) << count;
    EXPECT_DOUBLE_EQ(report.memory_median_abs_error, median(memory)) << count;
    EXPECT_DOUBLE_EQ(report.step_max_abs_error, step.back()) << count;
    EXPECT_DOUBLE_EQ(report.memory_max_abs_error, memory.back()) << count;
  }
}

// The runtime's measured peak bytes against the memory estimate, on dense,
// MoD and DAR layers (the validation table's memory column, as a unit test:
// docs/profiler.md reports a median error of a few percent).
TEST(ValidateRun, MeasuredPeakMemoryMatchesTheEstimate) {
  auto backend = make_cpu_backend();
  const DeviceProfile profile = tiny_profile(*backend);
  ValidationOptions options;
  options.rounds = 1;
  options.warmup_steps = 0;
  Config dense = tiny_dense(64, 32);
  dense.model.n_layers = 2;
  Config mod = dense;
  mod.mod.every = 2;
  mod.mod.capacity = 0.5;
  Config dar = dense;
  dar.dar.variant = DarVariant::dar;
  options.cases = {{"dense", "step", dense}, {"mod", "step", mod}, {"dar", "step", dar}};
  const ValidationReport report = run_validation(*backend, profile, options);
  for (const CaseResult& r : report.cases) {
    EXPECT_GT(r.measured_peak_bytes, 0.0) << r.validation_case.name;
    EXPECT_NEAR(r.predicted_peak_bytes / r.measured_peak_bytes, 1.0, 0.2)
        << r.validation_case.name << ": measured " << r.measured_peak_bytes << " B, estimated "
        << r.predicted_peak_bytes << " B";
  }
}

}  // namespace
}  // namespace modar::runtime
