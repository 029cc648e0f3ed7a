// runtime/backend.cpp: the public (non-virtual) op entry points of Backend, the
// backend factory and the host helpers.  Every entry point runs its check_*
// (runtime/op_checks.cpp) and then the backend's *_impl.
#include "modar/runtime/backend.hpp"

#include <cmath>
#include <cstring>

#include "modar/errors.hpp"
#include "modar/runtime/op_checks.hpp"

namespace modar::runtime {

void Backend::copy(const TensorView& src, const TensorView& dst) {
  check_copy(device(), src, dst);
  copy_impl(src, dst);
}

void Backend::fill(const TensorView& dst, double value) {
  check_fill(device(), dst);
  fill_impl(dst, value);
}

void Backend::convert(const TensorView& src, const TensorView& dst) {
  check_convert(device(), src, dst);
  convert_impl(src, dst);
}

void Backend::gemm(const TensorView& a, bool transpose_a, const TensorView& b, bool transpose_b,
                   const TensorView& c, double alpha, double beta) {
  check_gemm(device(), a, transpose_a, b, transpose_b, c);
  gemm_impl(a, transpose_a, b, transpose_b, c, alpha, beta);
}

void Backend::rmsnorm_forward(const TensorView& x, const TensorView& weight, const TensorView& out,
                              const TensorView& rstd, double eps) {
  check_rmsnorm_forward(device(), x, weight, out, rstd, eps);
  rmsnorm_forward_impl(x, weight, out, rstd, eps);
}

void Backend::rmsnorm_backward(const TensorView& dout, const TensorView& x,
                               const TensorView& weight, const TensorView& rstd,
                               const TensorView& dx, const TensorView& dweight) {
  check_rmsnorm_backward(device(), dout, x, weight, rstd, dx, dweight);
  rmsnorm_backward_impl(dout, x, weight, rstd, dx, dweight);
}

void Backend::rope_forward(const TensorView& x, const TensorView& positions, const TensorView& out,
                           const RopeParams& params) {
  check_rope(device(), "rope_forward", x, positions, out);
  rope_forward_impl(x, positions, out, params);
}

void Backend::rope_backward(const TensorView& dout, const TensorView& positions,
                            const TensorView& dx, const RopeParams& params) {
  check_rope(device(), "rope_backward", dout, positions, dx);
  rope_backward_impl(dout, positions, dx, params);
}

void Backend::attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& valid_lengths, const TensorView& out,
                                const TensorView& lse, const AttentionParams& params) {
  check_attention_forward(device(), q, k, v, valid_lengths, out, lse);
  attention_forward_impl(q, k, v, valid_lengths, out, lse, params);
}

void Backend::attention_backward(const TensorView& dout, const TensorView& q, const TensorView& k,
                                 const TensorView& v, const TensorView& valid_lengths,
                                 const TensorView& out, const TensorView& lse, const TensorView& dq,
                                 const TensorView& dk, const TensorView& dv,
                                 const AttentionParams& params) {
  check_attention_backward(device(), dout, q, k, v, valid_lengths, out, lse, dq, dk, dv);
  attention_backward_impl(dout, q, k, v, valid_lengths, out, lse, dq, dk, dv, params);
}

void Backend::router_forward(const TensorView& x, const TensorView& w, const TensorView& logits) {
  check_router_forward(device(), x, w, logits);
  router_forward_impl(x, w, logits);
}

void Backend::router_backward(const TensorView& dlogits, const TensorView& x, const TensorView& w,
                              const TensorView& dx, const TensorView& dw) {
  check_router_backward(device(), dlogits, x, w, dx, dw);
  router_backward_impl(dlogits, x, w, dx, dw);
}

void Backend::topk(const TensorView& logits, const TensorView& indices) {
  check_topk(device(), logits, indices);
  topk_impl(logits, indices);
}

void Backend::topk_ragged(const TensorView& logits, const TensorView& counts,
                          const TensorView& indices) {
  check_topk_ragged(device(), logits, counts, indices);
  topk_ragged_impl(logits, counts, indices);
}

void Backend::topk_mask(const TensorView& indices, const TensorView& mask) {
  check_topk_mask(device(), indices, mask);
  topk_mask_impl(indices, mask);
}

void Backend::gather_rows_forward(const TensorView& x, const TensorView& indices,
                                  const TensorView& out) {
  check_gather_rows(device(), "gather_rows_forward", x, indices, out);
  gather_rows_forward_impl(x, indices, out);
}

