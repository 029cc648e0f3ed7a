// runtime/cpu/cpu_common.hpp: helpers shared by the CPU (Eigen) backend's op files.
//
// Every CPU kernel is written ONCE, for a compute type C: double for fp64 data,
// float for fp32 and bf16 data.  Tensors whose storage dtype is not C (bf16, or
// an fp32 gradient of an fp64 op) go through a converted staging buffer:
//   Input<C>   read-only: points at the tensor when its dtype is C, otherwise
//              holds a converted copy;
//   Output<C>  overwrite / accumulate / modify: points at the tensor when its
//              dtype is C; otherwise a staging buffer that commit() converts
//              back (overwrite, modify) or adds into the tensor (accumulate).
// Kernels then only see C* pointers (nullptr for an absent optional tensor).
// Statistics tensors are already in C (stats_type), so they map directly.
// Index-value checks (token ids, positions) run before any parallel loop:
// an exception must never leave an OpenMP region.
#pragma once

#include <Eigen/Core>
#include <cstdint>
#include <string>
#include <vector>

#include "modar/base/errors.hpp"
#include "modar/runtime/tensor.hpp"

// Loops over independent rows / tokens run on OpenMP threads when the work is
// large enough to pay for a parallel region (tiny ops stay serial: on a busy
// 2-core machine a parallel region costs more than a few thousand FMAs).
#define MODAR_CPU_PRAGMA(text) _Pragma(#text)
#if defined(_OPENMP)
#define MODAR_PARALLEL_FOR_IF(condition) \
  MODAR_CPU_PRAGMA(omp parallel for schedule(static) if (condition))
#else
#define MODAR_PARALLEL_FOR_IF(condition)
#endif

namespace modar::runtime::cpu {

// Multiply-adds (or elements) below which a loop stays on one thread.
inline constexpr int64_t kParallelMinWork = int64_t{1} << 18;
inline bool worth_threads(int64_t work) {
  return work >= kParallelMinWork;
}

template <class C>
constexpr ScalarType scalar_type_of() {
  return std::is_same_v<C, double> ? ScalarType::fp64 : ScalarType::fp32;
}

// Calls f(C{}) with C = double for fp64, float otherwise.
template <class F>
void dispatch_compute(ScalarType type, F&& f) {
  if (type == ScalarType::fp64) {
    f(double{});
  } else {
    f(float{});
  }
}

// Element-wise conversions between any float tensor and a C array.
template <class C>
void load_converted(const TensorView& src, C* dst) {
  const int64_t count = src.numel();
  switch (src.dtype) {
    case ScalarType::fp64: {
      const double* p = src.ptr<double>();
      for (int64_t i = 0; i < count; ++i)
        dst[i] = static_cast<C>(p[i]);
      break;
    }
    case ScalarType::fp32: {
      const float* p = src.ptr<float>();
      for (int64_t i = 0; i < count; ++i)
        dst[i] = static_cast<C>(p[i]);
      break;
    }
    case ScalarType::bf16: {
      const uint16_t* p = src.ptr<uint16_t>();
      for (int64_t i = 0; i < count; ++i)
        dst[i] = static_cast<C>(bf16_to_float(p[i]));
      break;
    }
    case ScalarType::i32:
      throw ShapeError("cpu backend: " + src.describe() + " is not a float tensor");
  }
}

template <class C>
void store_converted(const C* src, const TensorView& dst, bool accumulate) {
  const int64_t count = dst.numel();
  switch (dst.dtype) {
    case ScalarType::fp64: {
      double* p = dst.ptr<double>();
      for (int64_t i = 0; i < count; ++i)
        p[i] = (accumulate ? p[i] : 0.0) + src[i];
      break;
    }
    case ScalarType::fp32: {
      float* p = dst.ptr<float>();
      for (int64_t i = 0; i < count; ++i) {
        p[i] = (accumulate ? p[i] : 0.0f) + static_cast<float>(src[i]);
      }
      break;
    }
    case ScalarType::bf16: {
      uint16_t* p = dst.ptr<uint16_t>();
      for (int64_t i = 0; i < count; ++i) {
        const float base = accumulate ? bf16_to_float(p[i]) : 0.0f;
        p[i] = float_to_bf16(base + static_cast<float>(src[i]));
      }
      break;
    }
    case ScalarType::i32:
      throw ShapeError("cpu backend: " + dst.describe() + " is not a float tensor");
  }
}

template <class C>
class Input {
 public:
  explicit Input(const TensorView& view) {
    if (view.empty())
      return;
    if (view.dtype == scalar_type_of<C>()) {
      data_ = static_cast<const C*>(view.data);
    } else {
      storage_.resize(static_cast<size_t>(view.numel()));
      load_converted(view, storage_.data());
      data_ = storage_.data();
    }
  }
  const C* data() const { return data_; }
  const C& operator[](int64_t i) const { return data_[i]; }

 private:
  const C* data_ = nullptr;
  std::vector<C> storage_;
};

enum class OutputMode { overwrite, accumulate, modify };

template <class C>
class Output {
 public:
  Output(const TensorView& view, OutputMode mode) : view_(view), mode_(mode) {
    if (view.empty())
      return;
    if (view.dtype == scalar_type_of<C>()) {
      data_ = static_cast<C*>(view.data);
    } else {
      storage_.assign(static_cast<size_t>(view.numel()), C(0));
      if (mode == OutputMode::modify)
        load_converted(view, storage_.data());
      data_ = storage_.data();
      staged_ = true;
    }
  }
  C* data() const { return data_; }
  C& operator[](int64_t i) const { return data_[i]; }
  // Writes a staged buffer back to the tensor (no-op when not staged).
  void commit() {
    if (staged_)
      store_converted(storage_.data(), view_, mode_ == OutputMode::accumulate);
    staged_ = false;
  }

 private:
  TensorView view_;
  OutputMode mode_;
  C* data_ = nullptr;
  std::vector<C> storage_;
  bool staged_ = false;
};

template <class C>
using RowMatrix = Eigen::Matrix<C, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class C>
using MatrixMap = Eigen::Map<RowMatrix<C>>;
template <class C>
using ConstMatrixMap = Eigen::Map<const RowMatrix<C>>;
template <class C>
using StridedMap = Eigen::Map<RowMatrix<C>, 0, Eigen::OuterStride<>>;
template <class C>
using ConstStridedMap = Eigen::Map<const RowMatrix<C>, 0, Eigen::OuterStride<>>;

template <class C>
inline C sigmoid(C x) {
  return C(1) / (C(1) + std::exp(-x));
}

// One row of d: dst[c] += factor * src[c].
template <class C>
inline void add_scaled_row(C* dst, C factor, const C* src, int64_t d) {
  for (int64_t c = 0; c < d; ++c)
    dst[c] += factor * src[c];
}

// One row of d: sum_c a[c] b[c], summed in c order.
template <class C>
inline C dot_row(const C* a, const C* b, int64_t d) {
  C sum = 0;
  for (int64_t c = 0; c < d; ++c)
    sum += a[c] * b[c];
  return sum;
}

// Throws ShapeError unless every index is in [lowest, upper) (data check).
void check_index_range(const char* op, const char* name, const TensorView& indices, int64_t lowest,
                       int64_t upper);

}  // namespace modar::runtime::cpu
