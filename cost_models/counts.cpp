// Parameter and FLOP counts (docs/cost_model.md counting).
//
// Parameters are counted in closed form from the shapes.  FLOPs are NOT
// computed by a second formula: they are the sums of the lowered ops' FLOPs
// (op_cost in lowering.cpp), so the report, the planner and the runtime's op
// list can never disagree.
#include "cost_model_internal.hpp"

namespace modar {
namespace detail {

ParamCounts closed_form_params(const Config& config) {
  const ModelConfig& m = config.model;
  const double width = static_cast<double>(m.d_model);
  const auto [heads, kv_heads, d_head, d_ff, up_width, qkv_width] = layer_widths(m);
  const double layers = static_cast<double>(m.n_layers);
  // The vocabulary as the embedding holds it (padded: model.make_vocab_size_divisible_by).
  const double vocab = static_cast<double>(m.padded_vocab(config.parallel.tensor));

  // Q K V (+ their biases) and the output projection; QK-norm weights: one
  // d_head vector each for Q and K (head), or one per projection width.
  double attention = width * qkv_width + heads * d_head * width;
  attention += m.qkv_bias ? qkv_width : 0.0;
  if (m.qk_norm == QkNorm::head) {
    attention += 2.0 * d_head;
  } else if (m.qk_norm == QkNorm::projection) {
    attention += (heads + kv_heads) * d_head;
  }
  const double mlp = (m.gated_mlp() ? 3.0 : 2.0) * width * d_ff;
  const double norms = 2.0 * width;
  double body = layers * (attention + mlp + norms) + width;  // + final norm

  const LayerCounts counts = layer_counts(config);
  const double routed = static_cast<double>(counts.routed_layers);
  body += routed * width;  // router vectors w_r
  if (config.mod.causal_router == CausalRouter::predictor) {
    const double hidden = static_cast<double>(config.mod.predictor_hidden);
    body += routed * (width * hidden + hidden + hidden + 1.0);
  }
  if (config.dar.enabled()) {
    const double n = static_cast<double>(counts.dar_streams);
    const double blocks = static_cast<double>(counts.dar_blocks);
    const double branches = 2.0 * layers;
    // Per branch and stream a pseudo-query w and a key-norm weight gamma; the
    // output read has its own per stream.
    body += (branches + 1.0) * n * 2.0 * width;
    if (counts.dar_streams >= 2) {
      // Coefficient head per branch: W (n d x outputs) + bias (outputs) + 3
      // scales; first branches of a block have no transport outputs.
      const double base_outputs = 2.0 * n;
      const double transport = static_cast<double>(DarConfig::transport_params(counts.dar_streams));
      const double first = blocks;
      const double later = branches - blocks;
      body += first * (n * width * base_outputs + base_outputs + 3.0);
      body += later * (n * width * (base_outputs + transport) + base_outputs + transport + 3.0);
    }
  }
  // MoE layers (docs/model.md experts): router + E experts + shared experts instead of the
  // dense FFN.
  const MoeParams moe = moe_params(config);
  body += moe.router + moe.routed + moe.shared - moe.replaced_dense;
  ParamCounts params;
  const double embedding = vocab * width;
  const double head = m.tie_embeddings ? 0.0 : vocab * width;
  params.total = body + embedding + head;
  params.non_embedding = body;
  params.experts = moe.routed;
  params.active = params.total - moe.routed + moe.active_routed;
  return params;
}

// Data-parallel replicas: device.count / (tensor x pipeline x expert); the
// whole device count when [parallel] is at its defaults.
int64_t global_sequences(const Config& config) {
  const int64_t data = std::max<int64_t>(1, config.parallel.data(config.device.count));
  return config.train.global_batch > 0 ? config.train.global_batch
                                       : config.train.micro_batch * data;
}

int64_t accumulation_steps(const Config& config) {
  const int64_t data = std::max<int64_t>(1, config.parallel.data(config.device.count));
  const int64_t per_micro_step = config.train.micro_batch * data;
  return std::max<int64_t>(1, global_sequences(config) / per_micro_step);
}

int64_t tokens_per_micro_step(const Config& config, StepKind step) {
  return step == StepKind::train ? config.train.micro_batch * config.model.seq_len
                                 : config.train.micro_batch;
}

FlopCounts FlopAccumulator::finish(const Config& config, StepKind step) const {
  FlopCounts flops;
  const double tokens = static_cast<double>(tokens_per_micro_step(config, step));
  flops.forward_per_token = forward / tokens;
  flops.forward_attention_per_token = attention / tokens;
  flops.forward_router_per_token = router / tokens;
  flops.forward_dar_per_token = depth_reads / tokens;
  flops.backward_per_token = backward / tokens;
  flops.recompute_per_token = recompute / tokens;
  flops.train_per_token = flops.forward_per_token + flops.backward_per_token;
  // Training: the global batch's tokens; decode: one new token per sequence
  // of the micro-batch on every device.
  flops.tokens_per_step = step == StepKind::train
                              ? static_cast<double>(global_sequences(config)) *
                                    static_cast<double>(config.model.seq_len)
                              : static_cast<double>(config.train.micro_batch * config.device.count);
  flops.train_per_step = flops.train_per_token * flops.tokens_per_step;
  flops.hardware_per_step =
      (flops.train_per_token + flops.recompute_per_token) * flops.tokens_per_step;
  const double per_step = flops.tokens_per_step / tokens;
  flops.train_per_step_causal_attention =
      flops.train_per_step + (attention_train_causal - attention_train) * per_step;
  flops.train_per_step_full_attention =
      flops.train_per_step + (attention_train_full - attention_train) * per_step;
  return flops;
}

void FlopAccumulator::add_attention_conventions(const OpRecord& op, double counted) {
  const double weight = static_cast<double>(op.multiplicity) * op.weight;
  attention_train += counted;
  attention_train_causal += op_cost(op.shape, op.pass, AttentionFlops::causal).flops * weight;
  attention_train_full += op_cost(op.shape, op.pass, AttentionFlops::full).flops * weight;
}

FlopCounts flop_counts_from_ops(const Config& config, StepKind step, const OpList& ops) {
  FlopAccumulator sums;
  for (const OpRecord& op : ops) {
    sums.add(op);
  }
  return sums.finish(config, step);
}

double flop_active_from_ops(const Config& config, StepKind step, const OpList& ops) {
  const FlopCounts flops = flop_counts_from_ops(config, step, ops);
  return (flops.forward_per_token - flops.forward_attention_per_token) / 2.0;
}

}  // namespace detail

namespace {

// Streams a training lowering into FLOP sums (nothing stored).
FlopCounts train_flops(const Config& config, double total_params) {
  struct Sums final : detail::OpConsumer {
    void take(const OpRecord& op) override { sums.add(op); }
    detail::FlopAccumulator sums;
  } consumer;
  detail::lower_streaming(config, StepKind::train, total_params, consumer);
  return consumer.sums.finish(config, StepKind::train);
}

}  // namespace

ParamCounts count_params(const Config& config) {
  validate(config);
  ParamCounts params = detail::closed_form_params(config);
  const FlopCounts flops = train_flops(config, params.total);
  params.flop_active = (flops.forward_per_token - flops.forward_attention_per_token) / 2.0;
  return params;
}

ParamAndFlopCounts count_params_and_flops(const Config& config) {
  validate(config);
  ParamAndFlopCounts counts;
  counts.params = detail::closed_form_params(config);
  counts.flops = train_flops(config, counts.params.total);
  counts.params.flop_active =
      (counts.flops.forward_per_token - counts.flops.forward_attention_per_token) / 2.0;
  return counts;
}

FlopCounts count_flops(const Config& config) {
  validate(config);
  return train_flops(config, detail::closed_form_params(config).total);
}

}  // namespace modar
