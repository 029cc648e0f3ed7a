// AttnRes / DAR depth residual: the two-phase schedule (prefix read once per
// block + closed-form merge of the partial, bank of block-local states) equals
// a naive host implementation that takes a plain softmax over ALL sources
// (completed entries + the partial) for every branch, written here from
// docs/model.md / docs/dar_math.md 3.2 and 4 alone.  Branches are host functions
// y = tanh(c_l (.) h), so the whole schedule is exercised, blocks, partials,
// coefficient heads, transport, gated writes and the output read included.
#include "test_layers_common.hpp"

namespace modar::runtime::layer_tests {
namespace {

constexpr double kNormEps = 1e-6;
using Matrix = std::vector<std::vector<double>>;  // [T][d]

double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

struct NaiveDepth {
  int64_t n, d, tokens, branches, per_block;
  StreamRoles roles;
  std::vector<double> folded;  // q' [n][branches + 1][d]
  // coefficient heads per branch (+ output): W [n d][outputs], bias, scale
  std::vector<std::vector<double>> weight, bias, scale;

  std::vector<double> query(int64_t j, int64_t l) const {
    const auto begin = folded.begin() + (j * (branches + 1) + l) * d;
    return std::vector<double>(begin, begin + d);
  }

  // softmax_r(q . k^_r) over the given key rows, applied to the value rows.
  static std::vector<double> read(const std::vector<const std::vector<double>*>& keys,
                                  const std::vector<const std::vector<double>*>& values,
                                  const std::vector<double>& q) {
    const size_t d = q.size();
    std::vector<double> scores;
    for (const auto* k : keys) {
      double ss = 0.0, qk = 0.0;
      for (size_t c = 0; c < d; ++c) {
        ss += (*k)[c] * (*k)[c];
        qk += q[c] * (*k)[c];
      }
      scores.push_back(qk / std::sqrt(ss / static_cast<double>(d) + kNormEps));
    }
    const double top = *std::max_element(scores.begin(), scores.end());
    double z = 0.0;
    for (double s : scores)
      z += std::exp(s - top);
    std::vector<double> out(d, 0.0);
    for (size_t r = 0; r < scores.size(); ++r) {
      const double a = std::exp(scores[r] - top) / z;
      for (size_t c = 0; c < d; ++c)
        out[c] += a * (*values[r])[c];
    }
    return out;
  }

