// runtime/validate_trace.cpp: a Backend that forwards every call to another
// backend and counts what was executed, mapped to the op vocabulary (ops.hpp),
// so `modar validate` can compare the runtime's executed op list with lower().
//
// The mapping follows cost_models/lowering.cpp's naming: a gather's backward
// (gather_rows_backward) is a scatter_add op and a scatter's backward a gather
// op; dar_mix belongs to dar_coefficients; GELU / SwiGLU / add / axpy / scale /
// mul / BCE are elementwise.  copy / fill / convert are counted as calls only.
#include <chrono>

#include "validate_internal.hpp"

namespace modar::runtime::validate_detail {

TracingBackend::Scope TracingBackend::timed(OpKind kind) {
  if (!recording_) {
    return Scope(nullptr, kind);
  }
  ++executed_.calls;
  ++executed_.calls_by_kind[static_cast<size_t>(kind)];
  return Scope(this, kind);
}

// Each recorded op is timed on its own (synchronised before and after), so the
// traced step also gives the measured time per op kind.
TracingBackend::Scope::Scope(TracingBackend* owner, OpKind kind) : owner_(owner), kind_(kind) {
  if (owner_ != nullptr) {
    owner_->inner_.synchronize();
    start_ = std::chrono::steady_clock::now();
  }
}

TracingBackend::Scope::~Scope() {
  if (owner_ != nullptr) {
    owner_->inner_.synchronize();
    owner_->executed_.measured_by_kind_s[static_cast<size_t>(kind_)] +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
}

void TracingBackend::copy_impl(const TensorView& src, const TensorView& dst) {
  if (recording_)
    ++executed_.calls;
  inner_.copy(src, dst);
}
void TracingBackend::fill_impl(const TensorView& dst, double value) {
  if (recording_)
    ++executed_.calls;
  inner_.fill(dst, value);
}
void TracingBackend::convert_impl(const TensorView& src, const TensorView& dst) {
  if (recording_)
    ++executed_.calls;
  inner_.convert(src, dst);
}

void TracingBackend::gemm_impl(const TensorView& a, bool transpose_a, const TensorView& b,
                               bool transpose_b, const TensorView& c, double alpha, double beta) {
  const Scope scope = timed(OpKind::gemm);
  if (recording_) {
    OpShape shape;
    shape.kind = OpKind::gemm;
    shape.dtype = dtype_;
    int64_t batch = 1;
    TensorView a2 = a, b2 = b;
    if (a.rank == 3 && b.rank == 3 && c.rank == 3) {
      batch = a.dim(0);
      a2 = reshape(a, {a.dim(1), a.dim(2)});
      b2 = reshape(b, {b.dim(1), b.dim(2)});
    } else {
      a2 = flatten_rows(a);
      b2 = flatten_rows(b);
    }
    const int64_t m = transpose_a ? a2.dim(1) : a2.dim(0);
    const int64_t k = transpose_a ? a2.dim(0) : a2.dim(1);
    const int64_t n = transpose_b ? b2.dim(0) : b2.dim(1);
    shape.dims = {m, n, k, batch, 0, 0, 0};
    gemm_shapes_.push_back(shape);
    ++executed_.gemm_calls;
    executed_.gemm_flops += 2.0 * static_cast<double>(m) * n * k * batch;
  }
  inner_.gemm(a, transpose_a, b, transpose_b, c, alpha, beta);
}

void TracingBackend::rmsnorm_forward_impl(const TensorView& x, const TensorView& weight,
                                          const TensorView& out, const TensorView& rstd,
                                          double eps) {
  const Scope scope = timed(OpKind::rmsnorm);
  inner_.rmsnorm_forward(x, weight, out, rstd, eps);
}
void TracingBackend::rmsnorm_backward_impl(const TensorView& dout, const TensorView& x,
                                           const TensorView& weight, const TensorView& rstd,
                                           const TensorView& dx, const TensorView& dweight) {
  const Scope scope = timed(OpKind::rmsnorm);
  inner_.rmsnorm_backward(dout, x, weight, rstd, dx, dweight);
}
void TracingBackend::rope_forward_impl(const TensorView& x, const TensorView& positions,
                                       const TensorView& out, const RopeParams& params) {
  const Scope scope = timed(OpKind::rope);
  inner_.rope_forward(x, positions, out, params);
}
void TracingBackend::rope_backward_impl(const TensorView& dout, const TensorView& positions,
                                        const TensorView& dx, const RopeParams& params) {
  const Scope scope = timed(OpKind::rope);
  inner_.rope_backward(dout, positions, dx, params);
}
void TracingBackend::attention_forward_impl(const TensorView& q, const TensorView& k,
                                            const TensorView& v, const TensorView& valid_lengths,
                                            const TensorView& out, const TensorView& lse,
                                            const AttentionParams& params) {
  const Scope scope = timed(OpKind::attention);
  inner_.attention_forward(q, k, v, valid_lengths, out, lse, params);
}
void TracingBackend::attention_backward_impl(const TensorView& dout, const TensorView& q,
                                             const TensorView& k, const TensorView& v,
                                             const TensorView& valid_lengths, const TensorView& out,
                                             const TensorView& lse, const TensorView& dq,
                                             const TensorView& dk, const TensorView& dv,
                                             const AttentionParams& params) {
  const Scope scope = timed(OpKind::attention);
  inner_.attention_backward(dout, q, k, v, valid_lengths, out, lse, dq, dk, dv, params);
}
void TracingBackend::router_forward_impl(const TensorView& x, const TensorView& w,
                                         const TensorView& logits) {
  const Scope scope = timed(OpKind::router);
  inner_.router_forward(x, w, logits);
}
void TracingBackend::router_backward_impl(const TensorView& dlogits, const TensorView& x,
                                          const TensorView& w, const TensorView& dx,
                                          const TensorView& dw) {
  const Scope scope = timed(OpKind::router);
  inner_.router_backward(dlogits, x, w, dx, dw);
}
void TracingBackend::topk_impl(const TensorView& logits, const TensorView& indices) {
  const Scope scope = timed(OpKind::topk);
  inner_.topk(logits, indices);
}
void TracingBackend::topk_ragged_impl(const TensorView& logits, const TensorView& counts,
                                      const TensorView& indices) {
  const Scope scope = timed(OpKind::topk);
  inner_.topk_ragged(logits, counts, indices);
}
void TracingBackend::topk_mask_impl(const TensorView& indices, const TensorView& mask) {
  const Scope scope = timed(OpKind::elementwise);
  inner_.topk_mask(indices, mask);
}
void TracingBackend::gather_rows_forward_impl(const TensorView& x, const TensorView& indices,
                                              const TensorView& out) {
  const Scope scope = timed(OpKind::gather);
  inner_.gather_rows_forward(x, indices, out);
}
void TracingBackend::gather_rows_backward_impl(const TensorView& dout, const TensorView& indices,
                                               const TensorView& dx) {
  const Scope scope = timed(OpKind::scatter_add);
  inner_.gather_rows_backward(dout, indices, dx);
}
void TracingBackend::scatter_add_scaled_forward_impl(const TensorView& x, const TensorView& indices,
                                                     const TensorView& router_logits,
                                                     const TensorView& delta, RouterScale gate) {
  const Scope scope = timed(OpKind::scatter_add);
  inner_.scatter_add_scaled_forward(x, indices, router_logits, delta, gate);
}
void TracingBackend::scatter_add_scaled_backward_impl(const TensorView& dx,
                                                      const TensorView& indices,
                                                      const TensorView& router_logits,
                                                      const TensorView& delta, RouterScale gate,
                                                      const TensorView& ddelta,
                                                      const TensorView& drouter_logits) {
  const Scope scope = timed(OpKind::gather);
  inner_.scatter_add_scaled_backward(dx, indices, router_logits, delta, gate, ddelta,
                                     drouter_logits);
}
void TracingBackend::depth_read_prefix_forward_impl(const TensorView& keys,
                                                    const TensorView& key_rstd,
                                                    const TensorView& values,
                                                    const TensorView& queries,
                                                    const TensorView& out, const TensorView& lse) {
  const Scope scope = timed(OpKind::depth_read_prefix);
  inner_.depth_read_prefix_forward(keys, key_rstd, values, queries, out, lse);
}
void TracingBackend::depth_read_prefix_backward_impl(
    const TensorView& dout, const TensorView& dlse, const TensorView& keys,
    const TensorView& key_rstd, const TensorView& values, const TensorView& queries,
    const TensorView& out, const TensorView& lse, const TensorView& dkeys,
    const TensorView& dvalues, const TensorView& dqueries) {
  const Scope scope = timed(OpKind::depth_read_prefix);
  inner_.depth_read_prefix_backward(dout, dlse, keys, key_rstd, values, queries, out, lse, dkeys,
                                    dvalues, dqueries);
}
void TracingBackend::depth_read_merge_forward_impl(
    const TensorView& prefix_out, const TensorView& prefix_lse, const TensorView& partial_keys,
    const TensorView& partial_key_rstd, const TensorView& partial_values, const TensorView& query,
    const TensorView& out, const TensorView& partial_weight) {
  const Scope scope = timed(OpKind::depth_read_merge);
  inner_.depth_read_merge_forward(prefix_out, prefix_lse, partial_keys, partial_key_rstd,
                                  partial_values, query, out, partial_weight);
}
void TracingBackend::depth_read_merge_backward_impl(
    const TensorView& dout, const TensorView& prefix_out, const TensorView& partial_keys,
    const TensorView& partial_key_rstd, const TensorView& partial_values, const TensorView& query,
    const TensorView& partial_weight, const TensorView& dprefix_out, const TensorView& dprefix_lse,
    const TensorView& dpartial_keys, const TensorView& dpartial_values, const TensorView& dquery) {
  const Scope scope = timed(OpKind::depth_read_merge);
  inner_.depth_read_merge_backward(dout, prefix_out, partial_keys, partial_key_rstd, partial_values,
                                   query, partial_weight, dprefix_out, dprefix_lse, dpartial_keys,
                                   dpartial_values, dquery);
}
void TracingBackend::dar_coefficients_forward_impl(
    const TensorView& retrieved, const TensorView& weight, const TensorView& bias,
    const TensorView& scale, const TensorView& alpha, const TensorView& beta,
    const TensorView& transport, const TensorView& z_rstd, const DarCoefficientParams& params) {
  const Scope scope = timed(OpKind::dar_coefficients);
  inner_.dar_coefficients_forward(retrieved, weight, bias, scale, alpha, beta, transport, z_rstd,
                                  params);
}
void TracingBackend::dar_coefficients_backward_impl(
    const TensorView& dalpha, const TensorView& dbeta, const TensorView& dtransport,
    const TensorView& retrieved, const TensorView& weight, const TensorView& bias,
    const TensorView& scale, const TensorView& alpha, const TensorView& beta,
    const TensorView& transport, const TensorView& z_rstd, const TensorView& dretrieved,
    const TensorView& dweight, const TensorView& dbias, const TensorView& dscale,
    const DarCoefficientParams& params) {
  const Scope scope = timed(OpKind::dar_coefficients);
  inner_.dar_coefficients_backward(dalpha, dbeta, dtransport, retrieved, weight, bias, scale, alpha,
                                   beta, transport, z_rstd, dretrieved, dweight, dbias, dscale,
                                   params);
}
void TracingBackend::dar_mix_forward_impl(const TensorView& retrieved, const TensorView& alpha,
                                          const TensorView& out) {
  const Scope scope = timed(OpKind::dar_coefficients);
  inner_.dar_mix_forward(retrieved, alpha, out);
}
void TracingBackend::dar_mix_backward_impl(const TensorView& dout, const TensorView& retrieved,
                                           const TensorView& alpha, const TensorView& dretrieved,
                                           const TensorView& dalpha) {
  const Scope scope = timed(OpKind::dar_coefficients);
  inner_.dar_mix_backward(dout, retrieved, alpha, dretrieved, dalpha);
}
void TracingBackend::dar_write_forward_impl(const TensorView& transport, const TensorView& partial,
                                            const TensorView& beta, const TensorView& y,
                                            const TensorView& out) {
  const Scope scope = timed(OpKind::dar_write);
  inner_.dar_write_forward(transport, partial, beta, y, out);
}
void TracingBackend::dar_write_backward_impl(const TensorView& dout, const TensorView& transport,
                                             const TensorView& partial, const TensorView& beta,
                                             const TensorView& y, const TensorView& dtransport,
                                             const TensorView& dpartial, const TensorView& dbeta,
                                             const TensorView& dy) {
  const Scope scope = timed(OpKind::dar_write);
  inner_.dar_write_backward(dout, transport, partial, beta, y, dtransport, dpartial, dbeta, dy);
}
void TracingBackend::gelu_forward_impl(const TensorView& x, const TensorView& out) {
  const Scope scope = timed(OpKind::elementwise);
  inner_.gelu_forward(x, out);
}
void TracingBackend::gelu_backward_impl(const TensorView& dout, const TensorView& x,
                                        const TensorView& dx) {
  const Scope scope = timed(OpKind::elementwise);
  inner_.gelu_backward(dout, x, dx);
}
void TracingBackend::swiglu_forward_impl(const TensorView& gate, const TensorView& up,
                                         const TensorView& out) {
  const Scope scope = timed(OpKind::elementwise);
  inner_.swiglu_forward(gate, up, out);
}
void TracingBackend::swiglu_backward_impl(const TensorView& dout, const TensorView& gate,
                                          const TensorView& up, const TensorView& dgate,
                                          const TensorView& dup) {
  const Scope scope = timed(OpKind::elementwise);
  inner_.swiglu_backward(dout, gate, up, dgate, dup);
}
void TracingBackend::add_impl(const TensorView& a, const TensorView& b, const TensorView& out) {
  const Scope scope = timed(OpKind::elementwise);
  inner_.add(a, b, out);
}
void TracingBackend::axpy_impl(double alpha, const TensorView& x, const TensorView& y) {
  const Scope scope = timed(OpKind::elementwise);
  inner_.axpy(alpha, x, y);
}
void TracingBackend::scale_impl(const TensorView& x, double alpha) {
  const Scope scope = timed(OpKind::elementwise);
  inner_.scale(x, alpha);
}
void TracingBackend::mul_forward_impl(const TensorView& a, const TensorView& b,
                                      const TensorView& out) {
  const Scope scope = timed(OpKind::elementwise);
  inner_.mul_forward(a, b, out);
}
void TracingBackend::mul_backward_impl(const TensorView& dout, const TensorView& a,
                                       const TensorView& b, const TensorView& da,
                                       const TensorView& db) {
  const Scope scope = timed(OpKind::elementwise);
  inner_.mul_backward(dout, a, b, da, db);
}
void TracingBackend::cross_entropy_forward_impl(const TensorView& logits, const TensorView& targets,
                                                const TensorView& loss, const TensorView& lse) {
  const Scope scope = timed(OpKind::cross_entropy);
  inner_.cross_entropy_forward(logits, targets, loss, lse);
}
void TracingBackend::cross_entropy_backward_impl(double dloss, const TensorView& logits,
                                                 const TensorView& targets, const TensorView& lse,
                                                 const TensorView& dlogits) {
  const Scope scope = timed(OpKind::cross_entropy);
  inner_.cross_entropy_backward(dloss, logits, targets, lse, dlogits);
}
void TracingBackend::bce_with_logits_forward_impl(const TensorView& logits,
                                                  const TensorView& targets,
                                                  const TensorView& loss) {
  const Scope scope = timed(OpKind::elementwise);
  inner_.bce_with_logits_forward(logits, targets, loss);
}
void TracingBackend::bce_with_logits_backward_impl(double dloss, const TensorView& logits,
                                                   const TensorView& targets,
                                                   const TensorView& dlogits) {
  const Scope scope = timed(OpKind::elementwise);
  inner_.bce_with_logits_backward(dloss, logits, targets, dlogits);
}
void TracingBackend::embedding_forward_impl(const TensorView& table, const TensorView& tokens,
                                            const TensorView& out) {
  const Scope scope = timed(OpKind::embedding);
  inner_.embedding_forward(table, tokens, out);
}
void TracingBackend::embedding_backward_impl(const TensorView& dout, const TensorView& tokens,
                                             const TensorView& dtable) {
  const Scope scope = timed(OpKind::embedding);
  inner_.embedding_backward(dout, tokens, dtable);
}
void TracingBackend::adamw_update_impl(const TensorView& params, const TensorView& grads,
                                       const TensorView& m, const TensorView& v,
                                       const AdamWParams& hyper, const TensorView& params_lowp) {
  const Scope scope = timed(OpKind::optimizer_update);
  inner_.adamw_update(params, grads, m, v, hyper, params_lowp);
}

}  // namespace modar::runtime::validate_detail
