// modar/runtime/backend.hpp: the backend interface of the reference runtime.
//
// One abstract class (ggml_backend_i-like) that every device implements: memory,
// copies, a timer for the profiler, device facts, and ONE entry point that
// executes an op given as a value (op_args.hpp: one argument struct per op,
// the op table).  The CPU backend (runtime/cpu, Eigen) is the reference every
// other backend is tested against.
//
// ---- How a call flows (FlashAttention style) --------------------------------
// run(OpArgs) is NON-virtual: it calls check() of op_args.hpp (shapes, dtypes,
// devices; throws modar::ShapeError naming the op, the argument and the
// mismatch; returns the resolved geometry), asks supports(op, dtype), and then
// the backend's protected virtual execute().  So argument checks live in ONE
// place for all backends, and a kernel may assume its arguments are
// consistent.  The named methods below (gemm(...), rmsnorm_forward(...), ...)
// are one-line conveniences that build the op's argument struct and run it.  Index VALUES (token
// ids, positions) are data, not shapes: the CPU backend checks their range and throws ShapeError,
// the CUDA backend does not.
//
// ---- Conventions shared by every op -----------------------------------------
//  * Layout: row-major, contiguous.  "rows" = product of all but the last dim.
//  * Forward ops OVERWRITE their outputs (exceptions: gemm with beta != 0,
//    scatter_add_scaled_forward and axpy, which update in place).
//  * Backward ops ACCUMULATE (+=) into every gradient output (llm.c's residual
//    convention, applied uniformly): zero gradients with fill(g, 0) first.  A
//    gradient output given as an empty view is not computed.
//  * dtypes: "float" = fp64 | fp32 | bf16.  Tensors of one op share the data
//    dtype unless noted; statistics (rstd, lse, logits, p, loss, depth-read
//    queries, DAR coefficient parameters and outputs) are in stats_type(data).
//    bf16 ops compute in fp32.  Indices are i32.
//  * Nothing aliases unless the op says so.
//
// ---- Split of the MoD / DAR maths into ops (see docs/runtime_ops.md) --------
// MoD routed layer:  router_forward -> topk (or topk_ragged) -> gather_rows_forward
//   (x and, for RoPE, the indices themselves are the original positions) -> the
//   layer's branches on the packed rows -> scatter_add_scaled_forward.
//   Ragged selections (predictor mode) use a PADDED layout [b, k_max]: unused
//   index slots hold -1; gather writes zero rows for them, scatter skips them,
//   and attention takes the per-sequence counts as valid_lengths.
// Depth reads (AttnRes / DAR, docs/dar_math.md 1.4, 4, 5):
//   * the history bank is best laid out stream-major, bank[n][entries][T][d],
//     so that stream j's completed prefix select(bank, j) sliced to [0, b) is a
//     contiguous [b][T][d] tensor;
//   * depth_read_prefix: ONE output stream per call, all S branch queries of the
//     block at once (keys = stream kappa(j), values = stream nu(j)); n calls
//     per block.  Source rstd is an input (computed once when the entry is
//     written, with rmsnorm_forward and an empty `out`); the backward returns the
//     FULL key gradient including the path through rstd (docs/dar_math.md 5.1), so rstd
//     itself is never differentiated separately;
//   * depth_read_merge: the closed-form partial merge for one (branch, stream);
//   * dar_coefficients: z = RMSNorm_unweighted([R_0..R_{n-1}]) per token,
//     c = scale_g * (z W) + bias, alpha = sigmoid, beta = 2 sigmoid, and the
//     transport matrix M (n = 2: [[rho, 1-rho], [1-rho, rho]], rho = sigmoid;
//     n > 2: Sinkhorn(exp(c_M))), emitted as a full [T][n][n] matrix so the
//     transport / write ops need not know n = 2 from n > 2;
//   * dar_mix: h = sum_j alpha_j R_j (the branch input);
//   * dar_write: P_new = M P + beta (x) y  (fused transport + gated write; with
//     beta / y empty it is the pure transport P' = M P, see dar_transport_*).
//
// ---- Backends register themselves (link topology) ---------------------------
// make_backend(name) looks the name up in a registry (runtime/core/backend.cpp).
// The CPU backend is always present.  The CUDA backend (runtime/cuda/, target
// modar_runtime_cuda, built only when MODAR_CUDA is ON) registers itself from
// its own translation unit (cuda_registration.cpp, linked into every user of
// the umbrella target modar_runtime); the core never calls into CUDA, and
// modar_runtime_cuda depends on the core, not the other way round.  Without
// CUDA, make_backend("cuda") throws BackendError saying so.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "modar/config_enums.hpp"
#include "modar/runtime/op_args.hpp"
#include "modar/runtime/tensor.hpp"

