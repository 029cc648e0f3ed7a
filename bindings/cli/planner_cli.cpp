#include "planner_cli.hpp"

#include <cmath>

#include "modar/base/errors.hpp"
#include "modar/base/text.hpp"

namespace modar::cli {

std::vector<FlagSpec> planner_common_flags() {
  return {
      {"--fit", true, false, "NAME|PATH",
       "scaling-law fit: epoch (default), hoffmann, or a TOML from `modar fit`"},
      {"--eps", true, false, "ARCH=V,...", "override efficiency priors, e.g. mod=0.94,dar=0.97"},
      {"--profile", true, false, "NAME|PATH", "device profile (default h200)"},
      {"--gpus", true, false, "N", "devices (data parallel; default 1)"},
      {"--config", true, false, "PATH", "base configuration TOML (vocab, MLP, dtype, batch, ...)"},
      {"--set", true, true, "KEY=VALUE", "override a base-config key (repeatable)"},
      {"--seq-len", true, false, "S", "sequence length (default 2048)"},
      {"--micro-batch", true, false, "B", "sequences per device per micro-step (default 8)"},
      {"--global-batch", true, false, "B",
       "sequences per optimizer step (default micro-batch x gpus)"},
      {"--recompute", true, false, "MODE", "activation recomputation: none | selective | full"},
      {"--mlp", true, false, "KIND", "gelu | swiglu"},
      {"--vocab", true, false, "V", "vocabulary size (default 50304)"},
      {"--gqa", true, false, "G", "query heads per KV head (default 1 = MHA)"},
      {"--aspect-min", true, false, "R", "smallest d_model / n_layers (default 32)"},
      {"--aspect-max", true, false, "R", "largest d_model / n_layers (default 128)"},
      {"--json", false, false, "", "print JSON"},
  };
}

Config planner_base_config(const ParsedArgs& parsed) {
  std::vector<std::string> sets = parsed.values("--set");
  const auto add = [&](const char* flag, const char* key) {
    if (const auto value = parsed.value(flag)) {
      sets.push_back(std::string(key) + "=" + *value);
    }
  };
  add("--seq-len", "model.seq_len");
  add("--micro-batch", "train.micro_batch");
  add("--global-batch", "train.global_batch");
  add("--recompute", "train.recompute");
  add("--mlp", "model.mlp");
  add("--vocab", "model.vocab_size");
  if (const auto path = parsed.value("--config")) {
    return load_config_with_overrides(*path, sets);
  }
  Config config;
  for (const std::string& assignment : sets) {
    apply_override(config, assignment);
  }
  validate(config);
  return config;
}

ShapeSearchOptions planner_shape_options(const ParsedArgs& parsed) {
  ShapeSearchOptions options;
  if (const auto v = parsed.value("--gqa")) {
    options.gqa_group = parse_positive_int("--gqa", *v);
  }
  if (const auto v = parsed.value("--aspect-min")) {
    options.aspect_min = parse_positive_double("--aspect-min", *v);
  }
  if (const auto v = parsed.value("--aspect-max")) {
    options.aspect_max = parse_positive_double("--aspect-max", *v);
  }
  if (options.aspect_max < options.aspect_min) {
    throw ConfigError("--aspect-max " + format_number(options.aspect_max) +
                      ": must be >= --aspect-min " + format_number(options.aspect_min));
  }
  return options;
}

std::vector<std::string> parse_list(const std::string& flag, const std::string& text) {
  std::vector<std::string> pieces;
  std::string current;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || text[i] == ',') {
      const auto begin = current.find_first_not_of(" \t");
      const auto end = current.find_last_not_of(" \t");
      if (begin == std::string::npos) {
        throw ConfigError(flag + " " + shown_value(text) +
                          ": empty item; allowed: a comma-separated list");
      }
      pieces.push_back(current.substr(begin, end - begin + 1));
      current.clear();
    } else {
      current += text[i];
    }
  }
  return pieces;
}

std::vector<double> parse_positive_double_list(const std::string& flag, const std::string& text) {
  std::vector<double> values;
  for (const std::string& piece : parse_list(flag, text)) {
    values.push_back(parse_budget(flag, piece));
  }
  return values;
}

std::vector<int64_t> parse_positive_int_list(const std::string& flag, const std::string& text) {
  std::vector<int64_t> values;
  for (const std::string& piece : parse_list(flag, text)) {
    values.push_back(parse_positive_int(flag, piece));
  }
  return values;
}

const std::vector<FlagKey>& planner_flag_keys() {
  static const std::vector<FlagKey> keys = {
      {"--seq-len", "model.seq_len"},       {"--micro-batch", "train.micro_batch"},
      {"--global-batch", "train.global_batch"}, {"--recompute", "train.recompute"},
      {"--mlp", "model.mlp"},               {"--vocab", "model.vocab_size"},
      {"--gpus", "device.count"},           {"--profile", "device.profile"},
      {"--capacity", "mod.capacity"},       {"--every", "mod.every"},
      {"--block-layers", "dar.block_layers"}, {"--streams", "dar.streams"},
      {"--gpus-per-node", "cluster.gpus_per_node"},
  };
  return keys;
}

void check_depth_knob(const std::string& flag, int64_t value, const ShapeSearchOptions& options,
                      const char* what) {
  if (value > options.max_layers) {
    throw ConfigError(flag + " = " + std::to_string(value) + ": " + what + " needs at least " +
                      std::to_string(value) + " layers, but the shape search stops at n_layers = " +
                      std::to_string(options.max_layers) + "; allowed: " + flag + " in [1, " +
                      std::to_string(options.max_layers) + "]");
  }
}

double parse_budget(const std::string& flag, const std::string& text) {
  const std::string lowered = [&] {
    std::string s = text;
    for (char& c : s) {
      c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
    return s;
  }();
  if (lowered.find("nan") != std::string::npos || lowered.find("inf") != std::string::npos) {
    throw ConfigError(flag + " " + shown_value(text) + ": must be a positive finite number");
  }
  const double value = parse_double(flag, text);
  if (!std::isfinite(value) || value <= 0) {
    throw ConfigError(flag + " " + text + ": must be a positive finite number");
  }
  return value;
}

}  // namespace modar::cli
