// Lowering: a Config -> the op list of one step, and the cost of each op.
//
// op_cost() is the one place where an op's FLOPs and minimum bytes are
// defined (per kind, per pass).  lower_into() walks the model once per layer
// CLASS (full layer, MoD-routed layer; with AttnRes / DAR also per branch
// class: first / middle / last branch of a block, and one prefix read per
// block) and emits each op once with its multiplicity, so the list length does
// not grow with depth (DAR's per-block prefix reads, which differ only in their
// source count, are folded into at most three records with exact sums).
//
// Training step of one micro-batch (T = micro_batch * seq_len tokens):
//   embedding -> [layers] -> final RMSNorm -> LM head GEMM -> cross-entropy,
//   then recompute ops (selective: norms, activations, RoPE; full: every op
//   inside the layers), then backward ops in reverse order (a linear layer's
//   backward is a dgrad and a wgrad GEMM), then the AdamW update.
// Full layer:   rmsnorm, qkv GEMM, rope, attention, out GEMM, residual add,
//               rmsnorm, up GEMM (SwiGLU: gate and up fused, width 2 d_ff),
//               activation, down GEMM, residual add.
// Routed layer (MoD, docs/model.md MoD): router GEMV on all T tokens, top-k, gather of
//               b*k rows, the full layer's ops on b*k rows with attention over
//               the k x k square, scatter-add of g(r) * delta.  With
//               causal_router = predictor, the predictor MLP runs too (its
//               input is stop-gradient: no dgrad for its first GEMM).
// AttnRes / DAR (docs/model.md AttnRes/DAR, docs/dar_math.md 4): per block one depth_read_prefix of
//               all S*n queries; per branch with i >= 2 a depth_read_merge; per
//               branch (DAR, n >= 2) dar_coefficients (predictor + mix); per
//               branch a dar_write (which replaces the residual add); the bank
//               init H_0 = embedding and the output read over H_0..H_N.  With
//               MoD + DAR the depth-read ops run on all T tokens (skipped
//               tokens have y = 0) and each branch of a routed layer gathers
//               its k rows and scatters g(r) * y back.
// Decode step: one new token per sequence (rows = micro_batch), attention of
//               that token over a KV cache of seq_len tokens (routed layers:
//               over their k cached routed tokens).  A routed layer's
//               branches are lowered once per possible routed count r = 1..B,
//               each op weighted by P(r) under Binomial(B, capacity) (the
//               causal router's decisions; r = 0 skips the block): the step's
//               work is its expectation (docs/cost_model.md "Decode").
#include <algorithm>
#include <cmath>
#include <cstring>

#include "cost_model_internal.hpp"
#include "step_accumulator.hpp"

