// GELU (tanh form), SwiGLU, add / axpy / scale / mul: known values and
// finite-difference backwards; bf16 within its rounding.
#include "test_ops_util.hpp"

namespace modar::runtime::testing {
namespace {

TEST(OpsGelu, KnownValuesAndGradient) {
  // Hand values of the tanh approximation 0.5 x (1 + tanh(sqrt(2/pi)(x + 0.044715 x^3))):
  // gelu(1) = 0.5 (1 + tanh(0.7978845608 * 1.044715)) = 0.8411919906
  // gelu(-1) = -1 + gelu(1) (odd part: gelu(x) - gelu(-x) = x).
  Tensor x = tensor({4}, {0, 1, -1, 3}), out = zeros({4});
  cpu().gelu_forward(x, out);
  const auto y = values_of(out);
  EXPECT_EQ(y[0], 0.0);
  EXPECT_NEAR(y[1], 0.8411919906082768, 1e-12);
  EXPECT_NEAR(y[1] - y[2], 1.0, 1e-15);
  EXPECT_NEAR(y[3], 2.9963627, 1e-6);  // 1.5 (1 + tanh(0.7978845608 * 4.207305))

  auto xs = random_values(12, 1, -3, 3);
  const auto w = random_values(12, 2);
  auto loss = [&] {
    Tensor xt = tensor({3, 4}, xs), o = zeros({3, 4});
    cpu().gelu_forward(xt, o);
    return project(o, w);
  };
  Tensor xt = tensor({3, 4}, xs), g = tensor({3, 4}, w), dx = zeros({3, 4});
  cpu().gelu_backward(g, xt, dx);
  expect_gradient("gelu dx", xs, loss, values_of(dx));
}

TEST(OpsSwiglu, ValuesAndGradients) {
  // silu(2) * 3 = 2 sigmoid(2) * 3.
  Tensor a = tensor({1}, {2}), b = tensor({1}, {3}), o = zeros({1});
  cpu().swiglu_forward(a, b, o);
  EXPECT_NEAR(values_of(o)[0], 6.0 / (1.0 + std::exp(-2.0)), 1e-15);

  auto gate = random_values(10, 3, -3, 3), up = random_values(10, 4);
  const auto w = random_values(10, 5);
  auto loss = [&] {
    Tensor gt = tensor({2, 5}, gate), ut = tensor({2, 5}, up), out = zeros({2, 5});
    cpu().swiglu_forward(gt, ut, out);
    return project(out, w);
  };
  Tensor gt = tensor({2, 5}, gate), ut = tensor({2, 5}, up), g = tensor({2, 5}, w);
  Tensor dg = zeros({2, 5}), du = zeros({2, 5});
  cpu().swiglu_backward(g, gt, ut, dg, du);
  expect_gradient("swiglu dgate", gate, loss, values_of(dg));
  expect_gradient("swiglu dup", up, loss, values_of(du));
}

TEST(OpsElementwise, AddAxpyScaleMul) {
  Tensor a = tensor({3}, {1, 2, 3}), b = tensor({3}, {10, 20, 30});
  cpu().add(a, b, a);  // residual add in place
  EXPECT_EQ(values_of(a), (std::vector<double>{11, 22, 33}));
  Tensor y32 = tensor({3}, {1, 1, 1}, ScalarType::fp32);
  cpu().axpy(-2.0, b, y32);  // fp64 x into fp32 y
  EXPECT_EQ(values_of(y32), (std::vector<double>{-19, -39, -59}));
  cpu().scale(y32, 0.5);
  EXPECT_EQ(values_of(y32), (std::vector<double>{-9.5, -19.5, -29.5}));

  auto p = random_values(6, 6), q = random_values(6, 7);
  const auto w = random_values(6, 8);
  auto loss = [&] {
    Tensor pt = tensor({6}, p), qt = tensor({6}, q), out = zeros({6});
    cpu().mul_forward(pt, qt, out);
    return project(out, w);
  };
  Tensor pt = tensor({6}, p), qt = tensor({6}, q), g = tensor({6}, w);
  Tensor dp = zeros({6}), dq = zeros({6});
  cpu().mul_backward(g, pt, qt, dp, dq);
  expect_gradient("mul da", p, loss, values_of(dp));
  expect_gradient("mul db", q, loss, values_of(dq));
}

TEST(OpsElementwise, Bf16WithinRoundingOfFp64) {
  const auto x = random_values(64, 9, -3, 3);
  Tensor x64 = tensor({64}, x), y64 = zeros({64});
  Tensor x16 = tensor({64}, x, ScalarType::bf16), y16 = zeros({64}, ScalarType::bf16);
  cpu().gelu_forward(x64, y64);
  cpu().gelu_forward(x16, y16);
  // Input rounding (2^-9 relative) times |gelu'| <= 1.13, plus output rounding.
  const auto a = values_of(y16), b = values_of(y64);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i], b[i], 1.13 * std::abs(x[i]) / 256 + std::abs(b[i]) / 256 + 1e-6) << x[i];
  }
  Tensor x32 = zeros({64}, ScalarType::fp32);
  expect_shape_error([&] { cpu().gelu_forward(x16, x32); }, "expected the shape and dtype of x");
}

}  // namespace
}  // namespace modar::runtime::testing
