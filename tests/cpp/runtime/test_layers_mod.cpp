// MoD routed layer (docs/model.md MoD): finite-difference gradients for g = r and
// g = sigmoid(r), the auxiliary BCE loss and the predictor; k = 1 and k = s;
// capacity 1 == the dense layer bit for bit; deterministic top-k under ties;
// decode (router / predictor, KV cache of routed tokens only) == a full forward
// on the routed tokens.
#include "test_layers_common.hpp"

namespace modar::runtime::layer_tests {
namespace {

constexpr int64_t kBatch = 2, kSeq = 6;

struct RoutedCase {
  const char* name;
  double capacity;
  RouterScale gate;
  CausalRouter causal;
};

class RoutedLayerGradients : public ::testing::TestWithParam<RoutedCase> {};

TEST_P(RoutedLayerGradients, MatchFiniteDifferences) {
  const RoutedCase& c = GetParam();
  const Context ctx = fp64_context();
  const BranchShape shape = small_shape();
  RoutingOptions routing{.capacity = c.capacity,
                         .gate = c.gate,
                         .causal = c.causal,
                         .predictor_hidden = 8,
                         .aux_loss_weight = 0.7};
  ParameterSet params;
  Rng rng(21);
  RoutedLayer layer(params, ctx, "layer", shape, routing, rng, 0.02);
  randomize_parameters(params, 200);
  const int64_t d = shape.d_model;
  std::vector<double> x_host = random_values(kBatch * kSeq * d, 31);
  const std::vector<double> weights = random_values(kBatch * kSeq * d, 32);

  // The objective the backward differentiates: <w, out> + aux weight * router
  // BCE (aux_loss mode) + predictor BCE (predictor mode).
  auto objective = [&](const RoutedLayer::Losses& losses, const std::vector<double>& out) {
    double value = dot(out, weights);
    if (c.causal == CausalRouter::aux_loss)
      value += routing.aux_loss_weight * losses.router_aux;
    if (c.causal == CausalRouter::predictor)
      value += losses.predictor;
    return value;
  };
  auto loss = [&]() {
    Buffer x = host_tensor(ctx, {kBatch, kSeq, d}, x_host);
    const RoutedLayer::Losses losses = layer.forward_inplace(ctx, x, nullptr);
    return objective(losses, download(ctx.backend, x));
  };
  params.zero_grads(ctx.backend);
  Buffer x = host_tensor(ctx, {kBatch, kSeq, d}, x_host);
  RoutedLayer::Saved saved;
  layer.forward_inplace(ctx, x, &saved);
  EXPECT_EQ(saved.indices.dim(1), layer.routed_tokens(kSeq));
  Buffer dx = host_tensor(ctx, {kBatch, kSeq, d}, weights);
  layer.backward_inplace(ctx, dx, saved);
  const std::vector<double> dx_host = download(ctx.backend, dx);

  expect_parameter_gradients(params, loss, 6);
  // The predictor's input is stop-gradient: its BCE does not reach x.
  auto lm_loss = [&]() {
    Buffer xi = host_tensor(ctx, {kBatch, kSeq, d}, x_host);
    RoutedLayer::Losses losses = layer.forward_inplace(ctx, xi, nullptr);
    losses.predictor = 0.0;
    return objective(losses, download(ctx.backend, xi));
  };
  expect_input_gradient(x_host, dx_host, lm_loss, 16);
  // The router must receive a gradient through g(r) (paper eq. 1).
  const std::vector<double> router_grad = download(ctx.backend, params.find("layer.router")->grad);
  EXPECT_GT(std::abs(router_grad[0]) + std::abs(router_grad[1]), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(
    Routing, RoutedLayerGradients,
    ::testing::Values(RoutedCase{"linear", 0.5, RouterScale::linear, CausalRouter::none},
                      RoutedCase{"sigmoid", 0.5, RouterScale::sigmoid, CausalRouter::none},
                      RoutedCase{"aux", 0.5, RouterScale::linear, CausalRouter::aux_loss},
                      RoutedCase{"predictor", 0.5, RouterScale::sigmoid, CausalRouter::predictor},
                      RoutedCase{"k1", 0.01, RouterScale::linear, CausalRouter::none},
                      RoutedCase{"ks", 1.0, RouterScale::sigmoid, CausalRouter::aux_loss}),
    [](const ::testing::TestParamInfo<RoutedCase>& info) { return std::string(info.param.name); });

// A routed layer (capacity 1) and a dense layer of the same shape, each
// built from its own Rng(4) (the identities below then copy one's parameters
// onto the other).
struct RoutedAndDense {
  ParameterSet routed_params, dense_params;
  Rng rng_a{4}, rng_b{4};
  RoutedLayer routed;
  TransformerLayer dense;
  RoutedAndDense(const Context& ctx, const BranchShape& shape, const RoutingOptions& routing)
      : routed(routed_params, ctx, "layer", shape, routing, rng_a, 0.02),
        dense(dense_params, ctx, "layer", shape, rng_b, 0.02) {}
};

// docs/model.md MoD: capacity 1 reproduces the dense layer.  With g(r) = 1 (unit gate)
// the routed layer is EXACTLY the dense layer: same output and the same
// gradients, bit for bit (gather of all s tokens is a copy, RoPE uses the same
// positions, and the scatter adds 1 * delta like the dense layer adds delta).
TEST(RoutedLayer, CapacityOneWithUnitGateIsTheDenseLayerExactly) {
  const Context ctx = fp64_context();
  const BranchShape shape = small_shape(MlpKind::swiglu, 2);
  RoutedAndDense layers(ctx, shape, {.capacity = 1.0, .unit_gate = true});
  auto& [routed_params, dense_params, rng_a, rng_b, routed, dense] = layers;
  randomize_parameters(dense_params, 9);
  copy_parameters(dense_params, routed_params);
  const int64_t d = shape.d_model;
  const std::vector<double> x_host = random_values(kBatch * kSeq * d, 1);
  const std::vector<double> weights = random_values(kBatch * kSeq * d, 2);
  Buffer positions = sequence_positions(ctx, kBatch, kSeq);

  routed_params.zero_grads(ctx.backend);
  dense_params.zero_grads(ctx.backend);
  Buffer xr = host_tensor(ctx, {kBatch, kSeq, d}, x_host);
  Buffer xd = host_tensor(ctx, {kBatch, kSeq, d}, x_host);
  RoutedLayer::Saved rs;
  TransformerLayer::Saved ds;
  routed.forward_inplace(ctx, xr, &rs);
  dense.forward_inplace(ctx, xd, positions, &ds);
  EXPECT_EQ(download(ctx.backend, xr), download(ctx.backend, xd));
  Buffer dxr = host_tensor(ctx, {kBatch, kSeq, d}, weights);
  Buffer dxd = host_tensor(ctx, {kBatch, kSeq, d}, weights);
  routed.backward_inplace(ctx, dxr, rs);
  dense.backward_inplace(ctx, dxd, ds);
  EXPECT_EQ(download(ctx.backend, dxr), download(ctx.backend, dxd));
  for (const auto& p : dense_params.all()) {
    EXPECT_EQ(download(ctx.backend, p->grad),
              download(ctx.backend, routed_params.find(p->name)->grad))
        << p->name;
  }
}

// With the paper's g(r) = r, capacity 1 gives x + r * (dense(x) - x).
TEST(RoutedLayer, CapacityOneWithLinearGateScalesTheDenseDeltaByR) {
  const Context ctx = fp64_context();
  const BranchShape shape = small_shape();
  RoutedAndDense layers(ctx, shape, {.capacity = 1.0});
  auto& [routed_params, dense_params, rng_a, rng_b, routed, dense] = layers;
  randomize_parameters(routed_params, 9);
  copy_parameters(routed_params, dense_params);
  const int64_t d = shape.d_model;
  const std::vector<double> x_host = random_values(kBatch * kSeq * d, 1);
  const std::vector<double> w_r = download(ctx.backend, routed_params.find("layer.router")->value);
  Buffer positions = sequence_positions(ctx, kBatch, kSeq);
  Buffer xr = host_tensor(ctx, {kBatch, kSeq, d}, x_host);
  Buffer xd = host_tensor(ctx, {kBatch, kSeq, d}, x_host);
  routed.forward_inplace(ctx, xr, nullptr);
  dense.forward_inplace(ctx, xd, positions, nullptr);
  const std::vector<double> out_r = download(ctx.backend, xr), out_d = download(ctx.backend, xd);
  for (int64_t t = 0; t < kBatch * kSeq; ++t) {
    double r = 0.0;
    for (int64_t c = 0; c < d; ++c)
      r += w_r[c] * x_host[t * d + c];
    for (int64_t c = 0; c < d; ++c) {
      const size_t i = static_cast<size_t>(t * d + c);
      EXPECT_NEAR(out_r[i], x_host[i] + r * (out_d[i] - x_host[i]), 1e-12);
    }
  }
}

// Router weights = e_0 make the logits equal to feature 0 of each token.
void set_router_to_first_feature(ParameterSet& params, int64_t d) {
  std::vector<double> w(static_cast<size_t>(d), 0.0);
  w[0] = 1.0;
  set_parameter(params, "layer.router", w);
}

TEST(RoutedLayer, TopKIsDeterministicUnderTiesAndKeepsOtherTokens) {
  const Context ctx = fp64_context();
  const BranchShape shape = small_shape();
  RoutingOptions routing;
  routing.capacity = 0.5;  // k = 3 of 6
  ParameterSet params;
  Rng rng(8);
  RoutedLayer layer(params, ctx, "layer", shape, routing, rng, 0.02);
  randomize_parameters(params, 3);
  set_router_to_first_feature(params, shape.d_model);
  const int64_t d = shape.d_model;
  std::vector<double> x_host = random_values(kBatch * kSeq * d, 5);
  // Sequence 0 logits: [1, 3, 3, 2, 3, 3] -> the three 3s at the lowest
  // positions: {1, 2, 4}.  Sequence 1: all equal -> {0, 1, 2}.
  const double seq0[kSeq] = {1, 3, 3, 2, 3, 3};
  for (int64_t t = 0; t < kSeq; ++t) {
    x_host[static_cast<size_t>(t * d)] = seq0[t];
    x_host[static_cast<size_t>((kSeq + t) * d)] = 0.5;
  }
  const std::vector<int32_t> expected = {1, 2, 4, 0, 1, 2};
  for (int repeat = 0; repeat < 2; ++repeat) {
    Buffer x = host_tensor(ctx, {kBatch, kSeq, d}, x_host);
    RoutedLayer::Saved saved;
    layer.forward_inplace(ctx, x, &saved);
    std::vector<int32_t> indices(6);
    ctx.backend.copy_to_host(saved.indices, indices.data());
    EXPECT_EQ(indices, expected);
    const std::vector<double> out = download(ctx.backend, x);
    for (int64_t b = 0; b < kBatch; ++b) {
      for (int64_t t = 0; t < kSeq; ++t) {
        const bool routed = std::find(expected.begin() + b * 3, expected.begin() + b * 3 + 3, t) !=
                            expected.begin() + b * 3 + 3;
        for (int64_t c = 0; c < d; ++c) {
          const size_t i = static_cast<size_t>((b * kSeq + t) * d + c);
          if (!routed) {
            EXPECT_EQ(out[i], x_host[i]) << "unrouted token changed";
          }
        }
      }
    }
  }
}

class RoutedDecode : public ::testing::TestWithParam<CausalRouter> {};

// Decoding token by token (route iff sigmoid(logit) > 0.5, KV cache of routed
// tokens only) equals a full forward whose selection is the decoded one.
TEST_P(RoutedDecode, MatchesFullForwardOnRoutedTokens) {
  const Context ctx = fp64_context();
  const BranchShape shape = small_shape(MlpKind::gelu, 2);
  RoutingOptions routing{
      .capacity = 0.5, .gate = RouterScale::sigmoid, .causal = GetParam(), .predictor_hidden = 8};
  ParameterSet params;
  Rng rng(12);
  RoutedLayer layer(params, ctx, "layer", shape, routing, rng, 0.02);
  randomize_parameters(params, 44);
  const int64_t s = 12, d = shape.d_model;
  const std::vector<double> x_host = random_values(s * d, 45);

  KvCache cache = layer.make_cache(ctx, s);
  std::vector<int32_t> routed;
  std::vector<double> decoded(x_host.size());
  for (int64_t t = 0; t < s; ++t) {
    std::vector<double> row(x_host.begin() + t * d, x_host.begin() + (t + 1) * d);
    Buffer xt = host_tensor(ctx, {1, 1, d}, row);
    if (layer.decode_inplace(ctx, xt, static_cast<int32_t>(t), cache)) {
      routed.push_back(static_cast<int32_t>(t));
    }
    const std::vector<double> out = download(ctx.backend, xt);
    std::copy(out.begin(), out.end(), decoded.begin() + t * d);
  }
  ASSERT_GT(routed.size(), 1u);
  ASSERT_LT(routed.size(), static_cast<size_t>(s));
  EXPECT_EQ(cache.count, static_cast<int64_t>(routed.size()));

  RoutedLayer::Selection selection;
  selection.positions = {routed};
  Buffer x = host_tensor(ctx, {1, s, d}, x_host);
  layer.forward_inplace(ctx, x, nullptr, &selection);
  const std::vector<double> full = download(ctx.backend, x);
  for (size_t i = 0; i < full.size(); ++i) {
    EXPECT_NEAR(decoded[i], full[i], 1e-12) << "element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(CausalRouters, RoutedDecode,
                         ::testing::Values(CausalRouter::predictor, CausalRouter::aux_loss));

}  // namespace
}  // namespace modar::runtime::layer_tests
