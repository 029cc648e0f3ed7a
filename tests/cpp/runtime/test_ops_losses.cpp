// Cross-entropy, BCE with logits, embedding, AdamW.
#include "test_ops_util.hpp"

namespace modar::runtime::testing {
namespace {

TEST(OpsCrossEntropy, HandValuesIgnoreIndexAndGradient) {
  // Uniform logits over V = 4: loss = log 4 for every counted row.
  Tensor logits = tensor({3, 4}, std::vector<double>(12, 0.7));
  Tensor targets = tensor({3}, {2, -1, 0}, ScalarType::i32);
  Tensor loss = zeros({1}), lse = zeros({3});
  cpu().cross_entropy_forward(logits, targets, loss, lse);
  EXPECT_NEAR(values_of(loss)[0], std::log(4.0), 1e-15);
  EXPECT_NEAR(values_of(lse)[0], 0.7 + std::log(4.0), 1e-15);
  // Two classes, logits [0, log 3]: p(target = 1) = 3/4, loss = -log(3/4).
  Tensor two = tensor({1, 2}, {0, std::log(3.0)}), t1 = tensor({1}, {1}, ScalarType::i32);
  Tensor lse1 = zeros({1});
  cpu().cross_entropy_forward(two, t1, loss, lse1);
  EXPECT_NEAR(values_of(loss)[0], -std::log(0.75), 1e-15);

  const int64_t rows = 4, vocab = 5;
  auto x = random_values(rows * vocab, 1, -2, 2);
  Tensor tg = tensor({2, 2}, {3, 0, -1, 4}, ScalarType::i32);
  auto loss_fn = [&] {
    Tensor xt = tensor({2, 2, vocab}, x), l = zeros({1}), s = zeros({rows});
    cpu().cross_entropy_forward(xt, tg, l, s);
    return 2.5 * values_of(l)[0];
  };
  Tensor xt = tensor({2, 2, vocab}, x), l = zeros({1}), s = zeros({rows});
  cpu().cross_entropy_forward(xt, tg, l, s);
  Tensor dx = zeros({2, 2, vocab});
  cpu().cross_entropy_backward(2.5, xt, tg, s, dx);
  expect_gradient("cross_entropy dlogits", x, loss_fn, values_of(dx));
  const auto g = values_of(dx);
  for (int64_t v = 0; v < vocab; ++v)
    EXPECT_EQ(g[2 * vocab + v], 0.0);  // ignored row

  Tensor bad = tensor({2, 2}, {3, 0, 5, 4}, ScalarType::i32);
  expect_shape_error([&] { cpu().cross_entropy_forward(xt, bad, l, s); }, "targets[2] = 5");
}

TEST(OpsBce, HandValueAndGradient) {
  Tensor x = tensor({2}, {0, 0}), t = tensor({2}, {1, 0}), loss = zeros({1});
  cpu().bce_with_logits_forward(x, t, loss);
  EXPECT_NEAR(values_of(loss)[0], std::log(2.0), 1e-15);
  // Large logits stay finite: x = 40, t = 0 -> loss ~ 40 (mean over 1 row).
  Tensor big = tensor({1}, {40}), t0 = tensor({1}, {0});
  cpu().bce_with_logits_forward(big, t0, loss);
  EXPECT_NEAR(values_of(loss)[0], 40.0, 1e-12);

  auto xs = random_values(6, 2, -3, 3);
  const std::vector<double> targets = {1, 0, 1, 1, 0, 0};
  auto loss_fn = [&] {
    Tensor xt = tensor({6}, xs), tt = tensor({6}, targets), l = zeros({1});
    cpu().bce_with_logits_forward(xt, tt, l);
    return values_of(l)[0];
  };
  Tensor xt = tensor({6}, xs), tt = tensor({6}, targets), dx = zeros({6});
  cpu().bce_with_logits_backward(1.0, xt, tt, dx);
  expect_gradient("bce dlogits", xs, loss_fn, values_of(dx));
}

TEST(OpsEmbedding, LookupAndRepeatedTokenGradients) {
  const auto table = random_values(5 * 3, 3);
  Tensor tt = tensor({5, 3}, table), tokens = tensor({2, 2}, {4, 1, 4, 0}, ScalarType::i32);
  Tensor out = zeros({2, 2, 3});
  cpu().embedding_forward(tt, tokens, out);
  const auto o = values_of(out);
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(o[0 * 3 + c], table[4 * 3 + c]);
    EXPECT_EQ(o[3 * 3 + c], table[0 * 3 + c]);
  }
  Tensor g = tensor({2, 2, 3}, {1, 1, 1, 2, 2, 2, 10, 10, 10, 5, 5, 5});
  for (ScalarType dtype : {ScalarType::fp64, ScalarType::fp32, ScalarType::bf16}) {
    Tensor dtable = zeros({5, 3}, dtype);
    cpu().embedding_backward(g, tokens, dtable);
    EXPECT_EQ(values_of(dtable),
              (std::vector<double>{5, 5, 5, 2, 2, 2, 0, 0, 0, 0, 0, 0, 11, 11, 11}));
  }
  Tensor bad = tensor({1}, {5}, ScalarType::i32), out1 = zeros({1, 3});
  expect_shape_error([&] { cpu().embedding_forward(tt, bad, out1); }, "tokens[0] = 5");
}

TEST(OpsAdamw, FirstStepsMatchHandFormula) {
  // Step 1: m_hat = g, v_hat = g^2, so the update is lr * (g / (|g| + eps) + wd * p).
  const double lr = 0.1, wd = 0.01, eps = 1e-8;
  Tensor p = tensor({3}, {1.0, -2.0, 0.5}, ScalarType::fp32);
  Tensor g = tensor({3}, {0.5, -0.25, 0.0}, ScalarType::bf16);  // exact in bf16
  Tensor m = zeros({3}, ScalarType::fp32), v = zeros({3}, ScalarType::fp32);
  Tensor lowp = zeros({3}, ScalarType::bf16);
  AdamWParams hyper;
  hyper.learning_rate = lr;
  hyper.weight_decay = wd;
  hyper.epsilon = eps;
  hyper.step = 1;
  cpu().adamw_update(p, g, m, v, hyper, lowp);
  const std::vector<double> expected = {1.0 - lr * (0.5 / (0.5 + eps) + wd * 1.0),
                                        -2.0 - lr * (-0.25 / (0.25 + eps) + wd * -2.0),
                                        0.5 - lr * (0.0 + wd * 0.5)};
  const auto got = values_of(p);
  for (int i = 0; i < 3; ++i)
    EXPECT_NEAR(got[i], expected[i], 1e-6);
  EXPECT_NEAR(values_of(lowp)[0], expected[0], expected[0] / 128);
  EXPECT_NEAR(values_of(m)[0], 0.1 * 0.5, 1e-7);    // (1 - beta1) g
  EXPECT_NEAR(values_of(v)[0], 0.05 * 0.25, 1e-7);  // (1 - beta2) g^2

  // Step 2 in fp64 with the same gradient: m = (1-b1)(1+b1) g / (1-b1^2) = g -> same ratio.
  Tensor p64 = tensor({1}, {1.0}), g64 = tensor({1}, {0.5}), m64 = zeros({1}), v64 = zeros({1});
  hyper.weight_decay = 0.0;
  cpu().adamw_update(p64, g64, m64, v64, hyper, TensorView{});
  hyper.step = 2;
  cpu().adamw_update(p64, g64, m64, v64, hyper, TensorView{});
  EXPECT_NEAR(values_of(p64)[0], 1.0 - 2 * lr * 0.5 / (0.5 + eps), 1e-12);

  hyper.step = 0;
  expect_shape_error([&] { cpu().adamw_update(p64, g64, m64, v64, hyper, TensorView{}); },
                     "step = 0");
  Tensor p16 = zeros({1}, ScalarType::bf16);
  hyper.step = 1;
  expect_shape_error([&] { cpu().adamw_update(p16, g64, m64, v64, hyper, TensorView{}); },
                     "master weights must be fp32 or fp64");
}

}  // namespace
}  // namespace modar::runtime::testing
