// runtime/core/op_checks_moe.cpp: the argument checks of the Mixture-of-Experts
// ops (op_args.hpp, backend.hpp "Mixture of Experts"), shared by every backend.
// Same rules as op_checks.cpp: tensors present and on the device, router
// statistics in one stats dtype (fp32 / fp64), indices i32, gradient outputs
// optional or shaped like their input; shapes named in the error.
#include <sstream>
#include <string>
#include <vector>

#include "modar/base/errors.hpp"
#include "modar/runtime/op_args.hpp"
#include "op_checker.hpp"

namespace modar::runtime {
namespace {

using MoeChecker = detail::Checker;
using detail::dims_text;

// logits, probs [T, E] stats (probs may be empty where noted); indices i32 [T, k], k <= E.
void check_route_tensors(const MoeChecker& c, const TensorView& logits, const TensorView& probs,
                         const TensorView& indices) {
  c.stats("logits", logits);
  c.shape("logits", logits, {-1, -1});
  c.like("probs", probs, "logits", logits);
  c.dtype("indices", indices, ScalarType::i32);
  c.shape("indices", indices, {logits.dim(0), -1});
  c.require(indices.dim(1) >= 1 && indices.dim(1) <= logits.dim(1),
            "indices is " + indices.describe() + "; expected k in [1, E = " +
                std::to_string(logits.dim(1)) + "] columns");
}

// x [.., d] with T rows; slots i32 [T, k]; rows [R, d] of x's dtype.
void check_permute_tensors(const MoeChecker& c, const TensorView& x, const TensorView& slots,
                           const TensorView& rows) {
  c.floating("x", x);
  c.dtype("slots", slots, ScalarType::i32);
  c.shape("slots", slots, {x.rows(), -1});
  c.floating("rows", rows);
  c.shape("rows", rows, {-1, x.dim(-1)});
  c.require(rows.dtype == x.dtype,
            "rows " + rows.describe() + " must have the dtype of x " + x.describe());
}

// gates [T, k] stats: one per (row, choice) of `pairs` [T, k] (indices or slots).
void check_gates(const MoeChecker& c, const TensorView& gates, const TensorView& pairs) {
  c.stats("gates", gates);
  c.shape("gates", gates, {pairs.dim(0), pairs.dim(1)});
}

// The router's gates: check_gates, in the dtype of its scores (`scores_name`).
void check_router_gates(const MoeChecker& c, const TensorView& gates, const TensorView& indices,
                        const char* scores_name, const TensorView& scores) {
  check_gates(c, gates, indices);
  c.require(gates.dtype == scores.dtype, "gates " + gates.describe() + " must have the dtype of " +
                                             scores_name + " " + scores.describe());
}

// moe_topk: the rows and choices of the router's scores [T, E], k of indices [T, k].
OpGeometry topk_geometry(const TensorView& scores, const TensorView& indices) {
  return OpGeometry::of(
      scores.dtype,
      MoeTopkDims{.rows = scores.dim(0), .choices = scores.dim(1), .k = indices.dim(1)});
}

// permute: the slots of the permuted rows [R, d], d and the token rows of x.
OpGeometry permute_geometry(const TensorView& x, const TensorView& rows) {
  return OpGeometry::of(x.dtype,
                        PermuteDims{.slots = rows.dim(0), .width = x.dim(-1), .rows = x.rows()});
}

// unpermute: the slots of y [R, d], d, the token rows of `tokens`, k of slots [T, k].
OpGeometry unpermute_geometry(const TensorView& y, const TensorView& tokens,
                              const TensorView& slots) {
  return OpGeometry::of(
      y.dtype,
      UnpermuteDims{
          .slots = y.dim(0), .width = y.dim(-1), .rows = tokens.rows(), .k = slots.dim(1)});
}

// expert_gemm: G groups, M rows, n, k, imbalance (permille; balanced here),
// ragged_inner (the weight gradient: the rows are the inner dimension).
OpGeometry expert_gemm_geometry(ScalarType dtype, int64_t groups, int64_t rows, int64_t n,
                                int64_t k, bool ragged_inner) {
  return OpGeometry::of(dtype, ExpertGemmDims{.groups = groups,
                                              .rows = rows,
                                              .n = n,
                                              .k = k,
                                              .imbalance_permille = 1000,
                                              .ragged_inner = ragged_inner ? 1 : 0});
}

}  // namespace

OpGeometry check(DeviceKind device, const MoeRouteForwardArgs& call) {
  MoeChecker c("moe_route_forward", device);
  check_route_tensors(c, call.logits, call.probs, call.indices);
  check_router_gates(c, call.gates, call.indices, "logits", call.logits);
  return topk_geometry(call.logits, call.indices);
}

OpGeometry check(DeviceKind device, const MoeRouteBackwardArgs& call) {
  MoeChecker c("moe_route_backward", device);
  check_route_tensors(c, call.probs, call.probs, call.indices);
  check_router_gates(c, call.gates, call.indices, "probs", call.probs);
  c.like("dgates", call.dgates, "gates", call.gates);
  c.like("dlogits", call.dlogits, "probs", call.probs);
  return topk_geometry(call.probs, call.indices);
}

OpGeometry check(DeviceKind device, const MoeAuxLossForwardArgs& call) {
  MoeChecker c("moe_aux_loss_forward", device);
  check_route_tensors(c, call.logits, call.probs, call.indices);
  c.shape("loss", call.loss, {2});
  c.require(call.loss.dtype == call.logits.dtype,
            "loss " + call.loss.describe() + " must have the dtype of logits");
  return topk_geometry(call.logits, call.indices);
}

OpGeometry check(DeviceKind device, const MoeAuxLossBackwardArgs& call) {
  MoeChecker c("moe_aux_loss_backward", device);
  check_route_tensors(c, call.logits, call.probs, call.indices);
  c.like("dlogits", call.dlogits, "logits", call.logits);
  return topk_geometry(call.logits, call.indices);
}

OpGeometry check(DeviceKind device, const MoeDispatchArgs& call) {
  MoeChecker c("moe_dispatch", device);
  c.dtype("indices", call.indices, ScalarType::i32);
  c.shape("indices", call.indices, {-1, -1});
  c.dtype("counts", call.counts, ScalarType::i32);
  c.shape("counts", call.counts, {-1});
  c.require(call.counts.dim(0) >= 1, "counts is " + call.counts.describe() +
                                         "; expected one entry per real expert (>= 1)");
  c.dtype("slots", call.slots, ScalarType::i32);
  c.shape("slots", call.slots, {call.indices.dim(0), call.indices.dim(1)});
  c.require(call.capacity >= 0,
            "capacity = " + std::to_string(call.capacity) + ": must be >= 0 (0 = dropless)");
  // moe_topk: rows, choices (unknown here: the real experts), k.
  return OpGeometry::of(ScalarType::fp32, MoeTopkDims{.rows = call.indices.dim(0),
                                                      .choices = call.counts.dim(0),
                                                      .k = call.indices.dim(1)});
}

OpGeometry check(DeviceKind device, const MoePermuteForwardArgs& call) {
  MoeChecker c("moe_permute_forward", device);
  check_permute_tensors(c, call.x, call.slots, call.out);
  // permute: slots, d, rows.
  return permute_geometry(call.x, call.out);
}

OpGeometry check(DeviceKind device, const MoePermuteBackwardArgs& call) {
  MoeChecker c("moe_permute_backward", device);
  check_permute_tensors(c, call.dx, call.slots, call.dout);
  return permute_geometry(call.dx, call.dout);
}

OpGeometry check(DeviceKind device, const MoeUnpermuteForwardArgs& call) {
  MoeChecker c("moe_unpermute_forward", device);
  check_permute_tensors(c, call.out, call.slots, call.y);
  check_gates(c, call.gates, call.slots);
  // unpermute: slots, d, rows, k.
  return unpermute_geometry(call.y, call.out, call.slots);
}

OpGeometry check(DeviceKind device, const MoeUnpermuteBackwardArgs& call) {
  MoeChecker c("moe_unpermute_backward", device);
  check_permute_tensors(c, call.dout, call.slots, call.y);
  check_gates(c, call.gates, call.slots);
  c.optional_like("dy", call.dy, "y", call.y);
  c.optional_like("dgates", call.dgates, "gates", call.gates);
  return unpermute_geometry(call.y, call.dout, call.slots);
}

OpGeometry check(DeviceKind device, const GroupedGemmArgs& call) {
  MoeChecker c("grouped_gemm", device);
  c.floating("a", call.a);
  c.floating("b", call.b);
  c.floating("c", call.c);
  c.require(call.a.dtype == call.b.dtype,
            "a " + call.a.describe() + " and b " + call.b.describe() + " must share a dtype");
  c.require(call.c.dtype == call.a.dtype || call.c.dtype == ScalarType::fp32,
            "c " + call.c.describe() + " must have the dtype of a (" + to_string(call.a.dtype) +
                ") or fp32");
  c.dtype("counts", call.counts, ScalarType::i32);
  c.shape("counts", call.counts, {-1});
  const int64_t experts = call.counts.dim(0);
  c.shape("a", call.a, {-1, -1});
  const int64_t rows = call.a.dim(0), k = call.a.dim(1);
  if (!call.transpose_a) {
    // c [R, N] = a [R, K] op(b_e), b [E, K, N] or [E, N, K].
    c.shape("b", call.b, {experts, -1, -1});
    const int64_t k_b = call.transpose_b ? call.b.dim(2) : call.b.dim(1);
    const int64_t n = call.transpose_b ? call.b.dim(1) : call.b.dim(2);
    c.require(k_b == k, "inner dimensions differ: a is " + call.a.describe() + ", b is " +
                            call.b.describe() + (call.transpose_b ? " (transposed)" : "") +
                            "; expected b " +
                            dims_text(call.transpose_b ? std::vector<int64_t>{experts, -1, k}
                                                       : std::vector<int64_t>{experts, k, -1}));
    c.shape("c", call.c, {rows, n});
    return expert_gemm_geometry(call.a.dtype, experts, rows, n, k, false);
  }
  // Weight gradient: c [E, K, N] = a_e^T b_e with a [R, K], b [R, N].
  c.require(!call.transpose_b, "transpose_a with transpose_b is not a grouped GEMM form");
  c.shape("b", call.b, {rows, -1});
  const int64_t n = call.b.dim(1);
  c.shape("c", call.c, {experts, k, n});
  // ragged_inner: C_g[n', k'] = A_g[m_g, n']^T B_g[m_g, k'].
  return expert_gemm_geometry(call.a.dtype, experts, rows, k, n, true);
}

}  // namespace modar::runtime
