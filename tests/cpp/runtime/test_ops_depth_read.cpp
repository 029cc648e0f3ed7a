// Depth reads (AttnRes / DAR): prefix read vs a naive softmax over sources,
// the two-phase form (prefix + closed-form merge) vs a one-shot softmax that
// includes the partial, and finite-difference gradients (docs/dar_math.md 5.1, 5.2).
#include "test_ops_util.hpp"

namespace modar::runtime::testing {
namespace {

constexpr double kEps = 1e-6;

// rstd of each row of a [rows, d] host array, computed here from the definition.
std::vector<double> host_rstd(const std::vector<double>& x, int64_t rows, int64_t d) {
  std::vector<double> r(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) {
    double ss = 0;
    for (int64_t c = 0; c < d; ++c)
      ss += x[i * d + c] * x[i * d + c];
    r[i] = 1.0 / std::sqrt(ss / d + kEps);
  }
  return r;
}

// One-shot softmax read of one query over explicit (key, value) rows.
void naive_read(const std::vector<std::vector<double>>& keys,
                const std::vector<std::vector<double>>& values, const std::vector<double>& q,
                std::vector<double>& out, double& lse) {
  const size_t d = q.size();
  std::vector<double> s;
  for (const auto& k : keys) {
    double ss = 0, qk = 0;
    for (size_t c = 0; c < d; ++c)
      ss += k[c] * k[c], qk += q[c] * k[c];
    s.push_back(qk / std::sqrt(ss / static_cast<double>(d) + kEps));
  }
  double z = 0;
  for (double v : s)
    z += std::exp(v);
  lse = std::log(z);
  out.assign(d, 0.0);
  for (size_t r = 0; r < keys.size(); ++r) {
    for (size_t c = 0; c < d; ++c)
      out[c] += std::exp(s[r]) / z * values[r][c];
  }
}

std::vector<double> row(const std::vector<double>& x, int64_t index, int64_t d) {
  return std::vector<double>(x.begin() + index * d, x.begin() + (index + 1) * d);
}

struct PrefixRun {
  Tensor out, lse;
};

PrefixRun run_prefix(const std::vector<double>& keys, const std::vector<double>& values,
                     const std::vector<double>& queries, int64_t sources, int64_t tokens, int64_t d,
                     int64_t query_count) {
  Tensor kt = tensor({sources, tokens, d}, keys), vt = tensor({sources, tokens, d}, values);
  Tensor rstd = tensor({sources, tokens}, host_rstd(keys, sources * tokens, d));
  Tensor qt = tensor({query_count, d}, queries);
  PrefixRun run{zeros({query_count, tokens, d}), zeros({query_count, tokens})};
  cpu().depth_read_prefix_forward(kt, rstd, vt, qt, run.out, run.lse);
  return run;
}

TEST(OpsDepthRead, PrefixMatchesNaiveSoftmaxOverSources) {
  const int64_t sources = 4, tokens = 3, d = 8, qn = 2;
  const auto keys = random_values(sources * tokens * d, 1, -2, 2);
  const auto values = random_values(sources * tokens * d, 2);
  const auto queries = random_values(qn * d, 3);
  PrefixRun run = run_prefix(keys, values, queries, sources, tokens, d, qn);
  const auto out = values_of(run.out), lse = values_of(run.lse);
  for (int64_t q = 0; q < qn; ++q) {
    for (int64_t t = 0; t < tokens; ++t) {
      std::vector<std::vector<double>> ks, vs;
      for (int64_t r = 0; r < sources; ++r) {
        ks.push_back(row(keys, r * tokens + t, d));
        vs.push_back(row(values, r * tokens + t, d));
      }
      std::vector<double> ref;
      double ref_lse;
      naive_read(ks, vs, row(queries, q, d), ref, ref_lse);
      EXPECT_LT(relative_error(row(out, q * tokens + t, d), ref), 1e-14);
      EXPECT_NEAR(lse[q * tokens + t], ref_lse, 1e-13);
    }
  }
}

TEST(OpsDepthRead, ZeroQueriesGiveUniformWeights) {
  // docs/dar_math.md 6.5: zero-initialised queries read the plain mean of the sources.
  const int64_t sources = 3, tokens = 2, d = 4;
  const auto keys = random_values(sources * tokens * d, 4);
  const auto values = random_values(sources * tokens * d, 5);
  PrefixRun run = run_prefix(keys, values, std::vector<double>(d, 0.0), sources, tokens, d, 1);
  const auto out = values_of(run.out);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t c = 0; c < d; ++c) {
      double mean = 0;
      for (int64_t r = 0; r < sources; ++r)
        mean += values[(r * tokens + t) * d + c] / sources;
      EXPECT_NEAR(out[t * d + c], mean, 1e-15);
    }
    EXPECT_NEAR(values_of(run.lse)[t], std::log(3.0), 1e-15);
  }
}

