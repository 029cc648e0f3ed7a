// Fixtures shared by the whole-model runtime tests (test_model*.cpp): the
// tiny model, its token ids, named config edits for parameterised tests and
// the bit-for-bit comparison of two models' steps.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "../common/tiny_model.hpp"
#include "test_layers_common.hpp"

namespace modar::runtime::layer_tests {

constexpr int64_t kModelBatch = 2, kModelSeq = kTinySeq, kModelVocab = kTinyVocab;

// d 16, 3 layers, 2 heads over 1 KV head, d_ff 24, V 13, s 6.
inline Config tiny_model_config() {
  return tiny_model(3);
}

// Deterministic ids (7 i + 3 + shift i^2) mod vocab; shifts give other sequences.
inline std::vector<int32_t> token_ids(int64_t count, int32_t vocab, int32_t shift) {
  std::vector<int32_t> ids(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    ids[static_cast<size_t>(i)] = static_cast<int32_t>((7 * i + 3 + shift * i * i) % vocab);
  }
  return ids;
}

// The tiny model's [kModelBatch, kModelSeq] tokens: token_ids with shift `shift`.
inline Buffer tiny_tokens(Model& model, int32_t shift) {
  return model.make_tokens(token_ids(kModelBatch * kModelSeq, kModelVocab, shift), kModelBatch,
                           kModelSeq);
}

// Activations and weights in `dtype`, seed `seed`; fp64 for the gradient
// and identity checks.
inline ModelOptions model_options(ScalarType dtype, uint64_t seed = 1) {
  ModelOptions options;
  options.dtype = dtype;
  options.seed = seed;
  return options;
}
inline ModelOptions fp64_model_options(uint64_t seed = 1) {
  return model_options(ScalarType::fp64, seed);
}

// A named edit of the tiny config, for INSTANTIATE_TEST_SUITE_P.
struct ModelCase {
  const char* name;
  std::function<void(Config&)> edit;
};
inline std::string model_case_name(const ::testing::TestParamInfo<ModelCase>& info) {
  return info.param.name;
}

// The same step on two models gave the same loss, logits and gradient of
// every parameter of `a` (found by name in `b`), bit for bit.
inline void expect_identical_steps(Model& a, const StepResult& step_a, Model& b,
                                   const StepResult& step_b) {
  EXPECT_EQ(step_a.loss, step_b.loss);
  EXPECT_EQ(a.last_logits(), b.last_logits());
  for (const auto& p : a.parameters().all()) {
    const Parameter* q = b.parameters().find(p->name);
    ASSERT_NE(q, nullptr) << p->name;
    EXPECT_EQ(download(cpu_backend(), p->grad), download(cpu_backend(), q->grad)) << p->name;
  }
}

}  // namespace modar::runtime::layer_tests
