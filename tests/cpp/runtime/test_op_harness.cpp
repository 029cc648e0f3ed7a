// tests/cpp/runtime/test_op_harness.cpp: ONE harness for every op of the op
// table (op_args.hpp) on every backend (ggml's test-backend-ops pattern, with
// FlashAttention's error rule).
//
// Each table row's sample (modar/runtime/op_samples.hpp: the one recipe of
// "a valid call of op X", shared with the profiler's benches) runs
//   * on the CPU in fp64: the reference;
//   * on the CPU in fp32 and bf16: its error against the reference must be
//     within the dtype's tolerance (relative to the output's scale);
//   * on every other registered backend (CUDA when a GPU is present; skipped
//     otherwise) in fp32 and bf16: FlashAttention's rule, its error against
//     the fp64 reference is at most 2x the CPU's error at the same dtype plus a
//     small floor (the two differ in summation order only).
// Inputs are the same values in every run (bf16-representable numbers).  The
// outputs an op overwrites are poisoned first (NaN; -2^30 for indices) in
// every run, so an element a kernel never writes fails.  Index outputs
// (top-k, dispatch) must be equal.  Every sample must produce a non-zero
// reference (a sample that computes nothing could not fail).
//
// The other backends also run every sample at larger "device sizes" (odd
// widths, several tiles; tests/cpp/cuda keeps only what is CUDA-specific:
// attention paths, allocator, device facts, the model step).
// MODAR_OP_HARNESS_SELF_CHECK=1 adds a second CPU backend as "other", to run
// those samples without a GPU.
//
// Performance mode: MODAR_OP_HARNESS_PERF=N builds every sample at N rows and
// prints the time of each op per backend and dtype (a table; no assertion).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "modar/base/errors.hpp"
#include "modar/runtime/backend.hpp"
#include "modar/runtime/op_samples.hpp"

namespace modar::runtime {
namespace {

// ---- running a sample -------------------------------------------------------------

using Views = std::vector<TensorView>;

struct RunResult {
  std::vector<std::vector<double>> outputs;
  std::vector<bool> is_index;
  double seconds_per_call = 0.0;
};

// Runs the sample's calls on `backend` in dtype `data`, written outputs
// poisoned first (NaN / -2^30), and downloads its outputs; timed_calls > 0
// then times the op itself.
RunResult run_sample(Backend& backend, const OpSample& sample, ScalarType data,
                     int timed_calls = 0) {
  SampleTensors made = make_sample_tensors(backend, sample, data, SampleFill::poisoned);
  const std::vector<OpArgs> calls = sample.calls(made.views);
  for (const OpArgs& call : calls)
    backend.run(call);
  RunResult result;
  for (int index : sample.outputs) {
    const TensorView& view = made.views[static_cast<size_t>(index)];
    result.outputs.push_back(download(backend, view));
    result.is_index.push_back(view.dtype == ScalarType::i32);
  }
  if (timed_calls > 0) {
    backend.synchronize();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < timed_calls; ++i)
      backend.run(calls.back());
    backend.synchronize();
    result.seconds_per_call =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
        timed_calls;
  }
  return result;
}

// max |a - b| / max(1, max |b|); infinite when either holds a NaN (an element
// the op never wrote keeps its poison).
double scaled_error(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0.0, scale = 1.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i]))
      return std::numeric_limits<double>::infinity();
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return diff / scale;
}

double cpu_tolerance(ScalarType dtype) {
  return dtype == ScalarType::bf16 ? 3e-2 : 1e-4;
}
double floor_tolerance(ScalarType dtype) {
  return dtype == ScalarType::bf16 ? 8e-3 : 1e-4;
}

Backend& cpu_backend() {
  static std::unique_ptr<Backend> backend = make_cpu_backend();
  return *backend;
}

// The small case (the recipes' defaults, with ragged inputs).
SampleSizes test_sizes() {
  SampleSizes sizes;
  sizes.ragged = true;
  return sizes;
}

