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
//   attention          b, H, G, s_q, s_k, d_h, causal(0/1)        causal among s_q (=s_k)
//   rmsnorm            rows, d
//   rope               rows, heads, d_h
//   router             rows, d                                     logits r = x . w_r (GEMV)
//   topk               b, s, k                                     per-sequence exact top-k
//   gather             rows, d                                     rows gathered by index
//   scatter_add        rows, d                                     x[idx] += g(r) * delta
//   depth_read_prefix  T, sources, queries, d                      queries = S * n (block)
//   depth_read_merge   T, n, d                                     closed-form partial merge
//   dar_coefficients   T, n, d, outputs                            RMSNorm + [n d x outputs] head
//   dar_write          T, n, d                                     P = M(rho) P + beta (x) y
//   elementwise        elements, inputs, outputs                   GELU, SwiGLU, residual add
//   cross_entropy      rows, vocab
//   embedding          rows, d                                     lookup: 0 FLOPs, bytes only
//   optimizer_update   params                                      AdamW, fp32 master
#pragma once

#include <array>
#include <cstdint>

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
};
inline constexpr int kOpKindCount = 16;

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
  double flops = 0.0;          // counted FLOPs (1 FMA = 2), per the active conventions
  double bytes = 0.0;          // minimum bytes moved (reads + writes)
  const char* label = "";      // static string, e.g. "attn.qkv", "mlp.up", "router"
  bool counts_as_model_flops = true;  // false for recompute and for ops outside the counted set
};

const char* to_string(OpKind kind);
const char* to_string(Pass pass);

}  // namespace modar
