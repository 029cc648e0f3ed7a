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
// Routed layer (MoD, SPEC 1.1): router GEMV on all T tokens, top-k, gather of
//               b*k rows, the full layer's ops on b*k rows with attention over
//               the k x k square, scatter-add of g(r) * delta.  With
//               causal_router = predictor, the predictor MLP runs too (its
//               input is stop-gradient: no dgrad for its first GEMM).
// AttnRes / DAR (SPEC 1.2, dar_math.md 4): per block one depth_read_prefix of
//               all S*n queries; per branch with i >= 2 a depth_read_merge; per
//               branch (DAR, n >= 2) dar_coefficients (predictor + mix); per
//               branch a dar_write (which replaces the residual add); the bank
//               init H_0 = embedding and the output read over H_0..H_N.  With
//               MoD + DAR the depth-read ops run on all T tokens (skipped
//               tokens have y = 0) and each branch of a routed layer gathers
//               its k rows and scatters g(r) * y back.
// Decode step: one new token per sequence (rows = micro_batch), attention of
//               that token over a KV cache of seq_len tokens (routed layers:
//               over their k cached routed tokens).  A routed layer processes
//               round(capacity * micro_batch) rows (at least 1): the expected
//               routed count under the causal router's threshold.
#include <algorithm>
#include <cmath>

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

// Scored (query, key) pairs of one head of one sequence under a convention.
[[gnu::always_inline]] inline double attention_pairs(const OpShape& s, AttentionFlops convention) {
  const double s_q = d(s.dims[3]);
  const double s_k = d(s.dims[4]);
  const bool causal = s.dims[6] != 0;
  if (!causal || convention == AttentionFlops::full) {
    return s_q * s_k;
  }
  // Megatron / FlashAttention count half of the square (s^2 / 2, not s(s+1)/2).
  return s_q * s_k / 2.0;
}

}  // namespace

