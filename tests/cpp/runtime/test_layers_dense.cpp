// Dense pre-norm layer: finite-difference gradients (fp64) of the attention +
// MLP layer for GELU / SwiGLU and GQA / MHA, and of each branch alone.
#include "test_layers_common.hpp"

namespace modar::runtime::layer_tests {
namespace {

struct DenseCase {
  MlpKind mlp;
  int64_t kv_heads;
};

class DenseLayerGradients : public ::testing::TestWithParam<DenseCase> {};

TEST_P(DenseLayerGradients, MatchFiniteDifferences) {
  const Context ctx = fp64_context();
  const BranchShape shape = small_shape(GetParam().mlp, GetParam().kv_heads);
  ParameterSet params;
  Rng rng(11);
  TransformerLayer layer(params, ctx, "layer", shape, rng, 0.02);
  randomize_parameters(params, 100);
  const int64_t b = 2, s = 5, d = shape.d_model;
  std::vector<double> x_host = random_values(b * s * d, 7);
  const std::vector<double> weights = random_values(b * s * d, 8);
  Buffer positions = sequence_positions(ctx, b, s);

  auto loss = [&]() {
    Buffer x = host_tensor(ctx, {b, s, d}, x_host);
    layer.forward_inplace(ctx, x, positions, nullptr);
    return dot(download(ctx.backend, x), weights);
  };
  params.zero_grads(ctx.backend);
  Buffer x = host_tensor(ctx, {b, s, d}, x_host);
  TransformerLayer::Saved saved;
  layer.forward_inplace(ctx, x, positions, &saved);
  Buffer dx = host_tensor(ctx, {b, s, d}, weights);
  layer.backward_inplace(ctx, dx, saved);
  const std::vector<double> dx_host = download(ctx.backend, dx);

  expect_parameter_gradients(params, loss, 6);
  expect_input_gradient(x_host, dx_host, loss, 12);
}

INSTANTIATE_TEST_SUITE_P(MlpAndHeads, DenseLayerGradients,
                         ::testing::Values(DenseCase{MlpKind::gelu, 2},
                                           DenseCase{MlpKind::swiglu, 4},
                                           DenseCase{MlpKind::gelu, 1}));

// The layer is x + a + m with m reading x + a: check that composition against
// the branches called one by one (an independent path through the same API).
TEST(DenseLayer, EqualsItsBranchesComposed) {
  const Context ctx = fp64_context();
  const BranchShape shape = small_shape();
  ParameterSet params;
  Rng rng(5);
  TransformerLayer layer(params, ctx, "layer", shape, rng, 0.02);
  randomize_parameters(params, 17);
  const int64_t b = 1, s = 6, d = shape.d_model;
  const std::vector<double> x_host = random_values(b * s * d, 3);
  Buffer positions = sequence_positions(ctx, b, s);
  Buffer x = host_tensor(ctx, {b, s, d}, x_host);
  layer.forward_inplace(ctx, x, positions, nullptr);
  const std::vector<double> out = download(ctx.backend, x);

  Buffer x0 = host_tensor(ctx, {b, s, d}, x_host);
  Buffer a = layer.attention().forward(ctx, x0, positions, TensorView{}, nullptr);
  std::vector<double> mid = download(ctx.backend, a);
  for (size_t i = 0; i < mid.size(); ++i)
    mid[i] += x_host[i];
  Buffer x1 = host_tensor(ctx, {b, s, d}, mid);
  const std::vector<double> m = download(ctx.backend, layer.mlp().forward(ctx, x1, nullptr));
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_NEAR(out[i], mid[i] + m[i], 1e-12);
  }
}

}  // namespace
}  // namespace modar::runtime::layer_tests
