// Whole-model training steps with [moe]: the identities at model level (one
// expert top-1 == dense; integrated MoDE with no null experts == MoE, bit for
// bit) and finite-difference gradients (fp64) of the full objective
// (LM + weighted load-balancing and z losses) for MoE, staged MoDE,
// integrated MoDE and MoE inside DAR.
#include "test_model_common.hpp"

namespace modar::runtime::layer_tests {
namespace {

Config moe_config() {
  Config config = tiny_model_config();
  config.moe.experts = 3;
  config.moe.top_k = 2;
  config.moe.expert_ffn = 8;
  config.moe.first_dense = 1;  // layers 1 and 2 are MoE
  config.moe.aux_loss_coef = 0.3;
  config.moe.z_loss_coef = 0.05;
  return config;
}

struct Step {
  StepResult result;
  std::vector<double> logits;
};

Step run_step(Model& model) {
  Buffer tokens = tiny_tokens(model, 0);
  Buffer targets = tiny_tokens(model, 1);
  Step step;
  step.result = model.forward_backward(tokens, targets);
  step.logits = model.last_logits();
  return step;
}

TEST(MoeModel, OneExpertTop1EqualsTheDenseModelBitForBit) {
  Config dense_config = moe_config();
  dense_config.moe = MoeConfig{};
  Config moe = moe_config();
  moe.moe.experts = 1;
  moe.moe.top_k = 1;
  moe.moe.expert_ffn = 0;  // = model.d_ff
  moe.moe.z_loss_coef = 0.0;
  validate(moe);
  const ModelOptions options = model_options(ScalarType::fp32);
  Model dense(cpu_backend(), dense_config, options);
  Model sparse(cpu_backend(), moe, options);
  copy_parameters(dense.parameters(), sparse.parameters());
  for (const auto& p : dense.parameters().all()) {
    const std::string& name = p->name;
    const size_t dot_at = name.rfind('.');
    if (dot_at == std::string::npos)
      continue;
    const std::string expert = name.substr(0, dot_at) + ".experts" + name.substr(dot_at);
    if (Parameter* q = sparse.parameters().find(expert)) {
      upload(cpu_backend(), download(cpu_backend(), p->value), q->value);
    }
  }
  const Step a = run_step(dense);
  const Step b = run_step(sparse);
  EXPECT_EQ(a.result.lm_loss, b.result.lm_loss);
  EXPECT_EQ(a.logits, b.logits);
  // aux = E sum f P = 1 * 1 * 1 for one expert (weighted 0.3 into the loss).
  EXPECT_DOUBLE_EQ(b.result.moe_aux_loss, 1.0);
  EXPECT_DOUBLE_EQ(b.result.loss, b.result.lm_loss + 2 * 0.3 * 1.0);
  EXPECT_EQ(download(cpu_backend(), dense.parameters().find("embedding")->grad),
            download(cpu_backend(), sparse.parameters().find("embedding")->grad));
  EXPECT_EQ(download(cpu_backend(), dense.parameters().find("layer2.w_out")->grad),
            download(cpu_backend(), sparse.parameters().find("layer2.experts.w_out")->grad));
}

TEST(MoeModel, IntegratedModeWithoutNullExpertsEqualsMoe) {
  Config moe = moe_config();
  Config integrated = moe;
  integrated.moe.mode = MoeMode::integrated;
  integrated.moe.null_experts = 0;
  validate(integrated);
  const ModelOptions options = model_options(ScalarType::fp32);
  Model a(cpu_backend(), moe, options);
  Model b(cpu_backend(), integrated, options);
  const Step sa = run_step(a);
  const Step sb = run_step(b);
  expect_identical_steps(a, sa.result, b, sb.result);
  // With null experts the router has more columns and some tokens skip the FFN.
  integrated.moe.null_experts = 2;
  Model c(cpu_backend(), integrated, options);
  const Step sc = run_step(c);
  EXPECT_GT(sc.result.moe_null, 0);
  EXPECT_EQ(c.parameters().find("layer1.moe_router")->value.dim(1), 5);
}

class MoeModelGradients : public ::testing::TestWithParam<ModelCase> {};

TEST_P(MoeModelGradients, MatchFiniteDifferences) {
  Config config = moe_config();
  GetParam().edit(config);
  validate(config);
  const ModelOptions options = fp64_model_options(7);
  Model model(cpu_backend(), config, options);
  randomize_parameters(model.parameters(), 91, 0.25);
  Buffer tokens = tiny_tokens(model, 0);
  Buffer targets = tiny_tokens(model, 1);
  const StepResult step = model.forward_backward(tokens, targets);
  const StepResult eval = model.evaluate(tokens, targets);
  EXPECT_DOUBLE_EQ(step.loss, eval.loss);
  EXPECT_GT(step.loss, step.lm_loss);  // the weighted aux / z terms are in the objective
  expect_parameter_gradients(
      model.parameters(), [&]() { return model.evaluate(tokens, targets).loss; }, 3, 1e-6, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(
    Architectures, MoeModelGradients,
    ::testing::Values(ModelCase{"moe", [](Config&) {}},
                      ModelCase{"moe_shared_capacity_swiglu",
                                [](Config& c) {
                                  c.model.mlp = MlpKind::swiglu;
                                  c.moe.shared_experts = 1;
                                  c.moe.capacity_factor = 0.75;
                                }},
                      ModelCase{"mode_staged",
                                [](Config& c) {
                                  c.moe.mode = MoeMode::staged;
                                  set_mod({.capacity = 0.5, .every = 2, .offset = 1})(c);
                                }},
                      ModelCase{"mode_integrated",
                                [](Config& c) {
                                  c.moe.mode = MoeMode::integrated;
                                  c.moe.null_experts = 2;
                                }},
                      ModelCase{"moe_dar",
                                set_dar({.variant = DarVariant::dar, .block_layers = 2})}),
    model_case_name);

}  // namespace
}  // namespace modar::runtime::layer_tests