namespace modar {

const char* to_string(StepKind step) {
  return step == StepKind::train ? "train" : "decode";
}

namespace {

double d(int64_t v) {
  return static_cast<double>(v);
}

// What an op's cost depends on besides its dims.
struct CostInputs {
  bool backward = false;
  AttentionFlops convention = AttentionFlops::causal;
  double bytes_per_element = 2.0;  // B: of the shape's dtype
  DType dtype = DType::bf16;
};

// ---- FLOPs and minimum bytes per kind (the table's cost hooks) ----------------
// One overload per dims struct of MODAR_OP_KINDS; forced inline: at each
// emission site of the lowering the kind is known, so no switch runs.

[[gnu::always_inline]] inline OpCost op_cost(const GemmDims& x, const CostInputs& in) {
  // Every pass: a plain GEMM (backward = a dgrad and a wgrad GEMM op).
  const double m = d(x.m), n = d(x.n), k = d(x.k), batch = d(std::max<int64_t>(x.batch, 1));
  const double B = in.bytes_per_element;
  return {2.0 * m * n * k * batch, B * (m * k + k * n + m * n) * batch};
}

// Scored (query, key) pairs of one head of one sequence under a convention.
[[gnu::always_inline]] inline double attention_pairs(const AttentionDims& x,
                                                     AttentionFlops convention) {
  const double s_q = d(x.query_len);
  const double s_k = d(x.key_len);
  if (x.causal == 0 || convention == AttentionFlops::full) {
    return s_q * s_k;
  }
  // Megatron / FlashAttention count half of the square (s^2 / 2, not s(s+1)/2).
  return s_q * s_k / 2.0;
}

[[gnu::always_inline]] inline OpCost op_cost(const AttentionDims& x, const CostInputs& in) {
  const double b = d(x.sequences), heads = d(x.heads), kv_heads = d(x.kv_heads),
               s_q = d(x.query_len), s_k = d(x.key_len), d_h = d(x.head_dim);
  const double B = in.bytes_per_element;
  const double forward_flops = 4.0 * b * heads * d_h * attention_pairs(x, in.convention);
  const double q_elements = b * s_q * heads * d_h;
  const double kv_elements = b * s_k * kv_heads * d_h;  // each of K and V
  const double lse_bytes = 4.0 * b * heads * s_q;
  if (!in.backward) {
    // Read Q K V, write O.
    return {forward_flops, B * (2.0 * q_elements + 2.0 * kv_elements) + lse_bytes};
  }
  // FlashAttention's own count: backward = 2.5 x forward (it recomputes the
  // scores); the Megatron / nanoGPT conventions: 2 x.  Bytes: read Q K V O dO
  // (+ lse), write dQ dK dV.
  return {forward_flops * (in.convention == AttentionFlops::flash ? 2.5 : 2.0),
          B * (4.0 * q_elements + 4.0 * kv_elements) + 2.0 * lse_bytes};
}

[[gnu::always_inline]] inline OpCost op_cost(const RmsnormDims& x, const CostInputs& in) {
  const double B = in.bytes_per_element;
  const double elements = d(x.rows) * d(x.width);
  return {(in.backward ? 8.0 : 4.0) * elements,
          (in.backward ? 3.0 : 2.0) * B * elements + 4.0 * d(x.rows) + B * d(x.width)};
}

[[gnu::always_inline]] inline OpCost op_cost(const RopeDims& x, const CostInputs& in) {
  const double elements = d(x.rows) * d(x.heads) * d(x.head_dim);
  // One complex multiply per pair of elements.
  return {3.0 * elements, in.bytes_per_element * 2.0 * elements};
}

[[gnu::always_inline]] inline OpCost op_cost(const RouterDims& x, const CostInputs& in) {
  const double rows = d(x.rows), width = d(x.width), B = in.bytes_per_element;
  // Forward r = x . w_r; backward dw_r = sum dr x and dx += dr w_r.
  return {(in.backward ? 4.0 : 2.0) * rows * width,
          in.backward ? B * 3.0 * rows * width + 4.0 * rows : B * rows * width + 4.0 * rows};
}

[[gnu::always_inline]] inline OpCost op_cost(const TopkDims& x, const CostInputs&) {
  // Comparisons, not counted; read fp32 logits, write int32 index + fp32 score.
  return {0.0, 4.0 * d(x.sequences) * d(x.seq_len) + 8.0 * d(x.sequences) * d(x.k)};
}

[[gnu::always_inline]] inline OpCost op_cost(const GatherDims& x, const CostInputs& in) {
  const double rows = d(x.rows), width = d(x.width);
  // Forward: copy rows.  Backward (of a scatter_add): d_delta = g dx[idx]
  // and dg = <dx[idx], delta>: read dx rows and delta, write d_delta.
  return {in.backward ? 3.0 * rows * width : 0.0,
          (in.backward ? 3.0 : 2.0) * in.bytes_per_element * rows * width + 4.0 * rows};
}

[[gnu::always_inline]] inline OpCost op_cost(const ScatterAddDims& x, const CostInputs& in) {
  const double rows = d(x.rows), width = d(x.width);
  return {2.0 * rows * width,  // x += g * delta
          3.0 * in.bytes_per_element * rows * width + 8.0 * rows};
}

[[gnu::always_inline]] inline OpCost op_cost(const DepthReadPrefixDims& x, const CostInputs& in) {
  const double tokens = d(x.tokens), sources = d(x.sources), queries = d(x.queries),
               width = d(x.width), streams = d(x.streams), B = in.bytes_per_element;
  // Each query: per source one key dot (2d) and one value FMA (2d).
  const double forward_flops = 4.0 * width * tokens * queries * sources;
  const double bank = B * sources * streams * tokens * width + 4.0 * sources * streams * tokens;
  const double outputs = B * queries * tokens * width + 4.0 * queries * tokens;
  // Forward: the bank is read once for keys AND values.  Backward: read the
  // bank and dR, write the bank gradient.
  return {in.backward ? 2.0 * forward_flops : forward_flops,
          in.backward ? 2.0 * bank + 2.0 * outputs : bank + outputs};
}

[[gnu::always_inline]] inline OpCost op_cost(const DepthReadMergeDims& x, const CostInputs& in) {
  const double tokens = d(x.tokens), streams = d(x.streams), width = d(x.width);
  const double forward_flops = 7.0 * streams * width * tokens;  // rstd 2d, logit 2d, merge 3d
  return {in.backward ? 2.0 * forward_flops : forward_flops,
          (in.backward ? 5.0 : 3.0) * in.bytes_per_element * streams * tokens * width +
              8.0 * streams * tokens};
}

[[gnu::always_inline]] inline OpCost op_cost(const DarCoefficientsDims& x, const CostInputs& in) {
  const double tokens = d(x.tokens), streams = d(x.streams), width = d(x.width),
               outputs = d(x.outputs), B = in.bytes_per_element;
  const double nd = streams * width;
  // RMS over n d (2nd), projection n d x outputs (2 n d outputs), mix h (2nd).
  const double forward_flops = tokens * (2.0 * nd + 2.0 * nd * outputs + 2.0 * nd);
  const double weights = B * nd * outputs;
  return {in.backward ? 2.0 * forward_flops : forward_flops,
          in.backward
              ? B * (2.0 * nd + 2.0 * width) * tokens + 2.0 * weights + 8.0 * outputs * tokens
              : B * (nd + width) * tokens + weights + 4.0 * outputs * tokens};
}

[[gnu::always_inline]] inline OpCost op_cost(const DarWriteDims& x, const CostInputs& in) {
  const double tokens = d(x.tokens), streams = d(x.streams), width = d(x.width),
               B = in.bytes_per_element;
  // mode 0: P = beta y (first branch), 1: P = M P + beta y, 2: H_0 init.
  const bool emit_rstd = x.emit_rstd != 0;
  const double nd = streams * width;
  double per_token = emit_rstd ? 2.0 * nd : 0.0;
  if (streams >= 2 && x.mode != 2) {
    per_token += 2.0 * nd;  // beta (x) y
    if (x.mode == 1) {
      per_token += 2.0 * streams * nd;  // M(rho) P: 2 n^2 d
    }
  }
  // (n = 1: P += y is the plain residual add, not counted, as in a dense model.)
  const double read_previous = x.mode == 1 ? B * nd * tokens : 0.0;
  const double forward_bytes = B * width * tokens + read_previous + B * nd * tokens +
                               4.0 * streams * tokens * (emit_rstd ? 2.0 : 1.0);
  return {in.backward ? 2.0 * tokens * per_token : tokens * per_token,
          in.backward ? 2.0 * forward_bytes : forward_bytes};
}

[[gnu::always_inline]] inline OpCost op_cost(const ElementwiseDims& x, const CostInputs& in) {
  const double elements = d(x.elements), inputs = d(x.inputs), outputs = d(x.outputs);
  return {elements * std::max(1.0, inputs), in.bytes_per_element * elements * (inputs + outputs)};
}

[[gnu::always_inline]] inline OpCost op_cost(const CrossEntropyDims& x, const CostInputs& in) {
  const double rows = d(x.rows), vocab = d(x.vocab), B = in.bytes_per_element;
  return {5.0 * rows * vocab,  // max, exp, sum, log, (grad) subtract: not counted
          in.backward ? 2.0 * B * rows * vocab + 4.0 * rows : B * rows * vocab + 8.0 * rows};
}

[[gnu::always_inline]] inline OpCost op_cost(const EmbeddingDims& x, const CostInputs& in) {
  const double rows = d(x.rows), width = d(x.width);
  return {0.0,  // a lookup
          (in.backward ? 3.0 : 2.0) * in.bytes_per_element * rows * width + 4.0 * rows};
}

[[gnu::always_inline]] inline OpCost op_cost(const OptimizerUpdateDims& x, const CostInputs& in) {
  const double params = d(x.params);
  // AdamW with fp32 master weights: read grad (fp32), master, m, v; write
  // master, m, v and the bf16 working copy (fp32 training: no copy).
  const bool low_precision = in.dtype != DType::fp32 && in.dtype != DType::fp64;
  return {12.0 * params,
          params * (4.0 + 12.0 + 12.0 + (low_precision ? in.bytes_per_element : 0.0))};
}

[[gnu::always_inline]] inline OpCost op_cost(const ExpertGemmDims& x, const CostInputs& in) {
  // Grouped GEMM: the ragged dim sums to `rows` over the groups (ragged_inner
  // picks which dim is ragged; FLOPs and bytes are the same either way).
  const double groups = d(std::max<int64_t>(x.groups, 1)), total = d(x.rows), n = d(x.n),
               k = d(x.k);
  return {2.0 * total * n * k, in.bytes_per_element * (total * k + groups * k * n + total * n)};
}

[[gnu::always_inline]] inline OpCost op_cost(const MoeTopkDims& x, const CostInputs& in) {
  const double rows = d(x.rows), choices = d(x.choices), k = d(x.k);
  // Forward: read fp32 logits, write fp32 probabilities (kept for the aux
  // and z losses), int32 index + fp32 gate per choice made.  Backward: read
  // the probabilities and the gate gradients, write the logit gradient.
  return {
      0.0,  // softmax and comparisons, not counted
      in.backward ? 8.0 * rows * choices + 4.0 * rows * k : 8.0 * rows * choices + 8.0 * rows * k};
}

[[gnu::always_inline]] inline OpCost op_cost(const PermuteDims& x, const CostInputs& in) {
  const double slots = d(x.slots), width = d(x.width), rows = d(x.rows), B = in.bytes_per_element;
  // Forward: a row copy per slot.  Backward: the slots' gradient rows are
  // added back into the tokens' rows.
  return {0.0, in.backward ? B * width * (slots + rows) + 4.0 * slots
                           : 2.0 * B * width * slots + 4.0 * slots};
}

[[gnu::always_inline]] inline OpCost op_cost(const UnpermuteDims& x, const CostInputs& in) {
  const double slots = d(x.slots), width = d(x.width), rows = d(x.rows), B = in.bytes_per_element;
  // Forward y[t] = sum gate e[slot]: read the slots and gates, write the
  // tokens.  Backward: d e[slot] = gate dy[t] and d gate = <dy[t], e[slot]>.
  return {(in.backward ? 4.0 : 2.0) * slots * width,
          in.backward ? 3.0 * B * width * slots + 8.0 * slots
                      : B * width * (slots + rows) + 8.0 * slots};
}

}  // namespace

OpCost op_cost(const OpShape& s, Pass pass, AttentionFlops convention) {
  const CostInputs in{pass == Pass::backward, convention, d(dtype_bytes(s.dtype)), s.dtype};
  return visit_dims(s, [&](const auto& dims) { return op_cost(dims, in); });
}

LayerCounts layer_counts(const Config& config) {
  LayerCounts counts;
  const int64_t layers = config.model.n_layers;
  if (config.mod.every > 0) {
    const int64_t phase = config.mod.offset % config.mod.every;
    counts.routed_layers = phase < layers ? (layers - 1 - phase) / config.mod.every + 1 : 0;
  }
  counts.full_layers = layers - counts.routed_layers;
  counts.routed_tokens_per_sequence = config.mod.routed_tokens_per_sequence(config.model.seq_len);
  if (config.dar.enabled()) {
    counts.dar_blocks = config.dar.blocks(layers);
    counts.dar_streams = config.dar.resolved_streams();
  }
  if (config.moe.enabled()) {
    const int64_t moe = config.moe.moe_layers(layers);
    if (config.mod.every > 0) {
      // MoE layers l = first_dense + j every, MoD-routed iff l % mod.every == phase.
      const int64_t phase = config.mod.offset % config.mod.every;
      for (int64_t l = config.moe.first_dense; l < layers; l += config.moe.interval) {
        counts.moe_routed_layers += (l % config.mod.every == phase) ? 1 : 0;
      }
    }
    counts.moe_full_layers = moe - counts.moe_routed_layers;
  }
  return counts;
}

namespace {

// The recompute module of an op (detail::RecomputePlan says which re-run):
// `never` outside the layers (embedding, head, DAR prefix reads); `layer`
// any op inside a layer that only full recompute re-runs; the rest the
// modules modar's selective (norms, RoPE, activations; core attention with
// the unfused kernel) and Megatron's selective (train.recompute_modules)
// name.
enum class Recomputed : uint8_t {
  never,
  layer,
  norm,
  rope,
  core_attention,
  mlp,
  mlp_activation,
  moe,
  moe_activation,
  shared,
  shared_activation,
  predictor_activation,
};

uint32_t recompute_mask(const detail::RecomputePlan& plan) {
  const auto bit = [](Recomputed r) { return uint32_t{1} << static_cast<unsigned>(r); };
  if (plan.full) {
    return ~bit(Recomputed::never);
  }
  uint32_t mask = 0;
  mask |= plan.norms ? bit(Recomputed::norm) : 0;
  mask |= plan.rope ? bit(Recomputed::rope) : 0;
  mask |= plan.core_attention ? bit(Recomputed::core_attention) : 0;
  mask |= plan.mlp ? bit(Recomputed::mlp) : 0;
  mask |= plan.mlp_activation ? bit(Recomputed::mlp_activation) : 0;
  mask |= plan.moe ? bit(Recomputed::moe) : 0;
  mask |= plan.moe_activation ? bit(Recomputed::moe_activation) : 0;
  mask |= plan.shared ? bit(Recomputed::shared) : 0;
  mask |= plan.shared_activation ? bit(Recomputed::shared_activation) : 0;
  mask |= plan.predictor_activation ? bit(Recomputed::predictor_activation) : 0;
  return mask;
}

struct LinearLabels {
  const char* forward;
  const char* dgrad;
  const char* wgrad;
};

// Labels of one FFN's up projection and activation, by MLP kind (gelu has
// one up matrix, the gated kinds a fused gate+up of twice the width).
struct FfnLabels {
  LinearLabels up;
  const char* activation;
  const char* activation_backward;
};

FfnLabels ffn_labels(const char* const (&names)[3][5], MlpKind kind) {
  const char* const* n = names[static_cast<int>(kind)];
  return {{n[0], n[1], n[2]}, n[3], n[4]};
}

// [kind][up, up.dgrad, up.wgrad, activation, activation.bwd], kinds in MlpKind order.
constexpr const char* kMlpNames[3][5] = {
    {"mlp.up", "mlp.up.dgrad", "mlp.up.wgrad", "mlp.gelu", "mlp.gelu.bwd"},
    {"mlp.gate_up", "mlp.gate_up.dgrad", "mlp.gate_up.wgrad", "mlp.swiglu", "mlp.swiglu.bwd"},
    {"mlp.gate_up", "mlp.gate_up.dgrad", "mlp.gate_up.wgrad", "mlp.geglu", "mlp.geglu.bwd"}};
constexpr const char* kExpertNames[3][5] = {
    {"moe.expert.up", "moe.expert.up.dgrad", "moe.expert.up.wgrad", "moe.expert.gelu",
     "moe.expert.gelu.bwd"},
    {"moe.expert.gate_up", "moe.expert.gate_up.dgrad", "moe.expert.gate_up.wgrad",
     "moe.expert.swiglu", "moe.expert.swiglu.bwd"},
    {"moe.expert.gate_up", "moe.expert.gate_up.dgrad", "moe.expert.gate_up.wgrad",
     "moe.expert.geglu", "moe.expert.geglu.bwd"}};
constexpr const char* kSharedNames[3][5] = {
    {"moe.shared.up", "moe.shared.up.dgrad", "moe.shared.up.wgrad", "moe.shared.gelu",
     "moe.shared.gelu.bwd"},
    {"moe.shared.gate_up", "moe.shared.gate_up.dgrad", "moe.shared.gate_up.wgrad",
     "moe.shared.swiglu", "moe.shared.swiglu.bwd"},
    {"moe.shared.gate_up", "moe.shared.gate_up.dgrad", "moe.shared.gate_up.wgrad",
     "moe.shared.geglu", "moe.shared.geglu.bwd"}};

// Stream: the consumer type of streaming mode (detail::OpConsumer for any
// consumer through a virtual call; a final consumer class for a direct,
// inlinable one: estimate_into's StepAccumulator).
template <class Stream>
class Lowerer {
 public:
  // Record mode: ops go to the three lists (forward, recompute, backward).
  // Streaming mode (`stream` set): every op is handed to the consumer as it is
  // made and nothing is stored (estimate_into's hot path; sums do not depend
  // on the order).
  Lowerer(const Config& config, StepKind step, OpList& ops, OpList& recompute, OpList& backward,
          Stream* stream, const detail::ShardView& view = detail::ShardView{})
      : config_(config),
        view_(view),
        train_(step == StepKind::train),
        dtype_(config.train.dtype),
        bytes_per_element_(static_cast<double>(dtype_bytes(config.train.dtype))),
        convention_(config.attention_flops),
        prefix_efficiency_(config.dar.enabled() && config.dar.kernel == DarKernel::prefix
                               ? config.dar.prefix_memory_efficiency
                               : 0.0),
        recompute_mask_(recompute_mask(detail::recompute_plan(config))),
        ops_(ops),
        recompute_(recompute),
        backward_(backward),
        stream_(stream) {}

