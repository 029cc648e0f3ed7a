// tests/cpp/cuda/cuda_test_util.hpp: the CUDA-vs-CPU harness.
//
// Every op is run three times on the SAME inputs (pre-rounded to the tested
// precision, so all three compute the same function):
//   reference  CPU backend in fp64 (statistics fp64),
//   naive      CPU backend in the tested precision (fp32 or bf16 data, fp32
//              statistics): the "same-precision naive implementation",
//   gpu        CUDA backend in the tested precision.
// FlashAttention's rule decides: for every output,
//   max|gpu - reference| <= 2 * max|naive - reference| + floor,
//   floor = eps(precision) * (1 + max|reference|)   (eps: 2^-20 fp32, 2^-8 bf16)
// GPU outputs are poisoned with NaN before the op, so an element the kernel
// never wrote fails.  Gradient outputs start from the same random values in
// all three runs (backward ops accumulate).
//
// Without a GPU every test skips with one line: MODAR_REQUIRE_CUDA() first.
//
// Harness self-check (no GPU needed): MODAR_CUDA_TESTS_ON_CPU=1 runs the
// "device" side on a second CPU backend.  That exercises every test case's
// shapes against the shared op checks and the harness itself (the rule then
// holds trivially); tests about the real device skip in that mode.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "modar/base/errors.hpp"
#include "modar/runtime/backend.hpp"

namespace modar::runtime::cuda_testing {

// The CUDA backend shared by all tests of the process, or null with the
// reason it could not be created ("no CUDA device: ...").
struct CudaState {
  std::unique_ptr<Backend> backend;
  std::string skip_reason;
  bool self_check = false;  // the "device" is a CPU backend (harness self-check)
};

inline CudaState& cuda_state() {
  static CudaState state = [] {
    CudaState s;
    const char* self_check = std::getenv("MODAR_CUDA_TESTS_ON_CPU");
    if (self_check != nullptr && std::string(self_check) == "1") {
      s.backend = make_cpu_backend();
      s.self_check = true;
      return s;
    }
    try {
      s.backend = make_cuda_backend();
    } catch (const BackendError& error) {
      s.skip_reason = error.what();
    }
    return s;
  }();
  return state;
}

inline Backend& gpu() {
  return *cuda_state().backend;
}

inline Backend& cpu() {
  static std::unique_ptr<Backend> backend = make_cpu_backend();
  return *backend;
}

#define MODAR_REQUIRE_CUDA()                                                    \
  do {                                                                          \
    if (!::modar::runtime::cuda_testing::cuda_state().skip_reason.empty()) {    \
      GTEST_SKIP() << ::modar::runtime::cuda_testing::cuda_state().skip_reason; \
    }                                                                           \
  } while (false)

// Tests about the device itself (not runnable in the harness self-check).
#define MODAR_REQUIRE_REAL_CUDA()                                          \
  do {                                                                     \
    MODAR_REQUIRE_CUDA();                                                  \
    if (::modar::runtime::cuda_testing::cuda_state().self_check) {         \
      GTEST_SKIP() << "harness self-check on the CPU: no device to query"; \
    }                                                                      \
  } while (false)

enum class Precision { fp32, bf16 };

inline const char* to_string(Precision p) {
  return p == Precision::fp32 ? "fp32" : "bf16";
}

// Roles of an op argument.  Inputs carry values; out_* are overwritten by the
// op; grad_* start from `values` and are accumulated into.
enum class Role { data, stats, index, out_data, out_stats, out_index, grad_data, grad_stats, none };

struct Arg {
  Role role = Role::none;
  std::vector<int64_t> shape;
  std::vector<double> values;  // inputs and grads (initial values); ignored for out_*
  std::string name;
};

inline Arg data(std::string name, std::vector<int64_t> shape, std::vector<double> values) {
  return {Role::data, std::move(shape), std::move(values), std::move(name)};
}
inline Arg stat(std::string name, std::vector<int64_t> shape, std::vector<double> values) {
  return {Role::stats, std::move(shape), std::move(values), std::move(name)};
}
inline Arg index(std::string name, std::vector<int64_t> shape, std::vector<double> values) {
  return {Role::index, std::move(shape), std::move(values), std::move(name)};
}
inline Arg out_data(std::string name, std::vector<int64_t> shape) {
  return {Role::out_data, std::move(shape), {}, std::move(name)};
}
inline Arg out_stat(std::string name, std::vector<int64_t> shape) {
  return {Role::out_stats, std::move(shape), {}, std::move(name)};
}
inline Arg out_index(std::string name, std::vector<int64_t> shape) {
  return {Role::out_index, std::move(shape), {}, std::move(name)};
}
inline Arg grad_data(std::string name, std::vector<int64_t> shape, std::vector<double> values) {
  return {Role::grad_data, std::move(shape), std::move(values), std::move(name)};
}
inline Arg grad_stat(std::string name, std::vector<int64_t> shape, std::vector<double> values) {
  return {Role::grad_stats, std::move(shape), std::move(values), std::move(name)};
}
inline Arg none() {
  return {};
}

inline int64_t count_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (const int64_t d : shape)
    n *= d;
  return n;
}