namespace modar::runtime {

// Wall-clock of device work for the profiler: steady_clock on the CPU, CUDA
// events on a GPU.  start() / stop() enqueue markers; elapsed_s() waits for
// stop() to complete and returns the seconds between the two markers.
class Timer {
 public:
  virtual ~Timer() = default;
  virtual void start() = 0;
  virtual void stop() = 0;
  virtual double elapsed_s() = 0;
};

// What a backend reports about its device (ggml's get_props): the profiler
// sizes its cache rotation and memory limit from these and records the
// provenance.  0 / empty = unknown.
struct DeviceFacts {
  std::string description;                        // "Intel(R) Xeon(R) ...", "NVIDIA H200"
  int device_index = 0;                           // the GPU ordinal (0 on the CPU)
  int64_t cache_bytes = 0;                        // last-level cache (CPU) / L2 (GPU)
  int64_t memory_bytes = 0;                       // total memory of the device
  int64_t memory_free_bytes = 0;                  // available now (CPU: MemAvailable)
  std::map<std::string, std::string> provenance;  // driver / runtime versions, clocks...
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string name() const = 0;  // "cpu", "cuda:0 (NVIDIA H200)", ...
  virtual DeviceKind device() const = 0;
  virtual DeviceFacts facts() const = 0;
  // Whether execute() implements `op` for data of `dtype` (ggml's supports_op).
  // run() throws ShapeError naming the op and the dtype when it does not.
  virtual bool supports(OpId op, ScalarType dtype) const = 0;

  // ---- the one entry point ------------------------------------------------------
  // Check `call` once (op_args.hpp check()), then execute it.  Returns the
  // resolved geometry.
  OpGeometry run(const OpArgs& call);

  // ---- memory -----------------------------------------------------------------
  virtual void* allocate(int64_t bytes) = 0;  // throws BackendError on failure
  virtual void deallocate(void* data) noexcept = 0;
  // Host memory <-> a tensor of this backend (bytes = view.bytes()).
  virtual void copy_from_host(const void* host, const TensorView& dst) = 0;
  virtual void copy_to_host(const TensorView& src, void* host) = 0;
  // Same dtype and numel, both on this backend.
  void copy(const TensorView& src, const TensorView& dst) { run(CopyArgs{src, dst}); }
  // Every element = value (converted to dst's dtype).  Float or i32 tensors.
  void fill(const TensorView& dst, double value) { run(FillArgs{dst, value}); }
  // Same numel, float dtypes (e.g. fp32 <-> bf16, RNE).
  void convert(const TensorView& src, const TensorView& dst) { run(ConvertArgs{src, dst}); }
  virtual void synchronize() = 0;
  virtual std::unique_ptr<Timer> make_timer() = 0;

  // ---- GEMM ---------------------------------------------------------------------
  // C = alpha * op(A) op(B) + beta * C, op(X) = X or X^T.
  // All rank 3 -> batched over dim 0 (same batch).  Otherwise every operand is
  // flattened to 2-D ([.., k] -> [rows, k]) and it is one GEMM: e.g. x [b, s, d]
  // times W [d, f] into y [b, s, f], or the weight gradient dW = x^T dy.
  // A and B share a float dtype; C has that dtype or fp32 (bf16 in, fp32 out).
  void gemm(const TensorView& a, bool transpose_a, const TensorView& b, bool transpose_b,
            const TensorView& c, double alpha = 1.0, double beta = 0.0) {
    run(GemmArgs{a, transpose_a, b, transpose_b, c, alpha, beta});
  }

