// runtime/tensor.cpp: TensorView helpers and the owning Tensor.
#include "modar/runtime/tensor.hpp"

#include <sstream>
#include <utility>

#include "modar/base/errors.hpp"
#include "modar/runtime/backend.hpp"

namespace modar::runtime {

namespace {

// One row per element type: its name and its bytes.
struct ScalarTraits {
  ScalarType type;
  const char* name;
  int64_t bytes;
};
constexpr ScalarTraits kScalarTraits[] = {{ScalarType::fp64, "fp64", 8},
                                          {ScalarType::fp32, "fp32", 4},
                                          {ScalarType::bf16, "bf16", 2},
                                          {ScalarType::i32, "i32", 4}};

// nullptr for a value outside the enum.
const ScalarTraits* traits_of(ScalarType type) {
  for (const ScalarTraits& row : kScalarTraits) {
    if (row.type == type)
      return &row;
  }
  return nullptr;
}

}  // namespace

const char* to_string(ScalarType type) {
  const ScalarTraits* traits = traits_of(type);
  return traits != nullptr ? traits->name : "?";
}

const char* to_string(DeviceKind device) {
  return device == DeviceKind::cpu ? "cpu" : device == DeviceKind::cuda ? "cuda" : "?";
}

int64_t scalar_bytes(ScalarType type) {
  const ScalarTraits* traits = traits_of(type);
  return traits != nullptr ? traits->bytes : 0;
}

bool is_floating(ScalarType type) {
  return type != ScalarType::i32;
}

ScalarType stats_type(ScalarType type) {
  return type == ScalarType::fp64 ? ScalarType::fp64 : ScalarType::fp32;
}

ScalarType scalar_type(DType dtype) {
  switch (dtype) {
    case DType::fp64:
      return ScalarType::fp64;
    case DType::fp32:
      return ScalarType::fp32;
    case DType::bf16:
      return ScalarType::bf16;
    case DType::fp16:
      break;
  }
  throw ShapeError(std::string("dtype = ") + modar::to_string(dtype) +
                   ": the runtime supports fp64, fp32 and bf16");
}

int64_t TensorView::dim(int i) const {
  const int index = i < 0 ? rank + i : i;
  if (index < 0 || index >= rank) {
    throw ShapeError("tensor " + describe() + ": dimension " + std::to_string(i) +
                     " out of range for rank " + std::to_string(rank));
  }
  return shape[static_cast<size_t>(index)];
}

int64_t TensorView::numel() const {
  if (rank == 0)
    return 0;
  int64_t count = 1;
  for (int i = 0; i < rank; ++i)
    count *= shape[static_cast<size_t>(i)];
  return count;
}

int64_t TensorView::rows() const {
  if (rank == 0)
    return 0;
  int64_t count = 1;
  for (int i = 0; i + 1 < rank; ++i)
    count *= shape[static_cast<size_t>(i)];
  return count;
}

std::string TensorView::describe() const {
  if (empty() && rank == 0)
    return "<empty>";
  std::ostringstream text;
  text << '[';
  for (int i = 0; i < rank; ++i)
    text << (i ? ", " : "") << shape[static_cast<size_t>(i)];
  text << "] " << to_string(dtype) << ' ' << to_string(device);
  if (empty())
    text << " (null data)";
  return text.str();
}

std::vector<int64_t> TensorView::shape_vector() const {
  return std::vector<int64_t>(shape.begin(), shape.begin() + rank);
}

TensorView make_view(void* data, ScalarType dtype, DeviceKind device,
                     const std::vector<int64_t>& shape) {
  if (shape.empty() || shape.size() > static_cast<size_t>(kMaxTensorRank)) {
    throw ShapeError("tensor rank " + std::to_string(shape.size()) + ": must be 1.." +
                     std::to_string(kMaxTensorRank));
  }
  TensorView view;
  view.data = data;
  view.dtype = dtype;
  view.device = device;
  view.rank = static_cast<int>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      throw ShapeError("tensor dimension " + std::to_string(i) + " = " + std::to_string(shape[i]) +
                       ": must be >= 0");
    }
    view.shape[i] = shape[i];
  }
  return view;
}

TensorView reshape(const TensorView& view, const std::vector<int64_t>& shape) {
  TensorView result = make_view(view.data, view.dtype, view.device, shape);
  if (result.numel() != view.numel()) {
    throw ShapeError("reshape of " + view.describe() + " to " + result.describe() +
                     ": element counts differ");
  }
  return result;
}

TensorView flatten_rows(const TensorView& view) {
  if (view.rank < 1)
    throw ShapeError("flatten_rows of " + view.describe() + ": rank 0");
  return make_view(view.data, view.dtype, view.device, {view.rows(), view.dim(-1)});
}

TensorView slice(const TensorView& view, int64_t begin, int64_t count) {
  if (view.rank < 1 || begin < 0 || count < 0 || begin + count > view.shape[0]) {
    throw ShapeError("slice [" + std::to_string(begin) + ", " + std::to_string(begin + count) +
                     ") of " + view.describe() + ": out of range of dimension 0");
  }
  TensorView result = view;
  result.shape[0] = count;
  const int64_t row_elements = view.shape[0] ? view.numel() / view.shape[0] : 0;
  if (view.data) {
    result.data = static_cast<char*>(view.data) + begin * row_elements * scalar_bytes(view.dtype);
  }
  return result;
}

TensorView select(const TensorView& view, int64_t index) {
  if (view.rank < 2)
    throw ShapeError("select on " + view.describe() + ": rank must be >= 2");
  TensorView one = slice(view, index, 1);
  TensorView result = one;
  result.rank = view.rank - 1;
  for (int i = 0; i < result.rank; ++i)
    result.shape[static_cast<size_t>(i)] = one.shape[static_cast<size_t>(i + 1)];
  result.shape[static_cast<size_t>(result.rank)] = 0;
  return result;
}

Tensor::Tensor(Backend& backend, const std::vector<int64_t>& shape, ScalarType dtype)
    : backend_(&backend) {
  view_ = make_view(nullptr, dtype, backend.device(), shape);
  const int64_t bytes = view_.bytes();
  view_.data = backend.allocate(bytes > 0 ? bytes : 1);
}

Tensor::Tensor(Tensor&& other) noexcept : backend_(other.backend_), view_(other.view_) {
  other.backend_ = nullptr;
  other.view_ = TensorView{};
}

Tensor& Tensor::operator=(Tensor&& other) noexcept {
  if (this != &other) {
    release();
    backend_ = std::exchange(other.backend_, nullptr);
    view_ = std::exchange(other.view_, TensorView{});
  }
  return *this;
}

Tensor::~Tensor() {
  release();
}

void Tensor::release() noexcept {
  if (backend_ && view_.data)
    backend_->deallocate(view_.data);
  backend_ = nullptr;
  view_ = TensorView{};
}

}  // namespace modar::runtime
