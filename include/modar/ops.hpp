// modar/ops.hpp: the op vocabulary shared by the cost model and the runtime.
//
// The planner lowers a Config into a list of OpRecords (cost_models/lowering),
// the runtime executes exactly these op kinds, and the profiler times them
// over a grid of OpShapes, so every predicted op time can be checked against a
// measured one (docs/cost_model.md).
//
// MODAR_OP_KINDS is the ONE table of op kinds (the planner's counterpart of
// the runtime's MODAR_RUNTIME_OPS).  A row:
//   X(kind, Dims, flops, timing)
//   * kind: the OpKind and its name (the key of profiles and of JSON output:
//     renaming one breaks old profiles; new kinds are appended);
//   * Dims: the typed dims struct below (what the op's numbers mean; an
//     OpShape stores them in declaration order in dims[0..]);
//   * flops: `counted` for the kinds whose FLOPs enter the model FLOPs by
//     default (GEMMs, attention, the MoD router, the depth-read family, the
//     expert GEMMs), `not_counted` for the bytes-dominated ones (norms,
//     elementwise, top-k, gather / scatter, cross-entropy, embedding, the
//     optimizer, the MoE top-k and permutations): reported, not counted;
//   * timing: how the timing model (cost_models/timing.cpp) looks a shape up
//     in a profile: `per_pass` (forward and backward measured apart,
//     recompute as forward), `any_pass` (one measurement serves every pass: a
//     dgrad / wgrad GEMM is a GEMM), `per_pass_else_gemm` (per pass; a
//     profile without any measurement of the kind times it as the plain GEMM
//     of expert_gemm_timing_dims()).
// The per-kind hooks are overloads on the Dims type, so a new row that lacks
// one fails to compile: op_cost(const Dims&, ...) in cost_models/lowering.cpp
// (FLOPs and bytes), bench_spec(const Dims&, ...) in
// runtime/calibration/profiler_ops.cpp (how the profiler times it).
// docs/adding_an_op.md walks through adding a kind.
//
// Backward ops carry Pass::backward and the same dims as their forward op,
// except GEMMs: a linear layer's backward is two plain GEMMs (dgrad, wgrad)
// with their own m, n, k, so a GEMM is timed the same way in every pass.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "modar/config_enums.hpp"