void Backend::gather_rows_backward(const TensorView& dout, const TensorView& indices,
                                   const TensorView& dx) {
  check_gather_rows(device(), "gather_rows_backward", dx, indices, dout);
  gather_rows_backward_impl(dout, indices, dx);
}

void Backend::scatter_add_scaled_forward(const TensorView& x, const TensorView& indices,
                                         const TensorView& router_logits, const TensorView& delta,
                                         RouterScale gate) {
  check_scatter_add_scaled(device(), "scatter_add_scaled_forward", x, indices, router_logits, delta,
                           TensorView{}, TensorView{});
  scatter_add_scaled_forward_impl(x, indices, router_logits, delta, gate);
}

void Backend::scatter_add_scaled_backward(const TensorView& dx, const TensorView& indices,
                                          const TensorView& router_logits, const TensorView& delta,
                                          RouterScale gate, const TensorView& ddelta,
                                          const TensorView& drouter_logits) {
  check_scatter_add_scaled(device(), "scatter_add_scaled_backward", dx, indices, router_logits,
                           delta, ddelta, drouter_logits);
  scatter_add_scaled_backward_impl(dx, indices, router_logits, delta, gate, ddelta, drouter_logits);
}

void Backend::depth_read_prefix_forward(const TensorView& keys, const TensorView& key_rstd,
                                        const TensorView& values, const TensorView& queries,
                                        const TensorView& out, const TensorView& lse) {
  check_depth_read_prefix_forward(device(), keys, key_rstd, values, queries, out, lse);
  depth_read_prefix_forward_impl(keys, key_rstd, values, queries, out, lse);
}

void Backend::depth_read_prefix_backward(const TensorView& dout, const TensorView& dlse,
                                         const TensorView& keys, const TensorView& key_rstd,
                                         const TensorView& values, const TensorView& queries,
                                         const TensorView& out, const TensorView& lse,
                                         const TensorView& dkeys, const TensorView& dvalues,
                                         const TensorView& dqueries) {
  check_depth_read_prefix_backward(device(), dout, dlse, keys, key_rstd, values, queries, out, lse,
                                   dkeys, dvalues, dqueries);
  depth_read_prefix_backward_impl(dout, dlse, keys, key_rstd, values, queries, out, lse, dkeys,
                                  dvalues, dqueries);
}

void Backend::depth_read_merge_forward(const TensorView& prefix_out, const TensorView& prefix_lse,
                                       const TensorView& partial_keys,
                                       const TensorView& partial_key_rstd,
                                       const TensorView& partial_values, const TensorView& query,
                                       const TensorView& out, const TensorView& partial_weight) {
  check_depth_read_merge(device(), "depth_read_merge_forward", prefix_out, prefix_lse, partial_keys,
                         partial_key_rstd, partial_values, query, out, partial_weight);
  if (prefix_lse.empty() || out.empty()) {
    throw ShapeError("depth_read_merge_forward: prefix_lse and out are required");
  }
  depth_read_merge_forward_impl(prefix_out, prefix_lse, partial_keys, partial_key_rstd,
                                partial_values, query, out, partial_weight);
}

void Backend::depth_read_merge_backward(
    const TensorView& dout, const TensorView& prefix_out, const TensorView& partial_keys,
    const TensorView& partial_key_rstd, const TensorView& partial_values, const TensorView& query,
    const TensorView& partial_weight, const TensorView& dprefix_out, const TensorView& dprefix_lse,
    const TensorView& dpartial_keys, const TensorView& dpartial_values, const TensorView& dquery) {
  check_depth_read_merge(device(), "depth_read_merge_backward", prefix_out, TensorView{},
                         partial_keys, partial_key_rstd, partial_values, query, dout,
                         partial_weight);
  check_depth_read_merge_grads(device(), prefix_out, query, dprefix_out, dprefix_lse, dpartial_keys,
                               dpartial_values, dquery);
  depth_read_merge_backward_impl(dout, prefix_out, partial_keys, partial_key_rstd, partial_values,
                                 query, partial_weight, dprefix_out, dprefix_lse, dpartial_keys,
                                 dpartial_values, dquery);
}

