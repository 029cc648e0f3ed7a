// Causal / full attention with GQA and per-sequence valid lengths, forward
// (out, lse) and backward (dq, dk, dv), CUDA vs CPU (FlashAttention rule; the
// FlashAttention tests allow 3x on gradients, we keep 2x).
//
// Two paths (include/modar/runtime/cuda_backend.hpp, CudaAttentionPath):
//   * the reference kernel (attention.cu, CUDA cores), every dtype / d_head;
//   * cuDNN's fused SDPA (tensor cores, bf16), the fast path.
// Small shapes go against the CPU (fp64 truth, CPU bf16 as the naive
// same-precision implementation).  Real sizes (s = 4096, d_head 64 / 128) go
// against the GPU reference kernel: truth = the reference kernel in fp32 on
// the same bf16-rounded inputs, naive = the reference kernel in bf16, and the
// fast path must stay within 2x the naive error (plus the bf16 floor); the
// reference kernel itself is checked against the CPU at s = 4096 once.
// cuDNN missing: the fast-path tests skip with the reason, or FAIL when
// MODAR_REQUIRE_CUDNN=1 (scripts/gpu-check.sh sets it on the device machine).
#include <cstring>

#include "cuda_test_util.hpp"
#include "modar/runtime/cuda_backend.hpp"

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

// The process-wide attention path for one scope.
class AttentionPathScope {
 public:
  explicit AttentionPathScope(CudaAttentionPath path) : saved_(cuda_attention_path()) {
    set_cuda_attention_path(path);
  }
  ~AttentionPathScope() { set_cuda_attention_path(saved_); }
  AttentionPathScope(const AttentionPathScope&) = delete;
  AttentionPathScope& operator=(const AttentionPathScope&) = delete;

 private:
  CudaAttentionPath saved_;
};

// "" when the cuDNN path runs a small bf16 attention, else why not.
std::string cudnn_unavailable_reason() {
  static const std::string reason = [] {
    AttentionPathScope scope(CudaAttentionPath::cudnn);
    try {
      const int64_t b = 1, s = 16, h = 2, d = 64;
      Tensor q = make_tensor(gpu(), {b, s, h, d}, ScalarType::bf16, random_values(b * s * h * d, 1));
      Tensor o = make_tensor(gpu(), {b, s, h, d}, ScalarType::bf16);
      Tensor lse = make_tensor(gpu(), {b, h, s}, ScalarType::fp32);
      gpu().attention_forward(q, q, q, TensorView{}, o, lse, AttentionParams{});
      gpu().synchronize();
    } catch (const BackendError& error) {
      return std::string(error.what());
    }
    return std::string();
  }();
  return reason;
}

#define MODAR_REQUIRE_CUDNN_ATTENTION()                                                       \
  do {                                                                                        \
    MODAR_REQUIRE_REAL_CUDA();                                                                \
    const std::string why_not = cudnn_unavailable_reason();                                   \
    if (!why_not.empty()) {                                                                   \
      const char* required = std::getenv("MODAR_REQUIRE_CUDNN");                              \
      if (required != nullptr && std::strcmp(required, "1") == 0) {                          \
        FAIL() << "MODAR_REQUIRE_CUDNN=1 but the cuDNN attention path is unavailable: "       \
               << why_not;                                                                    \
      }                                                                                       \
      GTEST_SKIP() << "cuDNN attention unavailable: " << why_not;                             \
    }                                                                                         \
  } while (false)

std::vector<double> case_lengths(const AttentionCase& c) {
  std::vector<double> lengths;
  for (int64_t i = 0; i < c.b; ++i) {
    lengths.push_back(c.ragged ? static_cast<double>(std::max<int64_t>(1, c.s - 7 * i - 3))
                               : static_cast<double>(c.s));
  }
  return lengths;
}

// Forward and backward of one case against the CPU, in the given precisions.
void check_case_against_cpu(const AttentionCase& c, uint64_t seed,
                            std::initializer_list<Precision> precisions,
                            const std::vector<double>& lengths) {
  const int64_t q_count = c.b * c.s * c.heads * c.d_head;
  const int64_t kv_count = c.b * c.s * c.kv_heads * c.d_head;
  const auto q = random_values(q_count, seed, -1.5, 1.5);
  const auto k = random_values(kv_count, seed + 1, -1.5, 1.5);
  const auto v = random_values(kv_count, seed + 2);
  AttentionParams params;
  params.causal = c.causal;
  const std::string label = "attention b=" + std::to_string(c.b) + " s=" + std::to_string(c.s) +
                            " H=" + std::to_string(c.heads) + " G=" + std::to_string(c.kv_heads) +
                            " d_h=" + std::to_string(c.d_head) + (c.causal ? " causal" : " full") +
                            (c.ragged ? " ragged" : "");
  const Arg lengths_arg = c.ragged ? index("len", {c.b}, lengths) : none();
  for (const Precision p : precisions) {
    expect_matches_cpu(
        label, p,
        {data("q", {c.b, c.s, c.heads, c.d_head}, q), data("k", {c.b, c.s, c.kv_heads, c.d_head}, k),
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
         data("q", {c.b, c.s, c.heads, c.d_head}, q), data("k", {c.b, c.s, c.kv_heads, c.d_head}, k),
         data("v", {c.b, c.s, c.kv_heads, c.d_head}, v), lengths_arg,
         data("out", {c.b, c.s, c.heads, c.d_head}, out), stat("lse", {c.b, c.heads, c.s}, lse),
         grad_data("dq", {c.b, c.s, c.heads, c.d_head}, random_values(q_count, seed + 4)),
         grad_data("dk", {c.b, c.s, c.kv_heads, c.d_head}, random_values(kv_count, seed + 5)),
         grad_data("dv", {c.b, c.s, c.kv_heads, c.d_head}, random_values(kv_count, seed + 6))},
        [&](Backend& be, const std::vector<TensorView>& t) {
          be.attention_backward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], t[9], params);
        });
  }
}

