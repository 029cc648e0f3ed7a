// Experts in the cost model (SPEC section 1.3, docs/moe.md): slots and
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

double moe_saved_extra_bytes(const Config& config, double rows, double tensor) {
  const MoeConfig& e = config.moe;
  if (!e.enabled() || config.train.recompute == Recompute::full) {
    return 0.0;
  }
  const ModelConfig& m = config.model;
  const bool swiglu = m.gated_mlp();
  const bool selective = config.train.recompute == Recompute::selective;
  const double B = static_cast<double>(dtype_bytes(config.train.dtype));
  const double width = static_cast<double>(m.d_model);
  const double d_ff = static_cast<double>(m.resolved_d_ff());
  const double up = swiglu ? 2.0 * d_ff : d_ff;
  const double ffn = static_cast<double>(e.resolved_expert_ffn(m));
  const double expert_up = swiglu ? 2.0 * ffn : ffn;
  const double shared_ffn = static_cast<double>(e.shared_ffn_total(m));
  const double shared_up = swiglu ? 2.0 * shared_ffn : shared_ffn;
  const double slots = static_cast<double>(moe_slots(config, static_cast<int64_t>(rows)));
  const double dense_ffn = (selective ? up : up + d_ff) / tensor;
  const double slot_elements = 2.0 * width + (selective ? expert_up : expert_up + ffn) / tensor;
  // The shared-expert gate keeps the ungated shared output (its gradient
  // reads it) and the sigmoid per row.
  const double gate_elements = e.shared_expert_gate ? width + 1.0 : 0.0;
  const double shared_elements =
      (selective ? shared_up : shared_up + shared_ffn) / tensor + gate_elements;
  return B * (slots * slot_elements + rows * shared_elements - rows * dense_ffn);
}

double moe_buffer_bytes(const Config& config, double rows) {
  const MoeConfig& e = config.moe;
  if (!e.enabled()) {
    return 0.0;
  }
  const double slots = static_cast<double>(moe_slots(config, static_cast<int64_t>(rows)));
  return 4.0 * rows * static_cast<double>(e.choices()) +
         8.0 * rows * static_cast<double>(e.top_k) + 4.0 * slots;
}

}  // namespace modar::detail
