// tests/cpp/runtime/test_ops_moe.cpp: the Mixture-of-Experts ops on the CPU in
// fp64: hand-computed routes, losses and dispatch layouts; a naive triple loop
// for the grouped GEMM; central-difference gradient checks of every backward.
#include <cmath>
#include <vector>

#include "test_ops_util.hpp"

namespace modar::runtime::testing {
namespace {

std::vector<double> ints(const TensorView& t) {
  return values_of(t);
}

// ---- route --------------------------------------------------------------------

TEST(MoeOps, RouteForwardByHand) {
  // Row 0: p = [1, 2, 3] / 6; top-2 = experts 2, 1.  Row 1: logits tie at 1:
  // the lower expert first; p = [e, e, 1] / (2e + 1).
  Tensor logits = tensor({2, 3}, {0.0, std::log(2.0), std::log(3.0), 1.0, 1.0, 0.0});
  Tensor probs = zeros({2, 3}), gates = zeros({2, 2});
  Tensor indices(cpu(), {2, 2}, ScalarType::i32);
  cpu().moe_route_forward(logits, probs, indices, gates, MoeRouteParams{false});
  const double e = std::exp(1.0), z = 2.0 * e + 1.0;
  const std::vector<double> p = values_of(probs);
  const std::vector<double> want_p = {1.0 / 6, 2.0 / 6, 3.0 / 6, e / z, e / z, 1.0 / z};
  for (size_t i = 0; i < p.size(); ++i)
    EXPECT_NEAR(p[i], want_p[i], 1e-15) << i;
  EXPECT_EQ(ints(indices), (std::vector<double>{2, 1, 0, 1}));
  std::vector<double> g = values_of(gates);
  EXPECT_NEAR(g[0], 0.5, 1e-15);
  EXPECT_NEAR(g[1], 1.0 / 3, 1e-15);
  EXPECT_NEAR(g[2], e / z, 1e-15);
  // Renormalised: row 0 gates 3/5, 2/5; row 1 (two equal probabilities) 1/2, 1/2.
  cpu().moe_route_forward(logits, probs, indices, gates, MoeRouteParams{true});
  g = values_of(gates);
  EXPECT_NEAR(g[0], 0.6, 1e-15);
  EXPECT_NEAR(g[1], 0.4, 1e-15);
  EXPECT_NEAR(g[2], 0.5, 1e-15);
  EXPECT_NEAR(g[3], 0.5, 1e-15);
}

TEST(MoeOps, RouteBackwardMatchesFiniteDifferences) {
  for (const bool renormalize : {false, true}) {
    const int64_t tokens = 5, experts = 6, k = 2;
    std::vector<double> logits_host = random_values(tokens * experts, 11, -2.0, 2.0);
    const std::vector<double> w = random_values(tokens * k, 12);
    const MoeRouteParams params{renormalize};
    Tensor logits = tensor({tokens, experts}, logits_host);
    Tensor probs = zeros({tokens, experts}), gates = zeros({tokens, k});
    Tensor indices(cpu(), {tokens, k}, ScalarType::i32);
    auto loss = [&] {
      upload(cpu(), logits_host, logits);
      cpu().moe_route_forward(logits, probs, indices, gates, params);
      return project(gates, w);
    };
    loss();
    Tensor dgates = tensor({tokens, k}, w), dlogits = zeros({tokens, experts});
    cpu().moe_route_backward(dgates, probs, indices, gates, dlogits, params);
    expect_gradient(renormalize ? "route (renormalised)" : "route", logits_host, loss,
                    values_of(dlogits));
  }
}

// ---- auxiliary losses -------------------------------------------------------

TEST(MoeOps, AuxAndZLossByHand) {
  // T = 2, E = 2, top-1.  Row 0: p = [1/2, 1/2] -> expert 0 (tie to the lower);
  // row 1: p = [3/4, 1/4] -> expert 0.  f = [1, 0], P = [5/8, 3/8]:
  //   aux = E sum f_e P_e = 2 * 5/8 = 1.25;
  //   z = mean(lse^2) = (ln 2^2 + ln 4^2) / 2 = 2.5 ln^2 2.
  Tensor logits = tensor({2, 2}, {0.0, 0.0, std::log(3.0), 0.0});
  Tensor probs = zeros({2, 2}), gates = zeros({2, 1}), loss = zeros({2});
  Tensor indices(cpu(), {2, 1}, ScalarType::i32);
  cpu().moe_route_forward(logits, probs, indices, gates, MoeRouteParams{});
  EXPECT_EQ(ints(indices), (std::vector<double>{0, 0}));
  cpu().moe_aux_loss_forward(logits, probs, indices, loss);
  const std::vector<double> l = values_of(loss);
  EXPECT_NEAR(l[0], 1.25, 1e-15);
  EXPECT_NEAR(l[1], 2.5 * std::log(2.0) * std::log(2.0), 1e-15);
  // Perfectly balanced routing gives aux = 1: T = 4, E = 4, uniform logits,
  // indices 0, 1, 2, 3 given by hand.
  Tensor flat = zeros({4, 4}), flat_p = zeros({4, 4}), flat_g = zeros({4, 1});
  Tensor flat_i(cpu(), {4, 1}, ScalarType::i32);
  cpu().moe_route_forward(flat, flat_p, flat_i, flat_g, MoeRouteParams{});
  upload(cpu(), {0, 1, 2, 3}, flat_i);
  cpu().moe_aux_loss_forward(flat, flat_p, flat_i, loss);
  EXPECT_NEAR(values_of(loss)[0], 1.0, 1e-15);
}

TEST(MoeOps, AuxLossBackwardMatchesFiniteDifferences) {
  const int64_t tokens = 6, experts = 5, k = 2;
  std::vector<double> logits_host = random_values(tokens * experts, 21, -2.0, 2.0);
  Tensor logits = tensor({tokens, experts}, logits_host);
  Tensor probs = zeros({tokens, experts}), gates = zeros({tokens, k}), loss = zeros({2});
  Tensor indices(cpu(), {tokens, k}, ScalarType::i32);
  const double daux = 1.5, dz = 0.25;
  auto objective = [&] {
    upload(cpu(), logits_host, logits);
    cpu().moe_route_forward(logits, probs, indices, gates, MoeRouteParams{});
    cpu().moe_aux_loss_forward(logits, probs, indices, loss);
    const std::vector<double> l = values_of(loss);
    return daux * l[0] + dz * l[1];
  };
  objective();
  Tensor dlogits = zeros({tokens, experts});
  cpu().moe_aux_loss_backward(daux, dz, logits, probs, indices, dlogits);
  expect_gradient("aux + z loss", logits_host, objective, values_of(dlogits));
}

// ---- dispatch -----------------------------------------------------------------

// T = 4, top-2, real experts 0 and 1, expert 2 is null.
const std::vector<double> kDispatchIndices = {0, 1, 0, 2, 0, 1, 1, 0};

TEST(MoeOps, DispatchDroplessByHand) {
  Tensor indices = tensor({4, 2}, kDispatchIndices, ScalarType::i32);
  Tensor counts(cpu(), {2}, ScalarType::i32), slots(cpu(), {4, 2}, ScalarType::i32);
  cpu().moe_dispatch(indices, counts, slots, 0);
  // Expert 0: (t0, j0), (t1, j0), (t2, j0), (t3, j1) -> rows 0..3 in token order;
  // expert 1: (t0, j1), (t2, j1), (t3, j0) -> rows 4..6; (t1, j1) is null.
  EXPECT_EQ(ints(counts), (std::vector<double>{4, 3}));
  EXPECT_EQ(ints(slots), (std::vector<double>{0, 4, 1, -1, 2, 5, 6, 3}));
}

TEST(MoeOps, DispatchCapacityDropsByHand) {
  Tensor indices = tensor({4, 2}, kDispatchIndices, ScalarType::i32);
  Tensor counts(cpu(), {2}, ScalarType::i32), slots(cpu(), {4, 2}, ScalarType::i32);
  // Capacity 2: first choices in token order: t0 -> 0, t1 -> 0 (expert 0 full),
  // t2 -> 0 DROPPED, t3 -> 1; second choices: t0 -> 1 (expert 1 full), t1 null,
  // t2 -> 1 DROPPED, t3 -> 0 DROPPED.  3 of the 7 real assignments drop.
  cpu().moe_dispatch(indices, counts, slots, 2);
  EXPECT_EQ(ints(counts), (std::vector<double>{2, 2}));
  EXPECT_EQ(ints(slots), (std::vector<double>{0, 2, 1, -1, -1, -1, 3, -1}));
  // A capacity >= the busiest expert's load (4) drops nothing: the dropless layout.
  for (const int64_t capacity : {4, 5, 100}) {
    cpu().moe_dispatch(indices, counts, slots, capacity);
    EXPECT_EQ(ints(counts), (std::vector<double>{4, 3})) << capacity;
    EXPECT_EQ(ints(slots), (std::vector<double>{0, 4, 1, -1, 2, 5, 6, 3})) << capacity;
  }
}

// ---- permute / combine ----------------------------------------------------------

TEST(MoeOps, PermuteAndCombineByHand) {
  Tensor indices = tensor({4, 2}, kDispatchIndices, ScalarType::i32);
  Tensor counts(cpu(), {2}, ScalarType::i32), slots(cpu(), {4, 2}, ScalarType::i32);
  cpu().moe_dispatch(indices, counts, slots, 0);
  // x rows t = [t + 1, 10 (t + 1)].
  Tensor x = tensor({4, 2}, {1, 10, 2, 20, 3, 30, 4, 40});
  Tensor rows = zeros({7, 2});
  cpu().moe_permute_forward(x, slots, rows);
  EXPECT_EQ(values_of(rows), (std::vector<double>{1, 10, 2, 20, 3, 30, 4, 40,  // expert 0
                                                  1, 10, 3, 30, 4, 40}));      // expert 1
  // Combine: y = 2 x at every row; out[t] = sum_j g_j y[slot_j].
  Tensor y = tensor({7, 2}, {2, 20, 4, 40, 6, 60, 8, 80, 2, 20, 6, 60, 8, 80});
  Tensor gates = tensor({4, 2}, {0.5, 0.25, 1.0, 3.0, 0.5, 0.5, 0.75, 0.125});
  Tensor out = zeros({4, 2});
  cpu().moe_unpermute_forward(y, slots, gates, out);
  // t0: 0.5 * 2 + 0.25 * 2 = 1.5 (x 1); t1: 1.0 * 4 (null skipped); t2: (0.5 + 0.5) * 6;
  // t3: 0.75 * 8 + 0.125 * 8 = 7.
  EXPECT_EQ(values_of(out), (std::vector<double>{1.5, 15, 4, 40, 6, 60, 7, 70}));
}

TEST(MoeOps, PermuteAndCombineBackwardsMatchFiniteDifferences) {
  const int64_t tokens = 6, k = 2, d = 3, experts = 3;
  // Random expert choices over 3 real + 1 null expert, capacity 3 (some drops).
  const std::vector<double> choice = {0, 1, 2, 3, 1, 0, 0, 2, 2, 1, 1, 2};
  Tensor indices = tensor({tokens, k}, choice, ScalarType::i32);
  Tensor counts(cpu(), {experts}, ScalarType::i32), slots(cpu(), {tokens, k}, ScalarType::i32);
  cpu().moe_dispatch(indices, counts, slots, 3);
  const int64_t rows = tokens * k;
  // permute: L = <w, P x>.
  std::vector<double> x_host = random_values(tokens * d, 31);
  const std::vector<double> w_rows = random_values(rows * d, 32);
  Tensor x = tensor({tokens, d}, x_host), permuted = zeros({rows, d});
  auto permute_loss = [&] {
    upload(cpu(), x_host, x);
    cpu().moe_permute_forward(x, slots, permuted);
    return project(permuted, w_rows);
  };
  Tensor dx = zeros({tokens, d});
  cpu().moe_permute_backward(tensor({rows, d}, w_rows), slots, dx);
  expect_gradient("permute x", x_host, permute_loss, values_of(dx));
  // combine: L = <w, U(y, g)>.
  std::vector<double> y_host = random_values(rows * d, 33);
  std::vector<double> g_host = random_values(tokens * k, 34);
  const std::vector<double> w_out = random_values(tokens * d, 35);
  Tensor y = tensor({rows, d}, y_host), gates = tensor({tokens, k}, g_host),
         out = zeros({tokens, d});
  auto combine_loss = [&] {
    upload(cpu(), y_host, y);
    upload(cpu(), g_host, gates);
    cpu().moe_unpermute_forward(y, slots, gates, out);
    return project(out, w_out);
  };
  Tensor dy = zeros({rows, d}), dgates = zeros({tokens, k});
  cpu().moe_unpermute_backward(tensor({tokens, d}, w_out), y, slots, gates, dy, dgates);
  expect_gradient("combine y", y_host, combine_loss, values_of(dy));
  expect_gradient("combine gates", g_host, combine_loss, values_of(dgates));
}

// ---- grouped GEMM -----------------------------------------------------------------

// Naive c_e = a_e op(b_e) per expert, rows grouped by counts.
std::vector<double> naive_grouped(const std::vector<double>& a, const std::vector<double>& b,
                                  bool transpose_b, const std::vector<int>& counts, int64_t k,
                                  int64_t n) {
  int64_t total = 0;
  for (int c : counts)
    total += c;
  std::vector<double> c(static_cast<size_t>(total * n), 0.0);
  int64_t row = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    for (int r = 0; r < counts[e]; ++r, ++row) {
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0.0;
        for (int64_t i = 0; i < k; ++i) {
          const double bv = transpose_b ? b[(e * n + j) * k + i] : b[(e * k + i) * n + j];
          sum += a[row * k + i] * bv;
        }
        c[row * n + j] = sum;
      }
    }
  }
  return c;
}

