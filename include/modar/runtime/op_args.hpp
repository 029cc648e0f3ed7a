// modar/runtime/op_args.hpp: the runtime's ops as values, and THE op table.
//
// Every op a Backend executes is one argument struct below (the tensors and
// scalars it needs, in the order of the matching Backend convenience method;
// see backend.hpp for each op's maths, shapes and dtypes).  An OpArgs value is
// one of them.  Backend::run(OpArgs) checks it ONCE (check() below, in
// runtime/core/op_checks.cpp: shapes, dtypes, devices; it returns the resolved
// geometry) and hands it to the backend's execute(): one entry point per
// backend, which dispatches to that backend's kernels (FlashAttention's
// `params` + ggml's `supports_op` patterns).
//
// MODAR_RUNTIME_OPS is the ONE table of runtime ops.  A row:
//   X(id, ArgsType, vocabulary kind, pass, in_vocabulary, profiled)
//   * id: the OpId and the op's name (= the Backend method);
//   * kind / pass: what the op is in the shared op vocabulary (modar/ops.hpp),
//     as cost_models/lowering.cpp labels it: e.g. a gather's backward
//     (gather_rows_backward) is a scatter_add op and a scatter's backward a
//     gather op; dar_mix belongs to dar_coefficients; GELU / SwiGLU / add /
//     axpy / scale / mul / BCE / topk_mask are elementwise; the MoE router,
//     its losses and the dispatch are moe_topk, the grouped GEMM (both forms)
//     is expert_gemm;
//   * in_vocabulary: false for copy / fill / convert (memory ops: counted as
//     calls only, never as a vocabulary op);
//   * profiled: the profiler's bench of (kind, pass) executes this op
//     (runtime/calibration/profiler_ops.cpp; tests/cpp/runtime/test_op_table.cpp
//     checks it).  Not profiled: the ragged top-k and the top-k mask (predictor
//     mode), SwiGLU forward (timed as adds), axpy / scale / mul, BCE.
// Users of the table: validate's tracing backend (vocabulary kind of each
// executed op), the profiler test above, the op harness
// (tests/cpp/runtime/test_op_harness.cpp: one case per row, every backend) and
// the backends themselves (one run() overload per row, generated).
// docs/adding_an_op.md walks through adding a row.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <variant>

#include "modar/config_enums.hpp"
#include "modar/ops.hpp"
#include "modar/runtime/tensor.hpp"

