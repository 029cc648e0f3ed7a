// `modar optimal`: isoFLOP- / wall-clock-optimal configurations for a budget
// (docs/planner.md).  All the work is modar::optimal(); this file turns the
// flags the user gave into an OptimalRequest (planner_cli.hpp's pattern).
#include <cstdio>

#include "cli_util.hpp"
#include "commands.hpp"
#include "modar/base/errors.hpp"
#include "modar/planner.hpp"
#include "planner_cli.hpp"

namespace modar::cli {

std::vector<FlagSpec> optimal_flags() {
  // The help's defaults are the library's (the request with nothing said).
  const OptimalSettings d = resolve_optimal(OptimalRequest{});
  std::vector<FlagSpec> flags = {
      {"--flops", true, false, "C", "training-FLOP budget (model FLOPs), e.g. 1e20"},
      {"--gpu-hours", true, false, "H",
       "wall-clock budget in device-hours on --profile, all GPUs together (e.g. 2e5 or 200k); "
       "step time decides the tokens"},
      {"--days", true, false, "D",
       "wall-clock budget on --gpus GPUs: days (14), weeks (2w) or hours (336h); = D x 24 x "
       "gpus GPU-hours"},
      arch_flag(d.archs),
      {"--capacity", true, false, "C",
       "MoD capacity fraction (default " + format_number(d.capacity) + ")"},
      {"--every", true, false, "N",
       "MoD: route every N-th layer (default " + std::to_string(d.every) + ")"},
      {"--block-layers", true, false, "K",
       "DAR layers per block (default " + std::to_string(d.block_layers) + "; 1 = Full DAR)"},
      {"--streams", true, false, "N", "DAR streams (default " + std::to_string(d.streams) + ")"},
      {"--json", false, false, "", "print JSON"},
  };
  for (FlagSpec& flag : planner_run_flags(d.run)) {
    flags.push_back(flag);
  }
  return flags;
}

OptimalRequest optimal_request(const ParsedArgs& parsed) {
  if (!parsed.has("--flops") && !parsed.has("--gpu-hours") && !parsed.has("--days")) {
    throw ConfigError("no budget: give --flops C, --gpu-hours H or --days D (with --gpus N)");
  }
  // Only what the user said; the library resolves and checks it.
  OptimalRequest request;
  set_if_given(parsed, "--flops", request.flops, parse_flop_budget);
  const BudgetFieldNames flags{"--gpu-hours", "--days", "--gpus", " "};
  if (const auto v = parsed.value("--gpu-hours")) {
    request.gpu_hours = parse_gpu_hours(*v, flags);
  }
  if (const auto v = parsed.value("--days")) {
    request.days = parse_days(*v, flags);
  }
  set_if_given(parsed, "--arch", request.arch, parse_list);
  set_if_given(parsed, "--capacity", request.capacity, parse_double);
  set_if_given(parsed, "--every", request.every, parse_int);
  set_if_given(parsed, "--block-layers", request.block_layers, parse_int);
  set_if_given(parsed, "--streams", request.streams, parse_int);
  parse_planner_run_flags(parsed, request);
  return request;
}

int cmd_optimal(const Args& args) {
  const std::vector<FlagSpec> flags = optimal_flags();
  if (print_help_if_asked(args, "optimal", "--flops C | --gpu-hours H | --days D [options]", flags,
                          "For a budget, the isoFLOP-optimal configuration of each architecture "
                          "and, for those with a loss prior, the fastest-stepping configuration "
                          "whose predicted loss matches the optimal baseline.")) {
    return 0;
  }
  const ParsedArgs parsed = parse_args(args, flags, "optimal", 0, 0);
  const RunControl control = progress_on_stderr(parsed.has("--quiet"));
  const OptimalResult result = with_typed_flags(parsed, planner_flag_keys(), [&] {
    const OptimalRequest request = optimal_request(parsed);
    const InterruptScope ctrl_c;  // Ctrl-C: the search stops at its next check, exit 130
    return optimal(request, control);
  });
  const std::string text = parsed.has("--json") ? to_json(result) + "\n" : to_table(result);
  std::fputs(text.c_str(), stdout);
  return 0;
}

}  // namespace modar::cli