TEST(MoeOps, GroupedGemmMatchesANaiveLoop) {
  const int64_t k = 4, n = 3, experts = 3;
  const std::vector<int> group = {2, 0, 3};  // expert 1 receives no row
  const int64_t rows = 5;
  const std::vector<double> a = random_values(rows * k, 41);
  const std::vector<double> b = random_values(experts * k * n, 42);
  Tensor counts = tensor({experts}, {2, 0, 3}, ScalarType::i32);
  for (const bool transpose_b : {false, true}) {
    Tensor b_t = transpose_b ? tensor({experts, n, k}, b) : tensor({experts, k, n}, b);
    Tensor c = zeros({rows, n});
    cpu().grouped_gemm(tensor({rows, k}, a), false, b_t, transpose_b, c, counts);
    const std::vector<double> want = naive_grouped(a, b, transpose_b, group, k, n);
    const std::vector<double> got = values_of(c);
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(got[i], want[i], 1e-14) << i << (transpose_b ? " (b transposed)" : "");
  }
  // Weight-gradient form: c_e = 2 a_e^T g_e + c_e; expert 1 (no rows) keeps c.
  const std::vector<double> g = random_values(rows * n, 43);
  Tensor dw = tensor({experts, k, n}, std::vector<double>(experts * k * n, 1.0));
  cpu().grouped_gemm(tensor({rows, k}, a), true, tensor({rows, n}, g), false, dw, counts, 2.0,
                     1.0);
  const std::vector<double> got = values_of(dw);
  int64_t row0 = 0;
  for (int64_t e = 0; e < experts; ++e) {
    for (int64_t i = 0; i < k; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0.0;
        for (int r = 0; r < group[static_cast<size_t>(e)]; ++r)
          sum += a[(row0 + r) * k + i] * g[(row0 + r) * n + j];
        EXPECT_NEAR(got[(e * k + i) * n + j], 1.0 + 2.0 * sum, 1e-14);
      }
    }
    row0 += group[static_cast<size_t>(e)];
  }
}