  // ---- RMSNorm ------------------------------------------------------------------
  // out = x * rstd * weight, rstd = (mean(x^2) + eps)^-1/2 per row.
  // x, out [.., d]; weight [d] or empty (unweighted); rstd [rows] stats.
  // `out` may be empty: then only rstd is computed (depth-read key statistics).
  void rmsnorm_forward(const TensorView& x, const TensorView& weight, const TensorView& out,
                       const TensorView& rstd, double eps) {
    run(RmsnormForwardArgs{x, weight, out, rstd, eps});
  }
  void rmsnorm_backward(const TensorView& dout, const TensorView& x, const TensorView& weight,
                        const TensorView& rstd, const TensorView& dx, const TensorView& dweight) {
    run(RmsnormBackwardArgs{dout, x, weight, rstd, dx, dweight});
  }

  // ---- RoPE ---------------------------------------------------------------------
  // x, out [.., heads, d_h] (d_h even); positions i32 [rows of x without the heads
  // dim], e.g. x [b, s, H, d_h] with positions [b, s].  Routed tokens pass their
  // ORIGINAL positions (the top-k indices).  out may alias x.
  void rope_forward(const TensorView& x, const TensorView& positions, const TensorView& out,
                    const RopeParams& params) {
    run(RopeForwardArgs{x, positions, out, params});
  }
  // dx += R(pos)^T dout
  void rope_backward(const TensorView& dout, const TensorView& positions, const TensorView& dx,
                     const RopeParams& params) {
    run(RopeBackwardArgs{dout, positions, dx, params});
  }

  // ---- attention ----------------------------------------------------------------
  // q [b, s, H, d_h]; k, v [b, s, G, d_h] with H % G == 0 (query head h uses kv
  // head h / (H/G)); out [b, s, H, d_h]; lse [b, H, s] stats (natural log of
  // the softmax denominator, scores already scaled).  valid_lengths i32 [b] or
  // empty (= all s): queries and keys at positions >= valid_lengths[i] are
  // padding; their outputs and lse are 0 and they receive no gradient.
  void attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                         const TensorView& valid_lengths, const TensorView& out,
                         const TensorView& lse, const AttentionParams& params) {
    run(AttentionForwardArgs{q, k, v, valid_lengths, out, lse, params});
  }
  void attention_backward(const TensorView& dout, const TensorView& q, const TensorView& k,
                          const TensorView& v, const TensorView& valid_lengths,
                          const TensorView& out, const TensorView& lse, const TensorView& dq,
                          const TensorView& dk, const TensorView& dv,
                          const AttentionParams& params) {
    run(AttentionBackwardArgs{dout, q, k, v, valid_lengths, out, lse, dq, dk, dv, params});
  }

