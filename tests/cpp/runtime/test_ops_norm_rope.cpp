// RMSNorm and RoPE: hand-computed forwards, finite-difference backwards.
#include <complex>

#include "test_ops_util.hpp"

namespace modar::runtime::testing {
namespace {

TEST(OpsRmsnorm, HandComputedForward) {
  // x = [3, 4]: mean(x^2) = 12.5, rstd = 12.5^-1/2; w = [1, 2].
  Tensor x = tensor({1, 2}, {3, 4}), w = tensor({2}, {1, 2});
  Tensor out = zeros({1, 2}), rstd = zeros({1});
  cpu().rmsnorm_forward(x, w, out, rstd, 0.0);
  const double r = 1.0 / std::sqrt(12.5);
  EXPECT_NEAR(values_of(rstd)[0], r, 1e-15);
  EXPECT_NEAR(values_of(out)[0], 3 * r, 1e-15);
  EXPECT_NEAR(values_of(out)[1], 8 * r, 1e-15);
  // Statistics only (out empty), with eps.
  Tensor rstd_only = zeros({1});
  cpu().rmsnorm_forward(x, TensorView{}, TensorView{}, rstd_only, 0.5);
  EXPECT_NEAR(values_of(rstd_only)[0], 1.0 / std::sqrt(13.0), 1e-15);
}

TEST(OpsRmsnorm, GradientsMatchFiniteDifferences) {
  const int64_t rows = 3, d = 7;
  for (bool weighted : {true, false}) {
    auto x = random_values(rows * d, 1);
    auto w = random_values(d, 2, 0.5, 1.5);
    const auto proj = random_values(rows * d, 3);
    auto loss = [&] {
      Tensor xt = tensor({rows, d}, x), wt = tensor({d}, w), out = zeros({rows, d}),
             rstd = zeros({rows});
      cpu().rmsnorm_forward(xt, weighted ? wt.view() : TensorView{}, out, rstd, 1e-5);
      return project(out, proj);
    };
    Tensor xt = tensor({rows, d}, x), wt = tensor({d}, w), out = zeros({rows, d}),
           rstd = zeros({rows});
    const TensorView weight = weighted ? wt.view() : TensorView{};
    cpu().rmsnorm_forward(xt, weight, out, rstd, 1e-5);
    Tensor dout = tensor({rows, d}, proj), dx = zeros({rows, d}), dw = zeros({d});
    cpu().rmsnorm_backward(dout, xt, weight, rstd, dx, weighted ? dw.view() : TensorView{});
    expect_gradient("rmsnorm dx", x, loss, values_of(dx));
    if (weighted)
      expect_gradient("rmsnorm dweight", w, loss, values_of(dw));
  }
}

TEST(OpsRmsnorm, BackwardAccumulatesAndBf16Runs) {
  Tensor x = random_tensor({2, 8}, 4), out = zeros({2, 8}), rstd = zeros({2});
  cpu().rmsnorm_forward(x, TensorView{}, out, rstd, 1e-6);
  Tensor dout = random_tensor({2, 8}, 5), dx_once = zeros({2, 8}), dx_twice = zeros({2, 8});
  cpu().rmsnorm_backward(dout, x, TensorView{}, rstd, dx_once, TensorView{});
  cpu().rmsnorm_backward(dout, x, TensorView{}, rstd, dx_twice, TensorView{});
  cpu().rmsnorm_backward(dout, x, TensorView{}, rstd, dx_twice, TensorView{});
  auto once = values_of(dx_once), twice = values_of(dx_twice);
  for (double& v : once)
    v *= 2;
  EXPECT_LT(relative_error(twice, once), 1e-15);
  // bf16 data, fp32 statistics, result within bf16 precision of fp64.
  Tensor x16 = tensor({2, 8}, values_of(x), ScalarType::bf16),
         out16 = zeros({2, 8}, ScalarType::bf16);
  Tensor rstd32 = zeros({2}, ScalarType::fp32);
  cpu().rmsnorm_forward(x16, TensorView{}, out16, rstd32, 1e-6);
  EXPECT_LT(relative_error(values_of(out16), values_of(out)), 2.0 / 128);
  expect_shape_error([&] { cpu().rmsnorm_forward(x16, TensorView{}, out16, rstd, 1e-6); },
                     "rstd is [2] fp64");
}

// Independent reference: the pair (x[i], x[i + h]) as a complex number times e^{i theta}.
std::vector<double> naive_rope(const std::vector<double>& x, const std::vector<int>& positions,
                               int64_t heads, int64_t d_head, double base) {
  std::vector<double> out(x.size());
  const int64_t half = d_head / 2;
  for (size_t r = 0; r < positions.size(); ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < half; ++i) {
        const double theta = positions[r] / std::pow(base, 2.0 * i / d_head);
        const size_t at = (r * heads + h) * d_head + i;
        const std::complex<double> z(x[at], x[at + half]);
        const std::complex<double> rotated = z * std::polar(1.0, theta);
        out[at] = rotated.real();
        out[at + half] = rotated.imag();
      }
    }
  }
  return out;
}

