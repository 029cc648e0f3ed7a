// Model keys that describe imported architectures: QKV biases, QK-norm and
// the GeGLU MLP.  Expected parameter counts and FLOPs are written from the
// shapes by hand (d = 512, L = 4, H = 8 query heads, G = 2 KV heads of
// d_head = 64, SwiGLU width 1408, V = 1000, s = 128).
#include <gtest/gtest.h>

#include "../common/config_error_of.hpp"
#include "../common/expect_relative.hpp"
#include "../common/model_files.hpp"
#include "modar/base/errors.hpp"
#include "modar/cost_model.hpp"
#include "modar/profile.hpp"

namespace modar {
namespace {

constexpr double d = 512, L = 4, H = 8, G = 2, dh = 64, f = 1408, V = 1000, s = 128;
// Per layer: Q (H dh) K V (G dh each) and the output projection, the gated
// MLP's three matrices, two norm weights; plus the final norm, embedding and
// untied head.
constexpr double kAttention = d * (H + 2 * G) * dh + H * dh * d;
constexpr double kMlp = 3 * d * f;
constexpr double kPlain = L * (kAttention + kMlp + 2 * d) + d + 2 * V * d;

// The model of the constants above, untied, micro-batch 1
// (tests/data/models/gqa_swiglu_512x4.toml).
Config base() {
  return modar_test::model_file("gqa_swiglu_512x4");
}

using modar_test::expect_relative;

TEST(ModelKeys, PlainCountIsTheHandCount) {
  expect_relative(count_params(base()).total, kPlain);
}

TEST(ModelKeys, QkvBiasAddsOneBiasPerProjectionOutput) {
  Config c = base();
  c.model.qkv_bias = true;
  // Q, K and V: (H + 2 G) d_head = 768 biases per layer.
  expect_relative(count_params(c).total, kPlain + L * (H + 2 * G) * dh);
  // The adds are fused into the QKV GEMM: the forward FLOPs do not change.
  expect_relative(count_flops(c).forward_per_token, count_flops(base()).forward_per_token);
}

TEST(ModelKeys, QkNormWeightsPerHeadOrPerProjection) {
  Config head = base();
  head.model.qk_norm = QkNorm::head;
  // Qwen3: one d_head weight for Q, one for K, shared by the heads.
  expect_relative(count_params(head).total, kPlain + L * 2 * dh);
  Config projection = base();
  projection.model.qk_norm = QkNorm::projection;
  // OLMoE: a weight over the whole Q projection (H dh) and K projection (G dh).
  expect_relative(count_params(projection).total, kPlain + L * (H + G) * dh);
  // Either norm saves its inputs (H + G) d_head per token and layer (bf16).
  const DeviceProfile profile = load_profile("cpu-generic");
  const double extra =
      estimate_memory(head, profile).activations - estimate_memory(base(), profile).activations;
  expect_relative(extra, L * s * (H + G) * dh * 2.0);
}

TEST(ModelKeys, GegluHasSwigluShapes) {
  Config geglu = base();
  geglu.model.mlp = MlpKind::geglu;
  expect_relative(count_params(geglu).total, kPlain);
  expect_relative(count_flops(geglu).forward_per_token, count_flops(base()).forward_per_token);
  // The default width of a gated MLP: 8d/3 rounded up to a multiple of 64.
  geglu.model.d_ff = 0;
  EXPECT_EQ(geglu.model.resolved_d_ff(), 1408);  // 8 x 512 / 3 = 1365.3 -> 1408
}

TEST(ModelKeys, SharedExpertKeysNeedSharedExperts) {
  Config c = base();
  c.moe = {.experts = 4, .shared_expert_ffn = 256};
  const std::string error = modar_test::error_of([&] { validate(c); });
  EXPECT_NE(error.find("ConfigError: "), std::string::npos) << error;
  EXPECT_NE(error.find("moe.shared_expert_ffn = 256"), std::string::npos) << error;
  c.moe.shared_expert_ffn = 0;
  c.moe.shared_expert_gate = true;
  EXPECT_THROW(validate(c), ConfigError);
  c.moe.shared_experts = 1;
  EXPECT_NO_THROW(validate(c));
}

}  // namespace
}  // namespace modar
