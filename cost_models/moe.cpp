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
  return (config.model.mlp == MlpKind::swiglu ? 3.0 : 2.0) * width * ffn;
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
  const double dense = (m.mlp == MlpKind::swiglu ? 3.0 : 2.0) * static_cast<double>(m.d_model) *
                       static_cast<double>(m.resolved_d_ff());
  out.routed = layers * static_cast<double>(e.experts) * expert;
  out.active_routed = layers * static_cast<double>(e.top_k) * static_cast<double>(e.experts) /
                      static_cast<double>(e.choices()) * expert;
  out.router = layers * static_cast<double>(m.d_model) * static_cast<double>(e.choices());
  out.shared = layers * static_cast<double>(e.shared_experts) * expert;
  out.replaced_dense = layers * dense;
  return out;
}

}  // namespace modar::detail