namespace {

// The body of op_cost, inlined into the lowering's hot loop; B = bytes per
// element of s.dtype.  Forced inline: at each emission site the kind is a
// constant, so the switch folds away.
[[gnu::always_inline]] inline OpCost op_cost_with_bytes(const OpShape& s, Pass pass,
                                                        AttentionFlops convention, double B) {
  const auto& x = s.dims;
  const bool backward = pass == Pass::backward;
  OpCost c;
  switch (s.kind) {
    case OpKind::gemm: {
      // Every pass: a plain GEMM (backward = a dgrad and a wgrad GEMM op).
      const double m = d(x[0]), n = d(x[1]), k = d(x[2]), batch = d(std::max<int64_t>(x[3], 1));
      c.flops = 2.0 * m * n * k * batch;
      c.bytes = B * (m * k + k * n + m * n) * batch;
      break;
    }
    case OpKind::attention: {
      const double b = d(x[0]), heads = d(x[1]), kv_heads = d(x[2]), s_q = d(x[3]), s_k = d(x[4]),
                   d_h = d(x[5]);
      const double forward_flops = 4.0 * b * heads * d_h * attention_pairs(s, convention);
      const double q_elements = b * s_q * heads * d_h;
      const double kv_elements = b * s_k * kv_heads * d_h;  // each of K and V
      const double lse_bytes = 4.0 * b * heads * s_q;
      if (!backward) {
        c.flops = forward_flops;
        c.bytes = B * (2.0 * q_elements + 2.0 * kv_elements) + lse_bytes;  // read Q K V, write O
      } else {
        // FlashAttention's own count: backward = 2.5 x forward (it recomputes
        // the scores); the Megatron / nanoGPT conventions: 2 x.
        c.flops = forward_flops * (convention == AttentionFlops::flash ? 2.5 : 2.0);
        // read Q K V O dO (+ lse), write dQ dK dV
        c.bytes = B * (4.0 * q_elements + 4.0 * kv_elements) + 2.0 * lse_bytes;
      }
      break;
    }
    case OpKind::rmsnorm: {
      const double elements = d(x[0]) * d(x[1]);
      c.flops = (backward ? 8.0 : 4.0) * elements;
      c.bytes = backward ? B * 3.0 * elements + 4.0 * d(x[0]) + B * d(x[1])
                         : B * 2.0 * elements + 4.0 * d(x[0]) + B * d(x[1]);
      break;
    }
    case OpKind::rope: {
      const double elements = d(x[0]) * d(x[1]) * d(x[2]);
      c.flops = 3.0 * elements;  // one complex multiply per pair of elements
      c.bytes = B * 2.0 * elements;
      break;
    }
    case OpKind::router: {
      const double rows = d(x[0]), width = d(x[1]);
      // Forward r = x . w_r; backward dw_r = sum dr x and dx += dr w_r.
      c.flops = (backward ? 4.0 : 2.0) * rows * width;
      c.bytes = backward ? B * 3.0 * rows * width + 4.0 * rows : B * rows * width + 4.0 * rows;
      break;
    }
    case OpKind::topk: {
      const double b = d(x[0]), seq = d(x[1]), k = d(x[2]);
      c.flops = 0.0;                          // comparisons, not counted
      c.bytes = 4.0 * b * seq + 8.0 * b * k;  // read fp32 logits, write int32 index + fp32 score
      break;
    }
    case OpKind::gather: {
      const double rows = d(x[0]), width = d(x[1]);
      // Forward: copy rows.  Backward (of a scatter_add): d_delta = g dx[idx]
      // and dg = <dx[idx], delta>: read dx rows and delta, write d_delta.
      c.flops = backward ? 3.0 * rows * width : 0.0;
      c.bytes = (backward ? 3.0 : 2.0) * B * rows * width + 4.0 * rows;
      break;
    }
    case OpKind::scatter_add: {
      const double rows = d(x[0]), width = d(x[1]);
      c.flops = 2.0 * rows * width;  // x += g * delta
      c.bytes = 3.0 * B * rows * width + 8.0 * rows;
      break;
    }
    case OpKind::depth_read_prefix: {
      const double tokens = d(x[0]), sources = d(x[1]), queries = d(x[2]), width = d(x[3]),
                   streams = d(x[4]);
      // Each query: per source one key dot (2d) and one value FMA (2d).
      const double forward_flops = 4.0 * width * tokens * queries * sources;
      const double bank = B * sources * streams * tokens * width + 4.0 * sources * streams * tokens;
      const double outputs = B * queries * tokens * width + 4.0 * queries * tokens;
      c.flops = backward ? 2.0 * forward_flops : forward_flops;
      // Forward: the bank is read once for keys AND values.  Backward: read the
      // bank and dR, write the bank gradient.
      c.bytes = backward ? 2.0 * bank + 2.0 * outputs : bank + outputs;
      break;
    }
    case OpKind::depth_read_merge: {
      const double tokens = d(x[0]), streams = d(x[1]), width = d(x[2]);
      const double forward_flops = 7.0 * streams * width * tokens;  // rstd 2d, logit 2d, merge 3d
      c.flops = backward ? 2.0 * forward_flops : forward_flops;
      c.bytes = (backward ? 5.0 : 3.0) * B * streams * tokens * width + 8.0 * streams * tokens;
      break;
    }
    case OpKind::dar_coefficients: {
      const double tokens = d(x[0]), streams = d(x[1]), width = d(x[2]), outputs = d(x[3]);
      const double nd = streams * width;
      // RMS over n d (2nd), projection n d x outputs (2 n d outputs), mix h (2nd).
      const double forward_flops = tokens * (2.0 * nd + 2.0 * nd * outputs + 2.0 * nd);
      c.flops = backward ? 2.0 * forward_flops : forward_flops;
      const double weights = B * nd * outputs;
      c.bytes = backward
                    ? B * (2.0 * nd + 2.0 * width) * tokens + 2.0 * weights + 8.0 * outputs * tokens
                    : B * (nd + width) * tokens + weights + 4.0 * outputs * tokens;
      break;
    }
    case OpKind::dar_write: {
      const double tokens = d(x[0]), streams = d(x[1]), width = d(x[2]);
      const int64_t mode = x[3];  // 0: P = beta y (first branch), 1: P = M P + beta y, 2: H_0 init
      const bool emit_rstd = x[4] != 0;
      const double nd = streams * width;
      double per_token = emit_rstd ? 2.0 * nd : 0.0;
      if (streams >= 2 && mode != 2) {
        per_token += 2.0 * nd;  // beta (x) y
        if (mode == 1) {
          per_token += 2.0 * streams * nd;  // M(rho) P: 2 n^2 d
        }
      }
      // (n = 1: P += y is the plain residual add, not counted, as in a dense model.)
      c.flops = backward ? 2.0 * tokens * per_token : tokens * per_token;
      const double read_previous = mode == 1 ? B * nd * tokens : 0.0;
      const double forward_bytes = B * width * tokens + read_previous + B * nd * tokens +
                                   4.0 * streams * tokens * (emit_rstd ? 2.0 : 1.0);
      c.bytes = backward ? 2.0 * forward_bytes : forward_bytes;
      break;
    }
    case OpKind::elementwise: {
      const double elements = d(x[0]), inputs = d(x[1]), outputs = d(x[2]);
      c.flops = elements * std::max(1.0, inputs);
      c.bytes = B * elements * (inputs + outputs);
      break;
    }
    case OpKind::cross_entropy: {
      const double rows = d(x[0]), vocab = d(x[1]);
      c.flops = 5.0 * rows * vocab;  // max, exp, sum, log, (grad) subtract: not counted
      c.bytes = backward ? 2.0 * B * rows * vocab + 4.0 * rows : B * rows * vocab + 8.0 * rows;
      break;
    }
    case OpKind::embedding: {
      const double rows = d(x[0]), width = d(x[1]);
      c.flops = 0.0;  // a lookup
      c.bytes = (backward ? 3.0 : 2.0) * B * rows * width + 4.0 * rows;
      break;
    }
    case OpKind::expert_gemm: {
      // Grouped GEMM: the ragged dim sums to M over the G groups (dims[5]
      // picks which dim is ragged; FLOPs and bytes are the same either way).
      const double groups = d(std::max<int64_t>(x[0], 1)), total = d(x[1]), n = d(x[2]),
                   k = d(x[3]);
      c.flops = 2.0 * total * n * k;
      c.bytes = B * (total * k + groups * k * n + total * n);
      break;
    }
    case OpKind::moe_topk: {
      const double rows = d(x[0]), choices = d(x[1]), k = d(x[2]);
      // Forward: read fp32 logits, write fp32 probabilities (kept for the aux
      // and z losses), int32 index + fp32 gate per choice made.  Backward:
      // read the probabilities and the gate gradients, write the logit gradient.
      c.flops = 0.0;  // softmax and comparisons, not counted
      c.bytes = backward ? 8.0 * rows * choices + 4.0 * rows * k
                         : 8.0 * rows * choices + 8.0 * rows * k;
      break;
    }
    case OpKind::permute: {
      const double slots = d(x[0]), width = d(x[1]), rows = d(x[2]);
      // Forward: a row copy per slot.  Backward: the slots' gradient rows are
      // added back into the tokens' rows.
      c.flops = 0.0;
      c.bytes = backward ? B * width * (slots + rows) + 4.0 * slots
                         : 2.0 * B * width * slots + 4.0 * slots;
      break;
    }
    case OpKind::unpermute: {
      const double slots = d(x[0]), width = d(x[1]), rows = d(x[2]);
      // Forward y[t] = sum gate e[slot]: read the slots and gates, write the
      // tokens.  Backward: d e[slot] = gate dy[t] and d gate = <dy[t], e[slot]>.
      c.flops = (backward ? 4.0 : 2.0) * slots * width;
      c.bytes = backward ? 3.0 * B * width * slots + 8.0 * slots
                         : B * width * (slots + rows) + 8.0 * slots;
      break;
    }
    case OpKind::optimizer_update: {
      const double params = d(x[0]);
      // AdamW with fp32 master weights: read grad (fp32), master, m, v; write
      // master, m, v and the bf16 working copy (fp32 training: no copy).
      const bool low_precision = s.dtype != DType::fp32 && s.dtype != DType::fp64;
      c.flops = 12.0 * params;
      c.bytes = params * (4.0 + 12.0 + 12.0 + (low_precision ? B : 0.0));
      break;
    }
  }
  return c;
}

}  // namespace

