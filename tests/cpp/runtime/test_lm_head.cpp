// The language-model head (LmHead, layers.hpp): its loss against a hand
// computation, its gradients (weighted, untied and tied, with ignored
// targets) against finite differences, and the objective's one formula
// (step_result) against the terms written out.
#include "test_layers_common.hpp"

namespace modar::runtime::layer_tests {
namespace {

// d = 2, V = 3, one row x = (3, 4), final norm weights (1, 1), eps = 0:
// u = x / rms(x) = (3, 4) / sqrt(12.5); an untied head W = I on the first two
// columns and (1, 1) on the third gives logits (u0, u1, u0 + u1); target 2:
// loss = log(e^u0 + e^u1 + e^(u0 + u1)) - (u0 + u1).
TEST(LmHead, LossIsTheCrossEntropyOfTheNormalisedProjection) {
  const Context ctx = fp64_context();
  ParameterSet params;
  Rng rng(1);
  LmHead head(params, ctx, 2, 3, 0.0, nullptr, Init::from_values({1, 0, 1, 0, 1, 1}), rng);
  Buffer x = host_tensor(ctx, {1, 1, 2}, {3.0, 4.0});
  Buffer targets = ctx.indices({1, 1}, {2});
  LmHead::Saved saved;
  const double loss = head.forward(ctx, x, targets, saved);
  const double r = std::sqrt(12.5), u0 = 3.0 / r, u1 = 4.0 / r;
  const double want = std::log(std::exp(u0) + std::exp(u1) + std::exp(u0 + u1)) - (u0 + u1);
  EXPECT_NEAR(loss, want, 1e-14);
  // An ignored target (-1) counts for nothing; a row of nothing but ignored
  // targets has loss 0.
  Buffer ignored = ctx.indices({1, 1}, {-1});
  LmHead::Saved none;
  EXPECT_EQ(head.forward(ctx, x, ignored, none), 0.0);
}

struct HeadCase {
  bool tied;
  double weight;
};

class LmHeadGradients : public ::testing::TestWithParam<HeadCase> {};

// f = weight x mean CE over the counted targets (two of the 8 ignored), as a
// function of x, the final norm and the head (or the tied embedding).
TEST_P(LmHeadGradients, MatchFiniteDifferences) {
  const Context ctx = fp64_context();
  const HeadCase c = GetParam();
  const int64_t b = 2, s = 4, d = 6, V = 5;
  ParameterSet params;
  Rng rng(3);
  Parameter* embedding =
      c.tied ? &params.add(ctx, "embedding", {V, d}, ctx.dtype, Init::normal_std(0.5), rng)
             : nullptr;
  LmHead head(params, ctx, d, V, 1e-6, embedding, Init::normal_std(0.5), rng);
  randomize_parameters(params, 9);
  std::vector<double> x_host = random_values(b * s * d, 4);
  Buffer targets = ctx.indices({b, s}, {1, 4, -1, 0, 2, -1, 3, 3});
  auto loss = [&]() {
    Buffer x = host_tensor(ctx, {b, s, d}, x_host);
    LmHead::Saved saved;
    return c.weight * head.forward(ctx, x, targets, saved);
  };
  params.zero_grads(ctx.backend);
  Buffer x = host_tensor(ctx, {b, s, d}, x_host);
  LmHead::Saved saved;
  head.forward(ctx, x, targets, saved);
  const std::vector<double> dx = download(ctx.backend, head.backward(ctx, c.weight, saved));
  EXPECT_TRUE(saved.logits.empty()) << "backward frees the logits unless they are kept";
  expect_parameter_gradients(params, loss, 6);
  expect_input_gradient(x_host, dx, loss, 12);
}

INSTANTIATE_TEST_SUITE_P(TiedAndWeighted, LmHeadGradients,
                         ::testing::Values(HeadCase{false, 1.0}, HeadCase{true, 1.0},
                                           HeadCase{false, 0.75}, HeadCase{true, 2.5}));

// step_result: loss = lm + w sum aux + sum pred + sum (alpha aux + beta z),
// the reported router / predictor / MoE terms their means over the layers.
TEST(Objective, StepResultIsTheSumTheBackwardDifferentiates) {
  LayerLosses layers;
  layers.router_aux = 0.9;  // two routed layers: 0.4 + 0.5
  layers.predictor = 0.3;
  layers.predictor_accuracy = 1.5;
  layers.moe_aux = 2.0;  // two MoE layers
  layers.moe_z = 0.02;
  layers.moe_weighted = 0.01 * 2.0 + 0.001 * 0.02;
  layers.moe_dropped = 7;
  const StepResult r = step_result(2.5, layers, 2, 2, 0.01);
  EXPECT_DOUBLE_EQ(r.loss, 2.5 + 0.01 * 0.9 + 0.3 + 0.02002);
  EXPECT_DOUBLE_EQ(r.lm_loss, 2.5);
  EXPECT_DOUBLE_EQ(r.router_aux, 0.45);
  EXPECT_DOUBLE_EQ(r.predictor, 0.15);
  EXPECT_DOUBLE_EQ(r.predictor_accuracy, 0.75);
  EXPECT_DOUBLE_EQ(r.moe_aux_loss, 1.0);
  EXPECT_DOUBLE_EQ(r.moe_z_loss, 0.01);
  EXPECT_EQ(r.moe_dropped, 7);
  // Scaling a sum of parts' means into their mean keeps the counts totals.
  layers.scale(0.5);
  EXPECT_DOUBLE_EQ(layers.router_aux, 0.45);
  EXPECT_EQ(layers.moe_dropped, 7.0);
}

}  // namespace
}  // namespace modar::runtime::layer_tests