TEST(CudaAttention, ForwardAndBackwardMatchCpu) {
  MODAR_REQUIRE_CUDA();
  AttentionPathScope scope(CudaAttentionPath::reference);  // the reference kernel
  const AttentionCase cases[] = {
      {2, 70, 4, 2, 64, true, false},   // GQA, seq not a multiple of the 32-row tile
      {2, 45, 2, 2, 40, true, true},    // d_head not a multiple of 32, ragged lengths
      {1, 33, 4, 1, 128, false, true},  // full attention, multi-query, d_head 128
      {1, 64, 2, 1, 256, true, false},  // the largest supported d_head
      {3, 16, 1, 1, 8, true, true},     // tiny
  };
  uint64_t seed = 1000;
  for (const AttentionCase& c : cases) {
    check_case_against_cpu(c, seed, {Precision::fp32, Precision::bf16}, case_lengths(c));
    seed += 100;
  }
}

// The fast path (cuDNN SDPA, bf16) against the CPU on the small cases, plus a
// predictor-mode case: ragged lengths including 0 and s.
TEST(CudaAttentionCudnn, ForwardAndBackwardMatchCpu) {
  // The harness self-check runs these cases on the CPU too (their shapes and
  // lengths through the op checks); on a GPU they need the cuDNN path.
  const bool self_check = cuda_state().self_check;
  if (!self_check) {
    MODAR_REQUIRE_CUDNN_ATTENTION();
  }
  AttentionPathScope scope(CudaAttentionPath::cudnn);  // unsupported -> BackendError, not fallback
  const AttentionCase cases[] = {
      {2, 70, 4, 2, 64, true, false},   // GQA, s not a multiple of any tile
      {2, 45, 2, 2, 40, true, true},    // d_head 40, ragged
      {1, 33, 4, 1, 128, false, true},  // full attention, multi-query, d_head 128
      {3, 16, 1, 1, 8, true, true},     // tiny
  };
  uint64_t seed = 3000;
  for (const AttentionCase& c : cases) {
    check_case_against_cpu(c, seed, {Precision::bf16}, case_lengths(c));
    seed += 100;
  }
  // MoD predictor mode: per-sequence routed counts, padded to k_max = 96.
  const AttentionCase ragged{4, 96, 4, 2, 64, true, true};
  check_case_against_cpu(ragged, seed, {Precision::bf16}, {96.0, 0.0, 1.0, 57.0});
  if (!self_check) {
    const CudaAttentionCounts counts = cuda_attention_counts();
    EXPECT_GT(counts.cudnn_forward, 0);
    EXPECT_GT(counts.cudnn_backward, 0);
  }
}

// Three runs of one op on the GPU with the FlashAttention rule: truth = the
// reference kernel in fp32, naive = the reference kernel in bf16, tested = the
// cuDNN path in bf16 (inputs pre-rounded to bf16 in all three).
void expect_fast_path_matches_reference(const std::string& label, const std::vector<Arg>& args,
                                        const OpFunction& op) {
  auto on_path = [&](CudaAttentionPath path) {
    return [&op, path](Backend& be, const std::vector<TensorView>& v) {
      AttentionPathScope scope(path);
      op(be, v);
    };
  };
  const World truth_world{&gpu(), ScalarType::fp32, ScalarType::fp32, true};
  const World low_world{&gpu(), ScalarType::bf16, ScalarType::fp32, true};
  const auto truth = run_world(truth_world, args, on_path(CudaAttentionPath::reference),
                               Precision::bf16);
  const auto naive = run_world(low_world, args, on_path(CudaAttentionPath::reference),
                               Precision::bf16);
  const auto fast = run_world(low_world, args, on_path(CudaAttentionPath::cudnn), Precision::bf16);
  const double eps = std::ldexp(1.0, -8);
  size_t output = 0;
  for (const Arg& arg : args) {
    if (!is_output(arg.role)) continue;
    const double naive_error = max_error(naive[output], truth[output]);
    const double fast_error = max_error(fast[output], truth[output]);
    const double floor = eps * (1.0 + max_abs(truth[output]));
    EXPECT_LE(fast_error, 2.0 * naive_error + floor)
        << label << " output " << arg.name << ": cuDNN error " << fast_error
        << ", reference-kernel bf16 error " << naive_error << ", floor " << floor;
    ++output;
  }
}

