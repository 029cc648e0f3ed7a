// GEMM: C = alpha op(A) op(B) + beta C against naive triple loops.
#include "test_ops_util.hpp"

namespace modar::runtime::testing {
namespace {

// Naive reference; a is stored [a_rows, a_cols] row-major (op applied here).
std::vector<double> naive_gemm(const std::vector<double>& a, int64_t a_rows, int64_t a_cols,
                               bool ta, const std::vector<double>& b, int64_t b_rows,
                               int64_t b_cols, bool tb, const std::vector<double>& c0, double alpha,
                               double beta) {
  const int64_t m = ta ? a_cols : a_rows, k = ta ? a_rows : a_cols, n = tb ? b_rows : b_cols;
  std::vector<double> c(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double av = ta ? a[p * a_cols + i] : a[i * a_cols + p];
        const double bv = tb ? b[j * b_cols + p] : b[p * b_cols + j];
        sum += av * bv;
      }
      c[i * n + j] = alpha * sum + beta * c0[i * n + j];
    }
  }
  return c;
}

TEST(OpsGemm, AllTransposeCombinationsMatchNaive) {
  const int64_t m = 5, n = 4, k = 3;
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      const auto a = random_values(m * k, 10 + ta);
      const auto b = random_values(k * n, 20 + tb);
      const auto c0 = random_values(m * n, 30);
      Tensor at = tensor(ta ? std::vector<int64_t>{k, m} : std::vector<int64_t>{m, k}, a);
      Tensor bt = tensor(tb ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n}, b);
      Tensor ct = tensor({m, n}, c0);
      cpu().gemm(at, ta, bt, tb, ct, 0.5, -2.0);
      const auto expected =
          naive_gemm(a, ta ? k : m, ta ? m : k, ta, b, tb ? n : k, tb ? k : n, tb, c0, 0.5, -2.0);
      EXPECT_LT(relative_error(values_of(ct), expected), 1e-14) << "ta=" << ta << " tb=" << tb;
    }
  }
}

TEST(OpsGemm, BetaZeroIgnoresGarbageInC) {
  Tensor a = tensor({2, 2}, {1, 2, 3, 4});
  Tensor b = tensor({2, 2}, {5, 6, 7, 8});
  Tensor c = tensor({2, 2}, {std::nan(""), 1e300, -1e300, std::nan("")});
  cpu().gemm(a, false, b, false, c);
  EXPECT_EQ(values_of(c), (std::vector<double>{19, 22, 43, 50}));  // by hand
}

TEST(OpsGemm, FlattensLeadingDimsAndBatches) {
  // x [2, 3, 4] times W [4, 5] -> [2, 3, 5] is one [6, 4] x [4, 5] GEMM.
  const auto x = random_values(24, 1), w = random_values(20, 2);
  Tensor xt = tensor({2, 3, 4}, x), wt = tensor({4, 5}, w), yt = zeros({2, 3, 5});
  cpu().gemm(xt, false, wt, false, yt);
  EXPECT_LT(relative_error(values_of(yt), naive_gemm(x, 6, 4, false, w, 4, 5, false,
                                                     std::vector<double>(30, 0.0), 1.0, 0.0)),
            1e-14);
  // Weight gradient dW = x^T dy over the flattened rows.
  const auto dy = random_values(30, 3);
  Tensor dyt = tensor({2, 3, 5}, dy), dwt = zeros({4, 5});
  cpu().gemm(xt, true, dyt, false, dwt);
  EXPECT_LT(relative_error(values_of(dwt), naive_gemm(x, 6, 4, true, dy, 6, 5, false,
                                                      std::vector<double>(20, 0.0), 1.0, 0.0)),
            1e-14);
  // Batched: all rank 3.
  const auto bb = random_values(2 * 4 * 2, 4);
  Tensor bt = tensor({2, 4, 2}, bb), ct = zeros({2, 3, 2});
  cpu().gemm(xt, false, bt, false, ct);
  const auto c = values_of(ct);
  for (int batch = 0; batch < 2; ++batch) {
    const std::vector<double> a_part(x.begin() + batch * 12, x.begin() + (batch + 1) * 12);
    const std::vector<double> b_part(bb.begin() + batch * 8, bb.begin() + (batch + 1) * 8);
    const auto expected =
        naive_gemm(a_part, 3, 4, false, b_part, 4, 2, false, std::vector<double>(6, 0.0), 1.0, 0.0);
    const std::vector<double> got(c.begin() + batch * 6, c.begin() + (batch + 1) * 6);
    EXPECT_LT(relative_error(got, expected), 1e-14);
  }
}