  // ---- MoD router, top-k, gather, scatter ---------------------------------------
  // logits[i] = x[i] . w;  x [.., d], w [d] (dtype of x), logits [rows] stats.
  void router_forward(const TensorView& x, const TensorView& w, const TensorView& logits) {
    run(RouterForwardArgs{x, w, logits});
  }
  void router_backward(const TensorView& dlogits, const TensorView& x, const TensorView& w,
                       const TensorView& dx, const TensorView& dw) {
    run(RouterBackwardArgs{dlogits, x, w, dx, dw});
  }
  // Per sequence, EXACTLY k = indices.dim(1) positions with the largest logits;
  // ties break toward the lower position; output positions ascending.
  // logits [b, s] (fp32 / fp64), indices i32 [b, k], 1 <= k <= s.
  void topk(const TensorView& logits, const TensorView& indices) { run(TopkArgs{logits, indices}); }
  // Per-sequence k: counts i32 [b] with 0 <= counts[i] <= k_max = indices.dim(1);
  // the first counts[i] slots as in topk, the rest -1.
  void topk_ragged(const TensorView& logits, const TensorView& counts, const TensorView& indices) {
    run(TopkRaggedArgs{logits, counts, indices});
  }
  // mask [b, s] (float) = 1 at the selected positions, 0 elsewhere (-1 skipped):
  // the BCE targets of the MoD auxiliary loss / predictor.
  void topk_mask(const TensorView& indices, const TensorView& mask) {
    run(TopkMaskArgs{indices, mask});
  }
  // out[i, j] = x[i, indices[i, j]]  (zero row for index -1).
  // x [b, s, d], indices i32 [b, k], out [b, k, d].
  void gather_rows_forward(const TensorView& x, const TensorView& indices, const TensorView& out) {
    run(GatherRowsForwardArgs{x, indices, out});
  }
  // dx[i, indices[i, j]] += dout[i, j]
  void gather_rows_backward(const TensorView& dout, const TensorView& indices,
                            const TensorView& dx) {
    run(GatherRowsBackwardArgs{dout, indices, dx});
  }
  // x[i, p] += g(r[i, p]) * delta[i, j] for p = indices[i, j] (-1 skipped), in place.
  // x [b, s, d], indices i32 [b, k], router_logits [b, s] stats, delta [b, k, d].
  // g(r) = r (RouterScale::linear, the paper's eq. 1) or sigmoid(r).
  void scatter_add_scaled_forward(const TensorView& x, const TensorView& indices,
                                  const TensorView& router_logits, const TensorView& delta,
                                  RouterScale gate) {
    run(ScatterAddScaledForwardArgs{x, indices, router_logits, delta, gate});
  }
  // dx = gradient w.r.t. the UPDATED x.  The gradient w.r.t. x before the update
  // is dx itself (identity), so the op only produces
  //   ddelta[i, j] += g(r) dx[i, p],   drouter_logits[i, p] += g'(r) <dx[i, p], delta[i, j]>.
  void scatter_add_scaled_backward(const TensorView& dx, const TensorView& indices,
                                   const TensorView& router_logits, const TensorView& delta,
                                   RouterScale gate, const TensorView& ddelta,
                                   const TensorView& drouter_logits) {
    run(ScatterAddScaledBackwardArgs{dx, indices, router_logits, delta, gate, ddelta,
                                     drouter_logits});
  }

  // ---- depth reads (AttnRes / DAR) ----------------------------------------------
  // For each query q and token t, over sources r = 0..R-1:
  //   s_r = queries[q] . keys[r, t] * key_rstd[r, t]      (no 1/sqrt(d))
  //   out[q, t] = sum_r softmax_r(s) values[r, t],  lse[q, t] = log sum_r exp(s_r)
  // keys, values [R, T, d] (float); key_rstd [R, T], queries [Q, d], lse [Q, T]
  // stats; out [Q, T, d] (float).  keys and values may be the same tensor.
  void depth_read_prefix_forward(const TensorView& keys, const TensorView& key_rstd,
                                 const TensorView& values, const TensorView& queries,
                                 const TensorView& out, const TensorView& lse) {
    run(DepthReadPrefixForwardArgs{keys, key_rstd, values, queries, out, lse});
  }
  // dlse may be empty (= 0).  dkeys gets the full key gradient (through rstd);
  // dkeys and dvalues may be the same tensor.
  void depth_read_prefix_backward(const TensorView& dout, const TensorView& dlse,
                                  const TensorView& keys, const TensorView& key_rstd,
                                  const TensorView& values, const TensorView& queries,
                                  const TensorView& out, const TensorView& lse,
                                  const TensorView& dkeys, const TensorView& dvalues,
                                  const TensorView& dqueries) {
    run(DepthReadPrefixBackwardArgs{dout, dlse, keys, key_rstd, values, queries, out, lse, dkeys,
                                    dvalues, dqueries});
  }
  // Closed-form merge of the partial P into a prefix read (one branch, one stream):
  //   s_P = query . partial_keys[t] * partial_key_rstd[t]
  //   p[t] = sigmoid(s_P - prefix_lse[t]),  out[t] = prefix_out[t] + p (partial_values[t] -
  //   prefix_out[t])
  // prefix_out, partial_keys, partial_values, out [T, d]; prefix_lse,
  // partial_key_rstd, partial_weight (= p, saved for backward) [T]; query [d].
  void depth_read_merge_forward(const TensorView& prefix_out, const TensorView& prefix_lse,
                                const TensorView& partial_keys, const TensorView& partial_key_rstd,
                                const TensorView& partial_values, const TensorView& query,
                                const TensorView& out, const TensorView& partial_weight) {
    run(DepthReadMergeForwardArgs{prefix_out, prefix_lse, partial_keys, partial_key_rstd,
                                  partial_values, query, out, partial_weight});
  }
  void depth_read_merge_backward(const TensorView& dout, const TensorView& prefix_out,
                                 const TensorView& partial_keys, const TensorView& partial_key_rstd,
                                 const TensorView& partial_values, const TensorView& query,
                                 const TensorView& partial_weight, const TensorView& dprefix_out,
                                 const TensorView& dprefix_lse, const TensorView& dpartial_keys,
                                 const TensorView& dpartial_values, const TensorView& dquery) {
    run(DepthReadMergeBackwardArgs{dout, prefix_out, partial_keys, partial_key_rstd, partial_values,
                                   query, partial_weight, dprefix_out, dprefix_lse, dpartial_keys,
                                   dpartial_values, dquery});
  }