void Backend::dar_coefficients_forward(const TensorView& retrieved, const TensorView& weight,
                                       const TensorView& bias, const TensorView& scale,
                                       const TensorView& alpha, const TensorView& beta,
                                       const TensorView& transport, const TensorView& z_rstd,
                                       const DarCoefficientParams& params) {
  check_dar_coefficients(device(), "dar_coefficients_forward", retrieved, weight, bias, scale,
                         alpha, beta, transport, z_rstd, params);
  dar_coefficients_forward_impl(retrieved, weight, bias, scale, alpha, beta, transport, z_rstd,
                                params);
}

void Backend::dar_coefficients_backward(const TensorView& dalpha, const TensorView& dbeta,
                                        const TensorView& dtransport, const TensorView& retrieved,
                                        const TensorView& weight, const TensorView& bias,
                                        const TensorView& scale, const TensorView& alpha,
                                        const TensorView& beta, const TensorView& transport,
                                        const TensorView& z_rstd, const TensorView& dretrieved,
                                        const TensorView& dweight, const TensorView& dbias,
                                        const TensorView& dscale,
                                        const DarCoefficientParams& params) {
  check_dar_coefficients(device(), "dar_coefficients_backward", retrieved, weight, bias, scale,
                         alpha, beta, transport, z_rstd, params);
  check_dar_coefficients_grads(device(), dalpha, dbeta, dtransport, retrieved, weight, bias, scale,
                               alpha, transport, dretrieved, dweight, dbias, dscale);
  dar_coefficients_backward_impl(dalpha, dbeta, dtransport, retrieved, weight, bias, scale, alpha,
                                 beta, transport, z_rstd, dretrieved, dweight, dbias, dscale,
                                 params);
}

void Backend::dar_mix_forward(const TensorView& retrieved, const TensorView& alpha,
                              const TensorView& out) {
  check_dar_mix(device(), "dar_mix_forward", retrieved, alpha, out);
  dar_mix_forward_impl(retrieved, alpha, out);
}

void Backend::dar_mix_backward(const TensorView& dout, const TensorView& retrieved,
                               const TensorView& alpha, const TensorView& dretrieved,
                               const TensorView& dalpha) {
  check_dar_mix(device(), "dar_mix_backward", retrieved, alpha, dout);
  check_same_float(device(), "dar_mix_backward", retrieved, "retrieved", dretrieved, "dretrieved",
                   true);
  check_same_float(device(), "dar_mix_backward", alpha, "alpha", dalpha, "dalpha", true);
  dar_mix_backward_impl(dout, retrieved, alpha, dretrieved, dalpha);
}

void Backend::dar_write_forward(const TensorView& transport, const TensorView& partial,
                                const TensorView& beta, const TensorView& y,
                                const TensorView& out) {
  check_dar_write(device(), "dar_write_forward", transport, partial, beta, y, out);
  dar_write_forward_impl(transport, partial, beta, y, out);
}

void Backend::dar_write_backward(const TensorView& dout, const TensorView& transport,
                                 const TensorView& partial, const TensorView& beta,
                                 const TensorView& y, const TensorView& dtransport,
                                 const TensorView& dpartial, const TensorView& dbeta,
                                 const TensorView& dy) {
  check_dar_write(device(), "dar_write_backward", transport, partial, beta, y, dout);
  const char* op = "dar_write_backward";
  if (!transport.empty()) {
    check_same_float(device(), op, transport, "transport", dtransport, "dtransport", true);
    check_same_float(device(), op, partial, "partial", dpartial, "dpartial", true);
  }
  if (!y.empty()) {
    check_same_float(device(), op, beta, "beta", dbeta, "dbeta", true);
    check_same_float(device(), op, y, "y", dy, "dy", true);
  }
  dar_write_backward_impl(dout, transport, partial, beta, y, dtransport, dpartial, dbeta, dy);
}

void Backend::dar_transport_forward(const TensorView& transport, const TensorView& partial,
                                    const TensorView& out) {
  dar_write_forward(transport, partial, TensorView{}, TensorView{}, out);
}

void Backend::dar_transport_backward(const TensorView& dout, const TensorView& transport,
                                     const TensorView& partial, const TensorView& dtransport,
                                     const TensorView& dpartial) {
  dar_write_backward(dout, transport, partial, TensorView{}, TensorView{}, dtransport, dpartial,
                     TensorView{}, TensorView{});
}

void Backend::gelu_forward(const TensorView& x, const TensorView& out) {
  check_same_float(device(), "gelu_forward", x, "x", out, "out", false);
  gelu_forward_impl(x, out);
}