OpCost op_cost(const OpShape& s, Pass pass, AttentionFlops convention) {
  return op_cost_with_bytes(s, pass, convention, d(dtype_bytes(s.dtype)));
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

// Which recompute policy re-runs an op in backward.
enum class Recomputed : uint8_t {
  never,      // outside the layers (embedding, head, DAR prefix reads)
  full_only,  // every op inside a layer: re-run under recompute = full
  cheap,      // norms, activations, RoPE: re-run under selective and full
};

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
          Stream* stream)
      : config_(config),
        train_(step == StepKind::train),
        dtype_(config.train.dtype),
        bytes_per_element_(static_cast<double>(dtype_bytes(config.train.dtype))),
        convention_(config.attention_flops),
        ops_(ops),
        recompute_(recompute),
        backward_(backward),
        stream_(stream) {}

  void run();

 private:
  // --- emission ------------------------------------------------------------
  [[gnu::always_inline]] void fill(OpRecord& op, OpKind kind, Pass pass,
                                   std::initializer_list<int64_t> dims, int64_t multiplicity,
                                   const char* label) const {
    op.shape.kind = kind;
    op.shape.dtype = dtype_;
    // Every dim is written (unused ones 0), so the caller's record needs no
    // zeroing first: the compiler drops the default initialisation.
    const size_t given = dims.size();
    for (size_t i = 0; i < op.shape.dims.size(); ++i) {
      op.shape.dims[i] = i < given ? dims.begin()[i] : 0;
    }
    op.pass = pass;
    op.multiplicity = multiplicity;
    const OpCost cost = op_cost_with_bytes(op.shape, pass, convention_, bytes_per_element_);
    op.flops = cost.flops;
    op.bytes = cost.bytes;
    op.label = label;
    op.counts_as_model_flops = is_counted_kind(kind) && pass != Pass::recompute;
  }

  [[gnu::always_inline]] void push(OpList& list, OpKind kind, Pass pass,
                                   std::initializer_list<int64_t> dims, int64_t multiplicity,
                                   const char* label) {
    if (multiplicity <= 0) {
      return;
    }
    if (stream_ != nullptr) {
      OpRecord op;
      fill(op, kind, pass, dims, multiplicity, label);
      stream_->take(op);
      return;
    }
    fill(list.emplace_back(), kind, pass, dims, multiplicity, label);
  }

  // A forward op, its recompute copy when the policy re-runs it, and (when
  // `backward_label` is set) its backward op with the same dims.
  [[gnu::always_inline]] void forward(OpKind kind, std::initializer_list<int64_t> dims,
                                      int64_t multiplicity, const char* label,
                                      Recomputed recomputed, const char* backward_label) {
    push(ops_, kind, Pass::forward, dims, multiplicity, label);
    if (!train_) {
      return;
    }
    const Recompute policy = config_.train.recompute;
    if ((policy == Recompute::full && recomputed != Recomputed::never) ||
        (policy == Recompute::selective && recomputed == Recomputed::cheap)) {
      push(recompute_, kind, Pass::recompute, dims, multiplicity, label);
    }
    if (backward_label != nullptr) {
      push(backward_, kind, Pass::backward, dims, multiplicity, backward_label);
    }
  }

  // Y[rows, out] = X[rows, in] W[in, out]; backward dX = dY W^T, dW = X^T dY.
  [[gnu::always_inline]] void linear(int64_t rows, int64_t in, int64_t out, int64_t multiplicity,
                                     const LinearLabels& labels, Recomputed recomputed,
                                     bool input_needs_grad = true) {
    forward(OpKind::gemm, {rows, out, in, 1}, multiplicity, labels.forward, recomputed, nullptr);
    if (!train_) {
      return;
    }
    if (input_needs_grad) {
      push(backward_, OpKind::gemm, Pass::backward, {rows, in, out, 1}, multiplicity, labels.dgrad);
    }
    push(backward_, OpKind::gemm, Pass::backward, {in, out, rows, 1}, multiplicity, labels.wgrad);
  }

  // --- model pieces -----------------------------------------------------------
  void attention_branch(int64_t rows, int64_t sequences, int64_t query_len, int64_t key_len,
                        bool causal, int64_t multiplicity);
  void mlp_branch(int64_t rows, int64_t multiplicity);
  void moe_branch(int64_t rows, int64_t multiplicity);
  void ffn_block(int64_t rows, int64_t width, int64_t multiplicity, const FfnLabels& labels,
                 const LinearLabels& down);
  // The FFN branches of `layers` layers on `rows` rows, `moe` of which are MoE.
  void ffn_branches(int64_t rows, int64_t layers, int64_t moe) {
    mlp_branch(rows, layers - moe);
    moe_branch(rows, moe);
  }
  void residual_add(int64_t rows, int64_t multiplicity) {
    forward(OpKind::elementwise, {rows * config_.model.d_model, 2, 1}, multiplicity, "residual.add",
            Recomputed::full_only, nullptr);  // backward: identity
  }
  void router(int64_t rows, int64_t multiplicity);
  void dar_branch_ops(int64_t branch_class, int64_t multiplicity);
  void layers_plain();
  void layers_with_depth_reads();
  void routed_gather(int64_t rows, int64_t multiplicity, const char* label) {
    // Forward gather; its backward scatters the gradient rows back.
    forward(OpKind::gather, {rows, config_.model.d_model}, multiplicity, label,
            Recomputed::full_only, nullptr);
    if (train_) {
      push(backward_, OpKind::scatter_add, Pass::backward, {rows, config_.model.d_model},
           multiplicity, "mod.gather.bwd");
    }
  }
  void routed_scatter(int64_t rows, int64_t multiplicity, const char* label) {
    // Forward x[idx] += g(r) delta; its backward gathers dx rows (d_delta, dg).
    forward(OpKind::scatter_add, {rows, config_.model.d_model}, multiplicity, label,
            Recomputed::full_only, nullptr);
    if (train_) {
      push(backward_, OpKind::gather, Pass::backward, {rows, config_.model.d_model}, multiplicity,
           "mod.scatter.bwd");
    }
  }

  // Rows a routed layer's branches process, sequences, and the attention
  // square: training k per sequence; decode the expected routed new tokens.
  int64_t tokens() const {
    return train_ ? config_.train.micro_batch * config_.model.seq_len : config_.train.micro_batch;
  }
  int64_t routed_rows() const {
    if (train_) {
      return config_.train.micro_batch * counts_.routed_tokens_per_sequence;
    }
    const int64_t expected =
        std::llround(config_.mod.capacity * static_cast<double>(config_.train.micro_batch));
    return std::clamp<int64_t>(expected, 1, config_.train.micro_batch);
  }
  void attention_for(bool routed, int64_t multiplicity) {
    const int64_t b = config_.train.micro_batch;
    const int64_t s = config_.model.seq_len;
    const int64_t k = counts_.routed_tokens_per_sequence;
    if (train_) {
      attention_branch(routed ? b * k : b * s, b, routed ? k : s, routed ? k : s, true,
                       multiplicity);
    } else {
      // Decode: each routed row is one sequence's new token attending to the cache.
      const int64_t rows = routed ? routed_rows() : b;
      attention_branch(rows, rows, 1, routed ? k : s, false, multiplicity);
    }
  }

  const Config& config_;
  const bool train_;
  const DType dtype_;
  const double bytes_per_element_;
  const AttentionFlops convention_;
  OpList& ops_;
  OpList& recompute_;
  OpList& backward_;
  Stream* stream_;
  LayerCounts counts_;
};