  // ---- DAR coefficient head, mix, transport / write -----------------------------
  // retrieved [n, T, d] (float, n >= 2); weight [n*d, outputs], bias [outputs],
  // scale [3] (alpha / beta / transport groups), alpha, beta [T, n],
  // transport [T, n, n] or empty (first branch of a block: no transport),
  // z_rstd [T]: all stats dtype.  outputs = 2n (+1 if n == 2, +n*n if n > 2, when
  // transport is present).  c columns: [0, n) alpha, [n, 2n) beta, then transport
  // (n = 2: rho; n > 2: row-major n x n Sinkhorn logits).
  void dar_coefficients_forward(const TensorView& retrieved, const TensorView& weight,
                                const TensorView& bias, const TensorView& scale,
                                const TensorView& alpha, const TensorView& beta,
                                const TensorView& transport, const TensorView& z_rstd,
                                const DarCoefficientParams& params) {
    run(DarCoefficientsForwardArgs{retrieved, weight, bias, scale, alpha, beta, transport, z_rstd,
                                   params});
  }
  // dtransport may be empty (then no transport gradient); all outputs +=.
  void dar_coefficients_backward(const TensorView& dalpha, const TensorView& dbeta,
                                 const TensorView& dtransport, const TensorView& retrieved,
                                 const TensorView& weight, const TensorView& bias,
                                 const TensorView& scale, const TensorView& alpha,
                                 const TensorView& beta, const TensorView& transport,
                                 const TensorView& z_rstd, const TensorView& dretrieved,
                                 const TensorView& dweight, const TensorView& dbias,
                                 const TensorView& dscale, const DarCoefficientParams& params) {
    run(DarCoefficientsBackwardArgs{dalpha, dbeta, dtransport, retrieved, weight, bias, scale,
                                    alpha, beta, transport, z_rstd, dretrieved, dweight, dbias,
                                    dscale, params});
  }
  // out[t] = sum_j alpha[t, j] retrieved[j, t];  retrieved [n, T, d], alpha [T, n] stats.
  void dar_mix_forward(const TensorView& retrieved, const TensorView& alpha,
                       const TensorView& out) {
    run(DarMixForwardArgs{retrieved, alpha, out});
  }
  void dar_mix_backward(const TensorView& dout, const TensorView& retrieved,
                        const TensorView& alpha, const TensorView& dretrieved,
                        const TensorView& dalpha) {
    run(DarMixBackwardArgs{dout, retrieved, alpha, dretrieved, dalpha});
  }
  // out[j, t] = sum_k transport[t, j, k] partial[k, t] + beta[t, j] y[t]
  // partial, out [n, T, d]; y [T, d]; transport [T, n, n], beta [T, n] stats.
  // transport and partial empty together -> no transport term (P^1 = beta (x) y);
  // beta and y empty together -> pure transport.  out must not alias partial.
  void dar_write_forward(const TensorView& transport, const TensorView& partial,
                         const TensorView& beta, const TensorView& y, const TensorView& out) {
    run(DarWriteForwardArgs{transport, partial, beta, y, out});
  }
  void dar_write_backward(const TensorView& dout, const TensorView& transport,
                          const TensorView& partial, const TensorView& beta, const TensorView& y,
                          const TensorView& dtransport, const TensorView& dpartial,
                          const TensorView& dbeta, const TensorView& dy) {
    run(DarWriteBackwardArgs{dout, transport, partial, beta, y, dtransport, dpartial, dbeta, dy});
  }
  // P' = M P (dar_write with no beta / y).
  void dar_transport_forward(const TensorView& transport, const TensorView& partial,
                             const TensorView& out);
  void dar_transport_backward(const TensorView& dout, const TensorView& transport,
                              const TensorView& partial, const TensorView& dtransport,
                              const TensorView& dpartial);