void Backend::gelu_backward(const TensorView& dout, const TensorView& x, const TensorView& dx) {
  check_same_float(device(), "gelu_backward", x, "x", dout, "dout", false);
  check_same_float(device(), "gelu_backward", x, "x", dx, "dx", false);
  gelu_backward_impl(dout, x, dx);
}

void Backend::swiglu_forward(const TensorView& gate, const TensorView& up, const TensorView& out) {
  check_same_float(device(), "swiglu_forward", gate, "gate", up, "up", false);
  check_same_float(device(), "swiglu_forward", gate, "gate", out, "out", false);
  swiglu_forward_impl(gate, up, out);
}

void Backend::swiglu_backward(const TensorView& dout, const TensorView& gate, const TensorView& up,
                              const TensorView& dgate, const TensorView& dup) {
  const char* op = "swiglu_backward";
  check_same_float(device(), op, gate, "gate", up, "up", false);
  check_same_float(device(), op, gate, "gate", dout, "dout", false);
  check_same_float(device(), op, gate, "gate", dgate, "dgate", true);
  check_same_float(device(), op, up, "up", dup, "dup", true);
  swiglu_backward_impl(dout, gate, up, dgate, dup);
}

void Backend::add(const TensorView& a, const TensorView& b, const TensorView& out) {
  check_same_float(device(), "add", a, "a", b, "b", false);
  check_same_float(device(), "add", a, "a", out, "out", false);
  add_impl(a, b, out);
}

void Backend::axpy(double alpha, const TensorView& x, const TensorView& y) {
  check_axpy(device(), x, y);
  axpy_impl(alpha, x, y);
}

void Backend::scale(const TensorView& x, double alpha) {
  check_same_float(device(), "scale", x, "x", x, "x", false);
  scale_impl(x, alpha);
}

void Backend::mul_forward(const TensorView& a, const TensorView& b, const TensorView& out) {
  check_same_float(device(), "mul_forward", a, "a", b, "b", false);
  check_same_float(device(), "mul_forward", a, "a", out, "out", false);
  mul_forward_impl(a, b, out);
}

void Backend::mul_backward(const TensorView& dout, const TensorView& a, const TensorView& b,
                           const TensorView& da, const TensorView& db) {
  const char* op = "mul_backward";
  check_same_float(device(), op, a, "a", b, "b", false);
  check_same_float(device(), op, a, "a", dout, "dout", false);
  check_same_float(device(), op, a, "a", da, "da", true);
  check_same_float(device(), op, b, "b", db, "db", true);
  mul_backward_impl(dout, a, b, da, db);
}

void Backend::cross_entropy_forward(const TensorView& logits, const TensorView& targets,
                                    const TensorView& loss, const TensorView& lse) {
  check_cross_entropy(device(), "cross_entropy_forward", logits, targets, loss, lse);
  if (loss.empty())
    throw ShapeError("cross_entropy_forward: loss is missing");
  cross_entropy_forward_impl(logits, targets, loss, lse);
}

void Backend::cross_entropy_backward(double dloss, const TensorView& logits,
                                     const TensorView& targets, const TensorView& lse,
                                     const TensorView& dlogits) {
  check_cross_entropy(device(), "cross_entropy_backward", logits, targets, TensorView{}, lse);
  check_same_float(device(), "cross_entropy_backward", logits, "logits", dlogits, "dlogits", false);
  cross_entropy_backward_impl(dloss, logits, targets, lse, dlogits);
}

void Backend::bce_with_logits_forward(const TensorView& logits, const TensorView& targets,
                                      const TensorView& loss) {
  check_bce_with_logits(device(), "bce_with_logits_forward", logits, targets, loss);
  if (loss.empty())
    throw ShapeError("bce_with_logits_forward: loss is missing");
  bce_with_logits_forward_impl(logits, targets, loss);
}

void Backend::bce_with_logits_backward(double dloss, const TensorView& logits,
                                       const TensorView& targets, const TensorView& dlogits) {
  check_bce_with_logits(device(), "bce_with_logits_backward", logits, targets, TensorView{});
  check_same_float(device(), "bce_with_logits_backward", logits, "logits", dlogits, "dlogits",
                   false);
  bce_with_logits_backward_impl(dloss, logits, targets, dlogits);
}

void Backend::embedding_forward(const TensorView& table, const TensorView& tokens,
                                const TensorView& out) {
  check_embedding(device(), "embedding_forward", table, tokens, out);
  if (out.dtype != table.dtype) {
    throw ShapeError("embedding_forward: out is " + out.describe() + "; expected dtype " +
                     to_string(table.dtype) + " of table");
  }
  embedding_forward_impl(table, tokens, out);
}

