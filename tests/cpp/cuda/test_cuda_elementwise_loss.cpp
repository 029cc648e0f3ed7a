// Elementwise ops (GELU, SwiGLU, add, axpy, scale, mul), cross-entropy with
// ignored rows, BCE with logits, embedding and AdamW: CUDA vs CPU with the
// FlashAttention rule.
#include "cuda_test_util.hpp"

namespace modar::runtime::cuda_testing {
namespace {

TEST(CudaElementwise, ActivationsAndArithmeticMatchCpu) {
  MODAR_REQUIRE_CUDA();
  const int64_t rows = 13, f = 257, n = rows * f;
  const auto a = random_values(n, 1, -4.0, 4.0);
  const auto b = random_values(n, 2, -4.0, 4.0);
  const auto g = random_values(n, 3);
  for (const Precision p : {Precision::fp32, Precision::bf16}) {
    const std::vector<int64_t> shape = {rows, f};
    using V = std::vector<TensorView>;
    expect_matches_cpu("gelu", p, {data("x", shape, a), out_data("out", shape)},
                       [](Backend& be, const V& v) { be.gelu_forward(v[0], v[1]); });
    expect_matches_cpu(
        "gelu backward", p,
        {data("dout", shape, g), data("x", shape, a), grad_data("dx", shape, random_values(n, 4))},
        [](Backend& be, const V& v) { be.gelu_backward(v[0], v[1], v[2]); });
    expect_matches_cpu("swiglu", p,
                       {data("gate", shape, a), data("up", shape, b), out_data("out", shape)},
                       [](Backend& be, const V& v) { be.swiglu_forward(v[0], v[1], v[2]); });
    expect_matches_cpu(
        "swiglu backward", p,
        {data("dout", shape, g), data("gate", shape, a), data("up", shape, b),
         grad_data("dgate", shape, random_values(n, 5)),
         grad_data("dup", shape, random_values(n, 6))},
        [](Backend& be, const V& v) { be.swiglu_backward(v[0], v[1], v[2], v[3], v[4]); });
    expect_matches_cpu("add", p, {data("a", shape, a), data("b", shape, b), out_data("out", shape)},
                       [](Backend& be, const V& v) { be.add(v[0], v[1], v[2]); });
    expect_matches_cpu("axpy", p, {data("x", shape, a), grad_data("y", shape, b)},
                       [](Backend& be, const V& v) { be.axpy(-0.75, v[0], v[1]); });
    expect_matches_cpu("axpy into fp32", p, {data("x", shape, a), grad_stat("y", shape, b)},
                       [](Backend& be, const V& v) { be.axpy(1.25, v[0], v[1]); });
    expect_matches_cpu("scale", p, {grad_data("x", shape, a)},
                       [](Backend& be, const V& v) { be.scale(v[0], 0.3); });
    expect_matches_cpu("mul", p, {data("a", shape, a), data("b", shape, b), out_data("out", shape)},
                       [](Backend& be, const V& v) { be.mul_forward(v[0], v[1], v[2]); });
    expect_matches_cpu(
        "mul backward", p,
        {data("dout", shape, g), data("a", shape, a), data("b", shape, b),
         grad_data("da", shape, random_values(n, 7)), grad_data("db", shape, random_values(n, 8))},
        [](Backend& be, const V& v) { be.mul_backward(v[0], v[1], v[2], v[3], v[4]); });
  }
}

TEST(CudaLoss, CrossEntropyWithIgnoredRowsMatchesCpu) {
  MODAR_REQUIRE_CUDA();
  const int64_t rows = 19;
  for (const int64_t vocab : {int64_t{10}, int64_t{5003}}) {
    std::vector<double> targets;
    for (int64_t i = 0; i < rows; ++i) {
      targets.push_back(i % 5 == 3 ? -1.0 : static_cast<double>((i * 7919) % vocab));
    }
    const auto logits = random_values(rows * vocab, 3, -6.0, 6.0);
    for (const Precision p : {Precision::fp32, Precision::bf16}) {
      const std::string label = "cross_entropy V=" + std::to_string(vocab);
      expect_matches_cpu(label, p,
                         {data("logits", {rows, vocab}, logits), index("targets", {rows}, targets),
                          out_stat("loss", {1}), out_stat("lse", {rows})},
                         [](Backend& be, const std::vector<TensorView>& v) {
                           be.cross_entropy_forward(v[0], v[1], v[2], v[3]);
                         });
      // lse consistent with the logits (fp64 on the host).
      const ScalarType lowp = p == Precision::fp32 ? ScalarType::fp32 : ScalarType::bf16;
      std::vector<double> lse(static_cast<size_t>(rows));
      for (int64_t i = 0; i < rows; ++i) {
        double m = -1e300, sum = 0.0;
        for (int64_t v = 0; v < vocab; ++v)
          m = std::max(m, round_to(logits[static_cast<size_t>(i * vocab + v)], lowp));
        for (int64_t v = 0; v < vocab; ++v)
          sum += std::exp(round_to(logits[static_cast<size_t>(i * vocab + v)], lowp) - m);
        lse[static_cast<size_t>(i)] = m + std::log(sum);
      }
      expect_matches_cpu(label + " backward", p,
                         {data("logits", {rows, vocab}, logits), index("targets", {rows}, targets),
                          stat("lse", {rows}, lse),
                          grad_data("dlogits", {rows, vocab}, random_values(rows * vocab, 4))},
                         [](Backend& be, const std::vector<TensorView>& v) {
                           be.cross_entropy_backward(0.7, v[0], v[1], v[2], v[3]);
                         });
    }
  }
}

TEST(CudaLoss, BceWithLogitsMatchesCpu) {
  MODAR_REQUIRE_CUDA();
  const int64_t rows = 3000;
  const auto logits = random_values(rows, 1, -30.0, 30.0);  // saturated sigmoids too
  std::vector<double> targets = random_values(rows, 2, 0.0, 1.0);
  for (size_t i = 0; i < targets.size(); i += 2)
    targets[i] = targets[i] > 0.5 ? 1.0 : 0.0;
  expect_matches_cpu(
      "bce forward", Precision::fp32,
      {stat("logits", {rows}, logits), stat("targets", {rows}, targets), out_stat("loss", {1})},
      [](Backend& be, const std::vector<TensorView>& v) {
        be.bce_with_logits_forward(v[0], v[1], v[2]);
      });
  expect_matches_cpu("bce backward", Precision::fp32,
                     {stat("logits", {rows}, logits), stat("targets", {rows}, targets),
                      grad_stat("dlogits", {rows}, random_values(rows, 3))},
                     [](Backend& be, const std::vector<TensorView>& v) {
                       be.bce_with_logits_backward(1.5, v[0], v[1], v[2]);
                     });
}

TEST(CudaEmbedding, LookupAndScatterMatchCpu) {
  MODAR_REQUIRE_CUDA();
  const int64_t vocab = 50, d = 72, b = 4, s = 9;
  std::vector<double> tokens;
  for (int64_t i = 0; i < b * s; ++i)
    tokens.push_back(static_cast<double>((i * 13) % 17));  // repeats
  for (const Precision p : {Precision::fp32, Precision::bf16}) {
    expect_matches_cpu("embedding", p,
                       {data("table", {vocab, d}, random_values(vocab * d, 1)),
                        index("tokens", {b, s}, tokens), out_data("out", {b, s, d})},
                       [](Backend& be, const std::vector<TensorView>& v) {
                         be.embedding_forward(v[0], v[1], v[2]);
                       });
    expect_matches_cpu(
        "embedding backward", p,
        {data("dout", {b, s, d}, random_values(b * s * d, 2)), index("tokens", {b, s}, tokens),
         grad_data("dtable", {vocab, d}, random_values(vocab * d, 3))},
        [](Backend& be, const std::vector<TensorView>& v) {
          be.embedding_backward(v[0], v[1], v[2]);
        });
  }
}

TEST(CudaAdamW, UpdateMatchesCpu) {
  MODAR_REQUIRE_CUDA();
  const int64_t n = 5000;
  AdamWParams hyper;
  hyper.learning_rate = 1e-3;
  hyper.weight_decay = 0.1;
  hyper.step = 7;
  hyper.grad_scale = 0.5;
  for (const Precision p : {Precision::fp32, Precision::bf16}) {
    // params / m / v are fp32 master state ("stats" role); grads and the
    // low-precision copy in the tested precision.
    expect_matches_cpu(
        "adamw", p,
        {grad_stat("params", {n}, random_values(n, 1)),
         data("grads", {n}, random_values(n, 2, -0.1, 0.1)),
         grad_stat("m", {n}, random_values(n, 3, -0.01, 0.01)),
         grad_stat("v", {n}, random_values(n, 4, 0.0, 1e-4)), out_data("params_lowp", {n})},
        [&](Backend& be, const std::vector<TensorView>& v) {
          be.adamw_update(v[0], v[1], v[2], v[3], hyper, v[4]);
        });
  }
}

}  // namespace
}  // namespace modar::runtime::cuda_testing