  void run();

 private:
  // --- emission ------------------------------------------------------------
  template <class Dims>
  [[gnu::always_inline]] void fill(OpRecord& op, const Dims& dims, Pass pass, int64_t multiplicity,
                                   const char* label) const {
    op.shape = OpShape::of(dims, dtype_);
    op.pass = pass;
    op.multiplicity = multiplicity;
    op.weight = weight_;
    const OpCost cost =
        op_cost(dims, CostInputs{pass == Pass::backward, convention_, bytes_per_element_, dtype_});
    op.flops = cost.flops;
    op.bytes = cost.bytes;
    op.label = label;
    op.counts_as_model_flops = is_counted_kind(kind_of<Dims>) && pass != Pass::recompute;
    // The DAR paper's prefix kernels: every dar.* record at their own rate.
    op.memory_efficiency =
        prefix_efficiency_ > 0.0 && std::strncmp(label, "dar.", 4) == 0 ? prefix_efficiency_ : 0.0;
  }

  template <class Dims>
  [[gnu::always_inline]] void push(OpList& list, const Dims& dims, Pass pass, int64_t multiplicity,
                                   const char* label) {
    if (multiplicity <= 0) {
      return;
    }
    if (stream_ != nullptr) {
      OpRecord op;
      fill(op, dims, pass, multiplicity, label);
      stream_->take(op);
      return;
    }
    fill(list.emplace_back(), dims, pass, multiplicity, label);
  }

