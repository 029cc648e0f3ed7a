// MoD routing on the GPU: router logits (fwd / bwd), the exact per-sequence
// top-k (ties toward the lower position, ascending, exactly k; ragged counts
// of predictor mode), the top-k mask, gather and the scaled scatter-add.
// Top-k indices must EQUAL the CPU backend's (the contract is deterministic);
// the float ops use the FlashAttention rule.
#include <algorithm>
#include <numeric>

#include "cuda_test_util.hpp"

namespace modar::runtime::cuda_testing {
namespace {

std::vector<int32_t> topk_on(Backend& backend, const std::vector<double>& logits, int64_t b,
                             int64_t s, int64_t k_max, const std::vector<double>* counts) {
  Tensor l = make_tensor(backend, {b, s}, ScalarType::fp32, logits);
  Tensor idx = make_tensor(backend, {b, k_max}, ScalarType::i32,
                           std::vector<double>(static_cast<size_t>(b * k_max), -7.0));
  if (counts != nullptr) {
    Tensor c = make_tensor(backend, {b}, ScalarType::i32, *counts);
    backend.topk_ragged(l, c, idx);
  } else {
    backend.topk(l, idx);
  }
  const auto values = download(backend, idx);
  return std::vector<int32_t>(values.begin(), values.end());
}

// Independent statement of the contract: the first k of the order
// (logit descending, position ascending), then sorted ascending.
std::vector<int32_t> contract_topk(const std::vector<double>& logits, int64_t s, int64_t k) {
  std::vector<int32_t> order(static_cast<size_t>(s));
  std::iota(order.begin(), order.end(), 0);
  auto key = [&](int32_t i) {
    const float v = static_cast<float>(logits[static_cast<size_t>(i)]);
    return std::isnan(v) ? -std::numeric_limits<float>::infinity() : v;
  };
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return key(a) > key(b); });
  order.resize(static_cast<size_t>(k));
  std::sort(order.begin(), order.end());
  return order;
}

void expect_topk_equal(const std::string& label, const std::vector<double>& logits, int64_t b,
                       int64_t s, int64_t k_max, const std::vector<double>* counts) {
  const auto gpu_idx = topk_on(gpu(), logits, b, s, k_max, counts);
  const auto cpu_idx = topk_on(cpu(), logits, b, s, k_max, counts);
  ASSERT_EQ(gpu_idx, cpu_idx) << label;
  for (int64_t i = 0; i < b; ++i) {
    const int64_t k =
        counts != nullptr ? static_cast<int64_t>((*counts)[static_cast<size_t>(i)]) : k_max;
    const std::vector<double> row(logits.begin() + i * s, logits.begin() + (i + 1) * s);
    const auto expected = contract_topk(row, s, k);
    for (int64_t j = 0; j < k_max; ++j) {
      const int32_t got = gpu_idx[static_cast<size_t>(i * k_max + j)];
      if (j < k) {
        ASSERT_EQ(got, expected[static_cast<size_t>(j)])
            << label << " sequence " << i << " slot " << j;
      } else {
        ASSERT_EQ(got, -1) << label << " sequence " << i << " slot " << j;
      }
    }
  }
}

TEST(CudaTopk, ExactlyKAscendingTiesTowardLowerPosition) {
  MODAR_REQUIRE_CUDA();
  std::mt19937_64 rng(42);
  struct Case {
    int64_t b, s, k;
    int distinct;  // 0: continuous values; else values from {0..distinct-1} (many ties)
  };
  const Case cases[] = {{4, 128, 16, 0},     {4, 128, 16, 3},   {3, 1000, 125, 0},
                        {3, 1000, 125, 2},   {2, 2048, 256, 7}, {2, 8192, 1024, 0},
                        {2, 12000, 1500, 5},  // longer than the shared-memory key cache
                        {5, 64, 1, 0},       {5, 64, 64, 2},    {1, 1, 1, 0},
                        {3, 33, 32, 1}};  // all logits equal: the first k positions
  for (const Case& c : cases) {
    std::vector<double> logits(static_cast<size_t>(c.b * c.s));
    std::uniform_real_distribution<double> cont(-4.0, 4.0);
    std::uniform_int_distribution<int> disc(0, std::max(0, c.distinct - 1));
    for (double& x : logits)
      x = c.distinct == 0 ? cont(rng) : static_cast<double>(disc(rng)) - 1.0;
    expect_topk_equal("topk b=" + std::to_string(c.b) + " s=" + std::to_string(c.s) +
                          " k=" + std::to_string(c.k) + " distinct=" + std::to_string(c.distinct),
                      logits, c.b, c.s, c.k, nullptr);
  }
  // Signed zeros tie, NaN ranks below -inf, infinities order normally.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> special = {0.0, -0.0, nan, -inf, inf, 1.0, -0.0, nan, -1.0, 0.0};
  for (int64_t k = 1; k <= 10; ++k) {
    expect_topk_equal("topk special values k=" + std::to_string(k), special, 1, 10, k, nullptr);
  }
}