TEST(OpsGemm, Bf16AndFp32WithinTheirPrecision) {
  const int64_t m = 16, n = 24, k = 64;
  const auto a = random_values(m * k, 5), b = random_values(k * n, 6);
  const auto exact =
      naive_gemm(a, m, k, false, b, k, n, false, std::vector<double>(m * n, 0.0), 1.0, 0.0);
  Tensor a32 = tensor({m, k}, a, ScalarType::fp32), b32 = tensor({k, n}, b, ScalarType::fp32);
  Tensor c32 = zeros({m, n}, ScalarType::fp32);
  cpu().gemm(a32, false, b32, false, c32);
  EXPECT_LT(relative_error(values_of(c32), exact), 1e-5);
  // bf16 inputs: compare with the exact product of the ROUNDED inputs (8-bit
  // mantissa), so only the fp32 accumulation and the final rounding remain.
  std::vector<double> a_r(a.size()), b_r(b.size());
  for (size_t i = 0; i < a.size(); ++i)
    a_r[i] = bf16_to_float(float_to_bf16(static_cast<float>(a[i])));
  for (size_t i = 0; i < b.size(); ++i)
    b_r[i] = bf16_to_float(float_to_bf16(static_cast<float>(b[i])));
  const auto exact_rounded =
      naive_gemm(a_r, m, k, false, b_r, k, n, false, std::vector<double>(m * n, 0.0), 1.0, 0.0);
  Tensor a16 = tensor({m, k}, a, ScalarType::bf16), b16 = tensor({k, n}, b, ScalarType::bf16);
  Tensor c16 = zeros({m, n}, ScalarType::bf16), c_f32 = zeros({m, n}, ScalarType::fp32);
  cpu().gemm(a16, false, b16, false, c16);
  cpu().gemm(a16, false, b16, false, c_f32);  // bf16 in, fp32 out
  EXPECT_LT(relative_error(values_of(c_f32), exact_rounded), 1e-5);
  EXPECT_LT(relative_error(values_of(c16), exact_rounded), 1.0 / 128);
}

TEST(OpsGemm, GradientFormulasMatchFiniteDifferences) {
  // The GEMM backward is two GEMMs: dA = dC B^T, dB = A^T dC.
  const int64_t m = 3, n = 4, k = 5;
  auto a = random_values(m * k, 7);
  auto b = random_values(k * n, 8);
  const auto w = random_values(m * n, 9);
  auto loss = [&] {
    Tensor at = tensor({m, k}, a), bt = tensor({k, n}, b), ct = zeros({m, n});
    cpu().gemm(at, false, bt, false, ct);
    return project(ct, w);
  };
  Tensor at = tensor({m, k}, a), bt = tensor({k, n}, b), dct = tensor({m, n}, w);
  Tensor da = zeros({m, k}), db = zeros({k, n});
  cpu().gemm(dct, false, bt, true, da);
  cpu().gemm(at, true, dct, false, db);
  expect_gradient("A", a, loss, values_of(da));
  expect_gradient("B", b, loss, values_of(db));
}

TEST(OpsGemm, ShapeErrorsSpellOutTheMismatch) {
  Tensor a = zeros({3, 4}), b = zeros({5, 6}), c = zeros({3, 6});
  expect_shape_error([&] { cpu().gemm(a, false, b, false, c); }, "inner dimensions differ");
  Tensor b2 = zeros({4, 6}), c_bad = zeros({3, 7});
  expect_shape_error([&] { cpu().gemm(a, false, b2, false, c_bad); }, "c is [3, 7]");
  Tensor b32 = zeros({4, 6}, ScalarType::fp32);
  expect_shape_error([&] { cpu().gemm(a, false, b32, false, c); }, "must share a dtype");
  expect_shape_error([&] { cpu().gemm(TensorView{}, false, b2, false, c); }, "a is missing");
}

}  // namespace
}  // namespace modar::runtime::testing
