// `modar layout CONFIG --gpus N`: every parallel layout of one model and one
// global batch on N GPUs, ranked by step time (planner/layout_search.cpp
// rank_layouts; docs/cluster.md "modar layout").  All the work is the
// library's; this file turns the flags the user gave into a LayoutRequest
// (resolve_layout applies the defaults and checks them).
#include <cstdio>
#include <string>
#include <vector>

#include "cli_util.hpp"
#include "commands.hpp"
#include "modar/layout_search.hpp"
#include "modar/profile.hpp"

namespace modar::cli {

namespace {

std::vector<FlagSpec> layout_flags(const LayoutSettings& d) {
  return {
      {"--gpus", true, false, "N",
       "devices to lay the model out on (required; at most " + std::to_string(kMaxLayoutGpus) +
           ")"},
      {"--gpus-per-node", true, false, "G",
       "GPUs per node (default: the profile's network, 8 without one)"},
      {"--global-batch", true, false, "SEQUENCES",
       "sequences per optimizer step, the same for every layout (default: the config's "
       "train.global_batch, else 2^22 / seq_len rounded up to a power of two, ~4M tokens)"},
      config_profile_flag(),
      set_flag(),
      {"--top", true, false, "K",
       "rows of each table (default " + std::to_string(d.top) + "; --json lists every layout)"},
      {"--json", false, false, "", "print the JSON document (every layout) instead of the tables"},
      {"--quiet", false, false, "",
       "no progress line on stderr (shown with an ETA when the ranking takes over a second)"},
  };
}

// The request fields the flags set, for errors naming the flag typed.
const std::vector<FlagKey>& layout_flag_keys() {
  static const std::vector<FlagKey> keys = {{"--profile", "device.profile"},
                                            {"--gpus-per-node", "gpus_per_node"},
                                            {"--gpus", "gpus"},
                                            {"--global-batch", "global_batch"},
                                            {"--top", "top"}};
  return keys;
}

LayoutRequest layout_request(const ParsedArgs& parsed) {
  LayoutRequest request;
  set_if_given(parsed, "--gpus", request.gpus, parse_int);
  set_if_given(parsed, "--gpus-per-node", request.gpus_per_node, parse_int);
  set_if_given(parsed, "--global-batch", request.global_batch, parse_int);
  set_if_given(parsed, "--top", request.top, parse_int);
  return request;
}

}  // namespace

int cmd_layout(const Args& args) {
  const std::vector<FlagSpec> flags = layout_flags(resolve_layout([] {
    LayoutRequest defaults;
    defaults.gpus = 1;  // any count: only the defaults are read
    return defaults;
  }()));
  if (print_help_if_asked(
          args, "layout",
          "CONFIG --gpus N [--gpus-per-node G] [--global-batch S] [--json] [--quiet]", flags,
          "Ranks every parallel layout of the model in CONFIG on N GPUs by step time at one\n"
          "global batch: tensor parallelism with and without sequence parallelism, context\n"
          "parallelism, pipeline parallelism (1F1B, interleaved v 2 / 4), expert parallelism\n"
          "and expert tensor parallelism (models with experts), ZeRO 0-3, micro-batch 1-8 and\n"
          "recompute none / selective / full.  Prints memory per device and MFU of the layouts\n"
          "that fit and, for the nearest that do not, what exceeds the device memory.\n"
          "CONFIG's [parallel] section and micro-batch are replaced; docs/cluster.md.")) {
    return 0;
  }
  const ParsedArgs parsed = parse_args(args, flags, "layout", 1, 1, "CONFIG (a TOML file)");
  if (!parsed.has("--gpus")) {
    throw ConfigError("--gpus: required (the number of devices to lay the model out on)");
  }
  std::vector<std::string> sets = parsed.values("--set");
  if (const auto profile_name = parsed.value("--profile")) {
    sets.push_back("device.profile=" + *profile_name);
  }
  const std::vector<FlagKey>& keys = layout_flag_keys();
  const LayoutSettings settings =
      with_typed_flags(parsed, keys, [&] { return resolve_layout(layout_request(parsed)); });
  const Config config = with_typed_flags(
      parsed, keys, [&] { return load_config_with_overrides(parsed.positional[0], sets); });
  const DeviceProfile profile =
      with_typed_flags(parsed, keys, [&] { return load_profile(config.device.profile); });
  const TimingModel timing(profile);
  const RunControl control = progress_on_stderr(parsed.has("--quiet"));
  const InterruptScope ctrl_c;  // Ctrl-C: the ranking stops at its next layout, exit 130
  const LayoutRanking ranking = with_typed_flags(
      parsed, keys, [&] { return rank_layouts(config, timing, settings.options, control); });
  std::string text;
  if (parsed.has("--json")) {
    text = to_json(ranking);
    text += "\n";
  } else {
    text = "modar layout: " + parsed.positional[0] + "\n" + to_table(ranking, settings.top);
  }
  std::fputs(text.c_str(), stdout);
  return std::fflush(stdout) == 0 ? 0 : 1;
}

}  // namespace modar::cli