  // ---- elementwise --------------------------------------------------------------
  // GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
  void gelu_forward(const TensorView& x, const TensorView& out) { run(GeluForwardArgs{x, out}); }
  void gelu_backward(const TensorView& dout, const TensorView& x, const TensorView& dx) {
    run(GeluBackwardArgs{dout, x, dx});
  }
  // SwiGLU: out = silu(gate) * up, silu(a) = a sigmoid(a); gate, up, out [.., f].
  void swiglu_forward(const TensorView& gate, const TensorView& up, const TensorView& out) {
    run(SwigluForwardArgs{gate, up, out});
  }
  void swiglu_backward(const TensorView& dout, const TensorView& gate, const TensorView& up,
                       const TensorView& dgate, const TensorView& dup) {
    run(SwigluBackwardArgs{dout, gate, up, dgate, dup});
  }
  // out = a + b (residual add; out may alias a or b).  Its backward is axpy.
  void add(const TensorView& a, const TensorView& b, const TensorView& out) {
    run(AddArgs{a, b, out});
  }
  // y += alpha x (gradient accumulation; x and y may differ in float dtype).
  void axpy(double alpha, const TensorView& x, const TensorView& y) { run(AxpyArgs{alpha, x, y}); }
  // x *= alpha, in place.
  void scale(const TensorView& x, double alpha) { run(ScaleArgs{x, alpha}); }
  // out = a * b elementwise (e.g. the folded depth query q' = w (.) gamma).
  void mul_forward(const TensorView& a, const TensorView& b, const TensorView& out) {
    run(MulForwardArgs{a, b, out});
  }
  void mul_backward(const TensorView& dout, const TensorView& a, const TensorView& b,
                    const TensorView& da, const TensorView& db) {
    run(MulBackwardArgs{dout, a, b, da, db});
  }

  // ---- losses, embedding, optimizer -----------------------------------------------
  // loss [1] = mean over rows with targets >= 0 of (lse - logits[target]);
  // logits [rows, V] (float); targets i32 [rows] (-1 = ignored); lse [rows] stats.
  void cross_entropy_forward(const TensorView& logits, const TensorView& targets,
                             const TensorView& loss, const TensorView& lse) {
    run(CrossEntropyForwardArgs{logits, targets, loss, lse});
  }
  // dlogits += dloss * (softmax - onehot) / count
  void cross_entropy_backward(double dloss, const TensorView& logits, const TensorView& targets,
                              const TensorView& lse, const TensorView& dlogits) {
    run(CrossEntropyBackwardArgs{dloss, logits, targets, lse, dlogits});
  }
  // loss [1] = mean over rows of BCE(sigmoid(logits), targets); logits, targets [rows] stats.
  void bce_with_logits_forward(const TensorView& logits, const TensorView& targets,
                               const TensorView& loss) {
    run(BceWithLogitsForwardArgs{logits, targets, loss});
  }
  void bce_with_logits_backward(double dloss, const TensorView& logits, const TensorView& targets,
                                const TensorView& dlogits) {
    run(BceWithLogitsBackwardArgs{dloss, logits, targets, dlogits});
  }
  // out[i] = table[tokens[i]]; table [V, d], tokens i32 [..], out [.., d].
  void embedding_forward(const TensorView& table, const TensorView& tokens, const TensorView& out) {
    run(EmbeddingForwardArgs{table, tokens, out});
  }
  void embedding_backward(const TensorView& dout, const TensorView& tokens,
                          const TensorView& dtable) {
    run(EmbeddingBackwardArgs{dout, tokens, dtable});
  }
  // AdamW with decoupled weight decay and bias correction, in place:
  //   g = grad_scale * grads;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
  //   p -= lr * (m / (1-b1^t) / (sqrt(v / (1-b2^t)) + eps) + wd * p)
  // params, m, v: fp32 (master) or fp64; grads: any float dtype, same numel;
  // params_lowp: empty or a bf16 / fp32 copy of the updated params (model weights).
  void adamw_update(const TensorView& params, const TensorView& grads, const TensorView& m,
                    const TensorView& v, const AdamWParams& hyper, const TensorView& params_lowp) {
    run(AdamwUpdateArgs{params, grads, m, v, hyper, params_lowp});
  }

