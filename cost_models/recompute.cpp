// Activation recompute: which modules of a layer are re-run in the backward
// (cost_model_internal.hpp RecomputePlan), from modar's train.recompute or
// Megatron-LM's train.recompute_granularity / recompute_modules
// (docs/cluster.md "Recompute").  The lowering re-emits the ops of the
// recomputed modules (time); memory.cpp drops what they no longer save.
#include <string>
#include <vector>

#include "cost_model_internal.hpp"
#include "modar/base/errors.hpp"
#include "modar/base/text.hpp"

namespace modar::detail {

namespace {

// Megatron-LM's --recompute-modules names (megatron/training/arguments.py),
// in modar's words.  mla_up_proj (multi-latent attention) has no modar model.
struct ModuleName {
  const char* name;
  void (*apply)(RecomputePlan&);
};
constexpr ModuleName kModules[] = {
    {"core_attn", [](RecomputePlan& p) { p.core_attention = true; }},
    {"layernorm", [](RecomputePlan& p) { p.norms = true; }},
    {"mlp",
     [](RecomputePlan& p) {
       p.mlp = true;
       p.mlp_activation = true;
     }},
    {"moe_act", [](RecomputePlan& p) { p.moe_activation = true; }},
    {"moe",
     [](RecomputePlan& p) {
       p.moe = true;
       p.moe_activation = true;
       p.shared = true;
       p.shared_activation = true;
     }},
    {"shared_experts",
     [](RecomputePlan& p) {
       p.shared = true;
       p.shared_activation = true;
     }},
};

std::string allowed_modules() {
  std::string out;
  for (const ModuleName& m : kModules) {
    out += out.empty() ? "" : ", ";
    out += m.name;
  }
  return out;
}

}  // namespace

RecomputePlan parse_recompute_modules(const std::string& text) {
  RecomputePlan plan;
  std::string word;
  bool any = false;
  const auto take = [&]() {
    if (word.empty()) {
      return;
    }
    const ModuleName* found = nullptr;
    for (const ModuleName& m : kModules) {
      if (word == m.name) {
        found = &m;
      }
    }
    if (found == nullptr) {
      throw ConfigError("train.recompute_modules = \"" + shown_value(text) + "\": unknown module '" +
                        shown_value(word) + "'; allowed, separated by spaces or commas: " +
                        allowed_modules());
    }
    found->apply(plan);
    any = true;
    word.clear();
  };
  for (char ch : text) {
    if (ch == ' ' || ch == ',' || ch == '\t') {
      take();
    } else {
      word += ch;
    }
  }
  take();
  if (!any) {
    throw ConfigError("train.recompute_modules = \"" + shown_value(text) +
                      "\": names no module; allowed, separated by spaces or commas: " +
                      allowed_modules());
  }
  return plan;
}

RecomputePlan recompute_plan(const Config& config) {
  const TrainConfig& train = config.train;
  RecomputePlan plan;
  if (train.recompute == Recompute::full ||
      train.recompute_granularity == RecomputeGranularity::full) {
    plan.full = true;
    return plan;
  }
  if (train.recompute_granularity == RecomputeGranularity::selective) {
    return parse_recompute_modules(train.recompute_modules);
  }
  if (train.recompute == Recompute::selective) {
    // modar's selective: norms, RoPE and activations (and the unfused
    // kernel's scores, which it re-runs: Korthikanti et al.'s selective).
    plan.norms = true;
    plan.rope = true;
    plan.mlp_activation = true;
    plan.moe_activation = true;
    plan.shared_activation = true;
    plan.predictor_activation = true;
    plan.core_attention = train.attention_kernel == AttentionKernel::unfused;
  }
  return plan;
}

}  // namespace modar::detail