// Real sizes: s = 4096 with d_head 64 and 128, causal GQA and ragged full.
TEST(CudaAttentionCudnn, RealSizesMatchTheReferenceKernel) {
  MODAR_REQUIRE_CUDNN_ATTENTION();
  struct Case {
    int64_t b, s, heads, kv_heads, d_head;
    bool causal, ragged;
  };
  const Case cases[] = {{2, 4096, 8, 2, 64, true, false}, {1, 4096, 4, 4, 128, true, true},
                        {1, 4096, 4, 1, 128, false, false}};
  uint64_t seed = 5000;
  for (const Case& c : cases) {
    const int64_t q_count = c.b * c.s * c.heads * c.d_head;
    const int64_t kv_count = c.b * c.s * c.kv_heads * c.d_head;
    const std::vector<int64_t> q_shape{c.b, c.s, c.heads, c.d_head};
    const std::vector<int64_t> kv_shape{c.b, c.s, c.kv_heads, c.d_head};
    const Arg lengths = c.ragged ? index("len", {c.b}, {3001.0}) : none();
    AttentionParams params;
    params.causal = c.causal;
    const std::string label = "attention s=" + std::to_string(c.s) + " H=" +
                              std::to_string(c.heads) + " G=" + std::to_string(c.kv_heads) +
                              " d_h=" + std::to_string(c.d_head) + (c.causal ? " causal" : "") +
                              (c.ragged ? " ragged" : "");
    const auto q = random_values(q_count, seed, -2.0, 2.0);
    const auto k = random_values(kv_count, seed + 1, -2.0, 2.0);
    const auto v = random_values(kv_count, seed + 2);
    expect_fast_path_matches_reference(
        label,
        {data("q", q_shape, q), data("k", kv_shape, k), data("v", kv_shape, v), lengths,
         out_data("out", q_shape), out_stat("lse", {c.b, c.heads, c.s})},
        [&](Backend& be, const std::vector<TensorView>& t) {
          be.attention_forward(t[0], t[1], t[2], t[3], t[4], t[5], params);
        });
    // The backward's saved out / lse: the reference kernel in fp32 on the
    // bf16-rounded inputs (any consistent forward will do).
    std::vector<double> out, lse;
    {
      AttentionPathScope scope(CudaAttentionPath::reference);
      auto rounded = [](std::vector<double> x) {
        for (double& e : x) e = round_to(e, ScalarType::bf16);
        return x;
      };
      Tensor qt = make_tensor(gpu(), q_shape, ScalarType::fp32, rounded(q));
      Tensor kt = make_tensor(gpu(), kv_shape, ScalarType::fp32, rounded(k));
      Tensor vt = make_tensor(gpu(), kv_shape, ScalarType::fp32, rounded(v));
      Tensor ot = make_tensor(gpu(), q_shape, ScalarType::fp32);
      Tensor lt = make_tensor(gpu(), {c.b, c.heads, c.s}, ScalarType::fp32);
      Tensor len = make_tensor(gpu(), {c.b}, ScalarType::i32, {3001.0});
      gpu().attention_forward(qt, kt, vt, c.ragged ? len.view() : TensorView{}, ot, lt, params);
      out = download(gpu(), ot);
      lse = download(gpu(), lt);
    }
    expect_fast_path_matches_reference(
        label + " backward",
        {data("dout", q_shape, random_values(q_count, seed + 3)), data("q", q_shape, q),
         data("k", kv_shape, k), data("v", kv_shape, v), lengths, data("out", q_shape, out),
         stat("lse", {c.b, c.heads, c.s}, lse),
         grad_data("dq", q_shape, random_values(q_count, seed + 4)),
         grad_data("dk", kv_shape, random_values(kv_count, seed + 5)),
         grad_data("dv", kv_shape, random_values(kv_count, seed + 6))},
        [&](Backend& be, const std::vector<TensorView>& t) {
          be.attention_backward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], t[9], params);
        });
    seed += 100;
  }
}

// The reference kernel itself at a real size, against the CPU (s = 4096,
// d_head 64, two query heads on one kv head: about 10-20 s of fp64 CPU work;
// d_head 128 at s = 4096 is covered through RealSizesMatchTheReferenceKernel).
TEST(CudaAttention, ReferenceKernelAtRealSizeMatchesCpu) {
  MODAR_REQUIRE_CUDA();
  AttentionPathScope scope(CudaAttentionPath::reference);
  const AttentionCase c{1, 4096, 2, 1, 64, true, false};
  check_case_against_cpu(c, 7000, {Precision::bf16}, case_lengths(c));
}

}  // namespace
}  // namespace modar::runtime::cuda_testing