  // ---- Mixture of Experts (MoE FFN, MoDE) ------------------------------------------
  // T tokens (rows), E_total = E real + null experts, top-k; router logits are a
  // gemm x W_r ([d, E_total], stats output).  Null experts are the indices
  // >= E (counts has E entries): their assignments get no row (slot -1).
  //
  // moe_route_forward: probs = softmax(logits) per row ([T, E_total] stats);
  //   indices i32 [T, k] = the k largest logits, in descending order (ties to
  //   the lower expert index, NaN last); gates [T, k] stats = probs at them
  //   (renormalize: divided by their sum).
  // moe_route_backward: dlogits += d/dlogits of sum_j dgates[t, j] gates[t, j]
  //   (through the renormalisation and the softmax; top-k not differentiated).
  void moe_route_forward(const TensorView& logits, const TensorView& probs,
                         const TensorView& indices, const TensorView& gates,
                         const MoeRouteParams& params) {
    run(MoeRouteForwardArgs{logits, probs, indices, gates, params});
  }
  void moe_route_backward(const TensorView& dgates, const TensorView& probs,
                          const TensorView& indices, const TensorView& gates,
                          const TensorView& dlogits, const MoeRouteParams& params) {
    run(MoeRouteBackwardArgs{dgates, probs, indices, gates, dlogits, params});
  }
  // loss [2] stats = {aux, z}:
  //   aux = E_total sum_e f_e P_e,  f_e = (assignments to e) / (T k),
  //         P_e = mean_t probs[t, e]   (Switch / GShard; 1 when uniform),
  //   z   = mean_t (logsumexp_e logits[t, e])^2   (ST-MoE router z-loss).
  // Backward: dlogits += daux d aux / dlogits + dz d z / dlogits (f_e is a
  // count: not differentiated).
  void moe_aux_loss_forward(const TensorView& logits, const TensorView& probs,
                            const TensorView& indices, const TensorView& loss) {
    run(MoeAuxLossForwardArgs{logits, probs, indices, loss});
  }
  void moe_aux_loss_backward(double daux, double dz, const TensorView& logits,
                             const TensorView& probs, const TensorView& indices,
                             const TensorView& dlogits) {
    run(MoeAuxLossBackwardArgs{daux, dz, logits, probs, indices, dlogits});
  }
  // The expert-grouped layout.  counts i32 [E] (out) = rows each real expert
  // receives; slots i32 [T, k] (out) = the row of assignment (t, j) in the
  // grouped layout (expert e's rows are [sum_{e' < e} counts, + counts[e]),
  // in token order), -1 when dropped or null.  capacity > 0: an expert keeps at
  // most `capacity` assignments, in priority order first choices (j = 0) of all
  // tokens first, then j = 1, ...; each in token order (GShard); the rest drop.
  void moe_dispatch(const TensorView& indices, const TensorView& counts, const TensorView& slots,
                    int64_t capacity) {
    run(MoeDispatchArgs{indices, counts, slots, capacity});
  }
  // out[slots[t, j]] = x[t] (rows no slot names: zero); x [.., d] with T rows,
  // out [R, d].  Backward: dx[t] += sum_j dout[slots[t, j]].
  void moe_permute_forward(const TensorView& x, const TensorView& slots, const TensorView& out) {
    run(MoePermuteForwardArgs{x, slots, out});
  }
  void moe_permute_backward(const TensorView& dout, const TensorView& slots,
                            const TensorView& dx) {
    run(MoePermuteBackwardArgs{dout, slots, dx});
  }
  // out[t] = sum_{j: slots[t, j] >= 0} gates[t, j] y[slots[t, j]] (overwrites;
  // zero for a token with no slot).  Backward: dy[slot] += gate dout[t],
  // dgates[t, j] += <dout[t], y[slot]>.
  void moe_unpermute_forward(const TensorView& y, const TensorView& slots, const TensorView& gates,
                             const TensorView& out) {
    run(MoeUnpermuteForwardArgs{y, slots, gates, out});
  }
  void moe_unpermute_backward(const TensorView& dout, const TensorView& y, const TensorView& slots,
                              const TensorView& gates, const TensorView& dy,
                              const TensorView& dgates) {
    run(MoeUnpermuteBackwardArgs{dout, y, slots, gates, dy, dgates});
  }
  // One GEMM per expert over ragged row groups (counts i32 [E], sum <= R):
  //   transpose_a false: a [R, K] grouped rows, b [E, K, N] ([E, N, K] with
  //     transpose_b), c [R, N]: c_e = alpha a_e op(b_e) + beta c_e; rows past
  //     sum(counts) are not touched;
  //   transpose_a true (weight gradient): a [R, K], b [R, N] (no transpose_b),
  //     c [E, K, N]: c_e = alpha a_e^T b_e + beta c_e (an expert with no rows:
  //     c_e = beta c_e).
  // Each expert's GEMM is exactly the gemm op on its rows.
  void grouped_gemm(const TensorView& a, bool transpose_a, const TensorView& b, bool transpose_b,
                    const TensorView& c, const TensorView& counts, double alpha = 1.0,
                    double beta = 0.0) {
    run(GroupedGemmArgs{a, transpose_a, b, transpose_b, c, counts, alpha, beta});
  }

