// Causal attention with GQA and valid lengths vs a naive reference; gradients
// by finite differences.
#include "test_ops_util.hpp"

namespace modar::runtime::testing {
namespace {

struct Dims {
  int64_t b, s, heads, kv_heads, d_head;
};

// Naive attention: for each (sequence, head, query i) a softmax over keys j.
void naive_attention(const Dims& dm, const std::vector<double>& q, const std::vector<double>& k,
                     const std::vector<double>& v, const std::vector<int>& lengths, bool causal,
                     std::vector<double>& out, std::vector<double>& lse) {
  out.assign(static_cast<size_t>(dm.b * dm.s * dm.heads * dm.d_head), 0.0);
  lse.assign(static_cast<size_t>(dm.b * dm.heads * dm.s), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(dm.d_head));
  auto qi = [&](int64_t b, int64_t t, int64_t h, int64_t c) {
    return ((b * dm.s + t) * dm.heads + h) * dm.d_head + c;
  };
  auto ki = [&](int64_t b, int64_t t, int64_t g, int64_t c) {
    return ((b * dm.s + t) * dm.kv_heads + g) * dm.d_head + c;
  };
  for (int64_t b = 0; b < dm.b; ++b) {
    for (int64_t h = 0; h < dm.heads; ++h) {
      const int64_t g = h / (dm.heads / dm.kv_heads);
      for (int64_t i = 0; i < lengths[b]; ++i) {
        std::vector<double> scores;
        for (int64_t j = 0; j < lengths[b] && (!causal || j <= i); ++j) {
          double sc = 0;
          for (int64_t c = 0; c < dm.d_head; ++c)
            sc += q[qi(b, i, h, c)] * k[ki(b, j, g, c)];
          scores.push_back(sc * scale);
        }
        double z = 0;
        for (double sc : scores)
          z += std::exp(sc);
        lse[(b * dm.heads + h) * dm.s + i] = std::log(z);
        for (size_t j = 0; j < scores.size(); ++j) {
          for (int64_t c = 0; c < dm.d_head; ++c) {
            out[qi(b, i, h, c)] +=
                std::exp(scores[j]) / z * v[ki(b, static_cast<int64_t>(j), g, c)];
          }
        }
      }
    }
  }
}

TEST(OpsAttention, CausalGqaWithValidLengthsMatchesNaive) {
  const Dims dm{2, 6, 4, 2, 8};
  const auto q = random_values(dm.b * dm.s * dm.heads * dm.d_head, 1, -2, 2);
  const auto k = random_values(dm.b * dm.s * dm.kv_heads * dm.d_head, 2, -2, 2);
  const auto v = random_values(dm.b * dm.s * dm.kv_heads * dm.d_head, 3);
  for (bool causal : {true, false}) {
    for (bool ragged : {false, true}) {
      const std::vector<int> lengths = ragged ? std::vector<int>{4, 6} : std::vector<int>{6, 6};
      Tensor qt = tensor({dm.b, dm.s, dm.heads, dm.d_head}, q);
      Tensor kt = tensor({dm.b, dm.s, dm.kv_heads, dm.d_head}, k);
      Tensor vt = tensor({dm.b, dm.s, dm.kv_heads, dm.d_head}, v);
      Tensor out = random_tensor({dm.b, dm.s, dm.heads, dm.d_head}, 99);  // garbage first
      Tensor lse = random_tensor({dm.b, dm.heads, dm.s}, 98);
      Tensor len = tensor({dm.b}, {4, 6}, ScalarType::i32);
      AttentionParams params;
      params.causal = causal;
      cpu().attention_forward(qt, kt, vt, ragged ? len.view() : TensorView{}, out, lse, params);
      std::vector<double> ref_out, ref_lse;
      naive_attention(dm, q, k, v, lengths, causal, ref_out, ref_lse);
      EXPECT_LT(relative_error(values_of(out), ref_out), 1e-13) << causal << ragged;
      EXPECT_LT(relative_error(values_of(lse), ref_lse), 1e-13) << causal << ragged;
    }
  }
}

TEST(OpsAttention, FirstQueryCopiesFirstValue) {
  // Causal: query 0 sees only key 0, so out[0] = v[0] whatever q and k are.
  Tensor q = random_tensor({1, 3, 1, 4}, 5), k = random_tensor({1, 3, 1, 4}, 6);
  Tensor v = random_tensor({1, 3, 1, 4}, 7), out = zeros({1, 3, 1, 4}), lse = zeros({1, 1, 3});
  cpu().attention_forward(q, k, v, TensorView{}, out, lse, AttentionParams{});
  const auto o = values_of(out), vv = values_of(v);
  for (int c = 0; c < 4; ++c)
    EXPECT_NEAR(o[c], vv[c], 1e-15);
}

TEST(OpsAttention, GradientsMatchFiniteDifferences) {
  const Dims dm{2, 5, 4, 2, 4};
  for (bool causal : {true, false}) {
    auto q = random_values(dm.b * dm.s * dm.heads * dm.d_head, 11);
    auto k = random_values(dm.b * dm.s * dm.kv_heads * dm.d_head, 12);
    auto v = random_values(dm.b * dm.s * dm.kv_heads * dm.d_head, 13);
    const auto proj = random_values(q.size(), 14);
    Tensor len = tensor({dm.b}, {3, 5}, ScalarType::i32);
    const std::vector<int64_t> q_shape{dm.b, dm.s, dm.heads, dm.d_head};
    const std::vector<int64_t> kv_shape{dm.b, dm.s, dm.kv_heads, dm.d_head};
    AttentionParams params;
    params.causal = causal;
    params.softmax_scale = causal ? 0.0 : 0.3;  // explicit scale on the full variant
    auto loss = [&] {
      Tensor qt = tensor(q_shape, q), kt = tensor(kv_shape, k), vt = tensor(kv_shape, v);
      Tensor out = zeros(q_shape), lse = zeros({dm.b, dm.heads, dm.s});
      cpu().attention_forward(qt, kt, vt, len, out, lse, params);
      return project(out, proj);
    };
    Tensor qt = tensor(q_shape, q), kt = tensor(kv_shape, k), vt = tensor(kv_shape, v);
    Tensor out = zeros(q_shape), lse = zeros({dm.b, dm.heads, dm.s});
    cpu().attention_forward(qt, kt, vt, len, out, lse, params);
    Tensor dout = tensor(q_shape, proj), dq = zeros(q_shape), dk = zeros(kv_shape),
           dv = zeros(kv_shape);
    cpu().attention_backward(dout, qt, kt, vt, len, out, lse, dq, dk, dv, params);
    const std::string tag = causal ? " (causal)" : " (full)";
    expect_gradient("attention dq" + tag, q, loss, values_of(dq));
    expect_gradient("attention dk" + tag, k, loss, values_of(dk));
    expect_gradient("attention dv" + tag, v, loss, values_of(dv));
  }
}

TEST(OpsAttention, Bf16CloseToFp64AndShapeErrors) {
  const Dims dm{1, 16, 2, 1, 16};
  Tensor q = random_tensor({1, 16, 2, 16}, 21), k = random_tensor({1, 16, 1, 16}, 22);
  Tensor v = random_tensor({1, 16, 1, 16}, 23);
  Tensor out = zeros({1, 16, 2, 16}), lse = zeros({1, 2, 16});
  cpu().attention_forward(q, k, v, TensorView{}, out, lse, AttentionParams{});
  Tensor q16 = tensor({1, 16, 2, 16}, values_of(q), ScalarType::bf16);
  Tensor k16 = tensor({1, 16, 1, 16}, values_of(k), ScalarType::bf16);
  Tensor v16 = tensor({1, 16, 1, 16}, values_of(v), ScalarType::bf16);
  Tensor out16 = zeros({1, 16, 2, 16}, ScalarType::bf16),
         lse32 = zeros({1, 2, 16}, ScalarType::fp32);
  cpu().attention_forward(q16, k16, v16, TensorView{}, out16, lse32, AttentionParams{});
  EXPECT_LT(relative_error(values_of(out16), values_of(out)), 0.03);
  (void)dm;
  Tensor k_bad = zeros({1, 16, 3, 16});
  expect_shape_error(
      [&] { cpu().attention_forward(q, k_bad, k_bad, TensorView{}, out, lse, AttentionParams{}); },
      "with H = 2 divisible by G");
  Tensor len_bad = tensor({1}, {17}, ScalarType::i32);
  expect_shape_error(
      [&] { cpu().attention_forward(q, k, v, len_bad, out, lse, AttentionParams{}); },
      "valid_lengths[0] = 17 out of range");
}

}  // namespace
}  // namespace modar::runtime::testing
