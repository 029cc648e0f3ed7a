// Shared helpers of the layer / model tests: fp64 CPU context, random host
// data, and a central finite-difference gradient check over parameters.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "modar/base/errors.hpp"
#include "modar/runtime/backend.hpp"
#include "modar/runtime/layers.hpp"
#include "modar/runtime/model.hpp"

namespace modar::runtime::layer_tests {

inline Backend& cpu_backend() {
  static std::unique_ptr<Backend> backend = make_cpu_backend();
  return *backend;
}

inline Context fp64_context() {
  return Context{cpu_backend(), nullptr, ScalarType::fp64};
}

inline std::vector<double> random_values(int64_t count, uint64_t seed, double scale = 1.0) {
  Rng rng(seed);
  std::vector<double> v(static_cast<size_t>(count));
  for (double& x : v) {
    x = scale * rng.normal();
  }
  return v;
}

inline Buffer host_tensor(const Context& ctx, const std::vector<int64_t>& shape,
                          const std::vector<double>& values) {
  Buffer b = ctx.make(shape);
  upload(ctx.backend, values, b);
  return b;
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    s += a[i] * b[i];
  }
  return s;
}

// Central differences of `loss` (which must only READ parameter values) against
// the gradients currently stored in `params`, at up to `samples` entries per
// parameter tensor.  Tolerance: |fd - analytic| <= tol * (1 + |analytic|).
inline void expect_parameter_gradients(
    ParameterSet& params, const std::function<double()>& loss, int samples = 4, double tol = 1e-6,
    double step = 1e-5, const std::function<bool(const std::string&)>& include = nullptr) {
  Backend& be = cpu_backend();
  int checked = 0;
  for (const auto& p : params.all()) {
    if (include && !include(p->name)) {
      continue;
    }
    const std::vector<double> analytic = download(be, p->grad);
    std::vector<double> values = download(be, p->value);
    const int64_t numel = static_cast<int64_t>(values.size());
    const int64_t count = std::min<int64_t>(samples, numel);
    for (int64_t c = 0; c < count; ++c) {
      // Spread the samples over the tensor; include the largest gradient.
      int64_t i = (c * 7919 + 13) % numel;
      if (c == 0) {
        i = std::max_element(analytic.begin(), analytic.end(),
                             [](double a, double b) { return std::abs(a) < std::abs(b); }) -
            analytic.begin();
      }
      const double original = values[static_cast<size_t>(i)];
      values[static_cast<size_t>(i)] = original + step;
      upload(be, values, p->value);
      const double plus = loss();
      values[static_cast<size_t>(i)] = original - step;
      upload(be, values, p->value);
      const double minus = loss();
      values[static_cast<size_t>(i)] = original;
      upload(be, values, p->value);
      const double fd = (plus - minus) / (2.0 * step);
      const double an = analytic[static_cast<size_t>(i)];
      EXPECT_NEAR(fd, an, tol * (1.0 + std::abs(an))) << p->name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
}

// Central differences w.r.t. an input tensor (host values re-uploaded by `loss`).
inline void expect_input_gradient(std::vector<double>& input, const std::vector<double>& analytic,
                                  const std::function<double()>& loss, int samples = 8,
                                  double tol = 1e-6, double step = 1e-5) {
  const int64_t numel = static_cast<int64_t>(input.size());
  for (int c = 0; c < samples; ++c) {
    const int64_t i = (c * 104729 + 7) % numel;
    const double original = input[static_cast<size_t>(i)];
    input[static_cast<size_t>(i)] = original + step;
    const double plus = loss();
    input[static_cast<size_t>(i)] = original - step;
    const double minus = loss();
    input[static_cast<size_t>(i)] = original;
    const double fd = (plus - minus) / (2.0 * step);
    EXPECT_NEAR(fd, analytic[static_cast<size_t>(i)],
                tol * (1.0 + std::abs(analytic[static_cast<size_t>(i)])))
        << "input[" << i << "]";
  }
}

inline BranchShape small_shape(MlpKind mlp = MlpKind::gelu, int64_t kv_heads = 2) {
  BranchShape shape;
  shape.d_model = 16;
  shape.n_heads = 4;
  shape.n_kv_heads = kv_heads;
  shape.d_head = 4;
  shape.d_ff = 24;
  shape.mlp = mlp;
  return shape;
}

// Copy every parameter of `src` whose name exists in `dst` with the same
// number of elements (others, e.g. depth queries of a different stream count,
// are left for the caller to set).
inline void copy_parameters(const ParameterSet& src, ParameterSet& dst) {
  Backend& be = cpu_backend();
  for (const auto& p : src.all()) {
    Parameter* q = dst.find(p->name);
    if (q != nullptr && q->value.numel() == p->value.numel()) {
      upload(be, download(be, p->value), q->value);
    }
  }
}

inline void set_parameter(ParameterSet& params, const std::string& name,
                          const std::vector<double>& values) {
  Parameter* p = params.find(name);
  ASSERT_NE(p, nullptr) << name;
  upload(cpu_backend(), values, p->value);
}

}  // namespace modar::runtime::layer_tests

namespace modar::runtime::layer_tests {

// Replace the default initialisation with O(1) values so that gradients are
// large enough for a finite-difference check to mean something: matrices and
// vectors N(0, scale^2), norm weights 1 + N(0, 0.1^2).  Names matching
// `keep_prefix` are left alone.
inline void randomize_parameters(ParameterSet& params, uint64_t seed, double scale = 0.3,
                                 const std::string& keep_prefix = "") {
  uint64_t s = seed;
  for (const auto& p : params.all()) {
    if (!keep_prefix.empty() && p->name.rfind(keep_prefix, 0) == 0) {
      continue;
    }
    std::vector<double> v = random_values(p->value.numel(), ++s, scale);
    const std::string& n = p->name;
    const bool is_norm = n.size() >= 4 && (n.find("norm") != std::string::npos);
    if (is_norm) {
      for (double& x : v) {
        x = 1.0 + x / scale * 0.1;
      }
    }
    upload(cpu_backend(), v, p->value);
  }
}

}  // namespace modar::runtime::layer_tests