TEST(MoeOps, GroupedGemmBackwardFormsMatchFiniteDifferences) {
  // L = <w, A op(B)> per expert; dA = dC B^T (grouped, transpose_b), dB = A^T dC.
  const int64_t k = 4, n = 3, experts = 3, rows = 6;
  Tensor counts = tensor({experts}, {1, 3, 2}, ScalarType::i32);
  std::vector<double> a_host = random_values(rows * k, 51);
  std::vector<double> b_host = random_values(experts * k * n, 52);
  const std::vector<double> w = random_values(rows * n, 53);
  Tensor a = tensor({rows, k}, a_host), b = tensor({experts, k, n}, b_host), c = zeros({rows, n});
  auto loss = [&] {
    upload(cpu(), a_host, a);
    upload(cpu(), b_host, b);
    cpu().grouped_gemm(a, false, b, false, c, counts);
    return project(c, w);
  };
  Tensor dc = tensor({rows, n}, w), da = zeros({rows, k}), db = zeros({experts, k, n});
  cpu().grouped_gemm(dc, false, b, true, da, counts);
  cpu().grouped_gemm(a, true, dc, false, db, counts, 1.0, 1.0);
  expect_gradient("grouped gemm a", a_host, loss, values_of(da));
  expect_gradient("grouped gemm b", b_host, loss, values_of(db));
}

