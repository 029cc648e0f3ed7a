// MoD routing ops: router, top-k (exactly k, ties to the lower position,
// ascending output), ragged top-k, mask, gather / scatter.
#include <limits>

#include "test_ops_util.hpp"

namespace modar::runtime::testing {
namespace {

std::vector<double> topk_of(const std::vector<double>& logits, int64_t b, int64_t s, int64_t k) {
  Tensor lt = tensor({b, s}, logits, ScalarType::fp32);
  Tensor idx = zeros({b, k}, ScalarType::i32);
  cpu().topk(lt, idx);
  return values_of(idx);
}

TEST(OpsTopk, ExactlyKAscendingTiesTowardLowerPosition) {
  // Hand cases, one sequence of 6.
  EXPECT_EQ(topk_of({0.1, 0.9, 0.3, 0.8, 0.2, 0.7}, 1, 6, 3), (std::vector<double>{1, 3, 5}));
  // All equal: exactly k, the lowest positions.
  EXPECT_EQ(topk_of({1, 1, 1, 1, 1, 1}, 1, 6, 4), (std::vector<double>{0, 1, 2, 3}));
  // A tie across the k-th place: 0.5 at positions 1, 3, 4; k = 3 takes 0 (0.9) then 1, 3.
  EXPECT_EQ(topk_of({0.9, 0.5, 0.1, 0.5, 0.5, 0.2}, 1, 6, 3), (std::vector<double>{0, 1, 3}));
  // k = 1 and k = s.
  EXPECT_EQ(topk_of({0.1, 0.9, 0.9, 0.8}, 1, 4, 1), (std::vector<double>{1}));
  EXPECT_EQ(topk_of({0.4, 0.1, 0.3, 0.2}, 1, 4, 4), (std::vector<double>{0, 1, 2, 3}));
  // Per sequence, independent rows.
  EXPECT_EQ(topk_of({3, 2, 1, 0, 0, 1, 2, 3}, 2, 4, 2), (std::vector<double>{0, 1, 2, 3}));
  // NaN ranks below every number.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(topk_of({nan, -5, nan, -7}, 1, 4, 2), (std::vector<double>{1, 3}));
}

TEST(OpsTopk, MatchesSortReferenceOnRandomLogitsWithTies) {
  const int64_t b = 3, s = 50, k = 13;
  auto logits = random_values(b * s, 4);
  for (double& v : logits)
    v = std::round(v * 4) / 4;  // many ties
  const auto got = topk_of(logits, b, s, k);
  for (int64_t i = 0; i < b; ++i) {
    // Reference: position p is selected iff fewer than k positions beat it,
    // where q beats p if logit_q > logit_p or (equal and q < p).
    std::vector<double> expected;
    for (int64_t p = 0; p < s; ++p) {
      int64_t better = 0;
      for (int64_t q = 0; q < s; ++q) {
        const double lq = logits[i * s + q], lp = logits[i * s + p];
        better += (lq > lp || (lq == lp && q < p)) ? 1 : 0;
      }
      if (better < k)
        expected.push_back(static_cast<double>(p));
    }
    ASSERT_EQ(expected.size(), static_cast<size_t>(k));
    EXPECT_EQ(std::vector<double>(got.begin() + i * k, got.begin() + (i + 1) * k), expected);
  }
}

TEST(OpsTopk, RaggedCountsPadWithMinusOneAndMask) {
  Tensor logits = tensor({2, 5}, {0.5, 0.1, 0.9, 0.3, 0.7, 1, 2, 3, 4, 5}, ScalarType::fp32);
  Tensor counts = tensor({2}, {2, 0}, ScalarType::i32);
  Tensor idx = zeros({2, 3}, ScalarType::i32);
  cpu().topk_ragged(logits, counts, idx);
  EXPECT_EQ(values_of(idx), (std::vector<double>{2, 4, -1, -1, -1, -1}));
  Tensor mask = random_tensor({2, 5}, 1, ScalarType::fp32);
  cpu().topk_mask(idx, mask);
  EXPECT_EQ(values_of(mask), (std::vector<double>{0, 0, 1, 0, 1, 0, 0, 0, 0, 0}));
  Tensor too_many = tensor({2}, {4, 0}, ScalarType::i32);
  expect_shape_error([&] { cpu().topk_ragged(logits, too_many, idx); }, "counts[0] = 4");
  Tensor k_too_big = zeros({2, 6}, ScalarType::i32);
  expect_shape_error([&] { cpu().topk(logits, k_too_big); }, "must be in [1, s = 5]");
}

TEST(OpsRouter, ForwardAndGradients) {
  const int64_t rows = 4, d = 6;
  auto x = random_values(rows * d, 5);
  auto w = random_values(d, 6);
  const auto proj = random_values(rows, 7);
  auto loss = [&] {
    Tensor xt = tensor({2, 2, d}, x), wt = tensor({d}, w), logits = zeros({rows});
    cpu().router_forward(xt, wt, logits);
    return project(logits, proj);
  };
  Tensor xt = tensor({2, 2, d}, x), wt = tensor({d}, w), logits = zeros({rows});
  cpu().router_forward(xt, wt, logits);
  for (int64_t i = 0; i < rows; ++i) {
    double expected = 0;
    for (int64_t c = 0; c < d; ++c)
      expected += x[i * d + c] * w[c];
    EXPECT_NEAR(values_of(logits)[i], expected, 1e-15);
  }
  Tensor g = tensor({rows}, proj), dx = zeros({2, 2, d}), dw = zeros({d});
  cpu().router_backward(g, xt, wt, dx, dw);
  expect_gradient("router dx", x, loss, values_of(dx));
  expect_gradient("router dw", w, loss, values_of(dw));
}

TEST(OpsGather, ForwardBackwardWithPadding) {
  const int64_t b = 2, s = 4, d = 3;
  const auto x = random_values(b * s * d, 8);
  Tensor xt = tensor({b, s, d}, x);
  Tensor idx = tensor({b, 2}, {1, 3, 0, -1}, ScalarType::i32);
  Tensor out = random_tensor({b, 2, d}, 9);
  cpu().gather_rows_forward(xt, idx, out);
  const auto o = values_of(out);
  for (int c = 0; c < d; ++c) {
    EXPECT_EQ(o[0 * d + c], x[(0 * s + 1) * d + c]);
    EXPECT_EQ(o[1 * d + c], x[(0 * s + 3) * d + c]);
    EXPECT_EQ(o[2 * d + c], x[(1 * s + 0) * d + c]);
    EXPECT_EQ(o[3 * d + c], 0.0);  // padding slot
  }
  // Backward is the transpose: <gather(x), g> = <x, gather^T(g)> for all x, g.
  const auto g = random_values(b * 2 * d, 10);
  Tensor gt = tensor({b, 2, d}, g), dx = zeros({b, s, d});
  cpu().gather_rows_backward(gt, idx, dx);
  EXPECT_NEAR(dot(o, g), dot(x, values_of(dx)), 1e-14);
  Tensor bad = tensor({b, 2}, {1, 4, 0, 0}, ScalarType::i32);
  expect_shape_error([&] { cpu().gather_rows_forward(xt, bad, out); }, "indices[1] = 4");
}

TEST(OpsScatter, ForwardMatchesNaiveAndGradients) {
  const int64_t b = 2, s = 5, d = 3, k = 2;
  for (RouterScale gate : {RouterScale::linear, RouterScale::sigmoid}) {
    const auto x0 = random_values(b * s * d, 11);
    auto r = random_values(b * s, 12, -2, 2);
    auto delta = random_values(b * k * d, 13);
    const std::vector<double> indices = {0, 3, 2, -1};
    Tensor idx = tensor({b, k}, indices, ScalarType::i32);
    Tensor xt = tensor({b, s, d}, x0), rt = tensor({b, s}, r), dt = tensor({b, k, d}, delta);
    cpu().scatter_add_scaled_forward(xt, idx, rt, dt, gate);
    std::vector<double> expected = x0;  // naive: only selected rows change, by g(r) delta
    for (int64_t i = 0; i < b; ++i) {
      for (int64_t j = 0; j < k; ++j) {
        const int p = static_cast<int>(indices[i * k + j]);
        if (p < 0)
          continue;
        const double rv = r[i * s + p];
        const double gv = gate == RouterScale::linear ? rv : 1.0 / (1.0 + std::exp(-rv));
        for (int64_t c = 0; c < d; ++c)
          expected[(i * s + p) * d + c] += gv * delta[(i * k + j) * d + c];
      }
    }
    EXPECT_LT(relative_error(values_of(xt), expected), 1e-15);

    const auto proj = random_values(b * s * d, 14);
    auto loss = [&] {
      Tensor x = tensor({b, s, d}, x0), rr = tensor({b, s}, r), dd = tensor({b, k, d}, delta);
      cpu().scatter_add_scaled_forward(x, idx, rr, dd, gate);
      return project(x, proj);
    };
    Tensor g = tensor({b, s, d}, proj), ddelta = zeros({b, k, d}), dr = zeros({b, s});
    cpu().scatter_add_scaled_backward(g, idx, rt, dt, gate, ddelta, dr);
    expect_gradient("scatter ddelta", delta, loss, values_of(ddelta));
    expect_gradient("scatter dr", r, loss, values_of(dr));
  }
}

TEST(OpsScatter, Bf16ResidualMatchesFp32WithinRounding) {
  const int64_t b = 1, s = 6, d = 8, k = 3;
  const auto x = random_values(b * s * d, 15), delta = random_values(b * k * d, 16);
  Tensor idx = tensor({b, k}, {0, 2, 5}, ScalarType::i32);
  Tensor r = tensor({b, s}, random_values(b * s, 17), ScalarType::fp32);
  Tensor x32 = tensor({b, s, d}, x, ScalarType::fp32),
         d32 = tensor({b, k, d}, delta, ScalarType::fp32);
  Tensor x16 = tensor({b, s, d}, x, ScalarType::bf16),
         d16 = tensor({b, k, d}, delta, ScalarType::bf16);
  cpu().scatter_add_scaled_forward(x32, idx, r, d32, RouterScale::sigmoid);
  cpu().scatter_add_scaled_forward(x16, idx, r, d16, RouterScale::sigmoid);
  const auto a = values_of(x16), ref = values_of(x32);
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_NEAR(a[i], ref[i], 3.0 / 256) << i;
  // Unselected rows pass through bf16 storage unchanged (one rounding of x).
  for (int64_t c = 0; c < d; ++c) {
    EXPECT_EQ(a[1 * d + c], bf16_to_float(float_to_bf16(static_cast<float>(x[1 * d + c]))));
  }
}

}  // namespace
}  // namespace modar::runtime::testing