  struct Coefficients {
    std::vector<double> alpha, beta;
    Matrix transport;  // n x n
  };
  Coefficients coefficients(int64_t l, const std::vector<std::vector<double>>& retrieved,
                            bool with_transport) const {
    std::vector<double> z;
    for (const auto& r : retrieved)
      z.insert(z.end(), r.begin(), r.end());
    double ss = 0.0;
    for (double v : z)
      ss += v * v;
    const double rstd = 1.0 / std::sqrt(ss / static_cast<double>(z.size()) + kNormEps);
    const auto& W = weight[static_cast<size_t>(l)];
    const auto& b = bias[static_cast<size_t>(l)];
    const auto& g = scale[static_cast<size_t>(l)];
    const size_t outputs = b.size();
    std::vector<double> c(outputs);
    for (size_t o = 0; o < outputs; ++o) {
      double acc = 0.0;
      for (size_t i = 0; i < z.size(); ++i)
        acc += z[i] * rstd * W[i * outputs + o];
      const size_t group =
          o < static_cast<size_t>(n) ? 0 : (o < static_cast<size_t>(2 * n) ? 1 : 2);
      c[o] = g[group] * acc + b[o];
    }
    Coefficients k;
    for (int64_t j = 0; j < n; ++j) {
      k.alpha.push_back(sigmoid(c[static_cast<size_t>(j)]));
      k.beta.push_back(2.0 * sigmoid(c[static_cast<size_t>(n + j)]));
    }
    if (with_transport) {
      k.transport.assign(static_cast<size_t>(n), std::vector<double>(static_cast<size_t>(n)));
      if (n == 2) {
        const double rho = sigmoid(c[4]);
        k.transport = {{rho, 1.0 - rho}, {1.0 - rho, rho}};
      } else {
        for (int64_t a = 0; a < n; ++a)
          for (int64_t b2 = 0; b2 < n; ++b2)
            k.transport[a][b2] = std::exp(c[static_cast<size_t>(2 * n + a * n + b2)]);
        for (int it = 0; it < 20; ++it) {
          for (auto& rowv : k.transport) {
            double s = 0.0;
            for (double v : rowv)
              s += v;
            for (double& v : rowv)
              v /= s;
          }
          for (int64_t b2 = 0; b2 < n; ++b2) {
            double s = 0.0;
            for (int64_t a = 0; a < n; ++a)
              s += k.transport[a][b2];
            for (int64_t a = 0; a < n; ++a)
              k.transport[a][b2] /= s;
          }
        }
      }
    }
    return k;
  }
};

struct DepthCase {
  const char* name;
  DarVariant variant;
  int64_t streams;
  int64_t per_block;
};

class DepthTwoPhase : public ::testing::TestWithParam<DepthCase> {};

TEST_P(DepthTwoPhase, EqualsNaiveSoftmaxOverAllSources) {
  const DepthCase& dc = GetParam();
  const Context ctx = fp64_context();
  const int64_t d = 8, tokens = 5, layers = 3, branches = 2 * layers, n = dc.streams;
  DepthOptions options;
  options.variant = dc.variant;
  options.streams = n;
  options.total_branches = branches;
  options.branches_per_block = dc.per_block;
  options.norm_eps = kNormEps;
  ParameterSet params;
  Rng rng(3);
  DepthResidual depth(params, ctx, options, d, rng);
  randomize_parameters(params, 77, 0.4);

  NaiveDepth naive{n,  d,  tokens, branches, dc.per_block, StreamRoles::of(dc.variant, n),
                   {}, {}, {},     {}};
  {
    const std::vector<double> w = download(ctx.backend, params.find("depth.query")->value);
    const std::vector<double> g = download(ctx.backend, params.find("depth.key_norm")->value);
    for (size_t i = 0; i < w.size(); ++i)
      naive.folded.push_back(w[i] * g[i]);
    if (n >= 2) {
      for (int64_t l = 0; l <= branches; ++l) {
        const std::string prefix =
            l == branches ? std::string("depth.out") : "depth.branch" + std::to_string(l);
        naive.weight.push_back(download(ctx.backend, params.find(prefix + ".coef_weight")->value));
        naive.bias.push_back(download(ctx.backend, params.find(prefix + ".coef_bias")->value));
        naive.scale.push_back(download(ctx.backend, params.find(prefix + ".coef_scale")->value));
      }
    }
  }
  const std::vector<double> embedding = random_values(tokens * d, 5);
  std::vector<std::vector<double>> branch_scale;
  for (int64_t l = 0; l < branches; ++l)
    branch_scale.push_back(random_values(d, 100 + l, 1.5));
  auto branch = [&](int64_t l, const std::vector<double>& h) {  // y = tanh(c_l (.) h) per token
    std::vector<double> y(h.size());
    for (size_t i = 0; i < h.size(); ++i)
      y[i] = std::tanh(branch_scale[l][i % d] * h[i]);
    return y;
  };

  // ---- the engine ----
  std::vector<std::vector<double>> engine_inputs;
  depth.set_saving(false);
  Buffer emb = host_tensor(ctx, {tokens, d}, embedding);
  depth.begin(ctx, emb, tokens);
  for (int64_t l = 0; l < branches; ++l) {
    engine_inputs.push_back(download(ctx.backend, depth.read(ctx, l)));
    Buffer y = host_tensor(ctx, {tokens, d}, branch(l, engine_inputs.back()));
    depth.write(ctx, l, y);
  }
  const std::vector<double> engine_out = download(ctx.backend, depth.read_output(ctx));

  // ---- naive, per token ----
  // Read l (a branch's input, or the output at l = branches) of one token:
  // every stream j's read over the bank's entries (and the open block's
  // partial sum, if any) with query (j, l), mixed as h = sum_j alpha_j R_j
  // (n = 1: the one read, AttnRes).
  struct NaiveRead {
    std::vector<double> h;
    NaiveDepth::Coefficients coef;  // n >= 2
  };
  auto read_and_mix = [&](const std::vector<Matrix>& bank, const Matrix* partial, int64_t l) {
    std::vector<std::vector<double>> retrieved;
    for (int64_t j = 0; j < n; ++j) {
      std::vector<const std::vector<double>*> keys, values;
      for (const auto& entry : bank) {
        keys.push_back(&entry[naive.roles.key_stream[j]]);
        values.push_back(&entry[naive.roles.value_stream[j]]);
      }
      if (partial != nullptr) {
        keys.push_back(&(*partial)[naive.roles.key_stream[j]]);
        values.push_back(&(*partial)[naive.roles.value_stream[j]]);
      }
      retrieved.push_back(NaiveDepth::read(keys, values, naive.query(j, l)));
    }
    NaiveRead out{std::vector<double>(static_cast<size_t>(d), 0.0), {}};
    if (n == 1) {
      out.h = retrieved[0];
      return out;
    }
    out.coef = naive.coefficients(l, retrieved, partial != nullptr);
    for (int64_t j = 0; j < n; ++j)
      for (int64_t c = 0; c < d; ++c)
        out.h[c] += out.coef.alpha[j] * retrieved[j][c];
    return out;
  };
  for (int64_t t = 0; t < tokens; ++t) {
    const std::vector<double> e(embedding.begin() + t * d, embedding.begin() + (t + 1) * d);
    std::vector<Matrix> bank = {Matrix(static_cast<size_t>(n), e)};  // bank[r][j] = d-vector
    Matrix partial;
    for (int64_t l = 0; l < branches; ++l) {
      const int64_t i = l % dc.per_block;
      const int64_t block_len = std::min<int64_t>(dc.per_block, branches - (l - i));
      const NaiveRead read = read_and_mix(bank, i > 0 ? &partial : nullptr, l);
      const std::vector<double>& h = read.h;
      const NaiveDepth::Coefficients& coef = read.coef;
      for (int64_t c = 0; c < d; ++c) {
        EXPECT_NEAR(engine_inputs[l][t * d + c], h[c], 1e-12)
            << "branch " << l << " token " << t << " feature " << c;
      }
      const std::vector<double> y = branch(l, h);  // per-feature, so token-local
      Matrix next(static_cast<size_t>(n), std::vector<double>(static_cast<size_t>(d), 0.0));
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t c = 0; c < d; ++c) {
          if (n == 1) {
            next[j][c] = (i > 0 ? partial[0][c] : 0.0) + y[c];
          } else {
            double v = coef.beta[j] * y[c];
            if (i > 0) {
              for (int64_t k = 0; k < n; ++k)
                v += coef.transport[j][k] * partial[k][c];
            }
            next[j][c] = v;
          }
        }
      }
      partial = next;
      if (i == block_len - 1)
        bank.push_back(partial);
    }
    // output read
    const std::vector<double> h = read_and_mix(bank, nullptr, branches).h;
    for (int64_t c = 0; c < d; ++c) {
      EXPECT_NEAR(engine_out[t * d + c], h[c], 1e-12) << "output token " << t;
    }
    EXPECT_EQ(static_cast<int64_t>(bank.size()), depth.entries());
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, DepthTwoPhase,
                         ::testing::Values(DepthCase{"attnres_block4", DarVariant::attnres, 1, 4},
                                           DepthCase{"attnres_full", DarVariant::attnres, 1, 1},
                                           DepthCase{"dar_block4", DarVariant::dar, 2, 4},
                                           DepthCase{"dar_full", DarVariant::dar, 2, 2},
                                           DepthCase{"selfkv", DarVariant::selfkv, 2, 4},
                                           DepthCase{"fixedkv", DarVariant::fixedkv, 2, 4},
                                           DepthCase{"crossv", DarVariant::crossv, 2, 4},
                                           DepthCase{"dar_n3", DarVariant::dar, 3, 4}),
                         [](const ::testing::TestParamInfo<DepthCase>& info) {
                           return std::string(info.param.name);
                         });

TEST(StreamRoles, MatchSpecTable) {
  const StreamRoles dar = StreamRoles::of(DarVariant::dar, 2);
  EXPECT_EQ(dar.key_stream, (std::vector<int>{1, 0}));
  EXPECT_EQ(dar.value_stream, (std::vector<int>{0, 1}));
  const StreamRoles dar3 = StreamRoles::of(DarVariant::dar, 3);
  EXPECT_EQ(dar3.key_stream, (std::vector<int>{1, 2, 0}));
  const StreamRoles fixed = StreamRoles::of(DarVariant::fixedkv, 2);
  EXPECT_EQ(fixed.key_stream, (std::vector<int>{0, 0}));
  EXPECT_EQ(fixed.value_stream, (std::vector<int>{1, 1}));
  const StreamRoles cross = StreamRoles::of(DarVariant::crossv, 2);
  EXPECT_EQ(cross.key_stream, (std::vector<int>{0, 1}));
  EXPECT_EQ(cross.value_stream, (std::vector<int>{1, 0}));
  const StreamRoles attnres = StreamRoles::of(DarVariant::attnres, 1);
  EXPECT_EQ(attnres.key_stream, (std::vector<int>{0}));
  EXPECT_EQ(attnres.value_stream, (std::vector<int>{0}));
}

// At initialisation the queries are zero: every read is a uniform average of
// its sources (docs/dar_math.md 6.5), e.g. branch 1 of block 0 reads (emb + y_0) / 2.
TEST(DepthResidual, ZeroQueriesGiveUniformDepthWeights) {
  const Context ctx = fp64_context();
  DepthOptions options;
  options.total_branches = 4;
  options.branches_per_block = 4;
  ParameterSet params;
  Rng rng(1);
  DepthResidual depth(params, ctx, options, 4, rng);
  const std::vector<double> emb = random_values(8, 2), y0 = random_values(8, 3);
  Buffer e = host_tensor(ctx, {2, 4}, emb);
  depth.begin(ctx, e, 2);
  const std::vector<double> h0 = download(ctx.backend, depth.read(ctx, 0));
  EXPECT_EQ(h0, emb);
  Buffer y = host_tensor(ctx, {2, 4}, y0);
  depth.write(ctx, 0, y);
  const std::vector<double> h1 = download(ctx.backend, depth.read(ctx, 1));
  for (size_t i = 0; i < h1.size(); ++i)
    EXPECT_NEAR(h1[i], 0.5 * (emb[i] + y0[i]), 1e-14);
}

}  // namespace
}  // namespace modar::runtime::layer_tests