namespace modar::runtime {

// ---- small POD parameter structs --------------------------------------------

struct RopeParams {
  // GPT-NeoX "half rotation": for i < d_h/2 the pair (x[i], x[i + d_h/2]) is
  // rotated by angle pos * theta_base^(-2i/d_h):
  //   x'[i] = x[i] cos - x[i+h] sin,   x'[i+h] = x[i+h] cos + x[i] sin.
  double theta_base = 10000.0;
};

struct AttentionParams {
  bool causal = true;          // key j visible to query i iff j <= i (and j < valid length)
  double softmax_scale = 0.0;  // 0 = 1 / sqrt(d_h)
};

struct DarCoefficientParams {
  double eps = 1e-6;             // RMSNorm eps of z
  int sinkhorn_iterations = 20;  // n > 2 only: row-then-column normalisations
};

struct AdamWParams {
  double learning_rate = 3e-4;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double epsilon = 1e-8;
  double weight_decay = 0.0;  // decoupled: p -= lr * wd * p
  int64_t step = 1;           // 1-based step count for bias correction
  double grad_scale = 1.0;    // gradients are multiplied by this first (clipping / loss scale)
};

// ---- one argument struct per op (fields: see the Backend method of that name) ----

struct CopyArgs {
  TensorView src;
  TensorView dst;
};
struct FillArgs {
  TensorView dst;
  double value = 0.0;
};
struct ConvertArgs {
  TensorView src;
  TensorView dst;
};
struct GemmArgs {
  TensorView a;
  bool transpose_a = false;
  TensorView b;
  bool transpose_b = false;
  TensorView c;
  double alpha = 1.0;
  double beta = 0.0;
};
struct RmsnormForwardArgs {
  TensorView x;
  TensorView weight;
  TensorView out;
  TensorView rstd;
  double eps = 1e-6;
};
struct RmsnormBackwardArgs {
  TensorView dout;
  TensorView x;
  TensorView weight;
  TensorView rstd;
  TensorView dx;
  TensorView dweight;
};
struct RopeForwardArgs {
  TensorView x;
  TensorView positions;
  TensorView out;
  RopeParams params{};
};
struct RopeBackwardArgs {
  TensorView dout;
  TensorView positions;
  TensorView dx;
  RopeParams params{};
};
struct AttentionForwardArgs {
  TensorView q;
  TensorView k;
  TensorView v;
  TensorView valid_lengths;
  TensorView out;
  TensorView lse;
  AttentionParams params{};
};
struct AttentionBackwardArgs {
  TensorView dout;
  TensorView q;
  TensorView k;
  TensorView v;
  TensorView valid_lengths;
  TensorView out;
  TensorView lse;
  TensorView dq;
  TensorView dk;
  TensorView dv;
  AttentionParams params{};
};
struct RouterForwardArgs {
  TensorView x;
  TensorView w;
  TensorView logits;
};
struct RouterBackwardArgs {
  TensorView dlogits;
  TensorView x;
  TensorView w;
  TensorView dx;
  TensorView dw;
};
struct TopkArgs {
  TensorView logits;
  TensorView indices;
};
struct TopkRaggedArgs {
  TensorView logits;
  TensorView counts;
  TensorView indices;
};
struct TopkMaskArgs {
  TensorView indices;
  TensorView mask;
};
struct GatherRowsForwardArgs {
  TensorView x;
  TensorView indices;
  TensorView out;
};
struct GatherRowsBackwardArgs {
  TensorView dout;
  TensorView indices;
  TensorView dx;
};
struct ScatterAddScaledForwardArgs {
  TensorView x;
  TensorView indices;
  TensorView router_logits;
  TensorView delta;
  RouterScale gate = RouterScale::linear;
};
struct ScatterAddScaledBackwardArgs {
  TensorView dx;
  TensorView indices;
  TensorView router_logits;
  TensorView delta;
  RouterScale gate = RouterScale::linear;
  TensorView ddelta;
  TensorView drouter_logits;
};
struct DepthReadPrefixForwardArgs {
  TensorView keys;
  TensorView key_rstd;
  TensorView values;
  TensorView queries;
  TensorView out;
  TensorView lse;
};
struct DepthReadPrefixBackwardArgs {
  TensorView dout;
  TensorView dlse;
  TensorView keys;
  TensorView key_rstd;
  TensorView values;
  TensorView queries;
  TensorView out;
  TensorView lse;
  TensorView dkeys;
  TensorView dvalues;
  TensorView dqueries;
};
struct DepthReadMergeForwardArgs {
  TensorView prefix_out;
  TensorView prefix_lse;
  TensorView partial_keys;
  TensorView partial_key_rstd;
  TensorView partial_values;
  TensorView query;
  TensorView out;
  TensorView partial_weight;
};
struct DepthReadMergeBackwardArgs {
  TensorView dout;
  TensorView prefix_out;
  TensorView partial_keys;
  TensorView partial_key_rstd;
  TensorView partial_values;
  TensorView query;
  TensorView partial_weight;
  TensorView dprefix_out;
  TensorView dprefix_lse;
  TensorView dpartial_keys;
  TensorView dpartial_values;
  TensorView dquery;
};
struct DarCoefficientsForwardArgs {
  TensorView retrieved;
  TensorView weight;
  TensorView bias;
  TensorView scale;
  TensorView alpha;
  TensorView beta;
  TensorView transport;
  TensorView z_rstd;
  DarCoefficientParams params{};
};
struct DarCoefficientsBackwardArgs {
  TensorView dalpha;
  TensorView dbeta;
  TensorView dtransport;
  TensorView retrieved;
  TensorView weight;
  TensorView bias;
  TensorView scale;
  TensorView alpha;
  TensorView beta;
  TensorView transport;
  TensorView z_rstd;
  TensorView dretrieved;
  TensorView dweight;
  TensorView dbias;
  TensorView dscale;
  DarCoefficientParams params{};
};
struct DarMixForwardArgs {
  TensorView retrieved;
  TensorView alpha;
  TensorView out;
};
struct DarMixBackwardArgs {
  TensorView dout;
  TensorView retrieved;
  TensorView alpha;
  TensorView dretrieved;
  TensorView dalpha;
};
struct DarWriteForwardArgs {
  TensorView transport;
  TensorView partial;
  TensorView beta;
  TensorView y;
  TensorView out;
};
struct DarWriteBackwardArgs {
  TensorView dout;
  TensorView transport;
  TensorView partial;
  TensorView beta;
  TensorView y;
  TensorView dtransport;
  TensorView dpartial;
  TensorView dbeta;
  TensorView dy;
};
struct GeluForwardArgs {
  TensorView x;
  TensorView out;
};
struct GeluBackwardArgs {
  TensorView dout;
  TensorView x;
  TensorView dx;
};
struct SwigluForwardArgs {
  TensorView gate;
  TensorView up;
  TensorView out;
};
struct SwigluBackwardArgs {
  TensorView dout;
  TensorView gate;
  TensorView up;
  TensorView dgate;
  TensorView dup;
};
struct AddArgs {
  TensorView a;
  TensorView b;
  TensorView out;
};
struct AxpyArgs {
  double alpha = 1.0;
  TensorView x;
  TensorView y;
};
struct ScaleArgs {
  TensorView x;
  double alpha = 1.0;
};
struct MulForwardArgs {
  TensorView a;
  TensorView b;
  TensorView out;
};
struct MulBackwardArgs {
  TensorView dout;
  TensorView a;
  TensorView b;
  TensorView da;
  TensorView db;
};
struct CrossEntropyForwardArgs {
  TensorView logits;
  TensorView targets;
  TensorView loss;
  TensorView lse;
};
struct CrossEntropyBackwardArgs {
  double dloss = 1.0;
  TensorView logits;
  TensorView targets;
  TensorView lse;
  TensorView dlogits;
};
struct BceWithLogitsForwardArgs {
  TensorView logits;
  TensorView targets;
  TensorView loss;
};
struct BceWithLogitsBackwardArgs {
  double dloss = 1.0;
  TensorView logits;
  TensorView targets;
  TensorView dlogits;
};
struct EmbeddingForwardArgs {
  TensorView table;
  TensorView tokens;
  TensorView out;
};
struct EmbeddingBackwardArgs {
  TensorView dout;
  TensorView tokens;
  TensorView dtable;
};
struct AdamwUpdateArgs {
  TensorView params;
  TensorView grads;
  TensorView m;
  TensorView v;
  AdamWParams hyper{};
  TensorView params_lowp;
};

// ---- Mixture of Experts (MoE FFN, MoDE; see backend.hpp and docs/runtime_ops.md) ----

struct MoeRouteParams {
  // false: gate = p_e (Switch / GShard);  true: gates of the k chosen experts
  // divided by their sum (Mixtral / DeepSeek "norm_topk_prob").
  bool renormalize = false;
};
struct MoeRouteForwardArgs {
  TensorView logits;
  TensorView probs;
  TensorView indices;
  TensorView gates;
  MoeRouteParams params{};
};
struct MoeRouteBackwardArgs {
  TensorView dgates;
  TensorView probs;
  TensorView indices;
  TensorView gates;
  TensorView dlogits;
  MoeRouteParams params{};
};
struct MoeAuxLossForwardArgs {
  TensorView logits;
  TensorView probs;
  TensorView indices;
  TensorView loss;
};
struct MoeAuxLossBackwardArgs {
  double daux = 1.0;
  double dz = 0.0;
  TensorView logits;
  TensorView probs;
  TensorView indices;
  TensorView dlogits;
};
struct MoeDispatchArgs {
  TensorView indices;
  TensorView counts;
  TensorView slots;
  int64_t capacity = 0;  // rows per expert; 0 = dropless
};
struct MoePermuteForwardArgs {
  TensorView x;
  TensorView slots;
  TensorView out;
};
struct MoePermuteBackwardArgs {
  TensorView dout;
  TensorView slots;
  TensorView dx;
};
struct MoeUnpermuteForwardArgs {
  TensorView y;
  TensorView slots;
  TensorView gates;
  TensorView out;
};
struct MoeUnpermuteBackwardArgs {
  TensorView dout;
  TensorView y;
  TensorView slots;
  TensorView gates;
  TensorView dy;
  TensorView dgates;
};
struct GroupedGemmArgs {
  TensorView a;
  bool transpose_a = false;
  TensorView b;
  bool transpose_b = false;
  TensorView c;
  TensorView counts;
  double alpha = 1.0;
  double beta = 0.0;
};

// ---- the op table ---------------------------------------------------------------

#define MODAR_RUNTIME_OPS(X)                                                                       \
  X(copy, CopyArgs, elementwise, forward, false, false)                                            \
  X(fill, FillArgs, elementwise, forward, false, false)                                            \
  X(convert, ConvertArgs, elementwise, forward, false, false)                                      \
  X(gemm, GemmArgs, gemm, forward, true, true)                                                     \
  X(rmsnorm_forward, RmsnormForwardArgs, rmsnorm, forward, true, true)                             \
  X(rmsnorm_backward, RmsnormBackwardArgs, rmsnorm, backward, true, true)                          \
  X(rope_forward, RopeForwardArgs, rope, forward, true, true)                                      \
  X(rope_backward, RopeBackwardArgs, rope, backward, true, true)                                   \
  X(attention_forward, AttentionForwardArgs, attention, forward, true, true)                       \
  X(attention_backward, AttentionBackwardArgs, attention, backward, true, true)                    \
  X(router_forward, RouterForwardArgs, router, forward, true, true)                                \
  X(router_backward, RouterBackwardArgs, router, backward, true, true)                             \
  X(topk, TopkArgs, topk, forward, true, true)                                                     \
  X(topk_ragged, TopkRaggedArgs, topk, forward, true, false)                                       \
  X(topk_mask, TopkMaskArgs, elementwise, forward, true, false)                                    \
  X(gather_rows_forward, GatherRowsForwardArgs, gather, forward, true, true)                       \
  X(gather_rows_backward, GatherRowsBackwardArgs, scatter_add, backward, true, true)               \
  X(scatter_add_scaled_forward, ScatterAddScaledForwardArgs, scatter_add, forward, true, true)     \
  X(scatter_add_scaled_backward, ScatterAddScaledBackwardArgs, gather, backward, true, true)       \
  X(depth_read_prefix_forward, DepthReadPrefixForwardArgs, depth_read_prefix, forward, true, true) \
  X(depth_read_prefix_backward, DepthReadPrefixBackwardArgs, depth_read_prefix, backward, true,    \
    true)                                                                                          \
  X(depth_read_merge_forward, DepthReadMergeForwardArgs, depth_read_merge, forward, true, true)    \
  X(depth_read_merge_backward, DepthReadMergeBackwardArgs, depth_read_merge, backward, true, true) \
  X(dar_coefficients_forward, DarCoefficientsForwardArgs, dar_coefficients, forward, true, true)   \
  X(dar_coefficients_backward, DarCoefficientsBackwardArgs, dar_coefficients, backward, true,      \
    true)                                                                                          \
  X(dar_mix_forward, DarMixForwardArgs, dar_coefficients, forward, true, true)                     \
  X(dar_mix_backward, DarMixBackwardArgs, dar_coefficients, backward, true, true)                  \
  X(dar_write_forward, DarWriteForwardArgs, dar_write, forward, true, true)                        \
  X(dar_write_backward, DarWriteBackwardArgs, dar_write, backward, true, true)                     \
  X(gelu_forward, GeluForwardArgs, elementwise, forward, true, true)                               \
  X(gelu_backward, GeluBackwardArgs, elementwise, backward, true, true)                            \
  X(swiglu_forward, SwigluForwardArgs, elementwise, forward, true, false)                          \
  X(swiglu_backward, SwigluBackwardArgs, elementwise, backward, true, true)                        \
  X(add, AddArgs, elementwise, forward, true, true)                                                \
  X(axpy, AxpyArgs, elementwise, backward, true, false)                                            \
  X(scale, ScaleArgs, elementwise, forward, true, false)                                           \
  X(mul_forward, MulForwardArgs, elementwise, forward, true, false)                                \
  X(mul_backward, MulBackwardArgs, elementwise, backward, true, false)                             \
  X(cross_entropy_forward, CrossEntropyForwardArgs, cross_entropy, forward, true, true)            \
  X(cross_entropy_backward, CrossEntropyBackwardArgs, cross_entropy, backward, true, true)         \
  X(bce_with_logits_forward, BceWithLogitsForwardArgs, elementwise, forward, true, false)          \
  X(bce_with_logits_backward, BceWithLogitsBackwardArgs, elementwise, backward, true, false)       \
  X(embedding_forward, EmbeddingForwardArgs, embedding, forward, true, true)                       \
  X(embedding_backward, EmbeddingBackwardArgs, embedding, backward, true, true)                    \
  X(adamw_update, AdamwUpdateArgs, optimizer_update, forward, true, true)                          \
  X(moe_route_forward, MoeRouteForwardArgs, moe_topk, forward, true, true)                        \
  X(moe_route_backward, MoeRouteBackwardArgs, moe_topk, backward, true, true)                     \
  X(moe_aux_loss_forward, MoeAuxLossForwardArgs, moe_topk, forward, true, true)                   \
  X(moe_aux_loss_backward, MoeAuxLossBackwardArgs, moe_topk, backward, true, true)                \
  X(moe_dispatch, MoeDispatchArgs, moe_topk, forward, true, true)                                 \
  X(moe_permute_forward, MoePermuteForwardArgs, permute, forward, true, true)                     \
  X(moe_permute_backward, MoePermuteBackwardArgs, permute, backward, true, true)                  \
  X(moe_unpermute_forward, MoeUnpermuteForwardArgs, unpermute, forward, true, true)               \
  X(moe_unpermute_backward, MoeUnpermuteBackwardArgs, unpermute, backward, true, true)            \
  X(grouped_gemm, GroupedGemmArgs, expert_gemm, forward, true, true)

enum class OpId : uint8_t {
#define MODAR_OP_ID(id, Args, kind, pass, in_vocabulary, profiled) id,
  MODAR_RUNTIME_OPS(MODAR_OP_ID)
#undef MODAR_OP_ID
};

#define MODAR_OP_ARGS_TYPE(id, Args, kind, pass, in_vocabulary, profiled) , Args
// One op call as a value.  The alternative's index is its OpId.
using OpArgs = std::variant<std::monostate MODAR_RUNTIME_OPS(MODAR_OP_ARGS_TYPE)>;
#undef MODAR_OP_ARGS_TYPE

// One row of the table.
struct OpInfo {
  OpId id;
  const char* name;  // "gemm", "rmsnorm_forward", ...
  OpKind kind;       // the vocabulary op it is (meaningful when in_vocabulary)
  Pass pass;
  bool in_vocabulary;
  bool profiled;
};

#define MODAR_OP_INFO(id, Args, kind, pass, in_vocabulary, profiled) \
  OpInfo{OpId::id, #id, OpKind::kind, Pass::pass, in_vocabulary, profiled},
inline constexpr std::array kOpTable{MODAR_RUNTIME_OPS(MODAR_OP_INFO)};
#undef MODAR_OP_INFO
inline constexpr size_t kOpCount = kOpTable.size();

inline const OpInfo& op_info(OpId id) {
  return kOpTable[static_cast<size_t>(id)];
}
// The OpId of a call (the variant holds one op; index 0 is "no op").
inline OpId op_id(const OpArgs& call) {
  return static_cast<OpId>(call.index() - 1);
}
// false for an unknown name.
bool parse_op_id(const char* name, OpId* id);

// The resolved geometry of a checked call: the data dtype (the first float
// tensor's) and the op's dims as dims of its vocabulary kind (ops.hpp: the
// table row's kind; copy / fill / convert: elementwise).  Dims a call cannot
// know are left at their defaults (e.g. a depth read's variant).
struct OpGeometry {
  ScalarType dtype = ScalarType::fp32;
  OpKind kind = OpKind::elementwise;
  OpDimsArray dims{};

  template <class Dims>
  static OpGeometry of(ScalarType dtype, const Dims& d) {
    return OpGeometry{dtype, kind_of<Dims>, op_dims_array(d)};
  }
  // The typed dims; throws std::logic_error when the geometry is another kind.
  template <class Dims>
  Dims as() const {
    return OpShape{kind, DType::fp32, dims}.as<Dims>();
  }
};

// The host-side argument checks, one per op (runtime/core/op_checks.cpp).  Each
// throws modar::ShapeError naming the op, the argument, its shape / dtype /
// device and what was expected, e.g. "attention_forward: k is [2, 8, 3, 16]
// fp32 cpu; expected [2, 8, G, 16] with H = 4 divisible by G".
#define MODAR_OP_CHECK(id, Args, kind, pass, in_vocabulary, profiled) \
  OpGeometry check(DeviceKind device, const Args& call);
MODAR_RUNTIME_OPS(MODAR_OP_CHECK)
#undef MODAR_OP_CHECK
OpGeometry check(DeviceKind device, const OpArgs& call);

// In a Backend subclass: declares `void run(const XArgs& call);` for every op
// (the kernels) and the execute() that dispatches to them.
#define MODAR_OP_RUN_DECLARATION(id, Args, kind, pass, in_vocabulary, profiled) \
  void run_op(const Args& call);
#define MODAR_BACKEND_OPS                                                \
  void execute(const OpArgs& call, const OpGeometry& geometry) override; \
  MODAR_RUNTIME_OPS(MODAR_OP_RUN_DECLARATION)

// The execute() body for a backend class that declared MODAR_BACKEND_OPS.
#define MODAR_BACKEND_EXECUTE(Class)                                                   \
  void Class::execute(const OpArgs& call, const OpGeometry& /*geometry*/) {            \
    std::visit(                                                                        \
        [this](const auto& op) {                                                       \
          if constexpr (!std::is_same_v<std::decay_t<decltype(op)>, std::monostate>) { \
            run_op(op);                                                                \
          }                                                                            \
        },                                                                             \
        call);                                                                         \
  }

}  // namespace modar::runtime
