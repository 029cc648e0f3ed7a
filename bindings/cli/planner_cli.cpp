// The flags `modar optimal` and `modar sweep` share (planner_cli.hpp).
#include "planner_cli.hpp"

#include <cmath>

#include "modar/base/errors.hpp"
#include "modar/base/text.hpp"
#include "modar/parallel.hpp"
#include "modar/profile.hpp"

namespace modar::cli {

namespace {

std::string joined(const std::vector<std::string>& names, const char* separator = ", ") {
  std::string text;
  for (const std::string& name : names) {
    text += (text.empty() ? "" : separator) + name;
  }
  return text;
}

// The base-configuration flags: each sets one config key.
struct BaseFlag {
  const char* flag;
  const char* key;
};
constexpr BaseFlag kBaseFlags[] = {
    {"--seq-len", "model.seq_len"},         {"--micro-batch", "train.micro_batch"},
    {"--global-batch", "train.global_batch"}, {"--recompute", "train.recompute"},
    {"--mlp", "model.mlp"},                 {"--vocab", "model.vocab_size"},
};

}  // namespace

std::string arch_list_text() {
  return joined(arch_names());
}

FlagSpec arch_flag(const std::vector<ArchSpec>& archs) {
  std::string default_archs;
  for (const ArchSpec& arch : archs) {
    default_archs += (default_archs.empty() ? "" : ",") + arch.name;
  }
  return {"--arch", true, false, "LIST",
          "architectures: " + arch_list_text() + " (default " + default_archs + ")"};
}

std::vector<FlagSpec> planner_run_flags(const PlannerRun& d) {
  const Config& base = d.base;
  const std::string per_node = std::to_string(network_or_default(d.profile).gpus_per_node);
  return {
      {"--fit", true, false, "NAME|PATH",
       "scaling-law fit: " + joined(builtin_fit_names()) + " or a fit TOML from `modar fit` "
       "(default " + d.fit.name + ")"},
      {"--eps", true, false, "ARCH=V,...",
       "override efficiency priors, e.g. mod=0.94,dar=0.97; each V in [" +
           format_number(kEpsMin) + ", " + format_number(kEpsMax) + "]"},
      {"--profile", true, false, "NAME|PATH",
       "device profile: " + joined(embedded_profile_names()) + " or a profile TOML (default " +
           d.profile_ref + ")"},
      {"--gpus", true, false, "N",
       "GPUs (default " + std::to_string(d.gpus) +
           "); more than one searches each shape's parallel layout: tensor (with sequence "
           "parallelism), pipeline (with interleaving), data parallel with ZeRO 0-3, "
           "micro-batch and recompute"},
      {"--gpus-per-node", true, false, "G",
       "cluster (--gpus > 1): GPUs per node (default: the profile's network, " + per_node + ")"},
      {"--config", true, false, "PATH",
       "base configuration TOML (vocab, MLP, dtype, batch, ...; no [mod], [dar], [moe]: the "
       "architecture flags set those)"},
      {"--set", true, true, "KEY=VALUE", "override a base-config key (repeatable)"},
      {"--seq-len", true, false, "S",
       "sequence length (default " + std::to_string(base.model.seq_len) + ")"},
      {"--micro-batch", true, false, "B",
       "sequences per device per micro-step (default " + std::to_string(base.train.micro_batch) +
           " on one GPU; on a cluster searched among 1, 2, 4 unless given)"},
      {"--global-batch", true, false, "B",
       "sequences per optimizer step (default " + global_batch_default_text(base) + ")"},
      {"--recompute", true, false, "MODE",
       "activation recomputation: none | selective | full (default " +
           std::string(to_string(base.train.recompute)) +
           " on one GPU; on a cluster the least that fits unless given)"},
      {"--mlp", true, false, "KIND",
       "gelu | swiglu (default " + std::string(to_string(base.model.mlp)) + ")"},
      {"--vocab", true, false, "V",
       "vocabulary size (default " + std::to_string(base.model.vocab_size) + ")"},
      {"--gqa", true, false, "G",
       "query heads per KV head (default " + std::to_string(d.shapes.gqa_group) + " = MHA)"},
      {"--aspect-min", true, false, "R",
       "smallest d_model / n_layers (default " + format_number(d.shapes.aspect_min) + ")"},
      {"--aspect-max", true, false, "R",
       "largest d_model / n_layers (default " + format_number(d.shapes.aspect_max) + ")"},
      quiet_flag(),
  };
}

void parse_planner_run_flags(const ParsedArgs& parsed, PlannerRunRequest& request) {
  set_if_given(parsed, "--fit", request.fit, text_as_given);
  if (const auto v = parsed.value("--eps")) {
    request.eps = parse_eps_overrides(*v);
  }
  set_if_given(parsed, "--profile", request.profile, text_as_given);
  set_if_given(parsed, "--gpus", request.gpus, parse_int);
  set_if_given(parsed, "--gpus-per-node", request.gpus_per_node, parse_int);
  set_if_given(parsed, "--gqa", request.shapes.gqa_group, parse_int);
  set_if_given(parsed, "--aspect-min", request.shapes.aspect_min, parse_number);
  set_if_given(parsed, "--aspect-max", request.shapes.aspect_max, parse_number);
  // The base configuration: a file and / or key=value assignments, set
  // through the config library (its own types and rules).
  std::vector<std::string> sets = parsed.values("--set");
  for (const BaseFlag& base_flag : kBaseFlags) {
    if (const auto value = parsed.value(base_flag.flag)) {
      sets.push_back(std::string(base_flag.key) + "=" + *value);
    }
  }
  for (const std::string& assignment : sets) {
    request.base_keys.push_back(assignment.substr(0, assignment.find('=')));
  }
  if (const auto path = parsed.value("--config")) {
    request.base = load_config_with_overrides(*path, sets);
  } else {
    for (const std::string& assignment : sets) {
      apply_override(request.base, assignment);
    }
    validate(request.base);
  }
}

const std::vector<FlagKey>& planner_flag_keys() {
  static const std::vector<FlagKey> keys = [] {
    std::vector<FlagKey> list = {
        // Request fields (optimal, sweep and the shared run).
        {"--flops", "flops"},
        {"--gpu-hours", "gpu_hours"},
        {"--days", "days"},
        {"--arch", "arch"},
        {"--capacity", "capacity"},
        {"--every", "every"},
        {"--block-layers", "block_layers"},
        {"--streams", "streams"},
        {"--fit", "fit"},
        {"--eps", "eps"},
        {"--profile", "profile"},
        {"--gpus", "gpus"},
        {"--gpus-per-node", "gpus_per_node"},
        {"--gqa", "gqa_group"},
        {"--aspect-min", "aspect_min"},
        {"--aspect-max", "aspect_max"},
        // Config keys.
        {"--gpus", "device.count"},
        {"--profile", "device.profile"},
        {"--gpus-per-node", "cluster.gpus_per_node"},
    };
    for (const BaseFlag& base_flag : kBaseFlags) {
      list.push_back({base_flag.flag, base_flag.key});
    }
    return list;
  }();
  return keys;
}

double parse_number(const std::string& flag, const std::string& text) {
  return parse_double(flag, text);
}

namespace {

double flop_budget(const std::string& flag, const std::string& text, const char* wall_clock) {
  double value = 0.0;
  if (!parse_finite_number_text(text, &value)) {
    throw ConfigError(flag + " = " + shown_value(text) +
                      ": not a number of FLOPs; allowed: a finite number of training FLOPs "
                      "such as 1e20 or 6e18; a wall-clock budget is " +
                      wall_clock);
  }
  return value;
}

}  // namespace

double parse_flop_budget(const std::string& flag, const std::string& text) {
  return flop_budget(flag, text, "--gpu-hours H or --days D");
}

std::vector<double> parse_flop_budget_list(const std::string& flag, const std::string& text) {
  std::vector<double> values;
  for (const std::string& piece : parse_list(flag, text)) {
    values.push_back(flop_budget(flag, piece, "modar optimal's --gpu-hours H or --days D"));
  }
  return values;
}

std::vector<double> parse_double_list(const std::string& flag, const std::string& text) {
  std::vector<double> values;
  for (const std::string& piece : parse_list(flag, text)) {
    values.push_back(parse_double(flag, piece));
  }
  return values;
}

std::vector<int64_t> parse_int_list(const std::string& flag, const std::string& text) {
  std::vector<int64_t> values;
  for (const std::string& piece : parse_list(flag, text)) {
    values.push_back(parse_int(flag, piece));
  }
  return values;
}

}  // namespace modar::cli