// Two-phase: prefix over the bank, then the merge of the partial P.
struct TwoPhase {
  std::vector<double> keys, values, queries, partial_keys, partial_values;
  int64_t sources, tokens, d;
};

std::vector<double> two_phase_forward(const TwoPhase& in, Tensor* out_keep = nullptr) {
  const int64_t t = in.tokens, d = in.d;
  PrefixRun run = run_prefix(in.keys, in.values, in.queries, in.sources, t, d, 1);
  Tensor pk = tensor({t, d}, in.partial_keys), pv = tensor({t, d}, in.partial_values);
  Tensor prstd = tensor({t}, host_rstd(in.partial_keys, t, d));
  Tensor q = tensor({d}, in.queries), h = zeros({t, d}), p = zeros({t});
  cpu().depth_read_merge_forward(select(run.out, 0), select(run.lse, 0), pk, prstd, pv, q, h, p);
  if (out_keep)
    *out_keep = std::move(h);
  return out_keep ? values_of(*out_keep) : values_of(h);
}

TEST(OpsDepthRead, TwoPhaseEqualsOneShotSoftmaxIncludingPartial) {
  TwoPhase in{random_values(3 * 4 * 8, 6, -2, 2),
              random_values(3 * 4 * 8, 7),
              random_values(8, 8, -1.5, 1.5),
              random_values(4 * 8, 9, -2, 2),
              random_values(4 * 8, 10),
              3,
              4,
              8};
  const auto h = two_phase_forward(in);
  for (int64_t t = 0; t < in.tokens; ++t) {
    std::vector<std::vector<double>> ks, vs;
    for (int64_t r = 0; r < in.sources; ++r) {
      ks.push_back(row(in.keys, r * in.tokens + t, in.d));
      vs.push_back(row(in.values, r * in.tokens + t, in.d));
    }
    ks.push_back(row(in.partial_keys, t, in.d));
    vs.push_back(row(in.partial_values, t, in.d));
    std::vector<double> ref;
    double ref_lse;
    naive_read(ks, vs, in.queries, ref, ref_lse);
    EXPECT_LT(relative_error(row(h, t, in.d), ref), 1e-14);
  }
}

TEST(OpsDepthRead, PrefixGradientsMatchFiniteDifferences) {
  const int64_t sources = 3, tokens = 2, d = 5, qn = 2;
  for (bool shared_bank : {false, true}) {  // shared: keys and values are one tensor (SelfKV)
    auto keys = random_values(sources * tokens * d, 11, -2, 2);
    auto values = shared_bank ? keys : random_values(sources * tokens * d, 12);
    auto queries = random_values(qn * d, 13);
    const auto w = random_values(qn * tokens * d, 14);
    const auto u = random_values(qn * tokens, 15);
    auto loss = [&] {
      PrefixRun run =
          run_prefix(keys, shared_bank ? keys : values, queries, sources, tokens, d, qn);
      return project(run.out, w) + project(run.lse, u);
    };
    const std::vector<int64_t> bank_shape{sources, tokens, d};
    Tensor kt = tensor(bank_shape, keys), vt = tensor(bank_shape, values);
    Tensor rstd = tensor({sources, tokens}, host_rstd(keys, sources * tokens, d));
    Tensor qt = tensor({qn, d}, queries);
    PrefixRun run = run_prefix(keys, values, queries, sources, tokens, d, qn);
    Tensor dout = tensor({qn, tokens, d}, w), dlse = tensor({qn, tokens}, u);
    Tensor dk = zeros(bank_shape), dv = zeros(bank_shape), dq = zeros({qn, d});
    const TensorView bank_values = shared_bank ? kt.view() : vt.view();
    const TensorView dvalues = shared_bank ? dk.view() : dv.view();
    cpu().depth_read_prefix_backward(dout, dlse, kt, rstd, bank_values, qt, run.out, run.lse, dk,
                                     dvalues, dq);
    expect_gradient(shared_bank ? "prefix dbank (shared)" : "prefix dkeys", keys, loss,
                    values_of(dk));
    if (!shared_bank)
      expect_gradient("prefix dvalues", values, loss, values_of(dv));
    expect_gradient("prefix dqueries", queries, loss, values_of(dq));
  }
}

