// MoD's top-k on the GPU against its contract: the exact per-sequence top-k
// (ties toward the lower position, ascending, exactly k; signed zeros, NaN,
// infinities; ragged counts of predictor mode) and the top-k mask.  Top-k
// indices must EQUAL the CPU backend's (the contract is deterministic).  The
// router and the routed rows' gather / scatter run through the op harness
// (tests/cpp/runtime/test_op_harness.cpp, ragged slots included).
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

}  // namespace
}  // namespace modar::runtime::cuda_testing
