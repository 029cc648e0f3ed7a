// modar/ops.hpp: the op vocabulary shared by the cost model and the runtime.
//
// The planner lowers a Config into a list of OpRecords (cost_models/lowering),
// the runtime executes exactly these op kinds, and the profiler times them
// over a grid of OpShapes, so every predicted op time can be checked against a
// measured one (SPEC section 3).  An OpShape is a small POD: its meaning per
// kind is fixed below and must not change without updating profiles/README.
//
//   kind               dims[0..]                                   notes
//   gemm               m, n, k, batch                              C[m,n] = A[m,k] B[k,n]
//   attention          b, H, G, s_q, s_k, d_h, causal(0/1)        causal: query i sees keys
//                                                                  <= i + (s_k - s_q)
//   rmsnorm            rows, d
//   rope               rows, heads, d_h                            heads = H + G (q and k)
//   router             rows, d                                     logits r = x . w_r (GEMV)
//   topk               b, s, k                                     per-sequence exact top-k
//   gather             rows, d                                     rows gathered by index
//   scatter_add        rows, d                                     x[idx] += g(r) * delta
//   depth_read_prefix  T, sources, queries, d, n, variant          queries = S * n (block) or
//                                                                  n (output read); variant =
//                                                                  int(DarVariant): kappa / nu
//   depth_read_merge   T, n, d, variant                            closed-form partial merge
//   dar_coefficients   T, n, d, outputs                            RMSNorm + [n d x outputs]
//                                                                  head + mix h = sum a_j R_j
//   dar_write          T, n, d, transport(0/1), emit_rstd(0/1)     P = M(rho) P + beta (x) y
//                                                                  (n = 1: P += y); emit_rstd:
//                                                                  block end, rstd of the entry
//   elementwise        elements, inputs, outputs                   GELU, SwiGLU, residual add
//   cross_entropy      rows, vocab
//   embedding          rows, d                                     lookup: 0 FLOPs, bytes only
//   optimizer_update   params                                      AdamW, fp32 master
//   --- experts (SPEC 1.3, docs/moe.md) ---
//   expert_gemm        G, M, n, k, imbalance_permille,             grouped GEMM over G experts
//                      ragged_inner(0/1)                           with ragged row counts m_g
//                                                                  (sum M).  0: C_g[m_g, n] =
//                                                                  A_g[m_g, k] B_g[k, n];
//                                                                  1 (weight gradient):
//                                                                  C_g[n, k] = A_g[m_g, n]^T
//                                                                  B_g[m_g, k].  FLOPs 2 M n k.
//                                                                  imbalance_permille = 1000 x
//                                                                  moe.load_imbalance (time only)
//   moe_topk           rows, choices, k                            softmax over choices (E + Z),
//                                                                  top-k, gates renormalised
//                                                                  over the k; keeps the probs
//                                                                  for the aux / z losses
//   permute            slots, d, rows                              out[slot] = x[token(slot)]
//                                                                  (tokens into expert order);
//                                                                  backward: scatter-add back
//   unpermute          slots, d, rows, k                           y[t] = sum over t's slots of
//                                                                  gate x e[slot] (combine)
//
// Backward ops carry Pass::backward and the same dims as their forward op,
// except GEMMs: a linear layer's backward is two plain GEMMs (dgrad, wgrad)
// with their own m, n, k, so a GEMM is timed the same way in every pass.
// op_dims_count(kind) says how many leading dims are meaningful.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "modar/config.hpp"

namespace modar {

enum class OpKind : uint8_t {
  gemm,
  attention,
  rmsnorm,
  rope,
  router,
  topk,
  gather,
  scatter_add,
  depth_read_prefix,
  depth_read_merge,
  dar_coefficients,
  dar_write,
  elementwise,
  cross_entropy,
  embedding,
  optimizer_update,
  // Appended (experts, SPEC 1.3): profiles name kinds by string, so old
  // profiles stay valid.
  expert_gemm,
  moe_topk,
  permute,
  unpermute,
};
inline constexpr int kOpKindCount = 20;

enum class Pass : uint8_t { forward, backward, recompute };

struct OpShape {
  OpKind kind = OpKind::gemm;
  DType dtype = DType::bf16;
  std::array<int64_t, 7> dims{};  // meaning per kind: see the table above
};

// One op of a lowered step.  `multiplicity` identical copies (layers with the
// same shape are counted, not repeated, so evaluation cost does not grow with
// depth).  flops / bytes are per copy; the totals multiply.
struct OpRecord {
  OpShape shape;
  Pass pass = Pass::forward;
  int64_t multiplicity = 1;
  double flops = 0.0;                 // counted FLOPs (1 FMA = 2), per the active conventions
  double bytes = 0.0;                 // minimum bytes moved (reads + writes)
  const char* label = "";             // static string, e.g. "attn.qkv", "mlp.up", "router"
  bool counts_as_model_flops = true;  // false for recompute and for ops outside the counted set
};

const char* to_string(OpKind kind);
const char* to_string(Pass pass);
// Inverse of to_string; false when `name` is no op kind / pass.
bool parse_op_kind(const std::string& name, OpKind* kind);
bool parse_pass(const std::string& name, Pass* pass);
// How many leading dims are meaningful for `kind` (the table above).
int op_dims_count(OpKind kind);
// The plain GEMM an expert_gemm is timed as when the profile has no
// measurement of expert_gemm itself: the per-expert shape with the busiest
// expert's rows (mean rows M / G x imbalance, rounded up) as a batch of G
// (one launch, the slowest group sets the pace).
OpShape expert_gemm_timing_shape(const OpShape& expert_gemm);
// True for the op kinds whose FLOPs are counted by default (SPEC section 2:
// GEMMs, attention, router, LM head; plus the depth-read family, whose
// FLOPs dar_math.md section 4.3 counts).  Norms, elementwise, top-k, gather,
// scatter, cross-entropy, embedding and the optimizer are bytes-dominated
// and reported but not counted.  Experts: expert_gemm is counted (the MoE
// router is a gemm); moe_topk, permute and unpermute are not.
inline bool is_counted_kind(OpKind kind) {
  switch (kind) {
    case OpKind::gemm:
    case OpKind::attention:
    case OpKind::router:
    case OpKind::depth_read_prefix:
    case OpKind::depth_read_merge:
    case OpKind::dar_coefficients:
    case OpKind::dar_write:
    case OpKind::expert_gemm:
      return true;
    default:
      return false;
  }
}

}  // namespace modar