  // A forward op, its recompute copy when the policy re-runs it, and (when
  // `backward_label` is set) its backward op with the same dims.
  template <class Dims>
  [[gnu::always_inline]] void forward(const Dims& dims, int64_t multiplicity, const char* label,
                                      Recomputed recomputed, const char* backward_label) {
    push(ops_, dims, Pass::forward, multiplicity, label);
    if (!train_) {
      return;
    }
    if ((recompute_mask_ >> static_cast<unsigned>(recomputed)) & 1u) {
      push(recompute_, dims, Pass::recompute, multiplicity, label);
    }
    if (backward_label != nullptr) {
      push(backward_, dims, Pass::backward, multiplicity, backward_label);
    }
  }

  // Y[rows, out] = X[rows, in] W[in, out]; backward dX = dY W^T, dW = X^T dY.
  [[gnu::always_inline]] void linear(int64_t rows, int64_t in, int64_t out, int64_t multiplicity,
                                     const LinearLabels& labels, Recomputed recomputed,
                                     bool input_needs_grad = true) {
    forward(GemmDims{.m = rows, .n = out, .k = in, .batch = 1}, multiplicity, labels.forward,
            recomputed, nullptr);
    if (!train_) {
      return;
    }
    if (input_needs_grad) {
      push(backward_, GemmDims{.m = rows, .n = in, .k = out, .batch = 1}, Pass::backward,
           multiplicity, labels.dgrad);
    }
    push(backward_, GemmDims{.m = in, .n = out, .k = rows, .batch = 1}, Pass::backward,
         multiplicity, labels.wgrad);
  }

  // --- model pieces -----------------------------------------------------------
  void attention_branch(int64_t rows, int64_t sequences, int64_t query_len, int64_t key_len,
                        bool causal, int64_t multiplicity);
  void mlp_branch(int64_t rows, int64_t multiplicity);
  void moe_branch(int64_t rows, int64_t multiplicity);
  void ffn_block(int64_t rows, int64_t width, int64_t multiplicity, const FfnLabels& labels,
                 const LinearLabels& down, Recomputed matrices, Recomputed activation);
  // The FFN branches of `layers` layers on `rows` rows, `moe` of which are MoE.
  void ffn_branches(int64_t rows, int64_t layers, int64_t moe) {
    mlp_branch(rows, layers - moe);
    moe_branch(rows, moe);
  }
  // Hidden dropout on `rows` rows (docs/cluster.md "Dropout"): Megatron's
  // fused bias-dropout-add writes a 1-byte mask beside the add, and its
  // backward reads the gradient and the mask and writes the gradient.  Both
  // are elementwise ops of one input and one output whose element counts give
  // exactly those bytes (rows d / (2B) for the mask write; rows d (2B + 1) /
  // (2B) for the backward), so a measured profile times them on its own grid.
  void hidden_dropout(int64_t rows, int64_t multiplicity, const char* mask_label,
                      const char* backward_label, Recomputed recomputed) {
    if (!train_ || config_.train.hidden_dropout <= 0.0 || multiplicity <= 0) {
      return;
    }
    const int64_t elements = rows * config_.model.d_model;
    const int64_t B = dtype_bytes(dtype_);
    forward(ElementwiseDims{.elements = (elements + 2 * B - 1) / (2 * B), .inputs = 1,
                            .outputs = 1},
            multiplicity, mask_label, recomputed, nullptr);
    push(backward_,
         ElementwiseDims{.elements = (elements * (2 * B + 1) + 2 * B - 1) / (2 * B),
                         .inputs = 1,
                         .outputs = 1},
         Pass::backward, multiplicity, backward_label);
  }
  void layer_dropout(int64_t rows, int64_t multiplicity) {
    hidden_dropout(rows, multiplicity, "dropout.mask", "dropout.bwd", Recomputed::layer);
  }
  void residual_add(int64_t rows, int64_t multiplicity) {
    forward(ElementwiseDims{.elements = rows * config_.model.d_model, .inputs = 2, .outputs = 1},
            multiplicity, "residual.add", Recomputed::layer, nullptr);  // backward: identity
  }
  void router(int64_t rows, int64_t multiplicity);
  void dar_branch_ops(int64_t branch_class, int64_t multiplicity);
  void layers_plain();
  void layers_with_depth_reads();
  // A routed-rows op whose backward is the mirror op on the same rows.
  template <class ForwardDims, class BackwardDims>
  void routed_rows(int64_t rows, int64_t multiplicity, const char* label,
                   const char* backward_label) {
    forward(ForwardDims{.rows = rows, .width = config_.model.d_model}, multiplicity, label,
            Recomputed::layer, nullptr);
    if (train_) {
      push(backward_, BackwardDims{.rows = rows, .width = config_.model.d_model}, Pass::backward,
           multiplicity, backward_label);
    }
  }
  // Forward gather; its backward scatters the gradient rows back.
  void routed_gather(int64_t rows, int64_t multiplicity, const char* label) {
    routed_rows<GatherDims, ScatterAddDims>(rows, multiplicity, label, "mod.gather.bwd");
  }
  // Forward x[idx] += g(r) delta; its backward gathers dx rows (d_delta, dg).
  void routed_scatter(int64_t rows, int64_t multiplicity, const char* label) {
    routed_rows<ScatterAddDims, GatherDims>(rows, multiplicity, label, "mod.scatter.bwd");
  }