void Backend::embedding_backward(const TensorView& dout, const TensorView& tokens,
                                 const TensorView& dtable) {
  check_embedding(device(), "embedding_backward", dtable, tokens, dout);
  embedding_backward_impl(dout, tokens, dtable);
}

void Backend::adamw_update(const TensorView& params, const TensorView& grads, const TensorView& m,
                           const TensorView& v, const AdamWParams& hyper,
                           const TensorView& params_lowp) {
  check_adamw(device(), params, grads, m, v, hyper, params_lowp);
  adamw_update_impl(params, grads, m, v, hyper, params_lowp);
}

// ---- factory --------------------------------------------------------------------

std::vector<std::string> available_backends() {
#if defined(MODAR_WITH_CUDA)
  return {"cpu", "cuda"};
#else
  return {"cpu"};
#endif
}

std::unique_ptr<Backend> make_backend(const std::string& name) {
  if (name == "cpu")
    return make_cpu_backend();
  if (name == "cuda") {
#if defined(MODAR_WITH_CUDA)
    return make_cuda_backend();
#else
    throw BackendError(
        "backend = cuda: this build of modar has no CUDA backend (configure with "
        "-DMODAR_CUDA=ON on a machine with the CUDA toolkit); available: cpu");
#endif
  }
  std::string allowed;
  for (const std::string& available : available_backends()) {
    allowed += (allowed.empty() ? "" : ", ") + available;
  }
  throw BackendError("backend = " + name + ": unknown; allowed: " + allowed);
}

// ---- host helpers ---------------------------------------------------------------

Tensor make_tensor(Backend& backend, const std::vector<int64_t>& shape, ScalarType dtype) {
  return Tensor(backend, shape, dtype);
}

Tensor make_tensor(Backend& backend, const std::vector<int64_t>& shape, ScalarType dtype,
                   const std::vector<double>& values) {
  Tensor tensor(backend, shape, dtype);
  upload(backend, values, tensor);
  return tensor;
}

void upload(Backend& backend, const std::vector<double>& values, const TensorView& dst) {
  if (static_cast<int64_t>(values.size()) != dst.numel()) {
    throw ShapeError("upload: " + std::to_string(values.size()) + " values for tensor " +
                     dst.describe());
  }
  std::vector<unsigned char> staging(static_cast<size_t>(dst.bytes()));
  for (size_t i = 0; i < values.size(); ++i) {
    switch (dst.dtype) {
      case ScalarType::fp64: {
        const double value = values[i];
        std::memcpy(staging.data() + i * 8, &value, 8);
        break;
      }
      case ScalarType::fp32: {
        const float value = static_cast<float>(values[i]);
        std::memcpy(staging.data() + i * 4, &value, 4);
        break;
      }
      case ScalarType::bf16: {
        const uint16_t value = float_to_bf16(static_cast<float>(values[i]));
        std::memcpy(staging.data() + i * 2, &value, 2);
        break;
      }
      case ScalarType::i32: {
        const int32_t value = static_cast<int32_t>(std::lround(values[i]));
        std::memcpy(staging.data() + i * 4, &value, 4);
        break;
      }
    }
  }
  backend.copy_from_host(staging.data(), dst);
}

std::vector<double> download(Backend& backend, const TensorView& src) {
  std::vector<unsigned char> staging(static_cast<size_t>(src.bytes()));
  backend.copy_to_host(src, staging.data());
  std::vector<double> values(static_cast<size_t>(src.numel()));
  for (size_t i = 0; i < values.size(); ++i) {
    switch (src.dtype) {
      case ScalarType::fp64: {
        double value;
        std::memcpy(&value, staging.data() + i * 8, 8);
        values[i] = value;
        break;
      }
      case ScalarType::fp32: {
        float value;
        std::memcpy(&value, staging.data() + i * 4, 4);
        values[i] = value;
        break;
      }
      case ScalarType::bf16: {
        uint16_t value;
        std::memcpy(&value, staging.data() + i * 2, 2);
        values[i] = bf16_to_float(value);
        break;
      }
      case ScalarType::i32: {
        int32_t value;
        std::memcpy(&value, staging.data() + i * 4, 4);
        values[i] = value;
        break;
      }
    }
  }
  return values;
}

}  // namespace modar::runtime