TEST(CudaTopk, RaggedCountsOfPredictorMode) {
  MODAR_REQUIRE_CUDA();
  const int64_t b = 6, s = 300, k_max = 80;
  std::vector<double> logits = random_values(b * s, 77, -2.0, 2.0);
  for (size_t i = 0; i < logits.size(); i += 3)
    logits[i] = 0.5;  // ties
  const std::vector<double> counts = {0, 1, 80, 17, 79, 40};
  expect_topk_equal("topk_ragged", logits, b, s, k_max, &counts);
}

TEST(CudaTopk, MaskMarksSelectedPositions) {
  MODAR_REQUIRE_CUDA();
  const int64_t b = 3, s = 50, k = 6;
  std::vector<double> indices = {0, 3, 9, 10, 49, -1, 1, 2, 3, 4, 5, 6, -1, -1, -1, -1, -1, -1};
  expect_matches_cpu(
      "topk_mask", Precision::fp32, {index("idx", {b, k}, indices), out_data("mask", {b, s})},
      [](Backend& be, const std::vector<TensorView>& v) { be.topk_mask(v[0], v[1]); });
  expect_matches_cpu(
      "topk_mask", Precision::bf16, {index("idx", {b, k}, indices), out_data("mask", {b, s})},
      [](Backend& be, const std::vector<TensorView>& v) { be.topk_mask(v[0], v[1]); });
}

TEST(CudaRouter, ForwardBackwardMatchCpu) {
  MODAR_REQUIRE_CUDA();
  const int64_t b = 3, s = 40, d = 200;
  for (const Precision p : {Precision::fp32, Precision::bf16}) {
    expect_matches_cpu(
        "router forward", p,
        {data("x", {b, s, d}, random_values(b * s * d, 1)), data("w", {d}, random_values(d, 2)),
         out_stat("logits", {b * s})},
        [](Backend& be, const std::vector<TensorView>& v) { be.router_forward(v[0], v[1], v[2]); });
    expect_matches_cpu(
        "router backward", p,
        {stat("dlogits", {b * s}, random_values(b * s, 3)),
         data("x", {b, s, d}, random_values(b * s * d, 1)), data("w", {d}, random_values(d, 2)),
         grad_data("dx", {b, s, d}, random_values(b * s * d, 4)),
         grad_data("dw", {d}, random_values(d, 5))},
        [](Backend& be, const std::vector<TensorView>& v) {
          be.router_backward(v[0], v[1], v[2], v[3], v[4]);
        });
  }
}

TEST(CudaGatherScatter, ForwardBackwardWithRaggedSlots) {
  MODAR_REQUIRE_CUDA();
  const int64_t b = 3, s = 20, k = 6, d = 96;
  // Ascending distinct positions per sequence, -1 for unused slots (ragged).
  const std::vector<double> indices = {0,  2,  5,  11, 12, 19, 3, 4,  7,
                                       -1, -1, -1, 1,  6,  8,  9, 15, -1};
  for (const Precision p : {Precision::fp32, Precision::bf16}) {
    expect_matches_cpu("gather forward", p,
                       {data("x", {b, s, d}, random_values(b * s * d, 1)),
                        index("idx", {b, k}, indices), out_data("out", {b, k, d})},
                       [](Backend& be, const std::vector<TensorView>& v) {
                         be.gather_rows_forward(v[0], v[1], v[2]);
                       });
    expect_matches_cpu(
        "gather backward", p,
        {data("dout", {b, k, d}, random_values(b * k * d, 2)), index("idx", {b, k}, indices),
         grad_data("dx", {b, s, d}, random_values(b * s * d, 3))},
        [](Backend& be, const std::vector<TensorView>& v) {
          be.gather_rows_backward(v[0], v[1], v[2]);
        });
    for (const RouterScale gate : {RouterScale::linear, RouterScale::sigmoid}) {
      const std::string name = gate == RouterScale::linear ? "linear" : "sigmoid";
      expect_matches_cpu(
          "scatter_add_scaled forward " + name, p,
          {grad_data("x", {b, s, d}, random_values(b * s * d, 4)), index("idx", {b, k}, indices),
           stat("r", {b, s}, random_values(b * s, 5, -2.0, 2.0)),
           data("delta", {b, k, d}, random_values(b * k * d, 6))},
          [gate](Backend& be, const std::vector<TensorView>& v) {
            be.scatter_add_scaled_forward(v[0], v[1], v[2], v[3], gate);
          });
      expect_matches_cpu(
          "scatter_add_scaled backward " + name, p,
          {data("dx", {b, s, d}, random_values(b * s * d, 7)), index("idx", {b, k}, indices),
           stat("r", {b, s}, random_values(b * s, 5, -2.0, 2.0)),
           data("delta", {b, k, d}, random_values(b * k * d, 6)),
           grad_data("ddelta", {b, k, d}, random_values(b * k * d, 8)),
           grad_stat("dr", {b, s}, random_values(b * s, 9))},
          [gate](Backend& be, const std::vector<TensorView>& v) {
            be.scatter_add_scaled_backward(v[0], v[1], v[2], v[3], gate, v[4], v[5]);
          });
    }
  }
}

}  // namespace
}  // namespace modar::runtime::cuda_testing