template <class Stream>
void Lowerer<Stream>::attention_branch(int64_t rows, int64_t sequences, int64_t query_len,
                                       int64_t key_len, bool causal, int64_t multiplicity) {
  const ModelConfig& m = config_.model;
  const int64_t heads = m.n_heads;
  const int64_t kv_heads = m.resolved_kv_heads();
  const int64_t d_head = m.resolved_d_head();
  forward(OpKind::rmsnorm, {rows, m.d_model}, multiplicity, "attn.norm", Recomputed::cheap,
          "attn.norm.bwd");
  linear(rows, m.d_model, (heads + 2 * kv_heads) * d_head, multiplicity,
         {"attn.qkv", "attn.qkv.dgrad", "attn.qkv.wgrad"}, Recomputed::full_only);
  // (QKV biases: fused into the GEMM's epilogue, no op of their own.)
  if (m.qk_norm != QkNorm::none) {
    // RMSNorm of the queries and keys: per head (rows x heads of d_head) or
    // over each whole projection; the same elements either way.
    const bool per_head = m.qk_norm == QkNorm::head;
    forward(OpKind::rmsnorm, {per_head ? rows * heads : rows, per_head ? d_head : heads * d_head},
            multiplicity, "attn.q_norm", Recomputed::cheap, "attn.q_norm.bwd");
    forward(OpKind::rmsnorm,
            {per_head ? rows * kv_heads : rows, per_head ? d_head : kv_heads * d_head},
            multiplicity, "attn.k_norm", Recomputed::cheap, "attn.k_norm.bwd");
  }
  forward(OpKind::rope, {rows, heads + kv_heads, d_head}, multiplicity, "attn.rope",
          Recomputed::cheap, "attn.rope.bwd");
  forward(OpKind::attention,
          {sequences, heads, kv_heads, query_len, key_len, d_head, causal ? 1 : 0}, multiplicity,
          "attn.core", Recomputed::full_only, "attn.core.bwd");
  linear(rows, heads * d_head, m.d_model, multiplicity,
         {"attn.out", "attn.out.dgrad", "attn.out.wgrad"}, Recomputed::full_only);
}

