// modar/runtime/tensor.hpp: the runtime's tensor types.
//
// Deliberately small and explicit (llm.c / ggml style, not a framework):
//
//  * TensorView  a POD: data pointer + scalar type + device + shape (rank 1..4).
//                Always ROW-MAJOR and CONTIGUOUS (the last dimension is the
//                fastest; no strides).  A view never owns memory; copying a
//                view copies the pointer.  An "empty" view (data == nullptr)
//                stands for an absent optional argument of an op.
//  * Tensor      the owning counterpart: storage allocated by a Backend and
//                freed by the same Backend in the destructor.  Move-only.  The
//                Backend must outlive every Tensor it allocated.
//
// Scalar types.  The runtime needs an index type that the configuration enum
// modar::DType does not have, so it has its own ScalarType (convert with
// scalar_type(DType); fp16 is not supported by the runtime):
//   fp64  used by the CPU backend for finite-difference gradient checks;
//   fp32  the reference precision (and optimizer master weights, statistics);
//   bf16  stored as uint16_t (the upper half of an IEEE fp32); converted with
//         round-to-nearest-even; every op computes in fp32;
//   i32   token ids, top-k indices, positions, valid lengths.
//
// "Statistics" (RMSNorm rstd, attention / depth-read lse, router logits, loss)
// are kept in stats_type(x): fp64 when the data is fp64, fp32 otherwise.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "modar/config_enums.hpp"

namespace modar::runtime {

enum class ScalarType : uint8_t { fp64, fp32, bf16, i32 };
enum class DeviceKind : uint8_t { cpu, cuda };

const char* to_string(ScalarType type);
const char* to_string(DeviceKind device);
int64_t scalar_bytes(ScalarType type);
bool is_floating(ScalarType type);  // fp64, fp32, bf16
// fp64 -> fp64, fp32 / bf16 -> fp32 (see the header comment).
ScalarType stats_type(ScalarType type);
// Config dtype -> runtime scalar type; throws modar::ShapeError for fp16.
ScalarType scalar_type(DType dtype);

// ---- bf16 <-> fp32 (round to nearest, ties to even; NaN stays NaN) --------
inline uint16_t float_to_bf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it a quiet NaN
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  const uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}
inline float bf16_to_float(uint16_t value) {
  const uint32_t bits = static_cast<uint32_t>(value) << 16;
  float result;
  std::memcpy(&result, &bits, sizeof(result));
  return result;
}

inline constexpr int kMaxTensorRank = 4;

struct TensorView {
  void* data = nullptr;
  ScalarType dtype = ScalarType::fp32;
  DeviceKind device = DeviceKind::cpu;
  int rank = 0;
  std::array<int64_t, kMaxTensorRank> shape{};

  bool empty() const { return data == nullptr; }
  // Dimension i; negative i counts from the back (-1 = last dimension).
  int64_t dim(int i) const;
  int64_t numel() const;
  int64_t bytes() const { return numel() * scalar_bytes(dtype); }
  // Product of all dimensions but the last ("rows" of a [.., d] tensor).
  int64_t rows() const;
  template <class T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
  // "[2, 3, 4] fp32 cpu" (used in ShapeError messages).
  std::string describe() const;
  std::vector<int64_t> shape_vector() const;
};

// A view of existing memory.  Throws ShapeError for rank 0 or > 4, or a
// negative dimension.
TensorView make_view(void* data, ScalarType dtype, DeviceKind device,
                     const std::vector<int64_t>& shape);
// Same memory, another shape with the same number of elements.
TensorView reshape(const TensorView& view, const std::vector<int64_t>& shape);
// [d0, ..., d_{r-1}] -> [d0 * ... * d_{r-2}, d_{r-1}]  (rank >= 1; rank 1 -> [1, d0]).
TensorView flatten_rows(const TensorView& view);
// Rows [begin, begin + count) along dimension 0 (contiguous sub-block).
TensorView slice(const TensorView& view, int64_t begin, int64_t count);
// view[index]: drops dimension 0 (rank must be >= 2).
TensorView select(const TensorView& view, int64_t index);

class Backend;

class Tensor {
 public:
  Tensor() = default;
  // Uninitialised storage of `shape` on `backend`'s device.
  Tensor(Backend& backend, const std::vector<int64_t>& shape, ScalarType dtype);
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
  Tensor(Tensor&& other) noexcept;
  Tensor& operator=(Tensor&& other) noexcept;
  ~Tensor();

  const TensorView& view() const { return view_; }
  operator const TensorView&() const { return view_; }  // NOLINT: pass a Tensor as a view
  bool empty() const { return view_.empty(); }
  int64_t dim(int i) const { return view_.dim(i); }
  int64_t numel() const { return view_.numel(); }
  int64_t bytes() const { return view_.bytes(); }
  ScalarType dtype() const { return view_.dtype; }
  Backend* backend() const { return backend_; }

 private:
  void release() noexcept;
  Backend* backend_ = nullptr;
  TensorView view_;
};

}  // namespace modar::runtime
