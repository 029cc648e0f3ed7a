// Internal pieces of the cost model shared between its source files.
#pragma once

#include "modar/cost_model.hpp"

namespace modar::detail {

// A layer's widths as the cost model's formulas take them (doubles): heads,
// KV heads, d_head, d_ff, the MLP's up projection output (2 d_ff when gated)
// and the Q K V projection output ((heads + 2 KV heads) d_head).
struct LayerWidths {
  double heads, kv_heads, d_head, d_ff, up, qkv;
};
inline LayerWidths layer_widths(const ModelConfig& m) {
  const double heads = static_cast<double>(m.n_heads);
  const double kv_heads = static_cast<double>(m.resolved_kv_heads());
  const double d_head = static_cast<double>(m.resolved_d_head());
  const double d_ff = static_cast<double>(m.resolved_d_ff());
  const double up = m.gated_mlp() ? 2.0 * d_ff : d_ff;
  const double qkv = (heads + 2.0 * kv_heads) * d_head;
  return {heads, kv_heads, d_head, d_ff, up, qkv};
}
// Parameters in closed form (no lowering); flop_active is left 0.
ParamCounts closed_form_params(const Config& config);
// Sequences per optimizer step over all devices (training), or new tokens'
// sequences (decode).
int64_t global_sequences(const Config& config);
// Micro-batches per optimizer step per device.
int64_t accumulation_steps(const Config& config);
// Sums the counted FLOPs of lowered ops (one micro-batch) by pass and part.
struct FlopAccumulator {
  double forward = 0, backward = 0, recompute = 0, attention = 0, router = 0, depth_reads = 0;
  // Forward + backward attention FLOPs as counted (op.flops), and counted
  // causal / full whatever the config's convention (FlopCounts).
  double attention_train = 0, attention_train_causal = 0, attention_train_full = 0;
  void add(const OpRecord& op) {
    if (!is_counted_kind(op.shape.kind)) {
      return;
    }
    const double total = op.flops * static_cast<double>(op.multiplicity) * op.weight;
    if (op.shape.kind == OpKind::attention && op.pass != Pass::recompute) {
      add_attention_conventions(op, total);
    }
    switch (op.pass) {
      case Pass::forward:
        forward += total;
        if (op.shape.kind == OpKind::attention) {
          attention += total;
        } else if (op.shape.kind == OpKind::router ||
                   (op.label[0] == 'm' && op.label[1] == 'o' && op.label[2] == 'd')) {
          router += total;  // the router GEMV and the predictor GEMMs (labels "mod.*")
        } else if (op.shape.kind != OpKind::gemm && op.shape.kind != OpKind::expert_gemm) {
          depth_reads += total;  // AttnRes / DAR ops
        }
        break;
      case Pass::backward:
        backward += total;
        break;
      case Pass::recompute:
        recompute += total;
        break;
    }
  }
  FlopCounts finish(const Config& config, StepKind step) const;
  void add_attention_conventions(const OpRecord& op, double counted);
};

// Receives lowered ops one at a time (streaming lowering: nothing is stored).
class OpConsumer {
 public:
  virtual void take(const OpRecord& op) = 0;

