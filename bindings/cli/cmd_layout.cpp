// `modar layout CONFIG --gpus N`: every parallel layout of one model and one
// global batch on N GPUs, ranked by step time (planner/layout_search.cpp
// rank_layouts; docs/cluster.md "modar layout").
#include <cstdio>
#include <string>
#include <vector>

#include "cli_util.hpp"
#include "commands.hpp"
#include "modar/layout_search.hpp"
#include "modar/profile.hpp"

namespace modar::cli {

namespace {

const std::vector<FlagSpec>& layout_flags() {
  static const std::vector<FlagSpec> flags = {
      {"--gpus", true, false, "N", "devices to lay the model out on (required)"},
      {"--gpus-per-node", true, false, "G",
       "GPUs per node (default: the profile's network, 8 without one)"},
      {"--global-batch", true, false, "SEQUENCES",
       "sequences per optimizer step, the same for every layout (default: the config's "
       "train.global_batch, else 2^22 / seq_len rounded up to a power of two, ~4M tokens)"},
      {"--profile", true, false, "NAME|PATH",
       "device profile (default: the config's device.profile)"},
      {"--set", true, true, "KEY=VALUE", "override a config key (repeatable)"},
      {"--top", true, false, "K", "rows of each table (default 20; --json lists every layout)"},
      {"--json", false, false, "", "print the JSON document (every layout) instead of the tables"},
  };
  return flags;
}

}  // namespace

int cmd_layout(const Args& args) {
  const std::vector<FlagSpec>& flags = layout_flags();
  if (wants_help(args)) {
    std::fputs(
        usage_text(
            "layout", "CONFIG --gpus N [--gpus-per-node G] [--global-batch S] [--json]", flags,
            "Ranks every parallel layout of the model in CONFIG on N GPUs by step time at one\n"
            "global batch: tensor parallelism with and without sequence parallelism, context\n"
            "parallelism, pipeline parallelism (1F1B, interleaved v 2 / 4), expert parallelism\n"
            "and expert tensor parallelism (models with experts), ZeRO 0-3, micro-batch 1-8 and\n"
            "recompute none / selective / full.  Prints memory per device and MFU of the layouts\n"
            "that fit and, for the nearest that do not, what exceeds the device memory.\n"
            "CONFIG's [parallel] section and micro-batch are replaced; docs/cluster.md.")
            .c_str(),
        stdout);
    return 0;
  }
  const ParsedArgs parsed = parse_args(args, flags, "layout", 1, 1, "CONFIG (a TOML file)");
  if (!parsed.has("--gpus")) {
    throw ConfigError("--gpus: required (the number of devices to lay the model out on)");
  }
  LayoutSearchOptions options;
  options.gpus = parse_positive_int("--gpus", *parsed.value("--gpus"));
  if (options.gpus > (int64_t{1} << 24)) {
    throw ConfigError("--gpus " + *parsed.value("--gpus") + ": must be <= 16777216");
  }
  if (const auto per_node = parsed.value("--gpus-per-node")) {
    options.gpus_per_node = parse_int_in_range("--gpus-per-node", *per_node, 1, 1024);
  }
  if (const auto global = parsed.value("--global-batch")) {
    options.global_batch = parse_positive_int("--global-batch", *global);
    if (options.global_batch > (int64_t{1} << 40)) {
      throw ConfigError("--global-batch " + *global + ": must be <= 2^40");
    }
  }
  const size_t top =
      static_cast<size_t>(parse_int_in_range("--top", parsed.value_or("--top", "20"), 1, 100000));
  options.dimensions = layout_ranking_dimensions();
  std::vector<std::string> sets = parsed.values("--set");
  if (const auto profile_name = parsed.value("--profile")) {
    sets.push_back("device.profile=" + *profile_name);
  }
  static const std::vector<FlagKey> kFlagKeys = {{"--profile", "device.profile"},
                                                 {"--gpus", "gpus"},
                                                 {"--global-batch", "global_batch"}};
  const Config config = with_typed_flags(
      parsed, kFlagKeys, [&] { return load_config_with_overrides(parsed.positional[0], sets); });
  const DeviceProfile profile =
      with_typed_flags(parsed, kFlagKeys, [&] { return load_profile(config.device.profile); });
  const TimingModel timing(profile);
  const InterruptScope interrupts;
  const LayoutRanking ranking =
      with_typed_flags(parsed, kFlagKeys, [&] { return rank_layouts(config, timing, options); });
  std::string text;
  if (parsed.has("--json")) {
    text = to_json(ranking);
    text += "\n";
  } else {
    text = "modar layout: " + parsed.positional[0] + "\n" + to_table(ranking, top);
  }
  std::fputs(text.c_str(), stdout);
  return std::fflush(stdout) == 0 ? 0 : 1;
}

}  // namespace modar::cli
