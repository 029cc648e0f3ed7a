// runtime/core/op_samples.cpp: the sample tensors' dtypes and values, and
// op_sample()'s dispatch over the recipes (generated from MODAR_RUNTIME_OPS;
// the recipes are in op_sample_recipes*.cpp).
#include "modar/runtime/op_samples.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>

#include "op_sample_recipes.hpp"

namespace modar::runtime {

namespace {

using Recipe = OpSample (*)(const SampleSizes&);
#define MODAR_OP_SAMPLE_RECIPE(id, Args, kind, pass, in_vocabulary, profiled) &sample_recipes::id,
constexpr std::array<Recipe, kOpCount> kRecipes{MODAR_RUNTIME_OPS(MODAR_OP_SAMPLE_RECIPE)};
#undef MODAR_OP_SAMPLE_RECIPE

// Deterministic fast generator for the fills (xorshift64*).
class FillRng {
 public:
  explicit FillRng(uint64_t seed) : state_(seed | 1ULL) {}
  uint64_t next() {
    state_ ^= state_ >> 12;
    state_ ^= state_ << 25;
    state_ ^= state_ >> 27;
    return state_ * 0x2545F4914F6CDD1DULL;
  }
  double uniform() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }

 private:
  uint64_t state_;
};

double bf16_round(double value) {
  return bf16_to_float(float_to_bf16(static_cast<float>(value)));
}

constexpr double kIndexPoison = -1073741824.0;  // -2^30: no valid index

// Element i of a tensor (`width`: its last dimension).
double sample_value(const SampleTensor& tensor, SampleFill fill, int64_t i, int64_t width,
                    FillRng& rng) {
  const bool output = tensor.use != SampleUse::input;
  const bool integer = tensor.role == SampleRole::index || tensor.role == SampleRole::sorted ||
                       tensor.role == SampleRole::sorted_ragged || tensor.role == SampleRole::given;
  if (output && fill != SampleFill::timing) {
    if (fill == SampleFill::poisoned && tensor.use == SampleUse::written)
      return integer ? kIndexPoison : std::numeric_limits<double>::quiet_NaN();
    return 0.0;
  }
  switch (tensor.role) {
    case SampleRole::positive:
    case SampleRole::stats_positive:
      return bf16_round(0.5 + rng.uniform());
    case SampleRole::stats_unit:
      return bf16_round(rng.uniform());
    case SampleRole::stats_small:
    case SampleRole::master_small:
      return bf16_round(0.01 + 0.01 * rng.uniform());
    case SampleRole::index:
      return output ? 0.0
                    : static_cast<double>(
                          rng.next() % static_cast<uint64_t>(std::max<int64_t>(tensor.limit, 1)));
    case SampleRole::sorted_ragged:
      if ((i / width) % 2 == 1 && i % width >= width - width / 3)
        return -1.0;
      [[fallthrough]];
    case SampleRole::sorted:
      return static_cast<double>(2 * (i % width) + static_cast<int64_t>(rng.next() & 1ULL));
    case SampleRole::given:
      return tensor.values[static_cast<size_t>(i)];
    default:
      return bf16_round(2.0 * rng.uniform() - 1.0);
  }
}

// The bytes of `value` as a T, at out (unaligned).
template <class T>
void store(T value, unsigned char* out) {
  std::memcpy(out, &value, sizeof(T));
}

void encode(ScalarType type, double value, unsigned char* out) {
  switch (type) {
    case ScalarType::fp64:
      return store(value, out);
    case ScalarType::fp32:
      return store(static_cast<float>(value), out);
    case ScalarType::bf16:
      return store(float_to_bf16(static_cast<float>(value)), out);
    case ScalarType::i32:
      return store(static_cast<int32_t>(value), out);
  }
}

constexpr int64_t kFillBlockElements = int64_t{1} << 22;

}  // namespace

OpSample op_sample(OpId op, const SampleSizes& sizes) {
  return kRecipes[static_cast<size_t>(op)](sizes);
}

std::optional<ScalarType> sample_dtype(SampleRole role, ScalarType data) {
  const ScalarType master = data == ScalarType::fp64 ? ScalarType::fp64 : ScalarType::fp32;
  switch (role) {
    case SampleRole::data:
    case SampleRole::positive:
      return data;
    case SampleRole::stats:
    case SampleRole::stats_positive:
    case SampleRole::stats_unit:
    case SampleRole::stats_small:
      return stats_type(data);
    case SampleRole::master:
    case SampleRole::master_small:
      return master;
    case SampleRole::lowp:  // absent when the data is already the master type
      return data != master ? std::optional(data) : std::nullopt;
    case SampleRole::fp32:
      return ScalarType::fp32;
    case SampleRole::index:
    case SampleRole::sorted:
    case SampleRole::sorted_ragged:
    case SampleRole::given:
      return ScalarType::i32;
  }
  return std::nullopt;
}

int64_t sample_tensor_bytes(const SampleTensor& tensor, ScalarType data) {
  const std::optional<ScalarType> dtype = sample_dtype(tensor.role, data);
  if (!dtype)
    return 0;
  int64_t count = 1;
  for (int64_t d : tensor.shape)
    count *= d;
  return count * scalar_bytes(*dtype);
}

void fill_sample_tensor(Backend& backend, const TensorView& view, const SampleTensor& tensor,
                        SampleFill fill, uint64_t seed) {
  FillRng rng(seed);
  const int64_t count = view.numel();
  const int64_t element_bytes = scalar_bytes(view.dtype);
  // Index-like values depend on the flat position: no repeated blocks.
  const bool positional = tensor.role == SampleRole::sorted ||
                          tensor.role == SampleRole::sorted_ragged ||
                          tensor.role == SampleRole::given;
  const int64_t block = positional ? count : std::min(count, kFillBlockElements);
  const int64_t width = view.rank > 0 ? view.dim(-1) : 1;
  std::vector<unsigned char> host(static_cast<size_t>(block * element_bytes));
  for (int64_t i = 0; i < block; ++i) {
    encode(view.dtype, sample_value(tensor, fill, i, width, rng), host.data() + i * element_bytes);
  }
  for (int64_t offset = 0; offset < count; offset += block) {
    const int64_t n = std::min(block, count - offset);
    const TensorView part =
        make_view(static_cast<unsigned char*>(view.data) + offset * element_bytes, view.dtype,
                  view.device, {n});
    backend.copy_from_host(host.data(), part);
  }
}

SampleTensors make_sample_tensors(Backend& backend, const OpSample& sample, ScalarType data,
                                  SampleFill fill, uint64_t seed) {
  SampleTensors made;
  for (size_t i = 0; i < sample.tensors.size(); ++i) {
    const SampleTensor& tensor = sample.tensors[i];
    const std::optional<ScalarType> dtype = sample_dtype(tensor.role, data);
    if (!dtype) {
      made.tensors.emplace_back();
      made.views.emplace_back();
      continue;
    }
    made.tensors.emplace_back(backend, tensor.shape, *dtype);
    made.views.push_back(made.tensors.back().view());
    fill_sample_tensor(backend, made.views.back(), tensor, fill, seed + 7919 * i);
  }
  return made;
}

}  // namespace modar::runtime
