// modar/runtime/op_checks.hpp: host-side argument checks, one per op.
//
// Backend's public op methods call these before dispatching to a backend's
// *_impl (FlashAttention's flash_api.cpp pattern: every check in ONE place, for
// every backend).  Each throws modar::ShapeError whose message names the op, the
// argument, its shape / dtype / device and what was expected, e.g.
//   "attention_forward: k is [2, 8, 3, 16] fp32 cpu; expected [2, 8, G, 16]
//    with H = 4 divisible by G".
// The argument lists mirror the Backend methods (see backend.hpp for meaning),
// with the backend's device first.
#pragma once

#include "modar/config.hpp"
#include "modar/runtime/backend.hpp"
#include "modar/runtime/tensor.hpp"

namespace modar::runtime {

void check_copy(DeviceKind device, const TensorView& src, const TensorView& dst);
void check_fill(DeviceKind device, const TensorView& dst);
void check_convert(DeviceKind device, const TensorView& src, const TensorView& dst);
void check_gemm(DeviceKind device, const TensorView& a, bool transpose_a, const TensorView& b,
                bool transpose_b, const TensorView& c);
void check_rmsnorm_forward(DeviceKind device, const TensorView& x, const TensorView& weight,
                           const TensorView& out, const TensorView& rstd, double eps);
void check_rmsnorm_backward(DeviceKind device, const TensorView& dout, const TensorView& x,
                            const TensorView& weight, const TensorView& rstd, const TensorView& dx,
                            const TensorView& dweight);
void check_rope(DeviceKind device, const char* op, const TensorView& x, const TensorView& positions,
                const TensorView& out);
void check_attention_forward(DeviceKind device, const TensorView& q, const TensorView& k,
                             const TensorView& v, const TensorView& valid_lengths,
                             const TensorView& out, const TensorView& lse);
void check_attention_backward(DeviceKind device, const TensorView& dout, const TensorView& q,
                              const TensorView& k, const TensorView& v,
                              const TensorView& valid_lengths, const TensorView& out,
                              const TensorView& lse, const TensorView& dq, const TensorView& dk,
                              const TensorView& dv);
void check_router_forward(DeviceKind device, const TensorView& x, const TensorView& w,
                          const TensorView& logits);
void check_router_backward(DeviceKind device, const TensorView& dlogits, const TensorView& x,
                           const TensorView& w, const TensorView& dx, const TensorView& dw);
void check_topk(DeviceKind device, const TensorView& logits, const TensorView& indices);
void check_topk_ragged(DeviceKind device, const TensorView& logits, const TensorView& counts,
                       const TensorView& indices);
void check_topk_mask(DeviceKind device, const TensorView& indices, const TensorView& mask);
void check_gather_rows(DeviceKind device, const char* op, const TensorView& x,
                       const TensorView& indices, const TensorView& out);
void check_scatter_add_scaled(DeviceKind device, const char* op, const TensorView& x,
                              const TensorView& indices, const TensorView& router_logits,
                              const TensorView& delta, const TensorView& ddelta,
                              const TensorView& drouter_logits);
void check_depth_read_prefix_forward(DeviceKind device, const TensorView& keys,
                                     const TensorView& key_rstd, const TensorView& values,
                                     const TensorView& queries, const TensorView& out,
                                     const TensorView& lse);
void check_depth_read_prefix_backward(DeviceKind device, const TensorView& dout,
                                      const TensorView& dlse, const TensorView& keys,
                                      const TensorView& key_rstd, const TensorView& values,
                                      const TensorView& queries, const TensorView& out,
                                      const TensorView& lse, const TensorView& dkeys,
                                      const TensorView& dvalues, const TensorView& dqueries);
void check_depth_read_merge(DeviceKind device, const char* op, const TensorView& prefix_out,
                            const TensorView& prefix_lse, const TensorView& partial_keys,
                            const TensorView& partial_key_rstd, const TensorView& partial_values,
                            const TensorView& query, const TensorView& out,
                            const TensorView& partial_weight);
void check_depth_read_merge_grads(DeviceKind device, const TensorView& prefix_out,
                                  const TensorView& query, const TensorView& dprefix_out,
                                  const TensorView& dprefix_lse, const TensorView& dpartial_keys,
                                  const TensorView& dpartial_values, const TensorView& dquery);
void check_dar_coefficients(DeviceKind device, const char* op, const TensorView& retrieved,
                            const TensorView& weight, const TensorView& bias,
                            const TensorView& scale, const TensorView& alpha,
                            const TensorView& beta, const TensorView& transport,
                            const TensorView& z_rstd, const DarCoefficientParams& params);
void check_dar_coefficients_grads(DeviceKind device, const TensorView& dalpha,
                                  const TensorView& dbeta, const TensorView& dtransport,
                                  const TensorView& retrieved, const TensorView& weight,
                                  const TensorView& bias, const TensorView& scale,
                                  const TensorView& alpha, const TensorView& transport,
                                  const TensorView& dretrieved, const TensorView& dweight,
                                  const TensorView& dbias, const TensorView& dscale);
void check_dar_mix(DeviceKind device, const char* op, const TensorView& retrieved,
                   const TensorView& alpha, const TensorView& out);
void check_dar_write(DeviceKind device, const char* op, const TensorView& transport,
                     const TensorView& partial, const TensorView& beta, const TensorView& y,
                     const TensorView& out);
void check_same_float(DeviceKind device, const char* op, const TensorView& reference,
                      const char* reference_name, const TensorView& other, const char* other_name,
                      bool optional);
void check_axpy(DeviceKind device, const TensorView& x, const TensorView& y);
void check_cross_entropy(DeviceKind device, const char* op, const TensorView& logits,
                         const TensorView& targets, const TensorView& loss, const TensorView& lse);
void check_bce_with_logits(DeviceKind device, const char* op, const TensorView& logits,
                           const TensorView& targets, const TensorView& loss);
void check_embedding(DeviceKind device, const char* op, const TensorView& table,
                     const TensorView& tokens, const TensorView& out);
void check_adamw(DeviceKind device, const TensorView& params, const TensorView& grads,
                 const TensorView& m, const TensorView& v, const AdamWParams& hyper,
                 const TensorView& params_lowp);

}  // namespace modar::runtime