 protected:
  // The one entry point of a backend: run the (already checked) op.  Backends
  // declare MODAR_BACKEND_OPS in their class (one run_op per table row) and
  // define execute with MODAR_BACKEND_EXECUTE (op_args.hpp).
  virtual void execute(const OpArgs& call, const OpGeometry& geometry) = 0;
};

// ---- factory and registry ---------------------------------------------------------
using BackendFactory = std::function<std::unique_ptr<Backend>()>;
// Called by a backend's own translation unit at static initialisation
// (runtime/cuda/cuda_registration.cpp).  A later registration of a name replaces it.
void register_backend(const std::string& name, BackendFactory factory);
// "cpu" or a registered name; anything else -> BackendError listing the allowed
// names.  "cuda" -> BackendError when modar was built without CUDA; the CUDA
// factory throws BackendError when no GPU is present.
std::unique_ptr<Backend> make_backend(const std::string& name);
std::unique_ptr<Backend> make_cpu_backend();
// Defined by the CUDA backend (runtime/cuda, only when built with CUDA; see
// cuda_backend.hpp).  Declared here for code that names it directly (the CUDA
// tests); the core itself only reaches CUDA through the registry.
std::unique_ptr<Backend> make_cuda_backend();
// Names make_backend accepts in this build ("cpu" and, with CUDA, "cuda").
std::vector<std::string> available_backends();

// ---- host helpers (tests, layers, profiler) --------------------------------------
// Values converted to/from the tensor's dtype (i32 values are rounded).
Tensor make_tensor(Backend& backend, const std::vector<int64_t>& shape, ScalarType dtype);
Tensor make_tensor(Backend& backend, const std::vector<int64_t>& shape, ScalarType dtype,
                   const std::vector<double>& values);
void upload(Backend& backend, const std::vector<double>& values, const TensorView& dst);
std::vector<double> download(Backend& backend, const TensorView& src);

}  // namespace modar::runtime