  // One depth read over `read.sources` bank entries (docs/dar_math.md 4.2).
  // With dar.kernel = prefix, the DAR paper's implementation (docs/moe.md
  // "The DAR paper's implementation"), a training read first packs the
  // normalised key views (an unweighted RMSNorm of the raw entries with
  // their cached rstd) and the values (a row copy) of its sources for every
  // stream; the backward rebuilds both packs from the raw entries
  // (dar.reconstruct_*) unless they are kept from the forward
  // (DarConfig::packs_kept: memory's dar_packs), and folds the packed
  // gradients back into the bank gradient (dar.pack_*.bwd).  The read's own
  // record charges one bank-sized operand (modar's fused kernel reads the raw
  // bank once for keys and values); a packed read has two, the key pack and
  // the value pack, and its backward writes their gradients apart: the
  // second operand's traffic is the companion record dar.prefix.value_pack
  // (read forward; read + its gradient's write backward; uncounted FLOPs).
  void depth_read(const DepthReadPrefixDims& read, int64_t multiplicity, const char* label,
                  const char* backward_label) {
    if (train_ && config_.dar.kernel == DarKernel::prefix) {
      const int64_t rows = read.sources * read.streams * read.tokens;
      const RmsnormDims keys{.rows = rows, .width = read.width};
      const GatherDims values{.rows = rows, .width = read.width};
      forward(keys, multiplicity, "dar.pack_keys", Recomputed::never, "dar.pack_keys.bwd");
      forward(values, multiplicity, "dar.pack_values", Recomputed::never, nullptr);
      if (!config_.dar.packs_kept()) {
        push(recompute_, keys, Pass::recompute, multiplicity, "dar.reconstruct_keys");
        push(recompute_, values, Pass::recompute, multiplicity, "dar.reconstruct_values");
      }
      const int64_t elements = rows * read.width;
      push(ops_, ElementwiseDims{.elements = elements, .inputs = 1, .outputs = 0}, Pass::forward,
           multiplicity, "dar.prefix.value_pack");
      push(backward_, ElementwiseDims{.elements = elements, .inputs = 1, .outputs = 1},
           Pass::backward, multiplicity, "dar.prefix.value_pack.bwd");
      push(backward_, ScatterAddDims{.rows = rows, .width = read.width}, Pass::backward,
           multiplicity, "dar.pack_values.bwd");
    }
    forward(read, multiplicity, label, Recomputed::never, backward_label);
  }

  int64_t tokens() const {
    return train_ ? config_.train.micro_batch * config_.model.seq_len : config_.train.micro_batch;
  }
  // Calls emit(rows, probability) for each number of rows a routed layer's
  // branches may process.  Training: k per sequence, always.  Decode
  // (docs/cost_model.md "Decode"): each of the B new tokens enters a routed
  // block on its own causal decision (predictor, or the router's
  // aux-loss-trained sigmoid), routed with probability c (both are trained to
  // reproduce the top-k choice, c of the tokens), so the count is
  // Binomial(B, c).  r = 0 skips the block outright: none of its weights are
  // read.  Probabilities below 1e-12 are dropped (at most B x 1e-12 of the
  // mass).  No allocation: the lowering stays allocation-free.
  template <class Emit>
  void for_each_routed_count(Emit&& emit) const {
    const int64_t b = config_.train.micro_batch;
    const double c = config_.mod.capacity;
    if (train_) {
      emit(b * counts_.routed_tokens_per_sequence, 1.0);
      return;
    }
    if (c >= 1.0) {
      emit(b, 1.0);
      return;
    }
    for (int64_t r = 1; r <= b; ++r) {
      const double log_p = std::lgamma(double(b) + 1) - std::lgamma(double(r) + 1) -
                           std::lgamma(double(b - r) + 1) + double(r) * std::log(c) +
                           double(b - r) * std::log1p(-c);
      const double p = std::exp(log_p);
      if (p >= 1e-12) {
        emit(r, p);
      }
    }
  }
  // Sequences, rows and the attention square of one branch: training the full
  // sequence or k per sequence; decode one new token per sequence attending
  // to the cache (routed layers: the k cached routed tokens).
  void attention_for(bool routed, int64_t routed_rows, int64_t multiplicity) {
    const int64_t b = config_.train.micro_batch;
    const int64_t s = config_.model.seq_len;
    const int64_t k = counts_.routed_tokens_per_sequence;
    if (train_) {
      // Context parallelism (ShardView): the rank's queries against the keys
      // of the whole sequence.
      const int64_t keys = (routed ? k : s) * view_.context;
      attention_branch(routed ? b * k : b * s, b, routed ? k : s, keys, true, multiplicity);
    } else {
      const int64_t rows = routed ? routed_rows : b;
      attention_branch(rows, rows, 1, routed ? k : s, false, multiplicity);
    }
  }
  // Ops emitted inside this scope run with expected weight `weight`.
  class WeightScope {
   public:
    WeightScope(Lowerer& lowerer, double weight) : lowerer_(lowerer) { lowerer_.weight_ = weight; }
    ~WeightScope() { lowerer_.weight_ = 1.0; }
    WeightScope(const WeightScope&) = delete;
    WeightScope& operator=(const WeightScope&) = delete;

   private:
    Lowerer& lowerer_;
  };