template <class Stream>
void Lowerer<Stream>::mlp_branch(int64_t rows, int64_t multiplicity) {
  const ModelConfig& m = config_.model;
  forward(OpKind::rmsnorm, {rows, m.d_model}, multiplicity, "mlp.norm", Recomputed::cheap,
          "mlp.norm.bwd");
  ffn_block(rows, m.resolved_d_ff(), multiplicity, ffn_labels(kMlpNames, m.mlp),
            {"mlp.down", "mlp.down.dgrad", "mlp.down.wgrad"});
}

// One dense FFN of width `width` on `rows` rows: up (or gate+up), the
// activation (GELU: y = gelu(u); gated: y = act(g) * u), down.
template <class Stream>
void Lowerer<Stream>::ffn_block(int64_t rows, int64_t width, int64_t multiplicity,
                                const FfnLabels& labels, const LinearLabels& down) {
  const ModelConfig& m = config_.model;
  const bool gated = m.gated_mlp();
  linear(rows, m.d_model, gated ? 2 * width : width, multiplicity, labels.up,
         Recomputed::full_only);
  forward(OpKind::elementwise, {rows * width, gated ? 2 : 1, 1}, multiplicity, labels.activation,
          Recomputed::cheap, nullptr);
  if (train_) {
    // Backward reads dY and the inputs, writes the input gradients.
    push(backward_, OpKind::elementwise, Pass::backward,
         {rows * width, gated ? 3 : 2, gated ? 2 : 1}, multiplicity, labels.activation_backward);
  }
  linear(rows, width, m.d_model, multiplicity, down, Recomputed::full_only);
}

