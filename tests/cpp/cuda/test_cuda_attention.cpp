// Causal / full attention with GQA and per-sequence valid lengths, forward
// (out, lse) and backward (dq, dk, dv), CUDA vs CPU (FlashAttention rule; the
// FlashAttention tests allow 3x on gradients, we keep 2x).
#include "cuda_test_util.hpp"

namespace modar::runtime::cuda_testing {
namespace {

struct AttentionCase {
  int64_t b, s, heads, kv_heads, d_head;
  bool causal;
  bool ragged;
};

// Forward on the CPU in fp64 gives out and lse consistent with the inputs, for
// the backward's saved tensors.
void saved_forward(const AttentionCase& c, const std::vector<double>& q,
                   const std::vector<double>& k, const std::vector<double>& v,
                   const std::vector<double>& lengths, Precision p, std::vector<double>& out,
                   std::vector<double>& lse) {
  const ScalarType lowp = p == Precision::fp32 ? ScalarType::fp32 : ScalarType::bf16;
  auto rounded = [&](std::vector<double> x) {
    for (double& e : x)
      e = round_to(e, lowp);
    return x;
  };
  Tensor qt = make_tensor(cpu(), {c.b, c.s, c.heads, c.d_head}, ScalarType::fp64, rounded(q));
  Tensor kt = make_tensor(cpu(), {c.b, c.s, c.kv_heads, c.d_head}, ScalarType::fp64, rounded(k));
  Tensor vt = make_tensor(cpu(), {c.b, c.s, c.kv_heads, c.d_head}, ScalarType::fp64, rounded(v));
  Tensor ot = make_tensor(cpu(), {c.b, c.s, c.heads, c.d_head}, ScalarType::fp64);
  Tensor lt = make_tensor(cpu(), {c.b, c.heads, c.s}, ScalarType::fp64);
  Tensor len = make_tensor(cpu(), {c.b}, ScalarType::i32, lengths);
  AttentionParams params;
  params.causal = c.causal;
  cpu().attention_forward(qt, kt, vt, c.ragged ? len.view() : TensorView{}, ot, lt, params);
  out = download(cpu(), ot);
  lse = download(cpu(), lt);
}

TEST(CudaAttention, ForwardAndBackwardMatchCpu) {
  MODAR_REQUIRE_CUDA();
  const AttentionCase cases[] = {
      {2, 70, 4, 2, 64, true, false},   // GQA, seq not a multiple of the 32-row tile
      {2, 45, 2, 2, 40, true, true},    // d_head not a multiple of 32, ragged lengths
      {1, 33, 4, 1, 128, false, true},  // full attention, multi-query, d_head 128
      {1, 64, 2, 1, 256, true, false},  // the largest supported d_head
      {3, 16, 1, 1, 8, true, true},     // tiny
  };
  uint64_t seed = 1000;
  for (const AttentionCase& c : cases) {
    const int64_t q_count = c.b * c.s * c.heads * c.d_head;
    const int64_t kv_count = c.b * c.s * c.kv_heads * c.d_head;
    std::vector<double> lengths;
    for (int64_t i = 0; i < c.b; ++i) {
      lengths.push_back(c.ragged ? static_cast<double>(std::max<int64_t>(1, c.s - 7 * i - 3))
                                 : static_cast<double>(c.s));
    }
    const auto q = random_values(q_count, seed, -1.5, 1.5);
    const auto k = random_values(kv_count, seed + 1, -1.5, 1.5);
    const auto v = random_values(kv_count, seed + 2);
    AttentionParams params;
    params.causal = c.causal;
    const std::string label = "attention b=" + std::to_string(c.b) + " s=" + std::to_string(c.s) +
                              " H=" + std::to_string(c.heads) + " G=" + std::to_string(c.kv_heads) +
                              " d_h=" + std::to_string(c.d_head) +
                              (c.causal ? " causal" : " full") + (c.ragged ? " ragged" : "");
    const Arg lengths_arg = c.ragged ? index("len", {c.b}, lengths) : none();
    for (const Precision p : {Precision::fp32, Precision::bf16}) {
      expect_matches_cpu(
          label, p,
          {data("q", {c.b, c.s, c.heads, c.d_head}, q),
           data("k", {c.b, c.s, c.kv_heads, c.d_head}, k),
           data("v", {c.b, c.s, c.kv_heads, c.d_head}, v), lengths_arg,
           out_data("out", {c.b, c.s, c.heads, c.d_head}), out_stat("lse", {c.b, c.heads, c.s})},
          [&](Backend& be, const std::vector<TensorView>& t) {
            be.attention_forward(t[0], t[1], t[2], t[3], t[4], t[5], params);
          });
      std::vector<double> out, lse;
      saved_forward(c, q, k, v, lengths, p, out, lse);
      expect_matches_cpu(
          label + " backward", p,
          {data("dout", {c.b, c.s, c.heads, c.d_head}, random_values(q_count, seed + 3)),
           data("q", {c.b, c.s, c.heads, c.d_head}, q),
           data("k", {c.b, c.s, c.kv_heads, c.d_head}, k),
           data("v", {c.b, c.s, c.kv_heads, c.d_head}, v), lengths_arg,
           data("out", {c.b, c.s, c.heads, c.d_head}, out), stat("lse", {c.b, c.heads, c.s}, lse),
           grad_data("dq", {c.b, c.s, c.heads, c.d_head}, random_values(q_count, seed + 4)),
           grad_data("dk", {c.b, c.s, c.kv_heads, c.d_head}, random_values(kv_count, seed + 5)),
           grad_data("dv", {c.b, c.s, c.kv_heads, c.d_head}, random_values(kv_count, seed + 6))},
          [&](Backend& be, const std::vector<TensorView>& t) {
            be.attention_backward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], t[9],
                                  params);
          });
    }
    seed += 100;
  }
}

}  // namespace
}  // namespace modar::runtime::cuda_testing
