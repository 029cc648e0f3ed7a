// runtime/core/op_sample_recipes.hpp: one recipe per row of MODAR_RUNTIME_OPS
// (declared from the table: a row without a definition does not link), and
// the shorthands the recipe files write tensors with.  Internal to core.
#pragma once

#include <vector>

#include "modar/runtime/op_samples.hpp"

namespace modar::runtime::sample_recipes {

#define MODAR_OP_SAMPLE_DECLARE(id, Args, kind, pass, in_vocabulary, profiled) \
  OpSample id(const SampleSizes& sizes);
MODAR_RUNTIME_OPS(MODAR_OP_SAMPLE_DECLARE)
#undef MODAR_OP_SAMPLE_DECLARE

using Shape = std::vector<int64_t>;
using Views = std::vector<TensorView>;
using Calls = std::vector<OpArgs>;

// An input of `role`.
inline SampleTensor in(Shape shape, SampleRole role = SampleRole::data) {
  return SampleTensor{std::move(shape), role, SampleUse::input, 0, {}};
}
// An output the op adds into (starts at zero).
inline SampleTensor acc(Shape shape, SampleRole role = SampleRole::data) {
  return SampleTensor{std::move(shape), role, SampleUse::accumulated, 0, {}};
}
// An output the op overwrites element by element.
inline SampleTensor out(Shape shape, SampleRole role = SampleRole::data) {
  return SampleTensor{std::move(shape), role, SampleUse::written, 0, {}};
}
// i32 inputs: uniform in [0, limit); rows of ascending distinct 2 j + {0, 1}; given values.
inline SampleTensor index(Shape shape, int64_t limit) {
  return SampleTensor{std::move(shape), SampleRole::index, SampleUse::input, limit, {}};
}
inline SampleTensor sorted(Shape shape, bool ragged) {
  return SampleTensor{std::move(shape),
                      ragged ? SampleRole::sorted_ragged : SampleRole::sorted,
                      SampleUse::input,
                      0,
                      {}};
}
inline SampleTensor given(Shape shape, std::vector<double> values) {
  return SampleTensor{std::move(shape), SampleRole::given, SampleUse::input, 0, std::move(values)};
}
// An i32 output the op overwrites.
inline SampleTensor index_out(Shape shape) {
  return SampleTensor{std::move(shape), SampleRole::index, SampleUse::written, 1, {}};
}

constexpr SampleRole kStats = SampleRole::stats;
constexpr SampleRole kStatsPositive = SampleRole::stats_positive;

// Appends a tensor to the sample; its index names it in the calls.
inline int add(OpSample& sample, SampleTensor tensor) {
  sample.tensors.push_back(std::move(tensor));
  return static_cast<int>(sample.tensors.size()) - 1;
}
// The view of tensor `index`, or an empty view for -1 (a tensor the sample has not).
inline TensorView at(const Views& views, int index) {
  return index < 0 ? TensorView{} : views[static_cast<size_t>(index)];
}

}  // namespace modar::runtime::sample_recipes