  const Config& config_;
  const detail::ShardView view_;
  const bool train_;
  const DType dtype_;
  const double bytes_per_element_;
  const AttentionFlops convention_;
  const double prefix_efficiency_;  // OpRecord::memory_efficiency of dar.* (0: none)
  const uint32_t recompute_mask_;  // bit r: ops tagged Recomputed r are re-run
  OpList& ops_;
  OpList& recompute_;
  OpList& backward_;
  Stream* stream_;
  LayerCounts counts_;
  double weight_ = 1.0;  // OpRecord::weight of the ops being emitted
};

template <class Stream>
void Lowerer<Stream>::attention_branch(int64_t rows, int64_t sequences, int64_t query_len,
                                       int64_t key_len, bool causal, int64_t multiplicity) {
  const ModelConfig& m = config_.model;
  const int64_t heads = m.n_heads;
  const int64_t kv_heads = m.resolved_kv_heads();
  const int64_t d_head = m.resolved_d_head();
  forward(RmsnormDims{.rows = rows, .width = m.d_model}, multiplicity, "attn.norm",
          Recomputed::norm, "attn.norm.bwd");
  linear(rows, m.d_model, (heads + 2 * kv_heads) * d_head, multiplicity,
         {"attn.qkv", "attn.qkv.dgrad", "attn.qkv.wgrad"}, Recomputed::layer);
  // (QKV biases: fused into the GEMM's epilogue, no op of their own.)
  if (m.qk_norm != QkNorm::none) {
    // RMSNorm of the queries and keys: per head (rows x heads of d_head) or
    // over each whole projection; the same elements either way.
    const bool per_head = m.qk_norm == QkNorm::head;
    forward(RmsnormDims{.rows = per_head ? rows * heads : rows,
                        .width = per_head ? d_head : heads * d_head},
            multiplicity, "attn.q_norm", Recomputed::norm, "attn.q_norm.bwd");
    forward(RmsnormDims{.rows = per_head ? rows * kv_heads : rows,
                        .width = per_head ? d_head : kv_heads * d_head},
            multiplicity, "attn.k_norm", Recomputed::norm, "attn.k_norm.bwd");
  }
  forward(RopeDims{.rows = rows, .heads = heads + kv_heads, .head_dim = d_head}, multiplicity,
          "attn.rope", Recomputed::rope, "attn.rope.bwd");
  forward(AttentionDims{.sequences = sequences,
                        .heads = heads,
                        .kv_heads = kv_heads,
                        .query_len = query_len,
                        .key_len = key_len,
                        .head_dim = d_head,
                        .causal = causal ? 1 : 0},
          multiplicity, "attn.core", Recomputed::core_attention, "attn.core.bwd");
  linear(rows, heads * d_head, m.d_model, multiplicity,
         {"attn.out", "attn.out.dgrad", "attn.out.wgrad"}, Recomputed::layer);
}

template <class Stream>
void Lowerer<Stream>::mlp_branch(int64_t rows, int64_t multiplicity) {
  const ModelConfig& m = config_.model;
  forward(RmsnormDims{.rows = rows, .width = m.d_model}, multiplicity, "mlp.norm",
          Recomputed::norm, "mlp.norm.bwd");
  ffn_block(rows, m.resolved_d_ff(), multiplicity, ffn_labels(kMlpNames, m.mlp),
            {"mlp.down", "mlp.down.dgrad", "mlp.down.wgrad"}, Recomputed::mlp,
            Recomputed::mlp_activation);
}

// One dense FFN of width `width` on `rows` rows: up (or gate+up), the
// activation (GELU: y = gelu(u); gated: y = act(g) * u), down; `matrices` and
// `activation` are the recompute modules of the GEMMs and the activation.
template <class Stream>
void Lowerer<Stream>::ffn_block(int64_t rows, int64_t width, int64_t multiplicity,
                                const FfnLabels& labels, const LinearLabels& down,
                                Recomputed matrices, Recomputed activation) {
  const ModelConfig& m = config_.model;
  const bool gated = m.gated_mlp();
  linear(rows, m.d_model, gated ? 2 * width : width, multiplicity, labels.up, matrices);
  forward(ElementwiseDims{.elements = rows * width, .inputs = gated ? 2 : 1, .outputs = 1},
          multiplicity, labels.activation, activation, nullptr);
  if (train_) {
    // Backward reads dY and the inputs, writes the input gradients.
    push(backward_,
         ElementwiseDims{
             .elements = rows * width, .inputs = gated ? 3 : 2, .outputs = gated ? 2 : 1},
         Pass::backward, multiplicity, labels.activation_backward);
  }
  linear(rows, width, m.d_model, multiplicity, down, matrices);
}

// MoE FFN (docs/model.md experts) on `rows` tokens: norm, router GEMM (d -> E + Z),
// softmax top-k, permutation into expert order, the experts' grouped GEMMs on
// the processed slots, the combine with the gates, and the shared experts (one
// fused FFN of width shared x expert_ffn on every token).  Processed slots:
// dropless, the expected real-expert assignments rows x k x E / (E + Z);
// with a capacity factor, every local expert's capacity ceil(cf rows k /
// (E + Z)) (padded dispatch, as Switch / GShard run it).  Under expert
// parallelism a rank holds E / EP experts and, in expectation, processes as
// many slots as it routes (its tokens' assignments spread over the group).
template <class Stream>
void Lowerer<Stream>::moe_branch(int64_t rows, int64_t multiplicity) {
  if (multiplicity <= 0) {
    return;
  }
  const ModelConfig& m = config_.model;
  const MoeConfig& e = config_.moe;
  const int64_t ffn = e.resolved_expert_ffn(m);
  const bool gated = m.gated_mlp();
  const int64_t up = gated ? 2 * ffn : ffn;
  const int64_t local = std::max<int64_t>(1, e.experts / std::max<int64_t>(config_.parallel.expert, 1));
  // The tokens this rank's experts see (ShardView: the expert-tensor group's).
  const int64_t expert_rows =
      rows * view_.expert_rows_numerator / std::max<int64_t>(view_.expert_rows_denominator, 1);
  const int64_t slots = detail::moe_slots(config_, expert_rows);
  const int64_t imbalance = std::llround(e.load_imbalance * 1000.0);
  forward(RmsnormDims{.rows = rows, .width = m.d_model}, multiplicity, "mlp.norm",
          Recomputed::norm, "mlp.norm.bwd");
  linear(rows, m.d_model, e.choices(), multiplicity,
         {"moe.router", "moe.router.dgrad", "moe.router.wgrad"}, Recomputed::moe);
  forward(MoeTopkDims{.rows = rows, .choices = e.choices(), .k = e.top_k}, multiplicity, "moe.topk",
          Recomputed::moe, "moe.topk.bwd");
  if (slots > 0) {
    forward(PermuteDims{.slots = slots, .width = m.d_model, .rows = expert_rows}, multiplicity,
            "moe.permute", Recomputed::moe, "moe.permute.bwd");
    // Expert GEMMs: forward, then (backward list) dgrad and wgrad per GEMM.
    auto grouped = [&](int64_t in, int64_t out, const LinearLabels& labels) {
      forward(ExpertGemmDims{.groups = local,
                             .rows = slots,
                             .n = out,
                             .k = in,
                             .imbalance_permille = imbalance,
                             .ragged_inner = 0},
              multiplicity, labels.forward, Recomputed::moe, nullptr);
      if (train_) {
        // dgrad and wgrad have the same dims; wgrad's inner dimension is the ragged one.
        ExpertGemmDims backward{.groups = local,
                                .rows = slots,
                                .n = in,
                                .k = out,
                                .imbalance_permille = imbalance,
                                .ragged_inner = 0};
        push(backward_, backward, Pass::backward, multiplicity, labels.dgrad);
        backward.ragged_inner = 1;
        push(backward_, backward, Pass::backward, multiplicity, labels.wgrad);
      }
    };
    const FfnLabels expert = ffn_labels(kExpertNames, m.mlp);
    grouped(m.d_model, up, expert.up);
    forward(ElementwiseDims{.elements = slots * ffn, .inputs = gated ? 2 : 1, .outputs = 1},
            multiplicity, expert.activation, Recomputed::moe_activation, nullptr);
    if (train_) {
      push(backward_,
           ElementwiseDims{
               .elements = slots * ffn, .inputs = gated ? 3 : 2, .outputs = gated ? 2 : 1},
           Pass::backward, multiplicity, expert.activation_backward);
    }
    grouped(ffn, m.d_model, {"moe.expert.down", "moe.expert.down.dgrad", "moe.expert.down.wgrad"});
    forward(UnpermuteDims{.slots = slots, .width = m.d_model, .rows = expert_rows, .k = e.top_k},
            multiplicity, "moe.unpermute", Recomputed::moe, "moe.unpermute.bwd");
  }
  if (e.shared_experts > 0) {
    ffn_block(rows, e.shared_ffn_total(m), multiplicity, ffn_labels(kSharedNames, m.mlp),
              {"moe.shared.down", "moe.shared.down.dgrad", "moe.shared.down.wgrad"},
              Recomputed::shared, Recomputed::shared_activation);
    if (e.shared_expert_gate) {
      // g = sigmoid(u . w_g) (a d -> 1 GEMM), then the shared output scaled
      // by g: reads the output and g, writes the scaled output.
      linear(rows, m.d_model, 1, multiplicity,
             {"moe.shared.gate", "moe.shared.gate.dgrad", "moe.shared.gate.wgrad"},
             Recomputed::shared);
      forward(ElementwiseDims{.elements = rows * m.d_model, .inputs = 2, .outputs = 1},
              multiplicity, "moe.shared.gate.scale", Recomputed::shared, nullptr);
      if (train_) {
        push(backward_, ElementwiseDims{.elements = rows * m.d_model, .inputs = 3, .outputs = 1},
             Pass::backward, multiplicity, "moe.shared.gate.scale.bwd");
      }
    }
    // Routed + shared outputs summed.
    forward(ElementwiseDims{.elements = rows * m.d_model, .inputs = 2, .outputs = 1}, multiplicity,
            "moe.shared.add", Recomputed::shared, nullptr);
  }
}

template <class Stream>
void Lowerer<Stream>::router(int64_t rows, int64_t multiplicity) {
  const ModelConfig& m = config_.model;
  const ModConfig& mod = config_.mod;
  const bool use_predictor = mod.causal_router == CausalRouter::predictor;
  // Training always computes the router logits (they scale the branch output);
  // decode uses the predictor instead when there is one.
  if (train_ || !use_predictor) {
    forward(RouterDims{.rows = rows, .width = m.d_model}, multiplicity, "mod.router",
            Recomputed::layer, "mod.router.bwd");
  }
  if (use_predictor) {
    // Predictor MLP on a stop-gradient copy of x: d -> hidden -> 1.
    linear(rows, m.d_model, mod.predictor_hidden, multiplicity,
           {"mod.predictor.in", "mod.predictor.in.dgrad", "mod.predictor.in.wgrad"},
           Recomputed::layer, /*input_needs_grad=*/false);
    forward(ElementwiseDims{.elements = rows * mod.predictor_hidden, .inputs = 1, .outputs = 1},
            multiplicity, "mod.predictor.act", Recomputed::predictor_activation,
            "mod.predictor.act.bwd");
    linear(rows, mod.predictor_hidden, 1, multiplicity,
           {"mod.predictor.out", "mod.predictor.out.dgrad", "mod.predictor.out.wgrad"},
           Recomputed::layer);
  }
  if (train_) {
    const int64_t b = config_.train.micro_batch;
    forward(TopkDims{.sequences = b,
                     .seq_len = config_.model.seq_len,
                     .k = counts_.routed_tokens_per_sequence},
            multiplicity, "mod.topk", Recomputed::never, nullptr);
    if (mod.causal_router != CausalRouter::none) {
      // BCE of the router (aux_loss) or predictor logits against the top-k mask.
      forward(ElementwiseDims{.elements = rows, .inputs = 2, .outputs = 1}, multiplicity,
              "mod.causal_bce", Recomputed::never, "mod.causal_bce.bwd");
    }
  }
}

template <class Stream>
void Lowerer<Stream>::layers_plain() {
  const int64_t T = tokens();
  const int64_t full = counts_.full_layers;
  const int64_t routed = counts_.routed_layers;
  // Full layers.
  attention_for(false, 0, full);
  residual_add(T, full);
  ffn_branches(T, full, counts_.moe_full_layers);
  residual_add(T, full);
  layer_dropout(T, 2 * full);
  // Routed layers: router on all tokens, branches on the routed rows only.
  if (routed > 0) {
    router(T, routed);
    for_each_routed_count([&](int64_t R, double probability) {
      const WeightScope scope(*this, probability);
      routed_gather(R, routed, "mod.gather");
      attention_for(true, R, routed);
      residual_add(R, routed);  // X~ + a, the MLP branch's input
      ffn_branches(R, routed, counts_.moe_routed_layers);
      residual_add(R, routed);  // delta = a + m
      layer_dropout(R, 2 * routed);
      routed_scatter(R, routed, "mod.scatter_add");
    });
  }
}

// Per-branch depth-read ops of one branch class (docs/dar_math.md 4.2):
//   0 = first branch of a block (i = 1): R = o (no merge), P = beta y;
//   1 = middle branch (2 <= i < S):     merge, P = M(rho) P + beta y;
//   2 = last branch (i = S):            merge, P = ..., emit the bank entry's rstd.
template <class Stream>
void Lowerer<Stream>::dar_branch_ops(int64_t branch_class, int64_t multiplicity) {
  const int64_t T = tokens();
  const int64_t n = counts_.dar_streams;
  const int64_t width = config_.model.d_model;
  const int64_t variant = static_cast<int64_t>(config_.dar.variant);
  if (branch_class != 0) {
    forward(DepthReadMergeDims{.tokens = T, .streams = n, .width = width, .variant = variant},
            multiplicity, "dar.merge", Recomputed::layer, "dar.merge.bwd");
  }
  if (n >= 2) {
    const int64_t outputs = 2 * n + (branch_class == 0 ? 0 : DarConfig::transport_params(n));
    forward(DarCoefficientsDims{.tokens = T, .streams = n, .width = width, .outputs = outputs},
            multiplicity, "dar.coefficients", Recomputed::layer, "dar.coefficients.bwd");
  }
}

template <class Stream>
void Lowerer<Stream>::layers_with_depth_reads() {
  const int64_t T = tokens();
  const int64_t layers = config_.model.n_layers;
  const int64_t K = config_.dar.block_layers;
  const int64_t N = counts_.dar_blocks;
  const int64_t n = counts_.dar_streams;
  const int64_t width = config_.model.d_model;
  const int64_t variant = static_cast<int64_t>(config_.dar.variant);
  const int64_t full = counts_.full_layers;
  const int64_t routed = counts_.routed_layers;

  // A depth read of this model's streams over `sources` bank entries with
  // `queries_per_token` queries (every read below differs only in these).
  const auto prefix_read = [&](int64_t sources, int64_t queries_per_token) {
    return DepthReadPrefixDims{.tokens = T,
                               .sources = sources,
                               .queries = queries_per_token,
                               .width = width,
                               .streams = n,
                               .variant = variant};
  };
  // Bank init: H_0[j] = embedding for every stream, plus its rstd.
  forward(DarWriteDims{.tokens = T, .streams = n, .width = width, .mode = 2, .emit_rstd = 1}, 1,
          "dar.bank_init", Recomputed::never, "dar.bank_init.bwd");
  // Phase 1: one prefix read per block b = 1..N over sources H_0..H_{b-1}.
  // The reads differ only in their source count b, and their FLOPs and bytes
  // are linear in it, so the complete blocks 1..F are emitted as two records
  // whose source counts floor / ceil of the mean keep the sums exact (F/2
  // reads of F/2 sources and F - F/2 of F/2 + 1 sum to F(F+1)/2); a shorter
  // last block (K not dividing L) keeps its own record.  The list length thus
  // stays independent of depth.
  const int64_t last_block_layers = layers - (N - 1) * K;
  const int64_t complete_blocks = last_block_layers == K ? N : N - 1;
  const int64_t queries = 2 * K * n;
  const int64_t half = complete_blocks / 2;
  if (complete_blocks % 2 == 1) {
    // Odd F: the mean (F+1)/2 is a whole number of sources.
    depth_read(prefix_read((complete_blocks + 1) / 2, queries),
               complete_blocks, "dar.prefix", "dar.prefix.bwd");
  } else if (half > 0) {
    depth_read(prefix_read(half, queries), half, "dar.prefix", "dar.prefix.bwd");
    depth_read(prefix_read(half + 1, queries), half, "dar.prefix", "dar.prefix.bwd");
  }
  if (complete_blocks < N) {
    depth_read(prefix_read(N, 2 * last_block_layers * n), 1, "dar.prefix", "dar.prefix.bwd");
  }
  // Per-branch ops by class: N first, 2L - 2N middle, N last branches.
  const int64_t branches = 2 * layers;
  dar_branch_ops(0, N);
  dar_branch_ops(1, branches - 2 * N);
  dar_branch_ops(2, N);
  // Writes: P = beta y (first), P = M P + beta y (middle), + rstd (last).
  forward(DarWriteDims{.tokens = T, .streams = n, .width = width, .mode = 0, .emit_rstd = 0}, N,
          "dar.write", Recomputed::layer, "dar.write.bwd");
  forward(DarWriteDims{.tokens = T, .streams = n, .width = width, .mode = 1, .emit_rstd = 0},
          branches - 2 * N, "dar.write", Recomputed::layer, "dar.write.bwd");
  forward(DarWriteDims{.tokens = T, .streams = n, .width = width, .mode = 1, .emit_rstd = 1}, N,
          "dar.write_block_end", Recomputed::layer, "dar.write_block_end.bwd");

  // The branches themselves (the residual adds are replaced by the writes).
  attention_for(false, 0, full);
  ffn_branches(T, full, counts_.moe_full_layers);
  layer_dropout(T, 2 * full);
  if (routed > 0) {
    router(T, routed);  // on the attention branch's input h (all tokens)
    for_each_routed_count([&](int64_t R, double probability) {
      const WeightScope scope(*this, probability);
      routed_gather(R, routed, "mod.gather");
      attention_for(true, R, routed);
      routed_scatter(R, routed, "mod.scatter_add");
      routed_gather(R, routed, "mod.gather");
      ffn_branches(R, routed, counts_.moe_routed_layers);
      routed_scatter(R, routed, "mod.scatter_add");
      layer_dropout(R, 2 * routed);
    });
  }

  // Output read over H_0..H_N (one query per stream), then the streams' mean.
  depth_read(prefix_read(N + 1, n), 1, "dar.output_read", "dar.output_read.bwd");
  if (n >= 2) {
    forward(ElementwiseDims{.elements = T * width, .inputs = n, .outputs = 1}, 1, "dar.output_mean",
            Recomputed::never, "dar.output_mean.bwd");
  }
}

template <class Stream>
void Lowerer<Stream>::run() {
  counts_ = layer_counts(config_);
  const ModelConfig& m = config_.model;
  const int64_t T = tokens();
  forward(EmbeddingDims{.rows = T, .width = m.d_model}, 1, "embedding", Recomputed::never,
          "embedding.bwd");
  hidden_dropout(T, 1, "embedding.dropout.mask", "embedding.dropout.bwd", Recomputed::never);
  if (config_.dar.enabled()) {
    layers_with_depth_reads();
  } else {
    layers_plain();
  }
  forward(RmsnormDims{.rows = T, .width = m.d_model}, 1, "final.norm", Recomputed::never,
          "final.norm.bwd");
  // The head and the loss run over the padded vocabulary (Megatron-LM pads
  // with make_vocab_size_divisible_by x tensor size; the padding's logits are
  // computed and masked).
  const int64_t vocab = m.padded_vocab(config_.parallel.tensor);
  linear(T, m.d_model, vocab, 1, {"head", "head.dgrad", "head.wgrad"}, Recomputed::never);
  if (train_) {
    forward(CrossEntropyDims{.rows = T, .vocab = vocab}, 1, "loss.cross_entropy",
            Recomputed::never, "loss.cross_entropy.bwd");
  }
}

}  // namespace

namespace {

OpRecord optimizer_update(const Config& config, double total_params) {
  OpRecord update;
  update.shape = OpShape::of(OptimizerUpdateDims{.params = static_cast<int64_t>(total_params)},
                             config.train.dtype);
  update.pass = Pass::forward;
  const OpCost cost = op_cost(update.shape, update.pass, config.attention_flops);
  update.flops = cost.flops;
  update.bytes = cost.bytes;
  update.label = "optimizer.adamw";
  update.counts_as_model_flops = false;
  return update;
}

}  // namespace

void lower_into(const Config& config, StepKind step, OpList& ops) {
  thread_local OpList recompute;
  thread_local OpList backward;
  ops.clear();
  recompute.clear();
  backward.clear();
  Lowerer<detail::OpConsumer> lowerer(config, step, ops, recompute, backward, nullptr);
  lowerer.run();
  ops.insert(ops.end(), recompute.begin(), recompute.end());
  ops.insert(ops.end(), backward.rbegin(), backward.rend());
  if (step == StepKind::train) {
    ops.push_back(optimizer_update(config, detail::closed_form_params(config).total));
  }
}

namespace detail {

namespace {

template <class Stream>
void stream_lowering(const Config& config, StepKind step, double total_params, Stream& consumer,
                     const ShardView& view = ShardView{}) {
  thread_local OpList unused;
  Lowerer<Stream> lowerer(config, step, unused, unused, unused, &consumer, view);
  lowerer.run();
  if (step == StepKind::train) {
    consumer.take(optimizer_update(config, total_params));
  }
}

}  // namespace

void lower_streaming(const Config& config, StepKind step, double total_params,
                     OpConsumer& consumer) {
  stream_lowering(config, step, total_params, consumer);
}

void lower_streaming(const Config& config, StepKind step, double total_params,
                     const ShardView& view, OpConsumer& consumer) {
  stream_lowering(config, step, total_params, consumer, view);
}

void lower_streaming(const Config& config, StepKind step, double total_params,
                     StepAccumulator& consumer) {
  stream_lowering(config, step, total_params, consumer);
}

}  // namespace detail

std::vector<OpRecord> lower(const Config& config, StepKind step) {
  validate(config);
  std::vector<OpRecord> ops;
  lower_into(config, step, ops);
  return ops;
}

}  // namespace modar