// MoE FFN (SPEC 1.3) on `rows` tokens: norm, router GEMM (d -> E + Z),
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
  const int64_t slots = detail::moe_slots(config_, rows);
  const int64_t imbalance = std::llround(e.load_imbalance * 1000.0);
  forward(OpKind::rmsnorm, {rows, m.d_model}, multiplicity, "mlp.norm", Recomputed::cheap,
          "mlp.norm.bwd");
  linear(rows, m.d_model, e.choices(), multiplicity,
         {"moe.router", "moe.router.dgrad", "moe.router.wgrad"}, Recomputed::full_only);
  forward(OpKind::moe_topk, {rows, e.choices(), e.top_k}, multiplicity, "moe.topk",
          Recomputed::full_only, "moe.topk.bwd");
  if (slots > 0) {
    forward(OpKind::permute, {slots, m.d_model, rows}, multiplicity, "moe.permute",
            Recomputed::full_only, "moe.permute.bwd");
    // Expert GEMMs: forward, then (backward list) dgrad and wgrad per GEMM.
    auto grouped = [&](int64_t in, int64_t out, const LinearLabels& labels) {
      forward(OpKind::expert_gemm, {local, slots, out, in, imbalance, 0}, multiplicity,
              labels.forward, Recomputed::full_only, nullptr);
      if (train_) {
        push(backward_, OpKind::expert_gemm, Pass::backward, {local, slots, in, out, imbalance, 0},
             multiplicity, labels.dgrad);
        push(backward_, OpKind::expert_gemm, Pass::backward, {local, slots, in, out, imbalance, 1},
             multiplicity, labels.wgrad);
      }
    };
    const FfnLabels expert = ffn_labels(kExpertNames, m.mlp);
    grouped(m.d_model, up, expert.up);
    forward(OpKind::elementwise, {slots * ffn, gated ? 2 : 1, 1}, multiplicity, expert.activation,
            Recomputed::cheap, nullptr);
    if (train_) {
      push(backward_, OpKind::elementwise, Pass::backward,
           {slots * ffn, gated ? 3 : 2, gated ? 2 : 1}, multiplicity, expert.activation_backward);
    }
    grouped(ffn, m.d_model, {"moe.expert.down", "moe.expert.down.dgrad", "moe.expert.down.wgrad"});
    forward(OpKind::unpermute, {slots, m.d_model, rows, e.top_k}, multiplicity, "moe.unpermute",
            Recomputed::full_only, "moe.unpermute.bwd");
  }
  if (e.shared_experts > 0) {
    ffn_block(rows, e.shared_ffn_total(m), multiplicity, ffn_labels(kSharedNames, m.mlp),
              {"moe.shared.down", "moe.shared.down.dgrad", "moe.shared.down.wgrad"});
    if (e.shared_expert_gate) {
      // g = sigmoid(u . w_g) (a d -> 1 GEMM), then the shared output scaled
      // by g: reads the output and g, writes the scaled output.
      linear(rows, m.d_model, 1, multiplicity,
             {"moe.shared.gate", "moe.shared.gate.dgrad", "moe.shared.gate.wgrad"},
             Recomputed::full_only);
      forward(OpKind::elementwise, {rows * m.d_model, 2, 1}, multiplicity, "moe.shared.gate.scale",
              Recomputed::full_only, nullptr);
      if (train_) {
        push(backward_, OpKind::elementwise, Pass::backward, {rows * m.d_model, 3, 1}, multiplicity,
             "moe.shared.gate.scale.bwd");
      }
    }
    // Routed + shared outputs summed.
    forward(OpKind::elementwise, {rows * m.d_model, 2, 1}, multiplicity, "moe.shared.add",
            Recomputed::full_only, nullptr);
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
    forward(OpKind::router, {rows, m.d_model}, multiplicity, "mod.router", Recomputed::full_only,
            "mod.router.bwd");
  }
  if (use_predictor) {
    // Predictor MLP on a stop-gradient copy of x: d -> hidden -> 1.
    linear(rows, m.d_model, mod.predictor_hidden, multiplicity,
           {"mod.predictor.in", "mod.predictor.in.dgrad", "mod.predictor.in.wgrad"},
           Recomputed::full_only, /*input_needs_grad=*/false);
    forward(OpKind::elementwise, {rows * mod.predictor_hidden, 1, 1}, multiplicity,
            "mod.predictor.act", Recomputed::cheap, "mod.predictor.act.bwd");
    linear(rows, mod.predictor_hidden, 1, multiplicity,
           {"mod.predictor.out", "mod.predictor.out.dgrad", "mod.predictor.out.wgrad"},
           Recomputed::full_only);
  }
  if (train_) {
    const int64_t b = config_.train.micro_batch;
    forward(OpKind::topk, {b, config_.model.seq_len, counts_.routed_tokens_per_sequence},
            multiplicity, "mod.topk", Recomputed::never, nullptr);
    if (mod.causal_router != CausalRouter::none) {
      // BCE of the router (aux_loss) or predictor logits against the top-k mask.
      forward(OpKind::elementwise, {rows, 2, 1}, multiplicity, "mod.causal_bce", Recomputed::never,
              "mod.causal_bce.bwd");
    }
  }
}