// ---- argument errors ---------------------------------------------------------------

TEST(MoeOps, BadArgumentsNameTheArgument) {
  Tensor a = zeros({4, 3}), b = zeros({2, 3, 5}), c = zeros({4, 5});
  Tensor too_many = tensor({2}, {3, 2}, ScalarType::i32);
  expect_shape_error([&] { cpu().grouped_gemm(a, false, b, false, c, too_many); },
                     "counts sum to 5 rows; a has 4");
  Tensor wrong_b = zeros({2, 4, 5});
  Tensor counts = tensor({2}, {1, 1}, ScalarType::i32);
  expect_shape_error([&] { cpu().grouped_gemm(a, false, wrong_b, false, c, counts); },
                     "grouped_gemm: inner dimensions differ");
  Tensor slots = tensor({4, 1}, {0, 1, 9, -1}, ScalarType::i32);
  Tensor rows = zeros({3, 3});
  expect_shape_error([&] { cpu().moe_permute_forward(a, slots, rows); }, "moe_permute_forward");
  Tensor indices = tensor({2, 1}, {0, -2}, ScalarType::i32);
  Tensor dispatch_counts(cpu(), {2}, ScalarType::i32), dispatch_slots(cpu(), {2, 1}, ScalarType::i32);
  expect_shape_error([&] { cpu().moe_dispatch(indices, dispatch_counts, dispatch_slots, 0); },
                     "moe_dispatch");
  expect_shape_error(
      [&] { cpu().moe_dispatch(tensor({2, 1}, {0, 1}, ScalarType::i32), dispatch_counts,
                               dispatch_slots, -1); },
      "capacity = -1");
}

}  // namespace
}  // namespace modar::runtime::testing