TEST(OpsDepthRead, MergeGradientsMatchFiniteDifferences) {
  const int64_t tokens = 3, d = 6;
  auto prefix_out = random_values(tokens * d, 16);
  auto prefix_lse = random_values(tokens, 17, 0.0, 2.0);
  auto pk = random_values(tokens * d, 18, -2, 2);
  auto pv = random_values(tokens * d, 19);
  auto q = random_values(d, 20);
  const auto w = random_values(tokens * d, 21);
  auto forward = [&](Tensor& h, Tensor& p) {
    Tensor o = tensor({tokens, d}, prefix_out), lse = tensor({tokens}, prefix_lse);
    Tensor kt = tensor({tokens, d}, pk), vt = tensor({tokens, d}, pv), qt = tensor({d}, q);
    Tensor rstd = tensor({tokens}, host_rstd(pk, tokens, d));
    cpu().depth_read_merge_forward(o, lse, kt, rstd, vt, qt, h, p);
  };
  auto loss = [&] {
    Tensor h = zeros({tokens, d}), p = zeros({tokens});
    forward(h, p);
    return project(h, w);
  };
  Tensor h = zeros({tokens, d}), p = zeros({tokens});
  forward(h, p);
  Tensor o = tensor({tokens, d}, prefix_out), kt = tensor({tokens, d}, pk);
  Tensor vt = tensor({tokens, d}, pv), qt = tensor({d}, q);
  Tensor rstd = tensor({tokens}, host_rstd(pk, tokens, d)), dh = tensor({tokens, d}, w);
  Tensor d_o = zeros({tokens, d}), d_lse = zeros({tokens}), d_k = zeros({tokens, d}),
         d_v = zeros({tokens, d}), d_q = zeros({d});
  cpu().depth_read_merge_backward(dh, o, kt, rstd, vt, qt, p, d_o, d_lse, d_k, d_v, d_q);
  expect_gradient("merge dprefix_out", prefix_out, loss, values_of(d_o));
  expect_gradient("merge dprefix_lse", prefix_lse, loss, values_of(d_lse));
  expect_gradient("merge dpartial_keys", pk, loss, values_of(d_k));
  expect_gradient("merge dpartial_values", pv, loss, values_of(d_v));
  expect_gradient("merge dquery", q, loss, values_of(d_q));
}

TEST(OpsDepthRead, ChainedTwoPhaseBackwardMatchesFiniteDifferences) {
  // Merge backward feeds dlse into the prefix backward; the total gradient must
  // equal that of the one-shot softmax (checked here by finite differences of
  // the two-phase forward, which equals the one-shot read).
  TwoPhase in{random_values(2 * 3 * 4, 22, -2, 2),
              random_values(2 * 3 * 4, 23),
              random_values(4, 24),
              random_values(3 * 4, 25, -2, 2),
              random_values(3 * 4, 26),
              2,
              3,
              4};
  const int64_t s = in.sources, t = in.tokens, d = in.d;
  const auto w = random_values(t * d, 27);
  auto loss = [&] { return dot(two_phase_forward(in), w); };
  Tensor kt = tensor({s, t, d}, in.keys), vt = tensor({s, t, d}, in.values);
  Tensor rstd = tensor({s, t}, host_rstd(in.keys, s * t, d)), qt = tensor({1, d}, in.queries);
  PrefixRun run = run_prefix(in.keys, in.values, in.queries, s, t, d, 1);
  Tensor pk = tensor({t, d}, in.partial_keys), pv = tensor({t, d}, in.partial_values);
  Tensor prstd = tensor({t}, host_rstd(in.partial_keys, t, d)), q = tensor({d}, in.queries);
  Tensor h = zeros({t, d}), p = zeros({t});
  cpu().depth_read_merge_forward(select(run.out, 0), select(run.lse, 0), pk, prstd, pv, q, h, p);
  Tensor dh = tensor({t, d}, w), d_o = zeros({1, t, d}), d_lse = zeros({1, t});
  Tensor d_pk = zeros({t, d}), d_pv = zeros({t, d}), dq = zeros({1, d});
  cpu().depth_read_merge_backward(dh, select(run.out, 0), pk, prstd, pv, q, p, select(d_o, 0),
                                  select(d_lse, 0), d_pk, d_pv, select(dq, 0));
  Tensor dk = zeros({s, t, d}), dv = zeros({s, t, d});
  cpu().depth_read_prefix_backward(d_o, d_lse, kt, rstd, vt, qt, run.out, run.lse, dk, dv, dq);
  expect_gradient("two-phase dkeys", in.keys, loss, values_of(dk));
  expect_gradient("two-phase dvalues", in.values, loss, values_of(dv));
  expect_gradient("two-phase dpartial_keys", in.partial_keys, loss, values_of(d_pk));
  expect_gradient("two-phase dpartial_values", in.partial_values, loss, values_of(d_pv));
  expect_gradient("two-phase dquery", in.queries, loss, values_of(dq));
}

TEST(OpsDepthRead, ShapeErrors) {
  Tensor keys = zeros({3, 4, 8}), values = zeros({3, 4, 8}), rstd = zeros({3, 4});
  Tensor queries = zeros({2, 8}), out = zeros({2, 4, 8}), lse = zeros({2, 4});
  Tensor wrong_rstd = zeros({4, 3});
  expect_shape_error(
      [&] { cpu().depth_read_prefix_forward(keys, wrong_rstd, values, queries, out, lse); },
      "key_rstd is [4, 3] fp64 cpu; expected [3, 4]");
  Tensor q32 = zeros({2, 8}, ScalarType::fp32);
  expect_shape_error([&] { cpu().depth_read_prefix_forward(keys, rstd, values, q32, out, lse); },
                     "expected dtype fp64");
}

}  // namespace
}  // namespace modar::runtime::testing
