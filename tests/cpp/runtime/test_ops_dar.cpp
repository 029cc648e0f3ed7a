// DAR coefficient head, read mix, transport and gated write: forwards derived
// by hand / from the definitions, backwards by finite differences.
#include "test_ops_util.hpp"

namespace modar::runtime::testing {
namespace {

double sigmoid_of(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

struct Coefficients {
  int64_t n, tokens, d;
  bool transport;
  int64_t outputs() const { return 2 * n + (transport ? (n == 2 ? 1 : n * n) : 0); }
};

struct CoefficientRun {
  Tensor alpha, beta, transport, z_rstd;
};

CoefficientRun run_coefficients(const Coefficients& c, const std::vector<double>& retrieved,
                                const std::vector<double>& weight, const std::vector<double>& bias,
                                const std::vector<double>& scale, int iterations = 20) {
  Tensor r = tensor({c.n, c.tokens, c.d}, retrieved);
  Tensor w = tensor({c.n * c.d, c.outputs()}, weight), b = tensor({c.outputs()}, bias);
  Tensor s = tensor({3}, scale);
  CoefficientRun run{zeros({c.tokens, c.n}), zeros({c.tokens, c.n}),
                     c.transport ? zeros({c.tokens, c.n, c.n}) : Tensor{}, zeros({c.tokens})};
  DarCoefficientParams params;
  params.sinkhorn_iterations = iterations;
  cpu().dar_coefficients_forward(r, w, b, s, run.alpha, run.beta, run.transport, run.z_rstd,
                                 params);
  return run;
}

TEST(OpsDarCoefficients, TwoStreamForwardFromDefinitions) {
  const Coefficients c{2, 3, 4, true};
  const auto retrieved = random_values(c.n * c.tokens * c.d, 1);
  const auto weight = random_values(c.n * c.d * c.outputs(), 2);
  const auto bias = random_values(c.outputs(), 3);
  const std::vector<double> scale = {0.5, 1.5, 2.0};
  CoefficientRun run = run_coefficients(c, retrieved, weight, bias, scale);
  const auto alpha = values_of(run.alpha), beta = values_of(run.beta);
  const auto m = values_of(run.transport);
  for (int64_t t = 0; t < c.tokens; ++t) {
    // z = RMSNorm of the concatenation [R_0[t]; R_1[t]] (unweighted).
    std::vector<double> z;
    for (int64_t j = 0; j < c.n; ++j) {
      for (int64_t e = 0; e < c.d; ++e)
        z.push_back(retrieved[(j * c.tokens + t) * c.d + e]);
    }
    double ss = 0;
    for (double v : z)
      ss += v * v;
    const double rstd = 1.0 / std::sqrt(ss / static_cast<double>(z.size()) + 1e-6);
    EXPECT_NEAR(values_of(run.z_rstd)[t], rstd, 1e-14);
    std::vector<double> pre(static_cast<size_t>(c.outputs()));
    for (int64_t o = 0; o < c.outputs(); ++o) {
      double u = 0;
      for (size_t i = 0; i < z.size(); ++i)
        u += z[i] * rstd * weight[i * c.outputs() + o];
      const double group_scale = o < 2 ? scale[0] : (o < 4 ? scale[1] : scale[2]);
      pre[o] = group_scale * u + bias[o];
    }
    for (int64_t j = 0; j < 2; ++j) {
      EXPECT_NEAR(alpha[t * 2 + j], sigmoid_of(pre[j]), 1e-14);
      EXPECT_NEAR(beta[t * 2 + j], 2.0 * sigmoid_of(pre[2 + j]), 1e-14);
    }
    const double rho = sigmoid_of(pre[4]);
    EXPECT_NEAR(m[t * 4 + 0], rho, 1e-14);
    EXPECT_NEAR(m[t * 4 + 1], 1 - rho, 1e-14);
    EXPECT_NEAR(m[t * 4 + 2], 1 - rho, 1e-14);
    EXPECT_NEAR(m[t * 4 + 3], rho, 1e-14);
  }
}

TEST(OpsDarCoefficients, SinkhornTransportIsDoublyStochastic) {
  const Coefficients c{3, 4, 3, true};
  CoefficientRun run = run_coefficients(c, random_values(c.n * c.tokens * c.d, 4),
                                        random_values(c.n * c.d * c.outputs(), 5),
                                        random_values(c.outputs(), 6), {1, 1, 1});
  const auto m = values_of(run.transport);
  for (int64_t t = 0; t < c.tokens; ++t) {
    for (int64_t i = 0; i < 3; ++i) {
      double row_sum = 0, col_sum = 0;
      for (int64_t j = 0; j < 3; ++j) {
        row_sum += m[t * 9 + i * 3 + j];
        col_sum += m[t * 9 + j * 3 + i];
        EXPECT_GT(m[t * 9 + i * 3 + j], 0.0);
      }
      EXPECT_NEAR(col_sum, 1.0, 1e-14);  // the last normalisation is over columns
      EXPECT_NEAR(row_sum, 1.0, 1e-6);   // converged after 20 rounds
    }
  }
}

void check_coefficient_gradients(const Coefficients& c, uint32_t seed) {
  auto retrieved = random_values(c.n * c.tokens * c.d, seed);
  auto weight = random_values(c.n * c.d * c.outputs(), seed + 1);
  auto bias = random_values(c.outputs(), seed + 2);
  auto scale = random_values(3, seed + 3, 0.5, 1.5);
  const auto wa = random_values(c.tokens * c.n, seed + 4);
  const auto wb = random_values(c.tokens * c.n, seed + 5);
  const auto wm = random_values(c.tokens * c.n * c.n, seed + 6);
  const int iterations = 5;
  auto loss = [&] {
    CoefficientRun run = run_coefficients(c, retrieved, weight, bias, scale, iterations);
    double l = project(run.alpha, wa) + project(run.beta, wb);
    if (c.transport)
      l += project(run.transport, wm);
    return l;
  };
  CoefficientRun run = run_coefficients(c, retrieved, weight, bias, scale, iterations);
  Tensor r = tensor({c.n, c.tokens, c.d}, retrieved);
  Tensor w = tensor({c.n * c.d, c.outputs()}, weight), b = tensor({c.outputs()}, bias);
  Tensor s = tensor({3}, scale);
  Tensor da = tensor({c.tokens, c.n}, wa), db = tensor({c.tokens, c.n}, wb);
  Tensor dm = c.transport ? tensor({c.tokens, c.n, c.n}, wm) : Tensor{};
  Tensor dr = zeros({c.n, c.tokens, c.d}), dw = zeros({c.n * c.d, c.outputs()});
  Tensor dbias = zeros({c.outputs()}), dscale = zeros({3});
  DarCoefficientParams params;
  params.sinkhorn_iterations = iterations;
  cpu().dar_coefficients_backward(da, db, dm, r, w, b, s, run.alpha, run.beta, run.transport,
                                  run.z_rstd, dr, dw, dbias, dscale, params);
  const std::string tag = "n=" + std::to_string(c.n) + (c.transport ? " transport" : "");
  expect_gradient("coefficients dretrieved " + tag, retrieved, loss, values_of(dr));
  expect_gradient("coefficients dweight " + tag, weight, loss, values_of(dw));
  expect_gradient("coefficients dbias " + tag, bias, loss, values_of(dbias));
  expect_gradient("coefficients dscale " + tag, scale, loss, values_of(dscale));
}

TEST(OpsDarCoefficients, GradientsMatchFiniteDifferences) {
  check_coefficient_gradients({2, 3, 4, true}, 10);
  check_coefficient_gradients({2, 2, 3, false}, 20);
  check_coefficient_gradients({3, 2, 3, true}, 30);  // through the unrolled Sinkhorn
}

TEST(OpsDarCoefficients, ShapeErrors) {
  Tensor r = zeros({1, 2, 4}), w = zeros({4, 2}), b = zeros({2}), s = zeros({3});
  Tensor a = zeros({2, 1}), bt = zeros({2, 1}), z = zeros({2});
  expect_shape_error(
      [&] {
        cpu().dar_coefficients_forward(r, w, b, s, a, bt, TensorView{}, z, DarCoefficientParams{});
      },
      "needs n >= 2 streams");
  Tensor r2 = zeros({2, 2, 4}), w_bad = zeros({8, 4}), b5 = zeros({5}), a2 = zeros({2, 2}),
         bt2 = zeros({2, 2}), m = zeros({2, 2, 2});
  expect_shape_error(
      [&] {
        cpu().dar_coefficients_forward(r2, w_bad, b5, s, a2, bt2, m, z, DarCoefficientParams{});
      },
      "weight is [8, 4] fp64 cpu; expected [8, 5]");
}

TEST(OpsDarMix, HandCaseAndGradients) {
  // h = 0.25 R_0 + 0.75 R_1.
  Tensor r = tensor({2, 1, 2}, {4, 8, 0, -4}), a = tensor({1, 2}, {0.25, 0.75});
  Tensor h = zeros({1, 2});
  cpu().dar_mix_forward(r, a, h);
  EXPECT_EQ(values_of(h), (std::vector<double>{1, -1}));

  const int64_t n = 3, tokens = 2, d = 4;
  auto retrieved = random_values(n * tokens * d, 40);
  auto alpha = random_values(tokens * n, 41, 0, 1);
  const auto w = random_values(tokens * d, 42);
  auto loss = [&] {
    Tensor rt = tensor({n, tokens, d}, retrieved), at = tensor({tokens, n}, alpha);
    Tensor out = zeros({tokens, d});
    cpu().dar_mix_forward(rt, at, out);
    return project(out, w);
  };
  Tensor rt = tensor({n, tokens, d}, retrieved), at = tensor({tokens, n}, alpha);
  Tensor dout = tensor({tokens, d}, w), dr = zeros({n, tokens, d}), da = zeros({tokens, n});
  cpu().dar_mix_backward(dout, rt, at, dr, da);
  expect_gradient("mix dretrieved", retrieved, loss, values_of(dr));
  expect_gradient("mix dalpha", alpha, loss, values_of(da));
}

TEST(OpsDarWrite, ForwardFromDefinitionAndSpecialCases) {
  // n = 2, one token, d = 2: P = [[1, 2], [3, 4]], rho = 0.75, beta = [0.5, 1.5], y = [10, 20].
  Tensor m = tensor({1, 2, 2}, {0.75, 0.25, 0.25, 0.75});
  Tensor p = tensor({2, 1, 2}, {1, 2, 3, 4}), beta = tensor({1, 2}, {0.5, 1.5});
  Tensor y = tensor({1, 2}, {10, 20}), out = zeros({2, 1, 2});
  cpu().dar_write_forward(m, p, beta, y, out);
  // stream 0: 0.75 [1,2] + 0.25 [3,4] + 0.5 [10,20] = [6.5, 12.5]
  // stream 1: 0.25 [1,2] + 0.75 [3,4] + 1.5 [10,20] = [17.5, 33.5]
  EXPECT_EQ(values_of(out), (std::vector<double>{6.5, 12.5, 17.5, 33.5}));
  // First branch of a block: P^1 = beta (x) y.
  cpu().dar_write_forward(TensorView{}, TensorView{}, beta, y, out);
  EXPECT_EQ(values_of(out), (std::vector<double>{5, 10, 15, 30}));
  // rho = 1: M is the identity, the pure transport leaves P unchanged.
  Tensor identity = tensor({1, 2, 2}, {1, 0, 0, 1});
  cpu().dar_transport_forward(identity, p, out);
  EXPECT_EQ(values_of(out), values_of(p));
  expect_shape_error([&] { cpu().dar_transport_forward(identity, p, p); },
                     "out must not alias partial");
  expect_shape_error([&] { cpu().dar_write_forward(m, TensorView{}, beta, y, out); },
                     "must be given together");
}

TEST(OpsDarWrite, GradientsMatchFiniteDifferences) {
  const int64_t n = 2, tokens = 3, d = 4;
  auto transport = random_values(tokens * n * n, 50, 0, 1);
  auto partial = random_values(n * tokens * d, 51);
  auto beta = random_values(tokens * n, 52, 0, 2);
  auto y = random_values(tokens * d, 53);
  const auto w = random_values(n * tokens * d, 54);
  auto loss = [&] {
    Tensor m = tensor({tokens, n, n}, transport), p = tensor({n, tokens, d}, partial);
    Tensor bt = tensor({tokens, n}, beta), yt = tensor({tokens, d}, y), out = zeros({n, tokens, d});
    cpu().dar_write_forward(m, p, bt, yt, out);
    return project(out, w);
  };
  Tensor m = tensor({tokens, n, n}, transport), p = tensor({n, tokens, d}, partial);
  Tensor bt = tensor({tokens, n}, beta), yt = tensor({tokens, d}, y);
  Tensor dout = tensor({n, tokens, d}, w), dm = zeros({tokens, n, n}), dp = zeros({n, tokens, d});
  Tensor dbeta = zeros({tokens, n}), dy = zeros({tokens, d});
  cpu().dar_write_backward(dout, m, p, bt, yt, dm, dp, dbeta, dy);
  expect_gradient("write dtransport", transport, loss, values_of(dm));
  expect_gradient("write dpartial", partial, loss, values_of(dp));
  expect_gradient("write dbeta", beta, loss, values_of(dbeta));
  expect_gradient("write dy", y, loss, values_of(dy));
}

TEST(OpsDarWrite, FirstBranchWriteGradients) {
  // P^1 = beta (x) y (no transport term): gradients for beta and y only.
  const int64_t n = 2, tokens = 2, d = 3;
  auto beta = random_values(tokens * n, 55, 0, 2);
  auto y = random_values(tokens * d, 56);
  const auto w = random_values(n * tokens * d, 57);
  auto loss = [&] {
    Tensor bt = tensor({tokens, n}, beta), yt = tensor({tokens, d}, y), out = zeros({n, tokens, d});
    cpu().dar_write_forward(TensorView{}, TensorView{}, bt, yt, out);
    return project(out, w);
  };
  Tensor bt = tensor({tokens, n}, beta), yt = tensor({tokens, d}, y);
  Tensor dout = tensor({n, tokens, d}, w), dbeta = zeros({tokens, n}), dy = zeros({tokens, d});
  cpu().dar_write_backward(dout, TensorView{}, TensorView{}, bt, yt, TensorView{}, TensorView{},
                           dbeta, dy);
  expect_gradient("first write dbeta", beta, loss, values_of(dbeta));
  expect_gradient("first write dy", y, loss, values_of(dy));
}

TEST(OpsDarWrite, RhoGradientThroughCoefficientsAndTransport) {
  // d loss / d c_rho through M(rho) = [[rho, 1-rho], [1-rho, rho]]: the
  // transport backward gives dM, the coefficient head maps it to the bias of
  // c_rho.  Checked against finite differences of the composed forward.
  const Coefficients c{2, 2, 3, true};
  const auto retrieved = random_values(c.n * c.tokens * c.d, 60);
  const auto weight = random_values(c.n * c.d * c.outputs(), 61);
  auto bias = random_values(c.outputs(), 62);
  const auto partial = random_values(c.n * c.tokens * c.d, 63);
  const auto w = random_values(c.n * c.tokens * c.d, 64);
  auto loss = [&] {
    CoefficientRun run = run_coefficients(c, retrieved, weight, bias, {1, 1, 1});
    Tensor p = tensor({c.n, c.tokens, c.d}, partial), out = zeros({c.n, c.tokens, c.d});
    cpu().dar_transport_forward(run.transport, p, out);
    return project(out, w);
  };
  CoefficientRun run = run_coefficients(c, retrieved, weight, bias, {1, 1, 1});
  Tensor p = tensor({c.n, c.tokens, c.d}, partial), dout = tensor({c.n, c.tokens, c.d}, w);
  Tensor dm = zeros({c.tokens, c.n, c.n});
  cpu().dar_transport_backward(dout, run.transport, p, dm, TensorView{});
  Tensor r = tensor({c.n, c.tokens, c.d}, retrieved);
  Tensor wt = tensor({c.n * c.d, c.outputs()}, weight), bt = tensor({c.outputs()}, bias);
  Tensor s = tensor({3}, {1, 1, 1}), zero_ab = zeros({c.tokens, c.n}), dbias = zeros({c.outputs()});
  cpu().dar_coefficients_backward(zero_ab, zero_ab, dm, r, wt, bt, s, run.alpha, run.beta,
                                  run.transport, run.z_rstd, TensorView{}, TensorView{}, dbias,
                                  TensorView{}, DarCoefficientParams{});
  const auto db = values_of(dbias);
  for (int o = 0; o < 4; ++o)
    EXPECT_EQ(db[o], 0.0);  // alpha / beta untouched
  std::vector<double> rho_bias = {bias[4]};
  auto rho_loss = [&] {
    const double saved = bias[4];
    bias[4] = rho_bias[0];
    const double l = loss();
    bias[4] = saved;
    return l;
  };
  expect_gradient("dc_rho via transport", rho_bias, rho_loss, {db[4]});
}

}  // namespace
}  // namespace modar::runtime::testing