inline std::vector<double> random_values(int64_t count, uint64_t seed, double lo = -1.0,
                                         double hi = 1.0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(static_cast<size_t>(count));
  for (double& x : v)
    x = dist(rng);
  return v;
}

inline double round_to(double value, ScalarType type) {
  if (type == ScalarType::bf16)
    return bf16_to_float(float_to_bf16(static_cast<float>(value)));
  if (type == ScalarType::fp32)
    return static_cast<double>(static_cast<float>(value));
  return value;
}

using OpFunction = std::function<void(Backend&, const std::vector<TensorView>&)>;

struct World {
  Backend* backend;
  ScalarType data_type;
  ScalarType stats_type;
  bool poison;
};

inline bool is_output(Role r) {
  return r == Role::out_data || r == Role::out_stats || r == Role::out_index ||
         r == Role::grad_data || r == Role::grad_stats;
}

// Runs `op` in one world; returns the downloaded outputs (in argument order).
inline std::vector<std::vector<double>> run_world(const World& world, const std::vector<Arg>& args,
                                                  const OpFunction& op, Precision precision) {
  const ScalarType lowp = precision == Precision::fp32 ? ScalarType::fp32 : ScalarType::bf16;
  std::vector<Tensor> tensors;
  std::vector<TensorView> views;
  tensors.reserve(args.size());
  for (const Arg& arg : args) {
    if (arg.role == Role::none) {
      tensors.emplace_back();
      views.emplace_back();
      continue;
    }
    ScalarType type = ScalarType::i32;
    bool is_stats = false;
    switch (arg.role) {
      case Role::data:
      case Role::out_data:
      case Role::grad_data:
        type = world.data_type;
        break;
      case Role::stats:
      case Role::out_stats:
      case Role::grad_stats:
        type = world.stats_type, is_stats = true;
        break;
      default:
        type = ScalarType::i32;
        break;
    }
    std::vector<double> values = arg.values;
    if (arg.role == Role::out_data || arg.role == Role::out_stats) {
      values.assign(static_cast<size_t>(count_of(arg.shape)),
                    world.poison ? std::numeric_limits<double>::quiet_NaN() : 0.0);
    } else if (arg.role == Role::out_index) {
      values.assign(static_cast<size_t>(count_of(arg.shape)), world.poison ? -7.0 : 0.0);
    } else if (type != ScalarType::i32) {
      // The same pre-rounded value in every world.
      const ScalarType rounding = is_stats ? ScalarType::fp32 : lowp;
      for (double& v : values)
        v = round_to(v, rounding);
    }
    tensors.push_back(make_tensor(*world.backend, arg.shape, type, values));
    views.push_back(tensors.back().view());
  }
  op(*world.backend, views);
  std::vector<std::vector<double>> outputs;
  for (size_t i = 0; i < args.size(); ++i) {
    if (is_output(args[i].role)) {
      outputs.push_back(download(*world.backend, views[i]));
    }
  }
  return outputs;
}

inline double max_abs(const std::vector<double>& v) {
  double m = 0.0;
  for (const double x : v)
    m = std::max(m, std::fabs(x));
  return m;
}

// max |a - b|; NaN or inf where the reference is finite -> +inf.
inline double max_error(const std::vector<double>& a, const std::vector<double>& reference) {
  double m = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(reference[i]))
      continue;
    if (!std::isfinite(a[i]))
      return std::numeric_limits<double>::infinity();
    m = std::max(m, std::fabs(a[i] - reference[i]));
  }
  return m;
}

// The FlashAttention rule for every output of `op` (see the header comment).
inline void expect_matches_cpu(const std::string& label, Precision precision,
                               const std::vector<Arg>& args, const OpFunction& op,
                               double factor = 2.0) {
  const ScalarType lowp = precision == Precision::fp32 ? ScalarType::fp32 : ScalarType::bf16;
  const World reference{&cpu(), ScalarType::fp64, ScalarType::fp64, false};
  const World naive{&cpu(), lowp, ScalarType::fp32, false};
  const World device{&gpu(), lowp, ScalarType::fp32, true};
  const auto ref_out = run_world(reference, args, op, precision);
  const auto naive_out = run_world(naive, args, op, precision);
  const auto gpu_out = run_world(device, args, op, precision);
  const double eps = precision == Precision::fp32 ? std::ldexp(1.0, -20) : std::ldexp(1.0, -8);
  size_t output = 0;
  for (const Arg& arg : args) {
    if (!is_output(arg.role))
      continue;
    const auto& ref = ref_out[output];
    const double naive_error = max_error(naive_out[output], ref);
    const double gpu_error = max_error(gpu_out[output], ref);
    const double floor = eps * (1.0 + max_abs(ref));
    EXPECT_LE(gpu_error, factor * naive_error + floor)
        << label << " [" << to_string(precision) << "] output " << arg.name << ": gpu error "
        << gpu_error << ", naive cpu error " << naive_error << ", floor " << floor << ", max|ref| "
        << max_abs(ref);
    ++output;
  }
}

}  // namespace modar::runtime::cuda_testing