// Sizes for the other backends' kernels (odd widths past a warp / block,
// several tiles, DAR with n = 3 (Sinkhorn) and n = 2 without transport, long
// top-k rows with ties, a vocabulary of 5003), compared on top of the small
// case; the CPU reference costs about a second per backend, so only where
// another backend runs.
std::vector<SampleSizes> device_sizes() {
  SampleSizes wide = test_sizes();
  wide.rows = 45;
  wide.batch = 3;
  wide.width = 257;
  wide.inner = 129;
  wide.cols = 65;
  wide.heads = 4;
  wide.kv_heads = 2;
  wide.head_dim = 40;
  wide.vocab = 5003;
  wide.table_rows = 1000;
  wide.sources = 5;
  wide.queries = 3;
  wide.streams = 3;
  wide.experts = 16;
  wide.local_experts = 12;
  wide.top_k = 4;
  SampleSizes long_rows = test_sizes();
  long_rows.rows = 70;
  long_rows.batch = 2;
  long_rows.width = 96;
  long_rows.heads = 2;
  long_rows.kv_heads = 1;
  long_rows.head_dim = 128;
  long_rows.causal = false;
  long_rows.max_position = 70000;  // RoPE past the tables (the fp64 angle path)
  long_rows.candidates = 12000;    // past the CUDA top-k's shared-memory key cache
  long_rows.streams = 2;
  long_rows.transport = false;
  long_rows.gate = RouterScale::linear;
  return {wide, long_rows};
}

OpId op_named(const std::string& name) {
  OpId id{};
  if (!parse_op_id(name.c_str(), &id))
    throw std::invalid_argument("no op " + name);
  return id;
}
OpSample test_sample(const std::string& name) {
  return op_sample(op_named(name), test_sizes());
}

// The backends other than the reference CPU one that can run here; with
// MODAR_OP_HARNESS_SELF_CHECK=1 also a second CPU backend (runs the device
// sizes' samples through the checks and the harness without a GPU).
std::vector<std::pair<std::string, std::unique_ptr<Backend>>> other_backends() {
  std::vector<std::pair<std::string, std::unique_ptr<Backend>>> backends;
  for (const std::string& name : available_backends()) {
    if (name == "cpu")
      continue;
    try {
      backends.emplace_back(name, make_backend(name));
    } catch (const BackendError&) {
      // e.g. CUDA built but no GPU on this machine
    }
  }
  const char* self_check = std::getenv("MODAR_OP_HARNESS_SELF_CHECK");
  if (self_check != nullptr && std::string(self_check) == "1")
    backends.emplace_back("cpu (self-check)", make_cpu_backend());
  return backends;
}

// ---- the tests --------------------------------------------------------------------

class OpHarnessCase : public ::testing::TestWithParam<std::string> {};

// The sample's last call is the op it is named after (so the table row is
// what runs), and it names the tensors the op writes.
TEST_P(OpHarnessCase, RunsItsOp) {
  const OpSample sample = test_sample(GetParam());
  const std::vector<OpArgs> calls = sample.calls(Views(sample.tensors.size()));
  ASSERT_FALSE(calls.empty());
  EXPECT_STREQ(op_info(op_id(calls.back())).name, GetParam().c_str());
  EXPECT_FALSE(sample.outputs.empty());
}

TEST_P(OpHarnessCase, CpuLowPrecisionAgreesWithFp64) {
  const OpSample sample = test_sample(GetParam());
  const RunResult reference = run_sample(cpu_backend(), sample, ScalarType::fp64);
  for (size_t o = 0; o < reference.outputs.size(); ++o) {
    const std::vector<double> zeros(reference.outputs[o].size(), 0.0);
    EXPECT_GT(scaled_error(reference.outputs[o], zeros), 0.0)
        << GetParam() << ": output " << o << " of the fp64 reference is all zeros";
    EXPECT_TRUE(std::isfinite(scaled_error(reference.outputs[o], zeros)))
        << GetParam() << ": output " << o << " of the fp64 reference has unwritten (NaN) elements";
  }
  for (ScalarType dtype : {ScalarType::fp32, ScalarType::bf16}) {
    const RunResult low = run_sample(cpu_backend(), sample, dtype);
    for (size_t o = 0; o < reference.outputs.size(); ++o) {
      if (reference.is_index[o]) {
        EXPECT_EQ(low.outputs[o], reference.outputs[o]) << GetParam() << " " << to_string(dtype);
        continue;
      }
      const double error = scaled_error(low.outputs[o], reference.outputs[o]);
      EXPECT_LE(error, cpu_tolerance(dtype))
          << GetParam() << ": cpu " << to_string(dtype) << " output " << o;
    }
  }
}

