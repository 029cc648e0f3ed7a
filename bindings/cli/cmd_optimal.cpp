// `modar optimal`: isoFLOP- / wall-clock-optimal configurations for a budget
// (docs/planner.md).  All the work is modar::optimal(); this file parses flags.
#include <cstdio>

#include "cli_util.hpp"
#include "commands.hpp"
#include "modar/base/errors.hpp"
#include "modar/planner.hpp"
#include "planner_cli.hpp"

namespace modar::cli {

std::vector<FlagSpec> optimal_flags() {
  std::vector<FlagSpec> flags = {
      {"--flops", true, false, "C", "training-FLOP budget (model FLOPs, e.g. 1e20)"},
      {"--gpu-hours", true, false, "H", "device-hour budget on --profile (step time decides)"},
      {"--arch", true, false, "LIST", "baseline,mod,dar,mod+dar (default: all four)"},
      {"--capacity", true, false, "C", "MoD capacity fraction (default 0.125)"},
      {"--every", true, false, "N", "MoD: route every N-th layer (default 2)"},
      {"--block-layers", true, false, "K", "DAR layers per block (default 2; 1 = Full DAR)"},
      {"--streams", true, false, "N", "DAR streams (default 2)"},
      {"--gpus-per-node", true, false, "G",
       "cluster (--gpus > 1): GPUs per node (default: the profile's network, 8)"},
  };
  for (FlagSpec& flag : planner_common_flags()) {
    flags.push_back(flag);
  }
  return flags;
}

OptimalRequest optimal_request(const ParsedArgs& parsed) {
  OptimalRequest request;
  if (const auto v = parsed.value("--flops")) {
    request.train_flops = parse_budget("--flops", *v);
  }
  if (const auto v = parsed.value("--gpu-hours")) {
    request.gpu_hours = parse_budget("--gpu-hours", *v);
  }
  if (!request.train_flops && !request.gpu_hours) {
    throw ConfigError("no budget: give --flops C and/or --gpu-hours H");
  }
  if (const auto v = parsed.value("--arch")) {
    request.archs = parse_list("--arch", *v);
  }
  if (const auto v = parsed.value("--capacity")) {
    request.capacity = parse_positive_double("--capacity", *v);
  }
  request.shapes = planner_shape_options(parsed);
  if (const auto v = parsed.value("--every")) {
    request.every = parse_positive_int("--every", *v);
    check_depth_knob("--every", request.every, request.shapes, "MoD routing every N-th layer");
  }
  if (const auto v = parsed.value("--block-layers")) {
    request.dar_block_layers = parse_positive_int("--block-layers", *v);
    check_depth_knob("--block-layers", request.dar_block_layers, request.shapes,
                     "a DAR block of K layers");
  }
  if (const auto v = parsed.value("--streams")) {
    request.dar_streams = parse_positive_int("--streams", *v);
  }
  parse_planner_run_flags(parsed, request);
  return request;
}

int cmd_optimal(const Args& args) {
  const std::vector<FlagSpec> flags = optimal_flags();
  if (wants_help(args)) {
    std::fputs(usage_text("optimal", "--flops C | --gpu-hours H [options]", flags,
                          "For a budget, the isoFLOP-optimal configuration of each architecture "
                          "and, for those with a loss prior, the fastest-stepping configuration "
                          "whose predicted loss matches the optimal baseline.")
                   .c_str(),
               stdout);
    return 0;
  }
  const ParsedArgs parsed = parse_args(args, flags, "optimal", 0, 0);
  const OptimalResult result = with_typed_flags(parsed, planner_flag_keys(),
                                                [&] { return optimal(optimal_request(parsed)); });
  const std::string text = parsed.has("--json") ? to_json(result) + "\n" : to_table(result);
  std::fputs(text.c_str(), stdout);
  return 0;
}

}  // namespace modar::cli