template <class Stream>
void Lowerer<Stream>::layers_plain() {
  const int64_t T = tokens();
  const int64_t full = counts_.full_layers;
  const int64_t routed = counts_.routed_layers;
  // Full layers.
  attention_for(false, full);
  residual_add(T, full);
  ffn_branches(T, full, counts_.moe_full_layers);
  residual_add(T, full);
  // Routed layers: router on all tokens, branches on the routed rows only.
  if (routed > 0) {
    const int64_t R = routed_rows();
    router(T, routed);
    routed_gather(R, routed, "mod.gather");
    attention_for(true, routed);
    residual_add(R, routed);  // X~ + a, the MLP branch's input
    ffn_branches(R, routed, counts_.moe_routed_layers);
    residual_add(R, routed);  // delta = a + m
    routed_scatter(R, routed, "mod.scatter_add");
  }
}

// Per-branch depth-read ops of one branch class (dar_math 4.2):
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
    forward(OpKind::depth_read_merge, {T, n, width, variant}, multiplicity, "dar.merge",
            Recomputed::full_only, "dar.merge.bwd");
  }
  if (n >= 2) {
    const int64_t outputs = 2 * n + (branch_class == 0 ? 0 : DarConfig::transport_params(n));
    forward(OpKind::dar_coefficients, {T, n, width, outputs}, multiplicity, "dar.coefficients",
            Recomputed::full_only, "dar.coefficients.bwd");
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

  // Bank init: H_0[j] = embedding for every stream, plus its rstd.
  forward(OpKind::dar_write, {T, n, width, 2, 1}, 1, "dar.bank_init", Recomputed::never,
          "dar.bank_init.bwd");
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
    forward(OpKind::depth_read_prefix, {T, (complete_blocks + 1) / 2, queries, width, n, variant},
            complete_blocks, "dar.prefix", Recomputed::never, "dar.prefix.bwd");
  } else if (half > 0) {
    forward(OpKind::depth_read_prefix, {T, half, queries, width, n, variant}, half, "dar.prefix",
            Recomputed::never, "dar.prefix.bwd");
    forward(OpKind::depth_read_prefix, {T, half + 1, queries, width, n, variant}, half,
            "dar.prefix", Recomputed::never, "dar.prefix.bwd");
  }
  if (complete_blocks < N) {
    forward(OpKind::depth_read_prefix, {T, N, 2 * last_block_layers * n, width, n, variant}, 1,
            "dar.prefix", Recomputed::never, "dar.prefix.bwd");
  }
  // Per-branch ops by class: N first, 2L - 2N middle, N last branches.
  const int64_t branches = 2 * layers;
  dar_branch_ops(0, N);
  dar_branch_ops(1, branches - 2 * N);
  dar_branch_ops(2, N);
  // Writes: P = beta y (first), P = M P + beta y (middle), + rstd (last).
  forward(OpKind::dar_write, {T, n, width, 0, 0}, N, "dar.write", Recomputed::full_only,
          "dar.write.bwd");
  forward(OpKind::dar_write, {T, n, width, 1, 0}, branches - 2 * N, "dar.write",
          Recomputed::full_only, "dar.write.bwd");
  forward(OpKind::dar_write, {T, n, width, 1, 1}, N, "dar.write_block_end", Recomputed::full_only,
          "dar.write_block_end.bwd");

  // The branches themselves (the residual adds are replaced by the writes).
  attention_for(false, full);
  ffn_branches(T, full, counts_.moe_full_layers);
  if (routed > 0) {
    const int64_t R = routed_rows();
    router(T, routed);  // on the attention branch's input h (all tokens)
    routed_gather(R, routed, "mod.gather");
    attention_for(true, routed);
    routed_scatter(R, routed, "mod.scatter_add");
    routed_gather(R, routed, "mod.gather");
    ffn_branches(R, routed, counts_.moe_routed_layers);
    routed_scatter(R, routed, "mod.scatter_add");
  }

  // Output read over H_0..H_N (one query per stream), then the streams' mean.
  forward(OpKind::depth_read_prefix, {T, N + 1, n, width, n, variant}, 1, "dar.output_read",
          Recomputed::never, "dar.output_read.bwd");
  if (n >= 2) {
    forward(OpKind::elementwise, {T * width, n, 1}, 1, "dar.output_mean", Recomputed::never,
            "dar.output_mean.bwd");
  }
}

