// `modar sweep`: every candidate on the isoFLOP curves (budget x architecture x
// capacity x every x K x n x shape) as CSV (default) or JSON lines.
#include <cstdio>

#include "cli_util.hpp"
#include "commands.hpp"
#include "modar/errors.hpp"
#include "modar/planner.hpp"
#include "planner_cli.hpp"

namespace modar::cli {

int cmd_sweep(const Args& args) {
  std::vector<FlagSpec> flags = {
      {"--flops", true, false, "C1,C2,...", "training-FLOP budgets"},
      {"--arch", true, false, "LIST", "baseline,mod,dar,mod+dar (default baseline,mod)"},
      {"--capacity", true, false, "LIST", "MoD capacities (default 0.125)"},
      {"--every", true, false, "LIST", "MoD routing frequencies (default 2)"},
      {"--block-layers", true, false, "LIST", "DAR layers per block (default 2)"},
      {"--streams", true, false, "LIST", "DAR streams (default 2)"},
      {"--no-time", false, false, "", "skip per-candidate memory and step time (faster)"},
      {"--jsonl", false, false, "", "JSON lines instead of CSV"},
      {"--output", true, false, "PATH", "write to PATH (atomically) instead of stdout"},
  };
  for (FlagSpec& flag : planner_common_flags()) {
    if (flag.name != "--json") {
      flags.push_back(flag);
    }
  }
  if (wants_help(args)) {
    std::fputs(usage_text("sweep", "--flops C1,C2,... [options]", flags,
                          "Every evaluated candidate, for isoFLOP curves like the MoD paper's "
                          "figure 4.  Empty eps / loss cells: no prior (loss unknown).")
                   .c_str(),
               stdout);
    return 0;
  }
  const ParsedArgs parsed = parse_args(args, flags, "sweep", 0, 0);
  SweepRequest request;
  const auto flops = parsed.value("--flops");
  if (!flops) {
    throw ConfigError("modar sweep: no budget; give --flops C1,C2,...");
  }
  request.budgets_flops = parse_positive_double_list("--flops", *flops);
  if (const auto v = parsed.value("--arch")) {
    request.archs = parse_list("--arch", *v);
  }
  if (const auto v = parsed.value("--capacity")) {
    request.capacities = parse_positive_double_list("--capacity", *v);
  }
  if (const auto v = parsed.value("--every")) {
    request.everys = parse_positive_int_list("--every", *v);
  }
  if (const auto v = parsed.value("--block-layers")) {
    request.block_layers = parse_positive_int_list("--block-layers", *v);
  }
  if (const auto v = parsed.value("--streams")) {
    request.streams = parse_positive_int_list("--streams", *v);
  }
  request.fit = parsed.value_or("--fit", "epoch");
  request.eps_overrides = parse_eps_overrides(parsed.value_or("--eps", ""));
  request.profile = parsed.value_or("--profile", default_profile_name());
  if (const auto v = parsed.value("--gpus")) {
    request.gpus = parse_positive_int("--gpus", *v);
  }
  request.with_time = !parsed.has("--no-time");
  request.base = planner_base_config(parsed);
  request.shapes = planner_shape_options(parsed);

  const bool jsonl = parsed.has("--jsonl");
  const auto output = parsed.value("--output");
  std::string buffer;
  if (!jsonl) {
    buffer = sweep_csv_header() + "\n";
  }
  // Rows are formatted as they come; stdout is written once at the end so a
  // failing sweep prints one error line and no partial table.
  sweep(request, [&](const SweepRow& row) {
    buffer += (jsonl ? to_json_line(row) : to_csv_line(row)) + "\n";
  });
  if (output) {
    save_text_atomically(*output, buffer);
  } else {
    std::fputs(buffer.c_str(), stdout);
  }
  return 0;
}

}  // namespace modar::cli
