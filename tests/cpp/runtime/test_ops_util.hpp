// tests/cpp/runtime/test_ops_util.hpp: helpers for the CPU op tests
// (test_ops_*.cpp): fp64 tensors from host vectors, random inputs, and a
// central-difference gradient checker.
//
// Gradient checks follow one pattern: the test defines a scalar loss
//   L = sum_i w_i out_i (+ sum_i u_i lse_i ...)
// with random projection weights w, u; runs the op's backward with dout = w
// (dlse = u) into zeroed gradient tensors; and compares each gradient entry
// with (L(x + h e_i) - L(x - h e_i)) / 2h, where the forward is re-run from the
// host copy of the inputs.  In fp64 with h = 1e-5 the truncation error is
// ~1e-10 relative, so a tolerance of 1e-6 catches any wrong term.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "modar/base/errors.hpp"
#include "modar/runtime/backend.hpp"

namespace modar::runtime::testing {

inline Backend& cpu() {
  static std::unique_ptr<Backend> backend = make_cpu_backend();
  return *backend;
}

inline std::vector<double> random_values(size_t count, uint32_t seed, double low = -1.0,
                                         double high = 1.0) {
  std::mt19937 generator(seed);
  std::uniform_real_distribution<double> distribution(low, high);
  std::vector<double> values(count);
  for (double& v : values)
    v = distribution(generator);
  return values;
}

inline int64_t product(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t d : shape)
    count *= d;
  return count;
}

inline Tensor tensor(const std::vector<int64_t>& shape, const std::vector<double>& values,
                     ScalarType dtype = ScalarType::fp64) {
  return make_tensor(cpu(), shape, dtype, values);
}

inline Tensor zeros(const std::vector<int64_t>& shape, ScalarType dtype = ScalarType::fp64) {
  Tensor t(cpu(), shape, dtype);
  cpu().fill(t, 0.0);
  return t;
}

inline Tensor random_tensor(const std::vector<int64_t>& shape, uint32_t seed,
                            ScalarType dtype = ScalarType::fp64, double low = -1.0,
                            double high = 1.0) {
  return tensor(shape, random_values(static_cast<size_t>(product(shape)), seed, low, high), dtype);
}

inline std::vector<double> values_of(const TensorView& view) {
  return download(cpu(), view);
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double sum = 0.0;
  for (size_t i = 0; i < a.size(); ++i)
    sum += a[i] * b[i];
  return sum;
}

// Projection loss sum_i w_i t_i of a tensor.
inline double project(const TensorView& t, const std::vector<double>& w) {
  return dot(values_of(t), w);
}

inline double max_abs(const std::vector<double>& v) {
  double m = 0.0;
  for (double x : v)
    m = std::max(m, std::abs(x));
  return m;
}

// max |a - b| / max(max |b|, floor): a scale-aware relative error.
inline double relative_error(const std::vector<double>& a, const std::vector<double>& b,
                             double floor = 1e-3) {
  double diff = 0.0;
  for (size_t i = 0; i < a.size(); ++i)
    diff = std::max(diff, std::abs(a[i] - b[i]));
  return diff / std::max(max_abs(b), floor);
}

// Central differences of `loss` w.r.t. every entry of `input` (which `loss`
// reads, e.g. by uploading it), compared with `analytic`.
inline void expect_gradient(const std::string& name, std::vector<double>& input,
                            const std::function<double()>& loss,
                            const std::vector<double>& analytic, double tolerance = 1e-6,
                            double step = 1e-5) {
  ASSERT_EQ(input.size(), analytic.size()) << name;
  std::vector<double> numeric(input.size());
  for (size_t i = 0; i < input.size(); ++i) {
    const double saved = input[i];
    input[i] = saved + step;
    const double plus = loss();
    input[i] = saved - step;
    const double minus = loss();
    input[i] = saved;
    numeric[i] = (plus - minus) / (2.0 * step);
  }
  const double error = relative_error(analytic, numeric);
  EXPECT_LT(error, tolerance) << "gradient " << name << ": relative error " << error
                              << " (max |numeric| " << max_abs(numeric) << ")";
  // A gradient check that cannot fail is no check: the gradient must be non-trivial.
  EXPECT_GT(max_abs(numeric), 1e-8) << "gradient " << name << " is identically zero";
}

// EXPECT that `call` throws ShapeError whose message contains `fragment`.
template <class F>
void expect_shape_error(F&& call, const std::string& fragment) {
  try {
    call();
    ADD_FAILURE() << "expected ShapeError containing '" << fragment << "'";
  } catch (const ShapeError& error) {
    EXPECT_NE(std::string(error.what()).find(fragment), std::string::npos)
        << "message: " << error.what() << "\nexpected to contain: " << fragment;
  }
}

}  // namespace modar::runtime::testing