template <class Stream>
void Lowerer<Stream>::run() {
  counts_ = layer_counts(config_);
  const ModelConfig& m = config_.model;
  const int64_t T = tokens();
  forward(OpKind::embedding, {T, m.d_model}, 1, "embedding", Recomputed::never, "embedding.bwd");
  if (config_.dar.enabled()) {
    layers_with_depth_reads();
  } else {
    layers_plain();
  }
  forward(OpKind::rmsnorm, {T, m.d_model}, 1, "final.norm", Recomputed::never, "final.norm.bwd");
  linear(T, m.d_model, m.vocab_size, 1, {"head", "head.dgrad", "head.wgrad"}, Recomputed::never);
  if (train_) {
    forward(OpKind::cross_entropy, {T, m.vocab_size}, 1, "loss.cross_entropy", Recomputed::never,
            "loss.cross_entropy.bwd");
  }
}

}  // namespace

namespace {

OpRecord optimizer_update(const Config& config, double total_params) {
  OpRecord update;
  update.shape.kind = OpKind::optimizer_update;
  update.shape.dtype = config.train.dtype;
  update.shape.dims[0] = static_cast<int64_t>(total_params);
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
void stream_lowering(const Config& config, StepKind step, double total_params, Stream& consumer) {
  thread_local OpList unused;
  Lowerer<Stream> lowerer(config, step, unused, unused, unused, &consumer);
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
