// Experts in the cost model (docs/model.md experts, docs/moe.md): slots and
// parameters.  The lowering of an MoE layer is in lowering.cpp (moe_branch);
// its memory in memory.cpp; the all-to-alls under expert parallelism in
// parallel.cpp.
#include <cmath>

#include "cost_model_internal.hpp"

namespace modar::detail {

int64_t moe_slots(const Config& config, int64_t rows) {
  const MoeConfig& e = config.moe;
  if (!e.enabled() || rows <= 0) {
    return 0;
  }
  if (e.dropless()) {
    const double expected = static_cast<double>(rows) * static_cast<double>(e.top_k) *
                            static_cast<double>(e.experts) / static_cast<double>(e.choices());
    return std::llround(expected);
  }
  return e.experts * e.expert_capacity(rows);
}

double expert_ffn_params(const Config& config) {
  const double width = static_cast<double>(config.model.d_model);
  const double ffn = static_cast<double>(config.moe.resolved_expert_ffn(config.model));
  return (config.model.gated_mlp() ? 3.0 : 2.0) * width * ffn;
}

MoeParams moe_params(const Config& config) {
  MoeParams out;
  const MoeConfig& e = config.moe;
  if (!e.enabled()) {
    return out;
  }
  const ModelConfig& m = config.model;
  const double layers = static_cast<double>(e.moe_layers(m.n_layers));
  const double expert = expert_ffn_params(config);
  const double matrices = m.gated_mlp() ? 3.0 : 2.0;
  const double dense =
      matrices * static_cast<double>(m.d_model) * static_cast<double>(m.resolved_d_ff());
  out.routed = layers * static_cast<double>(e.experts) * expert;
  out.active_routed = layers * static_cast<double>(e.top_k) * static_cast<double>(e.experts) /
                      static_cast<double>(e.choices()) * expert;
  out.router = layers * static_cast<double>(m.d_model) * static_cast<double>(e.choices());
  // The shared experts: one FFN of their total width, plus the gate vector.
  out.shared = layers * (matrices * static_cast<double>(m.d_model) *
                             static_cast<double>(e.shared_ffn_total(m)) +
                         (e.shared_expert_gate ? static_cast<double>(m.d_model) : 0.0));
  out.replaced_dense = layers * dense;
  return out;
}

double moe_rank_slots(const Config& config, double rows, const MoeRankShare& share) {
  return static_cast<double>(moe_slots(config, std::llround(rows * share.expert_rows)));
}

double moe_saved_extra_bytes(const Config& config, double rows, const MoeRankShare& share) {
  const MoeConfig& e = config.moe;
  const RecomputePlan plan = recompute_plan(config);
  if (!e.enabled() || plan.full) {
    return 0.0;
  }
  const ModelConfig& m = config.model;
  const bool swiglu = m.gated_mlp();
  const double B = static_cast<double>(dtype_bytes(config.train.dtype));
  const double width = static_cast<double>(m.d_model);
  const double d_ff = static_cast<double>(m.resolved_d_ff());
  const double up = swiglu ? 2.0 * d_ff : d_ff;
  const double ffn = static_cast<double>(e.resolved_expert_ffn(m));
  const double expert_up = swiglu ? 2.0 * ffn : ffn;
  const double shared_ffn = static_cast<double>(e.shared_ffn_total(m));
  const double shared_up = swiglu ? 2.0 * shared_ffn : shared_ffn;
  const double slots = moe_rank_slots(config, rows, share);
  // The dense FFN's tensors the layer table counted (memory.cpp), replaced.
  const double dense_ffn =
      ((plan.mlp ? 0.0 : up) + (plan.mlp_activation ? 0.0 : d_ff)) / share.tensor;
  // Per slot: the permuted input (the first expert GEMM's input), the up
  // projection (the activation's input), the activation output (the down
  // projection's input; recomputed under selective), and by where the routing
  // weight multiplies (docs/moe.md "Routing weights"): in the activation its
  // copy of the weight (one element); on the output the expert output (d, for
  // the weight's gradient); on the input the unscaled input (d) and the weight.
  double weight_elements = 0.0;
  switch (e.router_weights) {
    case RouterWeights::activation:
      weight_elements = 1.0;
      break;
    case RouterWeights::output:
      weight_elements = width;
      break;
    case RouterWeights::input:
      weight_elements = width + 1.0;
      break;
  }
  // Recompute (docs/cluster.md "Recompute"): the whole MoE FFN (Megatron's
  // "moe") keeps only its input; the experts' activation ("moe_act", modar's
  // selective) drops its output; the shared experts likewise.
  const double slot_elements =
      plan.moe ? 0.0
               : width + weight_elements +
                     (expert_up + (plan.moe_activation ? 0.0 : ffn)) / share.expert_tensor;
  // The shared-expert gate keeps the ungated shared output (its gradient
  // reads it) and the sigmoid per row (dropped when the shared experts are
  // recomputed).
  const double gate_elements = e.shared_expert_gate && !plan.shared ? width + 1.0 : 0.0;
  const double shared_elements =
      ((plan.shared ? 0.0 : shared_up) + (plan.shared_activation ? 0.0 : shared_ffn)) /
          share.tensor +
      gate_elements;
  return B * (slots * slot_elements + rows * shared_elements - rows * dense_ffn);
}

double moe_buffer_bytes(const Config& config, double rows) {
  const MoeConfig& e = config.moe;
  if (!e.enabled()) {
    return 0.0;
  }
  if (recompute_plan(config).moe) {
    return 0.0;  // the router and the permutation are re-run in the backward
  }
  const double slots = static_cast<double>(moe_slots(config, static_cast<int64_t>(rows)));
  // The permutation: modar's runtime keeps an int32 map per slot; Megatron-
  // Core's dispatcher (the routing weights not on the output) keeps its int64
  // sorted indices per slot and the boolean routing map per token and expert.
  const double permutation = e.router_weights == RouterWeights::output
                                 ? 4.0 * slots
                                 : 8.0 * slots + rows * static_cast<double>(e.choices());
  return 4.0 * rows * static_cast<double>(e.choices()) +
         8.0 * rows * static_cast<double>(e.top_k) + permutation;
}

}  // namespace modar::detail