namespace modar {

#define MODAR_OP_KINDS(X)                                         \
  X(gemm, GemmDims, counted, any_pass)                            \
  X(attention, AttentionDims, counted, per_pass)                  \
  X(rmsnorm, RmsnormDims, not_counted, per_pass)                  \
  X(rope, RopeDims, not_counted, per_pass)                        \
  X(router, RouterDims, counted, per_pass)                        \
  X(topk, TopkDims, not_counted, per_pass)                        \
  X(gather, GatherDims, not_counted, per_pass)                    \
  X(scatter_add, ScatterAddDims, not_counted, per_pass)           \
  X(depth_read_prefix, DepthReadPrefixDims, counted, per_pass)    \
  X(depth_read_merge, DepthReadMergeDims, counted, per_pass)      \
  X(dar_coefficients, DarCoefficientsDims, counted, per_pass)     \
  X(dar_write, DarWriteDims, counted, per_pass)                   \
  X(elementwise, ElementwiseDims, not_counted, per_pass)          \
  X(cross_entropy, CrossEntropyDims, not_counted, per_pass)       \
  X(embedding, EmbeddingDims, not_counted, per_pass)              \
  X(optimizer_update, OptimizerUpdateDims, not_counted, per_pass) \
  X(expert_gemm, ExpertGemmDims, counted, per_pass_else_gemm)     \
  X(moe_topk, MoeTopkDims, not_counted, per_pass)                 \
  X(permute, PermuteDims, not_counted, per_pass)                  \
  X(unpermute, UnpermuteDims, not_counted, per_pass)

enum class OpFlops : uint8_t { counted, not_counted };
enum class OpTiming : uint8_t { per_pass, any_pass, per_pass_else_gemm };

// How the timing model treats one dim of a kind: `axis` dims span the
// profile's grid (log(time) is interpolated in log(dim)); `category` dims are
// flags or small categorical values (a measurement applies only at the same
// value: one grid per value).
enum class DimRole : uint8_t { axis, category };
struct DimInfo {
  const char* name;
  DimRole role;
};
constexpr DimInfo axis_dim(const char* name) {
  return DimInfo{name, DimRole::axis};
}
constexpr DimInfo category_dim(const char* name) {
  return DimInfo{name, DimRole::category};
}

// ---- the dims of each kind ----------------------------------------------------
// Every field is an int64_t; kDims names the fields in declaration order (one
// entry per field, named as the field: op_dims_array() checks the count)
// with their role.

struct GemmDims {  // C[m, n] = A[m, k] B[k, n], `batch` independent products
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  int64_t batch = 1;  // 0 is read as 1
  static constexpr std::array kDims{axis_dim("m"), axis_dim("n"), axis_dim("k"), axis_dim("batch")};
};
// causal: query i sees keys <= i + (key_len - query_len).  Decode: query_len 1,
// key_len the cache, causal 0.
struct AttentionDims {
  int64_t sequences = 0;  // b
  int64_t heads = 0;      // H (query heads)
  int64_t kv_heads = 0;   // G
  int64_t query_len = 0;
  int64_t key_len = 0;
  int64_t head_dim = 0;
  int64_t causal = 1;  // 0 / 1
  static constexpr std::array kDims{
      axis_dim("sequences"), axis_dim("heads"),    axis_dim("kv_heads"),  axis_dim("query_len"),
      axis_dim("key_len"),   axis_dim("head_dim"), category_dim("causal")};
};
struct RmsnormDims {
  int64_t rows = 0;
  int64_t width = 0;
  static constexpr std::array kDims{axis_dim("rows"), axis_dim("width")};
};
struct RopeDims {
  int64_t rows = 0;
  int64_t heads = 0;  // H + G (q and k are rotated)
  int64_t head_dim = 0;
  static constexpr std::array kDims{axis_dim("rows"), axis_dim("heads"), axis_dim("head_dim")};
};
struct RouterDims {  // MoD router logits r = x . w_r (a GEMV)
  int64_t rows = 0;
  int64_t width = 0;
  static constexpr std::array kDims{axis_dim("rows"), axis_dim("width")};
};
struct TopkDims {  // exact top-k of each sequence's router logits
  int64_t sequences = 0;
  int64_t seq_len = 0;
  int64_t k = 0;
  static constexpr std::array kDims{axis_dim("sequences"), axis_dim("seq_len"), axis_dim("k")};
};
struct GatherDims {  // MoD gather of the routed rows (and the backward of a scatter)
  int64_t rows = 0;
  int64_t width = 0;
  static constexpr std::array kDims{axis_dim("rows"), axis_dim("width")};
};
struct ScatterAddDims {  // x[idx] += g(r) delta (and the backward of a gather)
  int64_t rows = 0;
  int64_t width = 0;
  static constexpr std::array kDims{axis_dim("rows"), axis_dim("width")};
};
// Phase 1 of AttnRes / DAR: `queries` = S n for a block (S = 2K branches), n
// for the output read; `variant` = int(DarVariant).
struct DepthReadPrefixDims {
  int64_t tokens = 0;
  int64_t sources = 0;
  int64_t queries = 0;
  int64_t width = 0;
  int64_t streams = 1;
  int64_t variant = 0;
  static constexpr std::array kDims{axis_dim("tokens"),      axis_dim("sources"),
                                    axis_dim("queries"),     axis_dim("width"),
                                    category_dim("streams"), category_dim("variant")};
};
struct DepthReadMergeDims {  // phase 2: the closed-form merge with the partial
  int64_t tokens = 0;
  int64_t streams = 1;
  int64_t width = 0;
  int64_t variant = 0;
  static constexpr std::array kDims{axis_dim("tokens"), category_dim("streams"), axis_dim("width"),
                                    category_dim("variant")};
};
// RMSNorm over n d, the [n d x outputs] coefficient head, the mix h = sum
// alpha_j R_j; outputs = 2n (first branch of a block) or 2n + transport params.
struct DarCoefficientsDims {
  int64_t tokens = 0;
  int64_t streams = 2;
  int64_t width = 0;
  int64_t outputs = 0;
  static constexpr std::array kDims{axis_dim("tokens"), category_dim("streams"), axis_dim("width"),
                                    category_dim("outputs")};
};
// P = M(rho) P + beta (x) y (n = 1: P += y).
struct DarWriteDims {
  int64_t tokens = 0;
  int64_t streams = 1;
  int64_t width = 0;
  int64_t mode = 0;       // 0: P = beta y (first branch), 1: P = M P + beta y, 2: H_0 init
  int64_t emit_rstd = 0;  // 1 at a block end: the rstd of the new bank entry
  static constexpr std::array kDims{axis_dim("tokens"), category_dim("streams"), axis_dim("width"),
                                    category_dim("mode"), category_dim("emit_rstd")};
};
struct ElementwiseDims {  // GELU, SwiGLU, residual add, means, BCE
  int64_t elements = 0;
  int64_t inputs = 1;
  int64_t outputs = 1;
  static constexpr std::array kDims{axis_dim("elements"), category_dim("inputs"),
                                    category_dim("outputs")};
};
struct CrossEntropyDims {
  int64_t rows = 0;
  int64_t vocab = 0;
  static constexpr std::array kDims{axis_dim("rows"), axis_dim("vocab")};
};
struct EmbeddingDims {  // a lookup: 0 FLOPs, bytes only
  int64_t rows = 0;
  int64_t width = 0;
  static constexpr std::array kDims{axis_dim("rows"), axis_dim("width")};
};
struct OptimizerUpdateDims {  // AdamW over fp32 master weights
  int64_t params = 0;
  static constexpr std::array kDims{axis_dim("params")};
};
// Grouped GEMM over `groups` experts with ragged row counts m_g (sum = rows).
// ragged_inner 0: C_g[m_g, n] = A_g[m_g, k] B_g[k, n]; 1 (weight gradient):
// C_g[n, k] = A_g[m_g, n]^T B_g[m_g, k].  FLOPs 2 rows n k either way.
struct ExpertGemmDims {
  int64_t groups = 1;
  int64_t rows = 0;
  int64_t n = 0;
  int64_t k = 0;
  int64_t imbalance_permille = 1000;  // 1000 x moe.load_imbalance (time only)
  int64_t ragged_inner = 0;           // 0 / 1
  static constexpr std::array kDims{axis_dim("groups"),
                                    axis_dim("rows"),
                                    axis_dim("n"),
                                    axis_dim("k"),
                                    axis_dim("imbalance_permille"),
                                    category_dim("ragged_inner")};
};
// Softmax over `choices` (E + Z), top-k, gates renormalised over the k; keeps
// the probabilities for the aux / z losses.
struct MoeTopkDims {
  int64_t rows = 0;
  int64_t choices = 0;
  int64_t k = 0;
  static constexpr std::array kDims{axis_dim("rows"), axis_dim("choices"), axis_dim("k")};
};
// out[slot] = x[token(slot)] (tokens into expert order); backward: scatter-add.
struct PermuteDims {
  int64_t slots = 0;
  int64_t width = 0;
  int64_t rows = 0;
  static constexpr std::array kDims{axis_dim("slots"), axis_dim("width"), axis_dim("rows")};
};
// y[t] = sum over t's slots of gate x e[slot] (the combine).
struct UnpermuteDims {
  int64_t slots = 0;
  int64_t width = 0;
  int64_t rows = 0;
  int64_t k = 0;
  static constexpr std::array kDims{axis_dim("slots"), axis_dim("width"), axis_dim("rows"),
                                    axis_dim("k")};
};

// ---- the kinds ---------------------------------------------------------------

enum class OpKind : uint8_t {
#define MODAR_OP_KIND_ID(kind, Dims, flops, timing) kind,
  MODAR_OP_KINDS(MODAR_OP_KIND_ID)
#undef MODAR_OP_KIND_ID
};

// One row of the table.
struct OpKindInfo {
  OpKind kind;
  const char* name;
  int dims_count;       // meaningful leading dims of an OpShape
  const DimInfo* dims;  // [dims_count]
  OpFlops flops;
  OpTiming timing;
};

#define MODAR_OP_KIND_INFO(kind, Dims, flops, timing)                                  \
  OpKindInfo{OpKind::kind,       #kind,          static_cast<int>(Dims::kDims.size()), \
             Dims::kDims.data(), OpFlops::flops, OpTiming::timing},
inline constexpr std::array kOpKindTable{MODAR_OP_KINDS(MODAR_OP_KIND_INFO)};
#undef MODAR_OP_KIND_INFO
inline constexpr int kOpKindCount = static_cast<int>(kOpKindTable.size());

// The largest dims count of any kind: the size of OpShape::dims.
inline constexpr size_t kMaxOpDims = [] {
  size_t most = 0;
  for (const OpKindInfo& info : kOpKindTable) {
    most = std::max(most, static_cast<size_t>(info.dims_count));
  }
  return most;
}();

inline constexpr const OpKindInfo& op_kind_info(OpKind kind) {
  return kOpKindTable[static_cast<size_t>(kind)];
}

// The OpKind of a dims struct (kind_of<GemmDims> == OpKind::gemm).
template <class Dims>
inline constexpr bool kIsOpDims = false;
template <class Dims>
inline constexpr OpKind kind_of = OpKind::gemm;
#define MODAR_OP_KIND_OF(kind, Dims, flops, timing) \
  template <>                                       \
  inline constexpr bool kIsOpDims<Dims> = true;     \
  template <>                                       \
  inline constexpr OpKind kind_of<Dims> = OpKind::kind;
MODAR_OP_KINDS(MODAR_OP_KIND_OF)
#undef MODAR_OP_KIND_OF

enum class Pass : uint8_t { forward, backward, recompute };

using OpDimsArray = std::array<int64_t, kMaxOpDims>;

// A typed dims struct as the positional array an OpShape stores (unused
// trailing dims 0), and back.
template <class Dims>
constexpr OpDimsArray op_dims_array(const Dims& d) {
  static_assert(kIsOpDims<Dims>, "not a dims struct of MODAR_OP_KINDS");
  constexpr size_t count = Dims::kDims.size();
  static_assert(sizeof(Dims) == count * sizeof(int64_t),
                "a dims struct holds exactly its kDims fields, all int64_t");
  if constexpr (count == 1) {
    const auto& [a] = d;
    return {a};
  } else if constexpr (count == 2) {
    const auto& [a, b] = d;
    return {a, b};
  } else if constexpr (count == 3) {
    const auto& [a, b, c] = d;
    return {a, b, c};
  } else if constexpr (count == 4) {
    const auto& [a, b, c, e] = d;
    return {a, b, c, e};
  } else if constexpr (count == 5) {
    const auto& [a, b, c, e, f] = d;
    return {a, b, c, e, f};
  } else if constexpr (count == 6) {
    const auto& [a, b, c, e, f, g] = d;
    return {a, b, c, e, f, g};
  } else {
    static_assert(count == 7, "dims structs have 1 to 7 fields");
    const auto& [a, b, c, e, f, g, h] = d;
    return {a, b, c, e, f, g, h};
  }
}
// (An index_sequence overload, not a templated lambda: CUDA translation units
// include this header as C++17.)
template <class Dims, size_t... I>
constexpr Dims op_dims_from(const OpDimsArray& x, std::index_sequence<I...>) {
  return Dims{x[I]...};
}
template <class Dims>
constexpr Dims op_dims_from(const OpDimsArray& x) {
  return op_dims_from<Dims>(x, std::make_index_sequence<Dims::kDims.size()>{});
}

struct OpShape {
  OpKind kind = OpKind::gemm;
  DType dtype = DType::bf16;
  // The kind's dims in declaration order (the dims struct's fields; the rest
  // 0).  Generic code (profiles, the timing grids, hashing) reads the array;
  // kind-specific code reads typed dims: as<Dims>() / visit_dims().
  OpDimsArray dims{};

