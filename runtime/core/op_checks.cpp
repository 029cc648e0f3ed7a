// runtime/core/op_checks.cpp: the argument checks of every op, shared by every
// backend (check() of include/modar/runtime/op_args.hpp), and the op table's
// name lookup.  Rules common to all ops:
//   * every required tensor is non-null and lives on the backend's device;
//   * data tensors of one op share one float dtype; statistics are in
//     stats_type(data); indices are i32;
//   * gradient outputs are optional (empty) or shaped like their input;
//     parameter gradients may be the parameter's dtype or fp32.
#include <cstring>
#include <initializer_list>
#include <sstream>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "modar/base/errors.hpp"
#include "modar/runtime/op_args.hpp"
#include "op_checker.hpp"

namespace modar::runtime {
namespace {

using detail::Checker;
using detail::dims_text;

void check_copy(DeviceKind device, const TensorView& src, const TensorView& dst) {
  Checker c("copy", device);
  c.present("src", src);
  c.present("dst", dst);
  c.require(src.dtype == dst.dtype && src.numel() == dst.numel(),
            "src " + src.describe() + " and dst " + dst.describe() +
                " must have the same dtype and element count");
}

void check_fill(DeviceKind device, const TensorView& dst) {
  Checker("fill", device).present("dst", dst);
}

void check_convert(DeviceKind device, const TensorView& src, const TensorView& dst) {
  Checker c("convert", device);
  c.floating("src", src);
  c.floating("dst", dst);
  c.require(src.numel() == dst.numel(), "src " + src.describe() + " and dst " + dst.describe() +
                                            " must have the same element count");
}

void check_gemm(DeviceKind device, const TensorView& a, bool transpose_a, const TensorView& b,
                bool transpose_b, const TensorView& c) {
  Checker k("gemm", device);
  k.floating("a", a);
  k.floating("b", b);
  k.floating("c", c);
  k.require(a.dtype == b.dtype,
            "a " + a.describe() + " and b " + b.describe() + " must share a dtype");
  k.require(c.dtype == a.dtype || c.dtype == ScalarType::fp32,
            "c " + c.describe() + " must have the dtype of a (" + to_string(a.dtype) + ") or fp32");
  const bool batched = a.rank == 3 && b.rank == 3 && c.rank == 3;
  int64_t batch = 1;
  int64_t a_rows, a_cols, b_rows, b_cols, c_rows, c_cols;
  if (batched) {
    batch = a.shape[0];
    k.require(b.shape[0] == batch && c.shape[0] == batch, "batched gemm needs one batch size: a " +
                                                              a.describe() + ", b " + b.describe() +
                                                              ", c " + c.describe());
    a_rows = a.shape[1], a_cols = a.shape[2], b_rows = b.shape[1], b_cols = b.shape[2];
    c_rows = c.shape[1], c_cols = c.shape[2];
  } else {
    a_rows = a.rows(), a_cols = a.dim(-1), b_rows = b.rows(), b_cols = b.dim(-1);
    c_rows = c.rows(), c_cols = c.dim(-1);
  }
  const int64_t m = transpose_a ? a_cols : a_rows;
  const int64_t k_a = transpose_a ? a_rows : a_cols;
  const int64_t k_b = transpose_b ? b_cols : b_rows;
  const int64_t n = transpose_b ? b_rows : b_cols;
  k.require(k_a == k_b, std::string("inner dimensions differ: op(a) is ") + dims_text({m, k_a}) +
                            " from a " + a.describe() + (transpose_a ? " (transposed)" : "") +
                            ", op(b) is " + dims_text({k_b, n}) + " from b " + b.describe() +
                            (transpose_b ? " (transposed)" : ""));
  k.require(c_rows == m && c_cols == n,
            "c is " + c.describe() + "; expected " + dims_text({m, n}) + " (as rows x columns)");
}

void check_rmsnorm_forward(DeviceKind device, const TensorView& x, const TensorView& weight,
                           const TensorView& out, const TensorView& rstd, double eps) {
  Checker c("rmsnorm_forward", device);
  c.floating("x", x);
  const int64_t d = x.dim(-1);
  if (!weight.empty()) {
    c.shape("weight", weight, {d});
    c.dtype("weight", weight, x.dtype);
  }
  c.optional_like("out", out, "x", x);
  c.stats("rstd", rstd, x.dtype, {x.rows()});
  c.require(eps >= 0.0, "eps = " + std::to_string(eps) + ": must be >= 0");
}

void check_rmsnorm_backward(DeviceKind device, const TensorView& dout, const TensorView& x,
                            const TensorView& weight, const TensorView& rstd, const TensorView& dx,
                            const TensorView& dweight) {
  Checker c("rmsnorm_backward", device);
  c.floating("x", x);
  c.like("dout", dout, "x", x);
  if (!weight.empty()) {
    c.shape("weight", weight, {x.dim(-1)});
    c.dtype("weight", weight, x.dtype);
    c.optional_param_grad("dweight", dweight, "weight", weight);
  } else {
    c.require(dweight.empty(), "dweight given without weight");
  }
  c.stats("rstd", rstd, x.dtype, {x.rows()});
  c.optional_like("dx", dx, "x", x);
}

void check_rope(DeviceKind device, const char* op, const TensorView& x, const TensorView& positions,
                const TensorView& out) {
  Checker c(op, device);
  c.floating("x", x);
  c.require(x.rank >= 2, "x is " + x.describe() + "; expected [.., heads, d_h]");
  c.require(x.dim(-1) % 2 == 0, "x is " + x.describe() + "; d_h must be even");
  c.dtype("positions", positions, ScalarType::i32);
  c.numel("positions", positions, x.rows() / x.dim(-2));
  c.like("out", out, "x", x);
}

void check_attention_forward(DeviceKind device, const TensorView& q, const TensorView& k,
                             const TensorView& v, const TensorView& valid_lengths,
                             const TensorView& out, const TensorView& lse) {
  Checker c("attention_forward", device);
  c.floating("q", q);
  c.shape("q", q, {-1, -1, -1, -1});
  const int64_t b = q.shape[0], s = q.shape[1], heads = q.shape[2], d_h = q.shape[3];
  c.shape("k", k, {b, s, -1, d_h});
  c.dtype("k", k, q.dtype);
  const int64_t kv_heads = k.shape[2];
  c.require(kv_heads > 0 && heads % kv_heads == 0,
            "k is " + k.describe() + "; expected [" + std::to_string(b) + ", " + std::to_string(s) +
                ", G, " + std::to_string(d_h) + "] with H = " + std::to_string(heads) +
                " divisible by G");
  c.like("v", v, "k", k);
  if (!valid_lengths.empty()) {
    c.dtype("valid_lengths", valid_lengths, ScalarType::i32);
    c.shape("valid_lengths", valid_lengths, {b});
  }
  c.like("out", out, "q", q);
  c.stats("lse", lse, q.dtype, {b, heads, s});
}

void check_attention_backward(DeviceKind device, const TensorView& dout, const TensorView& q,
                              const TensorView& k, const TensorView& v,
                              const TensorView& valid_lengths, const TensorView& out,
                              const TensorView& lse, const TensorView& dq, const TensorView& dk,
                              const TensorView& dv) {
  check_attention_forward(device, q, k, v, valid_lengths, out, lse);
  Checker c("attention_backward", device);
  c.like("dout", dout, "q", q);
  c.optional_like("dq", dq, "q", q);
  c.optional_like("dk", dk, "k", k);
  c.optional_like("dv", dv, "v", v);
}

void check_router_forward(DeviceKind device, const TensorView& x, const TensorView& w,
                          const TensorView& logits) {
  Checker c("router_forward", device);
  c.floating("x", x);
  c.shape("w", w, {x.dim(-1)});
  c.dtype("w", w, x.dtype);
  c.dtype("logits", logits, stats_type(x.dtype));
  c.numel("logits", logits, x.rows());
}

void check_router_backward(DeviceKind device, const TensorView& dlogits, const TensorView& x,
                           const TensorView& w, const TensorView& dx, const TensorView& dw) {
  check_router_forward(device, x, w, dlogits);
  Checker c("router_backward", device);
  c.optional_like("dx", dx, "x", x);
  c.optional_param_grad("dw", dw, "w", w);
}

void check_logits_2d(const Checker& c, const TensorView& logits) {
  c.shape("logits", logits, {-1, -1});
  c.require(logits.dtype == ScalarType::fp32 || logits.dtype == ScalarType::fp64,
            "logits is " + logits.describe() + "; expected fp32 or fp64");
}

void check_topk(DeviceKind device, const TensorView& logits, const TensorView& indices) {
  Checker c("topk", device);
  check_logits_2d(c, logits);
  c.dtype("indices", indices, ScalarType::i32);
  c.shape("indices", indices, {logits.shape[0], -1});
  c.require(indices.shape[1] >= 1 && indices.shape[1] <= logits.shape[1],
            "k = " + std::to_string(indices.shape[1]) + " (indices " + indices.describe() +
                "): must be in [1, s = " + std::to_string(logits.shape[1]) + "]");
}

void check_topk_ragged(DeviceKind device, const TensorView& logits, const TensorView& counts,
                       const TensorView& indices) {
  Checker c("topk_ragged", device);
  check_logits_2d(c, logits);
  c.dtype("counts", counts, ScalarType::i32);
  c.shape("counts", counts, {logits.shape[0]});
  c.dtype("indices", indices, ScalarType::i32);
  c.shape("indices", indices, {logits.shape[0], -1});
  c.require(indices.shape[1] <= logits.shape[1],
            "k_max = " + std::to_string(indices.shape[1]) + " (indices " + indices.describe() +
                "): must be <= s = " + std::to_string(logits.shape[1]));
}

void check_topk_mask(DeviceKind device, const TensorView& indices, const TensorView& mask) {
  Checker c("topk_mask", device);
  c.dtype("indices", indices, ScalarType::i32);
  c.shape("indices", indices, {-1, -1});
  c.floating("mask", mask);
  c.shape("mask", mask, {indices.shape[0], -1});
  c.require(indices.shape[1] <= mask.shape[1], "indices " + indices.describe() +
                                                   " has more slots than mask " + mask.describe() +
                                                   " has positions");
}

void check_gather_rows(DeviceKind device, const char* op, const TensorView& x,
                       const TensorView& indices, const TensorView& out) {
  Checker c(op, device);
  c.floating("x", x);
  c.shape("x", x, {-1, -1, -1});
  c.dtype("indices", indices, ScalarType::i32);
  c.shape("indices", indices, {x.shape[0], -1});
  c.shape("out", out, {x.shape[0], indices.shape[1], x.shape[2]});
  c.dtype("out", out, x.dtype);
  c.require(indices.shape[1] <= x.shape[1], "indices " + indices.describe() +
                                                " selects more rows than x " + x.describe() +
                                                " has per sequence");
}

void check_scatter_add_scaled(DeviceKind device, const char* op, const TensorView& x,
                              const TensorView& indices, const TensorView& router_logits,
                              const TensorView& delta, const TensorView& ddelta,
                              const TensorView& drouter_logits) {
  Checker c(op, device);
  c.floating("x", x);
  c.shape("x", x, {-1, -1, -1});
  const int64_t b = x.shape[0], s = x.shape[1], d = x.shape[2];
  c.dtype("indices", indices, ScalarType::i32);
  c.shape("indices", indices, {b, -1});
  c.require(indices.shape[1] <= s, "indices " + indices.describe() + " has more slots than x " +
                                       x.describe() + " has positions");
  c.stats("router_logits", router_logits, x.dtype, {b, s});
  c.shape("delta", delta, {b, indices.shape[1], d});
  c.dtype("delta", delta, x.dtype);
  c.optional_like("ddelta", ddelta, "delta", delta);
  c.optional_like("drouter_logits", drouter_logits, "router_logits", router_logits);
}

void check_depth_read_prefix_forward(DeviceKind device, const TensorView& keys,
                                     const TensorView& key_rstd, const TensorView& values,
                                     const TensorView& queries, const TensorView& out,
                                     const TensorView& lse) {
  Checker c("depth_read_prefix", device);
  c.floating("keys", keys);
  c.shape("keys", keys, {-1, -1, -1});
  const int64_t sources = keys.shape[0], tokens = keys.shape[1], d = keys.shape[2];
  c.require(sources >= 1, "keys is " + keys.describe() + "; at least one source is needed");
  c.stats("key_rstd", key_rstd, keys.dtype, {sources, tokens});
  c.like("values", values, "keys", keys);
  c.stats("queries", queries, keys.dtype, {-1, d});
  const int64_t count = queries.shape[0];
  c.shape("out", out, {count, tokens, d});
  c.dtype("out", out, keys.dtype);
  c.stats("lse", lse, keys.dtype, {count, tokens});
}

void check_depth_read_prefix_backward(DeviceKind device, const TensorView& dout,
                                      const TensorView& dlse, const TensorView& keys,
                                      const TensorView& key_rstd, const TensorView& values,
                                      const TensorView& queries, const TensorView& out,
                                      const TensorView& lse, const TensorView& dkeys,
                                      const TensorView& dvalues, const TensorView& dqueries) {
  check_depth_read_prefix_forward(device, keys, key_rstd, values, queries, out, lse);
  Checker c("depth_read_prefix_backward", device);
  c.like("dout", dout, "out", out);
  c.optional_like("dlse", dlse, "lse", lse);
  c.optional_like("dkeys", dkeys, "keys", keys);
  c.optional_like("dvalues", dvalues, "values", values);
  c.optional_like("dqueries", dqueries, "queries", queries);
}

void check_depth_read_merge(DeviceKind device, const char* op, const TensorView& prefix_out,
                            const TensorView& prefix_lse, const TensorView& partial_keys,
                            const TensorView& partial_key_rstd, const TensorView& partial_values,
                            const TensorView& query, const TensorView& out,
                            const TensorView& partial_weight) {
  Checker c(op, device);
  c.floating("prefix_out", prefix_out);
  c.shape("prefix_out", prefix_out, {-1, -1});
  const int64_t tokens = prefix_out.shape[0], d = prefix_out.shape[1];
  if (!prefix_lse.empty())
    c.stats("prefix_lse", prefix_lse, prefix_out.dtype, {tokens});
  c.like("partial_keys", partial_keys, "prefix_out", prefix_out);
  c.stats("partial_key_rstd", partial_key_rstd, prefix_out.dtype, {tokens});
  c.like("partial_values", partial_values, "prefix_out", prefix_out);
  c.stats("query", query, prefix_out.dtype, {d});
  if (!out.empty())
    c.like("out", out, "prefix_out", prefix_out);
  c.stats("partial_weight", partial_weight, prefix_out.dtype, {tokens});
}

void check_depth_read_merge_grads(DeviceKind device, const TensorView& prefix_out,
                                  const TensorView& query, const TensorView& dprefix_out,
                                  const TensorView& dprefix_lse, const TensorView& dpartial_keys,
                                  const TensorView& dpartial_values, const TensorView& dquery) {
  Checker c("depth_read_merge_backward", device);
  c.optional_like("dprefix_out", dprefix_out, "prefix_out", prefix_out);
  if (!dprefix_lse.empty()) {
    c.stats("dprefix_lse", dprefix_lse, prefix_out.dtype, {prefix_out.shape[0]});
  }
  c.optional_like("dpartial_keys", dpartial_keys, "prefix_out", prefix_out);
  c.optional_like("dpartial_values", dpartial_values, "prefix_out", prefix_out);
  c.optional_like("dquery", dquery, "query", query);
}

void check_dar_coefficients(DeviceKind device, const char* op, const TensorView& retrieved,
                            const TensorView& weight, const TensorView& bias,
                            const TensorView& scale, const TensorView& alpha,
                            const TensorView& beta, const TensorView& transport,
                            const TensorView& z_rstd, const DarCoefficientParams& params) {
  Checker c(op, device);
  c.floating("retrieved", retrieved);
  c.shape("retrieved", retrieved, {-1, -1, -1});
  const int64_t n = retrieved.shape[0], tokens = retrieved.shape[1], d = retrieved.shape[2];
  c.require(n >= 2, "retrieved is " + retrieved.describe() +
                        "; the coefficient head needs n >= 2 streams (n = 1 bypasses it)");
  const ScalarType data = retrieved.dtype;
  const int64_t outputs = 2 * n + (transport.empty() ? 0 : (n == 2 ? int64_t{1} : n * n));
  c.stats("weight", weight, data, {n * d, outputs});
  c.stats("bias", bias, data, {outputs});
  c.stats("scale", scale, data, {3});
  c.stats("alpha", alpha, data, {tokens, n});
  c.stats("beta", beta, data, {tokens, n});
  if (!transport.empty())
    c.stats("transport", transport, data, {tokens, n, n});
  c.stats("z_rstd", z_rstd, data, {tokens});
  c.require(
      params.sinkhorn_iterations >= 1 || n == 2,
      "sinkhorn_iterations = " + std::to_string(params.sinkhorn_iterations) + ": must be >= 1");
  c.require(params.eps >= 0.0, "eps = " + std::to_string(params.eps) + ": must be >= 0");
}

void check_dar_coefficients_grads(DeviceKind device, const TensorView& dalpha,
                                  const TensorView& dbeta, const TensorView& dtransport,
                                  const TensorView& retrieved, const TensorView& weight,
                                  const TensorView& bias, const TensorView& scale,
                                  const TensorView& alpha, const TensorView& transport,
                                  const TensorView& dretrieved, const TensorView& dweight,
                                  const TensorView& dbias, const TensorView& dscale) {
  Checker c("dar_coefficients_backward", device);
  c.like("dalpha", dalpha, "alpha", alpha);
  c.like("dbeta", dbeta, "alpha", alpha);
  if (!dtransport.empty()) {
    c.require(!transport.empty(), "dtransport given without transport");
    c.like("dtransport", dtransport, "transport", transport);
  }
  c.optional_like("dretrieved", dretrieved, "retrieved", retrieved);
  c.optional_like("dweight", dweight, "weight", weight);
  c.optional_like("dbias", dbias, "bias", bias);
  c.optional_like("dscale", dscale, "scale", scale);
}

void check_dar_mix(DeviceKind device, const char* op, const TensorView& retrieved,
                   const TensorView& alpha, const TensorView& out) {
  Checker c(op, device);
  c.floating("retrieved", retrieved);
  c.shape("retrieved", retrieved, {-1, -1, -1});
  const int64_t n = retrieved.shape[0], tokens = retrieved.shape[1], d = retrieved.shape[2];
  c.stats("alpha", alpha, retrieved.dtype, {tokens, n});
  c.shape("out", out, {tokens, d});
  c.dtype("out", out, retrieved.dtype);
}

void check_dar_write(DeviceKind device, const char* op, const TensorView& transport,
                     const TensorView& partial, const TensorView& beta, const TensorView& y,
                     const TensorView& out) {
  Checker c(op, device);
  c.floating("out", out);
  c.shape("out", out, {-1, -1, -1});
  const int64_t n = out.shape[0], tokens = out.shape[1], d = out.shape[2];
  c.require(transport.empty() == partial.empty(),
            "transport and partial must be given together (or both empty)");
  c.require(beta.empty() == y.empty(), "beta and y must be given together (or both empty)");
  c.require(!(transport.empty() && beta.empty()), "nothing to write: all inputs empty");
  if (!partial.empty()) {
    c.like("partial", partial, "out", out);
    c.stats("transport", transport, out.dtype, {tokens, n, n});
    c.require(partial.data != out.data, "out must not alias partial");
  }
  if (!y.empty()) {
    c.shape("y", y, {tokens, d});
    c.dtype("y", y, out.dtype);
    c.stats("beta", beta, out.dtype, {tokens, n});
  }
}

// A tensor named in a check: its argument name and view.
struct Named {
  const char* name;
  const TensorView& view;
};

// `reference` is floating; every `required` tensor has its shape and dtype, and
// so does every `optional` one that is given (the gradients a caller may skip).
void check_like(DeviceKind device, const char* op, Named reference,
                std::initializer_list<Named> required, std::initializer_list<Named> optional = {}) {
  Checker c(op, device);
  c.floating(reference.name, reference.view);
  for (const Named& t : required) {
    c.like(t.name, t.view, reference.name, reference.view);
  }
  for (const Named& t : optional) {
    c.optional_like(t.name, t.view, reference.name, reference.view);
  }
}

void check_axpy(DeviceKind device, const TensorView& x, const TensorView& y) {
  Checker c("axpy", device);
  c.floating("x", x);
  c.floating("y", y);
  c.require(x.numel() == y.numel(),
            "x " + x.describe() + " and y " + y.describe() + " must have the same element count");
}

void check_cross_entropy(DeviceKind device, const char* op, const TensorView& logits,
                         const TensorView& targets, const TensorView& loss, const TensorView& lse) {
  Checker c(op, device);
  c.floating("logits", logits);
  c.require(logits.rank >= 2, "logits is " + logits.describe() + "; expected [.., V]");
  c.dtype("targets", targets, ScalarType::i32);
  c.numel("targets", targets, logits.rows());
  if (!loss.empty())
    c.stats("loss", loss, logits.dtype, {1});
  c.stats("lse", lse, logits.dtype, {logits.rows()});
}

void check_bce_with_logits(DeviceKind device, const char* op, const TensorView& logits,
                           const TensorView& targets, const TensorView& loss) {
  Checker c(op, device);
  c.floating("logits", logits);
  c.require(logits.dtype != ScalarType::bf16,
            "logits is " + logits.describe() + "; expected fp32 or fp64 (statistics)");
  c.like("targets", targets, "logits", logits);
  if (!loss.empty())
    c.stats("loss", loss, logits.dtype, {1});
}

void check_embedding(DeviceKind device, const char* op, const TensorView& table,
                     const TensorView& tokens, const TensorView& out) {
  Checker c(op, device);
  c.floating("table", table);
  c.shape("table", table, {-1, -1});
  c.dtype("tokens", tokens, ScalarType::i32);
  c.floating("out", out);
  c.require(
      out.rank == tokens.rank + 1 && out.dim(-1) == table.shape[1] && out.rows() == tokens.numel(),
      "out is " + out.describe() + "; expected the shape of tokens " + tokens.describe() +
          " plus d = " + std::to_string(table.shape[1]));
}

void check_adamw(DeviceKind device, const TensorView& params, const TensorView& grads,
                 const TensorView& m, const TensorView& v, const AdamWParams& hyper,
                 const TensorView& params_lowp) {
  Checker c("adamw_update", device);
  c.floating("params", params);
  c.require(params.dtype == ScalarType::fp32 || params.dtype == ScalarType::fp64,
            "params is " + params.describe() + "; master weights must be fp32 or fp64");
  c.floating("grads", grads);
  c.numel("grads", grads, params.numel());
  c.like("m", m, "params", params);
  c.like("v", v, "params", params);
  if (!params_lowp.empty()) {
    c.floating("params_lowp", params_lowp);
    c.numel("params_lowp", params_lowp, params.numel());
  }
  c.require(hyper.step >= 1, "step = " + std::to_string(hyper.step) + ": must be >= 1");
  c.require(hyper.beta1 >= 0.0 && hyper.beta1 < 1.0 && hyper.beta2 >= 0.0 && hyper.beta2 < 1.0,
            "beta1 / beta2 must be in [0, 1)");
  c.require(hyper.epsilon > 0.0, "epsilon must be > 0");
}

}  // namespace

// ---- one check per op, returning the resolved geometry ------------------------------

namespace {

// Inner dims of a GEMM already checked by check_gemm: m, n, k, batch.
OpGeometry gemm_geometry(const GemmArgs& call) {
  const TensorView &a = call.a, &b = call.b;
  const bool batched = a.rank == 3 && b.rank == 3 && call.c.rank == 3;
  // Rows and columns of each operand as a matrix (per batch entry when batched).
  const int64_t a_rows = batched ? a.dim(1) : a.rows(), a_cols = a.dim(-1);
  const int64_t b_rows = batched ? b.dim(1) : b.rows(), b_cols = b.dim(-1);
  const int64_t m = call.transpose_a ? a_cols : a_rows;
  const int64_t k = call.transpose_a ? a_rows : a_cols;
  const int64_t n = call.transpose_b ? b_rows : b_cols;
  return OpGeometry::of(a.dtype, GemmDims{.m = m, .n = n, .k = k, .batch = batched ? a.dim(0) : 1});
}

// The ops over rows of a [.., width] tensor: rmsnorm, router, gather, scatter_add,
// cross_entropy (width = vocab), embedding.
template <class Dims>
OpGeometry rows_geometry(const TensorView& x) {
  return OpGeometry::of(x.dtype, Dims{x.rows(), x.dim(-1)});
}

OpGeometry elementwise_geometry(const TensorView& x, int64_t inputs, int64_t outputs) {
  return OpGeometry::of(
      x.dtype, ElementwiseDims{.elements = x.numel(), .inputs = inputs, .outputs = outputs});
}

}  // namespace

OpGeometry check(DeviceKind device, const CopyArgs& call) {
  check_copy(device, call.src, call.dst);
  return OpGeometry::of(call.src.dtype, ElementwiseDims{.elements = call.src.numel()});
}

OpGeometry check(DeviceKind device, const FillArgs& call) {
  check_fill(device, call.dst);
  return OpGeometry::of(call.dst.dtype, ElementwiseDims{.elements = call.dst.numel()});
}

OpGeometry check(DeviceKind device, const ConvertArgs& call) {
  check_convert(device, call.src, call.dst);
  return OpGeometry::of(call.src.dtype, ElementwiseDims{.elements = call.src.numel()});
}

OpGeometry check(DeviceKind device, const GemmArgs& call) {
  check_gemm(device, call.a, call.transpose_a, call.b, call.transpose_b, call.c);
  return gemm_geometry(call);
}

OpGeometry check(DeviceKind device, const RmsnormForwardArgs& call) {
  check_rmsnorm_forward(device, call.x, call.weight, call.out, call.rstd, call.eps);
  return rows_geometry<RmsnormDims>(call.x);
}

OpGeometry check(DeviceKind device, const RmsnormBackwardArgs& call) {
  check_rmsnorm_backward(device, call.dout, call.x, call.weight, call.rstd, call.dx, call.dweight);
  return rows_geometry<RmsnormDims>(call.x);
}

OpGeometry check(DeviceKind device, const RopeForwardArgs& call) {
  check_rope(device, "rope_forward", call.x, call.positions, call.out);
  return OpGeometry::of(call.x.dtype, RopeDims{.rows = call.positions.numel(),
                                               .heads = call.x.dim(-2),
                                               .head_dim = call.x.dim(-1)});
}

OpGeometry check(DeviceKind device, const RopeBackwardArgs& call) {
  check_rope(device, "rope_backward", call.dout, call.positions, call.dx);
  return OpGeometry::of(call.dout.dtype, RopeDims{.rows = call.positions.numel(),
                                                  .heads = call.dout.dim(-2),
                                                  .head_dim = call.dout.dim(-1)});
}

namespace {
OpGeometry attention_geometry(const TensorView& q, const TensorView& k,
                              const AttentionParams& params) {
  return OpGeometry::of(q.dtype, AttentionDims{.sequences = q.dim(0),
                                               .heads = q.dim(2),
                                               .kv_heads = k.dim(2),
                                               .query_len = q.dim(1),
                                               .key_len = k.dim(1),
                                               .head_dim = q.dim(3),
                                               .causal = params.causal ? 1 : 0});
}
}  // namespace

OpGeometry check(DeviceKind device, const AttentionForwardArgs& call) {
  check_attention_forward(device, call.q, call.k, call.v, call.valid_lengths, call.out, call.lse);
  return attention_geometry(call.q, call.k, call.params);
}

OpGeometry check(DeviceKind device, const AttentionBackwardArgs& call) {
  check_attention_backward(device, call.dout, call.q, call.k, call.v, call.valid_lengths, call.out,
                           call.lse, call.dq, call.dk, call.dv);
  return attention_geometry(call.q, call.k, call.params);
}

OpGeometry check(DeviceKind device, const RouterForwardArgs& call) {
  check_router_forward(device, call.x, call.w, call.logits);
  return rows_geometry<RouterDims>(call.x);
}

OpGeometry check(DeviceKind device, const RouterBackwardArgs& call) {
  check_router_backward(device, call.dlogits, call.x, call.w, call.dx, call.dw);
  return rows_geometry<RouterDims>(call.x);
}

OpGeometry check(DeviceKind device, const TopkArgs& call) {
  check_topk(device, call.logits, call.indices);
  return OpGeometry::of(call.logits.dtype, TopkDims{.sequences = call.logits.dim(0),
                                                    .seq_len = call.logits.dim(1),
                                                    .k = call.indices.dim(1)});
}

OpGeometry check(DeviceKind device, const TopkRaggedArgs& call) {
  check_topk_ragged(device, call.logits, call.counts, call.indices);
  return OpGeometry::of(call.logits.dtype, TopkDims{.sequences = call.logits.dim(0),
                                                    .seq_len = call.logits.dim(1),
                                                    .k = call.indices.dim(1)});
}

OpGeometry check(DeviceKind device, const TopkMaskArgs& call) {
  check_topk_mask(device, call.indices, call.mask);
  return elementwise_geometry(call.mask, 1, 1);
}

// Gather / scatter: rows moved (b * k) and the row width d.
OpGeometry check(DeviceKind device, const GatherRowsForwardArgs& call) {
  check_gather_rows(device, "gather_rows_forward", call.x, call.indices, call.out);
  return rows_geometry<GatherDims>(call.out);
}

OpGeometry check(DeviceKind device, const GatherRowsBackwardArgs& call) {
  check_gather_rows(device, "gather_rows_backward", call.dx, call.indices, call.dout);
  return rows_geometry<ScatterAddDims>(call.dout);
}

OpGeometry check(DeviceKind device, const ScatterAddScaledForwardArgs& call) {
  check_scatter_add_scaled(device, "scatter_add_scaled_forward", call.x, call.indices,
                           call.router_logits, call.delta, TensorView{}, TensorView{});
  return rows_geometry<ScatterAddDims>(call.delta);
}

OpGeometry check(DeviceKind device, const ScatterAddScaledBackwardArgs& call) {
  check_scatter_add_scaled(device, "scatter_add_scaled_backward", call.dx, call.indices,
                           call.router_logits, call.delta, call.ddelta, call.drouter_logits);
  return rows_geometry<GatherDims>(call.delta);
}

// Depth reads: T, sources, queries, d (one output stream per call).
OpGeometry check(DeviceKind device, const DepthReadPrefixForwardArgs& call) {
  check_depth_read_prefix_forward(device, call.keys, call.key_rstd, call.values, call.queries,
                                  call.out, call.lse);
  return OpGeometry::of(call.keys.dtype, DepthReadPrefixDims{.tokens = call.keys.dim(1),
                                                             .sources = call.keys.dim(0),
                                                             .queries = call.queries.dim(0),
                                                             .width = call.keys.dim(2),
                                                             .streams = 1});
}

OpGeometry check(DeviceKind device, const DepthReadPrefixBackwardArgs& call) {
  check_depth_read_prefix_backward(device, call.dout, call.dlse, call.keys, call.key_rstd,
                                   call.values, call.queries, call.out, call.lse, call.dkeys,
                                   call.dvalues, call.dqueries);
  return OpGeometry::of(call.keys.dtype, DepthReadPrefixDims{.tokens = call.keys.dim(1),
                                                             .sources = call.keys.dim(0),
                                                             .queries = call.queries.dim(0),
                                                             .width = call.keys.dim(2),
                                                             .streams = 1});
}

// Merge: T, 1 stream, d.
OpGeometry check(DeviceKind device, const DepthReadMergeForwardArgs& call) {
  check_depth_read_merge(device, "depth_read_merge_forward", call.prefix_out, call.prefix_lse,
                         call.partial_keys, call.partial_key_rstd, call.partial_values, call.query,
                         call.out, call.partial_weight);
  if (call.prefix_lse.empty() || call.out.empty()) {
    throw ShapeError("depth_read_merge_forward: prefix_lse and out are required");
  }
  return OpGeometry::of(call.prefix_out.dtype, DepthReadMergeDims{.tokens = call.prefix_out.dim(0),
                                                                  .streams = 1,
                                                                  .width = call.prefix_out.dim(1)});
}

OpGeometry check(DeviceKind device, const DepthReadMergeBackwardArgs& call) {
  check_depth_read_merge(device, "depth_read_merge_backward", call.prefix_out, TensorView{},
                         call.partial_keys, call.partial_key_rstd, call.partial_values, call.query,
                         call.dout, call.partial_weight);
  check_depth_read_merge_grads(device, call.prefix_out, call.query, call.dprefix_out,
                               call.dprefix_lse, call.dpartial_keys, call.dpartial_values,
                               call.dquery);
  return OpGeometry::of(call.prefix_out.dtype, DepthReadMergeDims{.tokens = call.prefix_out.dim(0),
                                                                  .streams = 1,
                                                                  .width = call.prefix_out.dim(1)});
}

// DAR head / mix / write: T, n, d.
OpGeometry check(DeviceKind device, const DarCoefficientsForwardArgs& call) {
  check_dar_coefficients(device, "dar_coefficients_forward", call.retrieved, call.weight, call.bias,
                         call.scale, call.alpha, call.beta, call.transport, call.z_rstd,
                         call.params);
  const TensorView& r = call.retrieved;
  return OpGeometry::of(r.dtype, DarCoefficientsDims{.tokens = r.dim(1),
                                                     .streams = r.dim(0),
                                                     .width = r.dim(2),
                                                     .outputs = call.weight.dim(1)});
}

OpGeometry check(DeviceKind device, const DarCoefficientsBackwardArgs& call) {
  check_dar_coefficients(device, "dar_coefficients_backward", call.retrieved, call.weight,
                         call.bias, call.scale, call.alpha, call.beta, call.transport, call.z_rstd,
                         call.params);
  check_dar_coefficients_grads(device, call.dalpha, call.dbeta, call.dtransport, call.retrieved,
                               call.weight, call.bias, call.scale, call.alpha, call.transport,
                               call.dretrieved, call.dweight, call.dbias, call.dscale);
  const TensorView& r = call.retrieved;
  return OpGeometry::of(r.dtype, DarCoefficientsDims{.tokens = r.dim(1),
                                                     .streams = r.dim(0),
                                                     .width = r.dim(2),
                                                     .outputs = call.weight.dim(1)});
}

OpGeometry check(DeviceKind device, const DarMixForwardArgs& call) {
  check_dar_mix(device, "dar_mix_forward", call.retrieved, call.alpha, call.out);
  const TensorView& r = call.retrieved;
  return OpGeometry::of(
      r.dtype, DarCoefficientsDims{.tokens = r.dim(1), .streams = r.dim(0), .width = r.dim(2)});
}

OpGeometry check(DeviceKind device, const DarMixBackwardArgs& call) {
  const char* op = "dar_mix_backward";
  check_dar_mix(device, op, call.retrieved, call.alpha, call.dout);
  check_like(device, op, {"retrieved", call.retrieved}, {}, {{"dretrieved", call.dretrieved}});
  check_like(device, op, {"alpha", call.alpha}, {}, {{"dalpha", call.dalpha}});
  const TensorView& r = call.retrieved;
  return OpGeometry::of(
      r.dtype, DarCoefficientsDims{.tokens = r.dim(1), .streams = r.dim(0), .width = r.dim(2)});
}

OpGeometry check(DeviceKind device, const DarWriteForwardArgs& call) {
  check_dar_write(device, "dar_write_forward", call.transport, call.partial, call.beta, call.y,
                  call.out);
  const TensorView& o = call.out;
  return OpGeometry::of(o.dtype, DarWriteDims{.tokens = o.dim(1),
                                              .streams = o.dim(0),
                                              .width = o.dim(2),
                                              .mode = call.transport.empty() ? 0 : 1});
}

OpGeometry check(DeviceKind device, const DarWriteBackwardArgs& call) {
  const char* op = "dar_write_backward";
  check_dar_write(device, op, call.transport, call.partial, call.beta, call.y, call.dout);
  if (!call.transport.empty()) {
    check_like(device, op, {"transport", call.transport}, {}, {{"dtransport", call.dtransport}});
    check_like(device, op, {"partial", call.partial}, {}, {{"dpartial", call.dpartial}});
  }
  if (!call.y.empty()) {
    check_like(device, op, {"beta", call.beta}, {}, {{"dbeta", call.dbeta}});
    check_like(device, op, {"y", call.y}, {}, {{"dy", call.dy}});
  }
  const TensorView& o = call.dout;
  return OpGeometry::of(o.dtype, DarWriteDims{.tokens = o.dim(1),
                                              .streams = o.dim(0),
                                              .width = o.dim(2),
                                              .mode = call.transport.empty() ? 0 : 1});
}

OpGeometry check(DeviceKind device, const GeluForwardArgs& call) {
  check_like(device, "gelu_forward", {"x", call.x}, {{"out", call.out}});
  return elementwise_geometry(call.x, 1, 1);
}

OpGeometry check(DeviceKind device, const GeluBackwardArgs& call) {
  check_like(device, "gelu_backward", {"x", call.x}, {{"dout", call.dout}, {"dx", call.dx}});
  return elementwise_geometry(call.x, 2, 1);
}

OpGeometry check(DeviceKind device, const SwigluForwardArgs& call) {
  check_like(device, "swiglu_forward", {"gate", call.gate}, {{"up", call.up}, {"out", call.out}});
  return elementwise_geometry(call.gate, 2, 1);
}

OpGeometry check(DeviceKind device, const SwigluBackwardArgs& call) {
  const char* op = "swiglu_backward";
  check_like(device, op, {"gate", call.gate}, {{"up", call.up}, {"dout", call.dout}},
             {{"dgate", call.dgate}});
  check_like(device, op, {"up", call.up}, {}, {{"dup", call.dup}});
  return elementwise_geometry(call.gate, 3, 2);
}

OpGeometry check(DeviceKind device, const AddArgs& call) {
  check_like(device, "add", {"a", call.a}, {{"b", call.b}, {"out", call.out}});
  return elementwise_geometry(call.a, 2, 1);
}

OpGeometry check(DeviceKind device, const AxpyArgs& call) {
  check_axpy(device, call.x, call.y);
  return elementwise_geometry(call.x, 2, 1);
}

OpGeometry check(DeviceKind device, const ScaleArgs& call) {
  check_like(device, "scale", {"x", call.x}, {});
  return elementwise_geometry(call.x, 1, 1);
}

OpGeometry check(DeviceKind device, const MulForwardArgs& call) {
  check_like(device, "mul_forward", {"a", call.a}, {{"b", call.b}, {"out", call.out}});
  return elementwise_geometry(call.a, 2, 1);
}

OpGeometry check(DeviceKind device, const MulBackwardArgs& call) {
  const char* op = "mul_backward";
  check_like(device, op, {"a", call.a}, {{"b", call.b}, {"dout", call.dout}}, {{"da", call.da}});
  check_like(device, op, {"b", call.b}, {}, {{"db", call.db}});
  return elementwise_geometry(call.a, 3, 2);
}

OpGeometry check(DeviceKind device, const CrossEntropyForwardArgs& call) {
  check_cross_entropy(device, "cross_entropy_forward", call.logits, call.targets, call.loss,
                      call.lse);
  if (call.loss.empty())
    throw ShapeError("cross_entropy_forward: loss is missing");
  return rows_geometry<CrossEntropyDims>(call.logits);
}

OpGeometry check(DeviceKind device, const CrossEntropyBackwardArgs& call) {
  check_cross_entropy(device, "cross_entropy_backward", call.logits, call.targets, TensorView{},
                      call.lse);
  check_like(device, "cross_entropy_backward", {"logits", call.logits},
             {{"dlogits", call.dlogits}});
  return rows_geometry<CrossEntropyDims>(call.logits);
}

OpGeometry check(DeviceKind device, const BceWithLogitsForwardArgs& call) {
  check_bce_with_logits(device, "bce_with_logits_forward", call.logits, call.targets, call.loss);
  if (call.loss.empty())
    throw ShapeError("bce_with_logits_forward: loss is missing");
  return elementwise_geometry(call.logits, 2, 1);
}

OpGeometry check(DeviceKind device, const BceWithLogitsBackwardArgs& call) {
  check_bce_with_logits(device, "bce_with_logits_backward", call.logits, call.targets,
                        TensorView{});
  check_like(device, "bce_with_logits_backward", {"logits", call.logits},
             {{"dlogits", call.dlogits}});
  return elementwise_geometry(call.logits, 2, 1);
}

OpGeometry check(DeviceKind device, const EmbeddingForwardArgs& call) {
  check_embedding(device, "embedding_forward", call.table, call.tokens, call.out);
  if (call.out.dtype != call.table.dtype) {
    throw ShapeError("embedding_forward: out is " + call.out.describe() + "; expected dtype " +
                     to_string(call.table.dtype) + " of table");
  }
  return rows_geometry<EmbeddingDims>(call.out);
}

OpGeometry check(DeviceKind device, const EmbeddingBackwardArgs& call) {
  check_embedding(device, "embedding_backward", call.dtable, call.tokens, call.dout);
  return rows_geometry<EmbeddingDims>(call.dout);
}

OpGeometry check(DeviceKind device, const AdamwUpdateArgs& call) {
  check_adamw(device, call.params, call.grads, call.m, call.v, call.hyper, call.params_lowp);
  return OpGeometry::of(call.grads.dtype, OptimizerUpdateDims{.params = call.params.numel()});
}

OpGeometry check(DeviceKind device, const OpArgs& call) {
  return std::visit(
      [device](const auto& op) -> OpGeometry {
        if constexpr (std::is_same_v<std::decay_t<decltype(op)>, std::monostate>) {
          throw ShapeError("Backend::run: an empty OpArgs (no op)");
        } else {
          return check(device, op);
        }
      },
      call);
}

bool parse_op_id(const char* name, OpId* id) {
  for (const OpInfo& info : kOpTable) {
    if (std::strcmp(info.name, name) == 0) {
      *id = info.id;
      return true;
    }
  }
  return false;
}

}  // namespace modar::runtime