// FlashAttention's rule on one other backend at one size: its error against
// the fp64 reference is at most twice the CPU's at the same dtype plus a floor.
// Returns the number of dtypes compared.
int compare_with_cpu(Backend& backend, const std::string& name, const OpSample& sample,
                     const std::string& label) {
  const OpId op = op_id(sample.calls(Views(sample.tensors.size())).back());
  int ran = 0;
  std::optional<RunResult> reference;
  for (ScalarType dtype : {ScalarType::fp32, ScalarType::bf16}) {
    if (!backend.supports(op, dtype))
      continue;
    if (!reference)
      reference = run_sample(cpu_backend(), sample, ScalarType::fp64);
    const RunResult cpu_low = run_sample(cpu_backend(), sample, dtype);
    const RunResult other = run_sample(backend, sample, dtype);
    ++ran;
    for (size_t o = 0; o < reference->outputs.size(); ++o) {
      if (reference->is_index[o]) {
        EXPECT_EQ(other.outputs[o], reference->outputs[o]) << label << " on " << name;
        continue;
      }
      const double cpu_error = scaled_error(cpu_low.outputs[o], reference->outputs[o]);
      const double error = scaled_error(other.outputs[o], reference->outputs[o]);
      EXPECT_LE(error, 2.0 * cpu_error + floor_tolerance(dtype))
          << label << " on " << name << " " << to_string(dtype) << " output " << o << " (cpu error "
          << cpu_error << ")";
    }
  }
  return ran;
}

// Every other backend, at the small case and the device sizes.
TEST_P(OpHarnessCase, OtherBackendsWithinTwiceTheCpuError) {
  int ran = 0;
  for (auto& [name, backend] : other_backends()) {
    ran += compare_with_cpu(*backend, name, test_sample(GetParam()), GetParam());
    const std::vector<SampleSizes> sizes = device_sizes();
    for (size_t i = 0; i < sizes.size(); ++i) {
      ran += compare_with_cpu(*backend, name, op_sample(op_named(GetParam()), sizes[i]),
                              GetParam() + " at device sizes " + std::to_string(i));
    }
  }
  if (ran == 0)
    GTEST_SKIP() << "no backend other than the CPU can run here (no GPU)";
}

std::vector<std::string> op_names() {
  std::vector<std::string> names;
  for (const OpInfo& info : kOpTable)
    names.emplace_back(info.name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(EveryOp, OpHarnessCase, ::testing::ValuesIn(op_names()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

// MODAR_OP_HARNESS_PERF=N: every sample at N rows, timed per backend and dtype.
TEST(OpHarness, PerformanceMode) {
  const char* size_text = std::getenv("MODAR_OP_HARNESS_PERF");
  if (size_text == nullptr)
    GTEST_SKIP() << "set MODAR_OP_HARNESS_PERF=N to time every op at N rows";
  SampleSizes sizes;
  sizes.rows = std::max<int64_t>(1, std::atoll(size_text));
  std::printf("%-30s %-8s %-6s %12s\n", "op", "backend", "dtype", "us/call");
  for (const std::string& name : available_backends()) {
    std::unique_ptr<Backend> backend;
    try {
      backend = make_backend(name);
    } catch (const BackendError&) {
      continue;
    }
    for (const OpInfo& info : kOpTable) {
      const OpSample sample = op_sample(info.id, sizes);
      for (ScalarType dtype : {ScalarType::fp32, ScalarType::bf16}) {
        if (!backend->supports(info.id, dtype))
          continue;
        const RunResult r = run_sample(*backend, sample, dtype, 20);
        std::printf("%-30s %-8s %-6s %12.2f\n", info.name, name.c_str(), to_string(dtype),
                    1e6 * r.seconds_per_call);
      }
    }
  }
}

}  // namespace
}  // namespace modar::runtime