  template <class Dims>
  static constexpr OpShape of(const Dims& d, DType dtype) {
    return OpShape{kind_of<Dims>, dtype, op_dims_array(d)};
  }
  // The typed dims; throws std::logic_error when the shape is another kind.
  template <class Dims>
  constexpr Dims as() const {
    if (kind != kind_of<Dims>) {
      throw std::logic_error("OpShape::as: the shape is not of this kind");
    }
    return op_dims_from<Dims>(dims);
  }
};

// Calls f(typed dims) for the shape's kind and returns what it returns (the
// one switch over OpKind that the kind-specific code shares).
template <class F>
constexpr decltype(auto) visit_dims(const OpShape& shape, F&& f) {
  switch (shape.kind) {
#define MODAR_OP_KIND_VISIT(kind, Dims, flops, timing) \
  case OpKind::kind:                                   \
    return f(op_dims_from<Dims>(shape.dims));
    MODAR_OP_KINDS(MODAR_OP_KIND_VISIT)
#undef MODAR_OP_KIND_VISIT
  }
  throw std::logic_error("visit_dims: not an op kind");
}

// One op of a lowered step.  `multiplicity` identical copies (layers with the
// same shape are counted, not repeated, so evaluation cost does not grow with
// depth).  flops / bytes are per copy; the totals multiply.  `weight` is the
// expected number of times each copy runs per step: 1, except for decode's
// MoD routed blocks, lowered once per possible number r of routed new tokens
// with weight P(r routed) (docs/cost_model.md "Decode"); FLOPs, bytes and
// time multiply by it.
struct OpRecord {
  OpShape shape;
  Pass pass = Pass::forward;
  int64_t multiplicity = 1;
  double weight = 1.0;
  double flops = 0.0;                 // counted FLOPs (1 FMA = 2), per the active conventions
  double bytes = 0.0;                 // minimum bytes moved (reads + writes)
  const char* label = "";             // static string, e.g. "attn.qkv", "mlp.up", "router"
  bool counts_as_model_flops = true;  // false for recompute and for ops outside the counted set
  // > 0: the fraction of the profile's memory bandwidth this memory-bound
  // kernel reaches instead of its family's (TimingModel::at_memory_efficiency_s;
  // the DAR paper's prefix kernels, dar.prefix_memory_efficiency); 0: its family's.
  double memory_efficiency = 0.0;
};

inline const char* to_string(OpKind kind) {
  return static_cast<size_t>(kind) < kOpKindTable.size() ? op_kind_info(kind).name : "unknown";
}
const char* to_string(Pass pass);
// Inverse of to_string; false when `name` is no op kind / pass.
bool parse_op_kind(const std::string& name, OpKind* kind);
bool parse_pass(const std::string& name, Pass* pass);
// How many leading dims are meaningful for `kind` (its dims struct's fields).
inline constexpr int op_dims_count(OpKind kind) {
  return op_kind_info(kind).dims_count;
}
// The plain GEMM an expert_gemm is timed as when the profile has no
// measurement of expert_gemm itself: the per-expert shape with the busiest
// expert's rows (mean rows M / G x imbalance, rounded up) as a batch of G
// (one launch, the slowest group sets the pace).
GemmDims expert_gemm_timing_dims(const ExpertGemmDims& expert_gemm);
// True for the kinds whose FLOPs are counted by default (the table's `flops`).
inline constexpr bool is_counted_kind(OpKind kind) {
  return op_kind_info(kind).flops == OpFlops::counted;
}

}  // namespace modar
