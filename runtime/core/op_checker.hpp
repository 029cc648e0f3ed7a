// runtime/core/op_checker.hpp (internal): the argument checker behind every
// op's check() (op_checks.cpp, op_checks_moe.cpp): each failure is one
// ShapeError naming the op, the argument, what it is and what was expected.
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include "modar/base/errors.hpp"
#include "modar/runtime/op_args.hpp"

namespace modar::runtime::detail {

inline std::string dims_text(const std::vector<int64_t>& dims) {
  std::ostringstream text;
  text << '[';
  for (size_t i = 0; i < dims.size(); ++i) {
    text << (i ? ", " : "");
    if (dims[i] < 0) {
      text << '*';
    } else {
      text << dims[i];
    }
  }
  text << ']';
  return text.str();
}

class Checker {
 public:
  Checker(const char* op, DeviceKind device) : op_(op), device_(device) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw ShapeError(std::string(op_) + ": " + what);
  }
  void require(bool condition, const std::string& what) const {
    if (!condition)
      fail(what);
  }

  // Non-null, on the device, rank in [min_rank, max_rank].
  void present(const char* name, const TensorView& t, int min_rank = 1,
               int max_rank = kMaxTensorRank) const {
    if (t.empty())
      fail(std::string(name) + " is missing (null data)");
    if (t.device != device_) {
      fail(std::string(name) + " is " + t.describe() + "; expected a tensor on " +
           to_string(device_));
    }
    if (t.rank < min_rank || t.rank > max_rank) {
      fail(std::string(name) + " is " + t.describe() + "; expected rank " +
           std::to_string(min_rank) +
           (max_rank != min_rank ? ".." + std::to_string(max_rank) : std::string()));
    }
  }
  void floating(const char* name, const TensorView& t) const {
    present(name, t);
    if (!is_floating(t.dtype)) {
      fail(std::string(name) + " is " + t.describe() + "; expected fp64, fp32 or bf16");
    }
  }
  void dtype(const char* name, const TensorView& t, ScalarType expected) const {
    present(name, t);
    if (t.dtype != expected) {
      fail(std::string(name) + " is " + t.describe() + "; expected dtype " + to_string(expected));
    }
  }
  // Exact shape; a negative entry matches anything.
  void shape(const char* name, const TensorView& t, const std::vector<int64_t>& dims) const {
    present(name, t);
    bool ok = t.rank == static_cast<int>(dims.size());
    for (int i = 0; ok && i < t.rank; ++i) {
      ok = dims[static_cast<size_t>(i)] < 0 ||
           dims[static_cast<size_t>(i)] == t.shape[static_cast<size_t>(i)];
    }
    if (!ok)
      fail(std::string(name) + " is " + t.describe() + "; expected " + dims_text(dims));
  }
  void numel(const char* name, const TensorView& t, int64_t count) const {
    present(name, t);
    if (t.numel() != count) {
      fail(std::string(name) + " is " + t.describe() + "; expected " + std::to_string(count) +
           " elements");
    }
  }
  // Router statistics (MoE): fp32 or fp64, whatever the data dtype.
  void stats(const char* name, const TensorView& t) const {
    present(name, t);
    if (t.dtype != ScalarType::fp32 && t.dtype != ScalarType::fp64)
      fail(std::string(name) + " is " + t.describe() + "; expected router statistics (fp32 or fp64)");
  }
  void stats(const char* name, const TensorView& t, ScalarType data,
             const std::vector<int64_t>& dims) const {
    shape(name, t, dims);
    dtype(name, t, stats_type(data));
  }
  void like(const char* name, const TensorView& t, const char* ref_name,
            const TensorView& ref) const {
    present(name, t);
    if (t.dtype != ref.dtype || t.shape_vector() != ref.shape_vector()) {
      fail(std::string(name) + " is " + t.describe() + "; expected the shape and dtype of " +
           ref_name + " " + ref.describe());
    }
  }
  void optional_like(const char* name, const TensorView& t, const char* ref_name,
                     const TensorView& ref) const {
    if (!t.empty())
      like(name, t, ref_name, ref);
  }
  // Parameter gradient: the parameter's shape, its dtype or fp32 (or fp64).
  void optional_param_grad(const char* name, const TensorView& t, const char* ref_name,
                           const TensorView& ref) const {
    if (t.empty())
      return;
    present(name, t);
    const bool dtype_ok =
        t.dtype == ref.dtype || t.dtype == ScalarType::fp32 || t.dtype == ScalarType::fp64;
    if (!dtype_ok || t.shape_vector() != ref.shape_vector()) {
      fail(std::string(name) + " is " + t.describe() + "; expected the shape of " + ref_name + " " +
           ref.describe() + " with its dtype or fp32");
    }
  }

 private:
  const char* op_;
  DeviceKind device_;
};

}  // namespace modar::runtime::detail