TEST(OpsRope, MatchesComplexRotationAtGivenPositions) {
  const int64_t rows = 4, heads = 2, d_head = 8;
  const std::vector<int> positions = {0, 5, 1000, 3};  // routed tokens keep their positions
  const auto x = random_values(rows * heads * d_head, 6);
  Tensor xt = tensor({rows, heads, d_head}, x), out = zeros({rows, heads, d_head});
  Tensor pos = tensor({rows}, {0, 5, 1000, 3}, ScalarType::i32);
  cpu().rope_forward(xt, pos, out, RopeParams{10000.0});
  const auto got = values_of(out);
  EXPECT_LT(relative_error(got, naive_rope(x, positions, heads, d_head, 10000.0)), 1e-13);
  // Position 0 is the identity.
  for (int64_t i = 0; i < heads * d_head; ++i)
    EXPECT_NEAR(got[static_cast<size_t>(i)], x[static_cast<size_t>(i)], 1e-15);
  // In place (out aliases x).
  cpu().rope_forward(xt, pos, xt, RopeParams{10000.0});
  EXPECT_LT(relative_error(values_of(xt), got), 1e-15);
}

TEST(OpsRope, DotProductDependsOnlyOnRelativePosition) {
  const auto q = random_values(8, 7), k = random_values(8, 8);
  auto rotated_dot = [&](int qp, int kp) {
    Tensor qt = tensor({1, 1, 8}, q), kt = tensor({1, 1, 8}, k);
    Tensor qpos = tensor({1}, {static_cast<double>(qp)}, ScalarType::i32);
    Tensor kpos = tensor({1}, {static_cast<double>(kp)}, ScalarType::i32);
    cpu().rope_forward(qt, qpos, qt, RopeParams{});
    cpu().rope_forward(kt, kpos, kt, RopeParams{});
    return dot(values_of(qt), values_of(kt));
  };
  EXPECT_NEAR(rotated_dot(5, 3), rotated_dot(12, 10), 1e-12);
  EXPECT_NEAR(rotated_dot(7, 7), dot(q, k), 1e-12);
}

TEST(OpsRope, BackwardMatchesFiniteDifferences) {
  const int64_t b = 2, s = 3, heads = 2, d_head = 4;
  auto x = random_values(b * s * heads * d_head, 9);
  const auto proj = random_values(x.size(), 10);
  Tensor pos = tensor({b, s}, {4, 9, 17, 0, 2, 30}, ScalarType::i32);
  auto loss = [&] {
    Tensor xt = tensor({b, s, heads, d_head}, x), out = zeros({b, s, heads, d_head});
    cpu().rope_forward(xt, pos, out, RopeParams{500.0});
    return project(out, proj);
  };
  Tensor dout = tensor({b, s, heads, d_head}, proj), dx = zeros({b, s, heads, d_head});
  cpu().rope_backward(dout, pos, dx, RopeParams{500.0});
  expect_gradient("rope dx", x, loss, values_of(dx));
  Tensor bad_pos = tensor({b * s + 1}, std::vector<double>(b * s + 1, 0.0), ScalarType::i32);
  expect_shape_error([&] { cpu().rope_forward(dout, bad_pos, dx, RopeParams{}); },
                     "positions is [7] i32 cpu; expected 6 elements");
}

}  // namespace
}  // namespace modar::runtime::testing