 protected:
  ~OpConsumer() = default;
};
// What a tensor-parallel rank's lowering (parallel.cpp: the SHARD config, its
// widths already divided) differs in beyond the shard's shapes.  Expert
// layers: under sequence parallelism a rank dispatches its T / t tokens and
// its expert-tensor group gathers etp ranks' slots, so its experts run on
// moe_slots(rows x expert_rows_numerator / expert_rows_denominator) slots at
// the width moe.expert_ffn of the shard (divided by etp); the shared experts
// are split by the dense tensor size instead (the shard's
// moe.shared_expert_ffn).  Context parallelism: the shard's
// seq_len is the rank's s / c queries per sequence; ring attention runs them
// against all keys of the sequence, `context` times the shard's (the causal
// pairs counted, s_q s_k / 2, are then the rank's 1 / c of the sequence's).
struct ShardView {
  int64_t expert_rows_numerator = 1;
  int64_t expert_rows_denominator = 1;
  int64_t context = 1;
};

// The ops of lower_into(), in an unspecified order, handed to `consumer`
// (total_params sizes the optimizer update).
void lower_streaming(const Config& config, StepKind step, double total_params,
                     OpConsumer& consumer);
// The same for one tensor-parallel rank's shard (parallel.cpp).
void lower_streaming(const Config& config, StepKind step, double total_params,
                     const ShardView& view, OpConsumer& consumer);
// The same for estimate_into's own consumer (step_accumulator.hpp), called
// directly instead of through the virtual take().
class StepAccumulator;
void lower_streaming(const Config& config, StepKind step, double total_params,
                     StepAccumulator& consumer);

// Counts from an already lowered op list (one micro-batch).
FlopCounts flop_counts_from_ops(const Config& config, StepKind step, const OpList& ops);
// N_f from the lowered forward ops.
double flop_active_from_ops(const Config& config, StepKind step, const OpList& ops);
// What the DAR paper's prefix kernels keep for the backward beyond modar's
// fused model (dar.kernel = prefix; 0 otherwise), for `tokens` tokens of one
// micro-batch over the whole model: fp32 logits and shifted scores of every
// (query, source) pair and stream, and the retrieved state of every query
// (docs/moe.md "The DAR paper's implementation").
double dar_prefix_retained_bytes(const Config& config, double tokens);
// The packed normalised key views and values of every depth read, kept for
// the backward instead of rebuilt (DarConfig::packs_kept; 0 otherwise), for
// `tokens` tokens of one micro-batch over the whole model (docs/moe.md
// "Which packs are kept").
double dar_kept_packs_bytes(const Config& config, double tokens);
// The largest DAR transient of the backward, one block's (docs/dar_math.md
// 5.4), for `tokens` tokens of one micro-batch: the bank gradient, the
// block's phase-1 gradients and outputs, the partial's gradients, one
// branch's recomputed read; with the prefix kernels the rebuilt packs and
// their gradients instead of the recomputed outputs.  0 without AttnRes / DAR.
// One formula for the single-device model (memory.cpp) and every pipeline
// stage holding depth reads (parallel.cpp StageMemoryModel).
double dar_block_backward_bytes(const Config& config, double tokens);
// AttnRes / DAR: what `layers` layers holding `blocks` depth blocks keep for
// the merges' backward, per micro-batch of `tokens` tokens (memory.cpp).
// `blocks` is where the two models differ: one device counts the whole
// blocks (2L - N branches merge a partial), a pipeline stage spreads them
// evenly (layers / K per stage).
struct DarMergeSaved {
  double partials = 0.0;        // MemoryBreakdown::dar_partials
  double branch_outputs = 0.0;  // MemoryBreakdown::dar_branch_outputs
};
DarMergeSaved dar_merge_saved_bytes(double layers, double blocks, int64_t streams, double tokens,
                                    double width, double dtype_bytes);
MemoryBreakdown memory_from_params(const Config& config, double total_params,
                                   double device_memory_bytes, StepKind step);
// The peak of a breakdown: the sum of its parts (kMemoryParts; the
// single-device model and the cluster's stages both use it).
inline double sum_of_parts(const MemoryBreakdown& m) {
  double bytes = 0.0;
  for (const MemoryPart& part : kMemoryParts) {
    bytes += m.*part.bytes;
  }
  return bytes;
}
// What the backward re-runs (recompute.cpp; docs/cluster.md "Recompute"):
// every op inside the layers (full: only each layer's input is kept), or
// modules of a layer, each dropping the tensors it alone saved.
struct RecomputePlan {
  bool full = false;
  bool norms = false;           // norm outputs dropped (modar selective; Megatron layernorm)
  bool rope = false;            // RoPE re-run (modar selective)
  bool core_attention = false;  // log-sum-exp / unfused scores dropped (Megatron core_attn)
  bool mlp = false;             // the dense MLP's up projection output dropped (Megatron mlp)
  bool mlp_activation = false;  // the dense MLP's activation output dropped
  bool moe = false;             // the whole MoE FFN re-run: slots, router buffers dropped (moe)
  bool moe_activation = false;  // the experts' activation outputs dropped (moe_act)
  bool shared = false;          // the shared experts re-run (shared_experts)
  bool shared_activation = false;
  bool predictor_activation = false;  // MoD predictor's hidden activation (modar selective)
  bool any() const {
    return full || norms || rope || core_attention || mlp || mlp_activation || moe ||
           moe_activation || shared || shared_activation || predictor_activation;
  }
};
RecomputePlan recompute_plan(const Config& config);
// train.recompute_modules parsed (ConfigError naming the key on a bad name).
RecomputePlan parse_recompute_modules(const std::string& text);

// Dropout (docs/cluster.md "Dropout"): torch keeps a 1-byte mask per element.
inline constexpr double kDropoutMaskBytes = 1.0;
// Bytes the unfused attention saves per score (without recompute): the
// softmax output, plus with attention dropout its output and mask.
double saved_bytes_per_score(const Config& config);
// Bytes one layer's hidden-dropout masks take per row (its two branch
// outputs, 1 byte per element), 0 without hidden dropout.
double hidden_dropout_mask_bytes_per_row(const Config& config);
// How a rank of a cluster layout holds a layer's saved tensors: tensors of
// whole d_model rows x `tokens` (sequence parallelism: 1 / t), the rest
// divided by `tensor` (Korthikanti et al. 2022).  {1, 1}: one device.
struct LayerShare {
  double tokens = 1.0;
  double tensor = 1.0;
};
// Bytes one transformer layer (not recomputed in full) saves for backward on
// `rows` rows with attention over `sequence_len` tokens per sequence
// (memory.cpp's table: norms, Q K V, attention output, MLP, statistics,
// dropout masks, unfused scores).
double layer_saved_bytes(const Config& config, double rows, double sequence_len,
                         const LayerShare& share, const RecomputePlan& plan);
// ---- experts (cost_models/moe.cpp; docs/model.md experts, docs/moe.md) ------------------
// Expert slots one MoE layer processes on one device for `rows` tokens:
// dropless, the expected real-expert assignments round(rows k E / (E + Z));
// with a capacity factor, E x expert_capacity(rows) (padded dispatch).
int64_t moe_slots(const Config& config, int64_t rows);
// Parameters of one expert FFN (the model's MLP kind at moe.expert_ffn).
double expert_ffn_params(const Config& config);
// The MoE layers' routed experts (all of them) and the router / shared
// experts, over every MoE layer.
struct MoeParams {
  double routed = 0;     // E x expert FFN x MoE layers
  double active_routed = 0;  // top_k x E / (E + Z) x expert FFN x MoE layers
  double router = 0;     // d x (E + Z) x MoE layers
  double shared = 0;     // shared_experts x expert FFN x MoE layers
  double replaced_dense = 0;  // the dense FFNs the MoE layers do not have
};
MoeParams moe_params(const Config& config);
// How one rank of a cluster layout holds an MoE layer (parallel.cpp): the
// dense FFN and the shared experts split by the tensor size, the routed
// experts' widths by the expert tensor size, and the routed experts run on
// moe_slots(rows x expert_rows) slots (sequence parallelism: the rank's
// rows / t gathered over its expert-tensor group).  {1, 1, 1}: one device.
struct MoeRankShare {
  double tensor = 1.0;
  double expert_tensor = 1.0;
  double expert_rows = 1.0;
};
// Bytes one MoE layer on `rows` rows saves for backward beyond a dense layer
// on the same rows (memory.cpp's table).
double moe_saved_extra_bytes(const Config& config, double rows, const MoeRankShare& share);
// The expert slots one rank runs for `rows` rows entering the layer.
double moe_rank_slots(const Config& config, double rows, const MoeRankShare& share);
// Router probabilities, index + gates and the permutation map of one MoE layer.
double moe_buffer_bytes(const Config& config, double rows);

// Tokens of one lowered micro-step (training: micro_batch * seq_len; decode: micro_batch).
int64_t tokens_per_micro_step(const Config& config, StepKind step);

}  // namespace modar::detail
