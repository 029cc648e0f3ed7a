// Internal pieces of the cost model shared between its source files.
#pragma once

#include "modar/cost_model.hpp"

namespace modar::detail {

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
  void add(const OpRecord& op) {
    if (!is_counted_kind(op.shape.kind)) {
      return;
    }
    const double total = op.flops * static_cast<double>(op.multiplicity);
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
};

// Receives lowered ops one at a time (streaming lowering: nothing is stored).
class OpConsumer {
 public:
  virtual void take(const OpRecord& op) = 0;

 protected:
  ~OpConsumer() = default;
};
// The ops of lower_into(), in an unspecified order, handed to `consumer`
// (total_params sizes the optimizer update).
void lower_streaming(const Config& config, StepKind step, double total_params,
                     OpConsumer& consumer);
// The same for estimate_into's own consumer (step_accumulator.hpp), called
// directly instead of through the virtual take().
class StepAccumulator;
void lower_streaming(const Config& config, StepKind step, double total_params,
                     StepAccumulator& consumer);

// Counts from an already lowered op list (one micro-batch).
FlopCounts flop_counts_from_ops(const Config& config, StepKind step, const OpList& ops);
// N_f from the lowered forward ops.
double flop_active_from_ops(const Config& config, StepKind step, const OpList& ops);
MemoryBreakdown memory_from_params(const Config& config, double total_params,
                                   double device_memory_bytes, StepKind step);
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
// Bytes one MoE layer on `rows` rows saves for backward beyond a dense layer
// on the same rows (memory.cpp's table; widths of experts split by `tensor`).
double moe_saved_extra_bytes(const Config& config, double rows, double tensor);
// Router probabilities, index + gates and the permutation map of one MoE layer.
double moe_buffer_bytes(const Config& config, double rows);

// Tokens of one lowered micro-step (training: micro_batch * seq_len; decode: micro_batch).
int64_t tokens_per_micro_step(const Config& config, StepKind step);

}  // namespace modar::detail
