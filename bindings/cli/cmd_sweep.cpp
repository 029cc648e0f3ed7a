// `modar sweep`: the isoFLOP curves behind `modar optimal` (budget x
// architecture x capacity x every x K x n), one row per N_f bin, as CSV
// (default) or JSON lines.  All the work is modar::sweep(); this file turns
// the flags the user gave into a SweepRequest (planner_cli.hpp's pattern).
#include <cstdio>

#include "cli_util.hpp"
#include "commands.hpp"
#include "modar/base/errors.hpp"
#include "modar/base/files.hpp"
#include "modar/planner.hpp"
#include "planner_cli.hpp"

namespace modar::cli {

namespace {

std::vector<FlagSpec> sweep_flags(const SweepSettings& d) {
  std::vector<FlagSpec> flags = {
      {"--flops", true, false, "C1,C2,...", "training-FLOP budgets, e.g. 6e18,2e19,1e20"},
      arch_flag(d.variants),
      {"--capacity", true, false, "LIST",
       "MoD capacities (default " + format_number(kDefaultModCapacity) + ")"},
      {"--every", true, false, "LIST",
       "MoD routing frequencies (default " + std::to_string(kDefaultModEvery) + ")"},
      {"--block-layers", true, false, "LIST",
       "DAR layers per block (default " + std::to_string(kDefaultDarBlockLayers) + ")"},
      {"--streams", true, false, "LIST",
       "DAR streams (default " + std::to_string(kDefaultDarStreams) + ")"},
      {"--no-time", false, false, "", "skip each row's step time (faster; memory is kept)"},
      {"--grid-step", true, false, "R",
       "ratio of consecutive N_f bins of a curve (default " + format_number(d.grid_step) + ")"},
      {"--grid-half-width", true, false, "W",
       "a curve spans N_f* / W .. N_f* x W around its compute-optimal N_f* (default " +
           format_number(d.grid_half_width) + ")"},
      {"--jsonl", false, false, "", "JSON lines instead of CSV"},
      {"--output", true, false, "PATH", "write to PATH (atomically) instead of stdout"},
  };
  for (FlagSpec& flag : planner_run_flags(d.run)) {
    flags.push_back(flag);
  }
  return flags;
}

SweepRequest sweep_request(const ParsedArgs& parsed) {
  SweepRequest request;
  request.flops = parse_flop_budget_list("--flops", *parsed.value("--flops"));
  set_if_given(parsed, "--arch", request.arch, parse_list);
  set_if_given(parsed, "--capacity", request.capacity, parse_double_list);
  set_if_given(parsed, "--every", request.every, parse_int_list);
  set_if_given(parsed, "--block-layers", request.block_layers, parse_int_list);
  set_if_given(parsed, "--streams", request.streams, parse_int_list);
  if (parsed.has("--no-time")) {
    request.with_time = false;
  }
  set_if_given(parsed, "--grid-step", request.grid_step, parse_double);
  set_if_given(parsed, "--grid-half-width", request.grid_half_width, parse_double);
  parse_planner_run_flags(parsed, request);
  return request;
}

}  // namespace

int cmd_sweep(const Args& args) {
  const std::vector<FlagSpec> flags = sweep_flags(resolve_sweep([] {
    SweepRequest defaults;
    defaults.flops = {1e20};  // any budget: only the defaults are read
    return defaults;
  }()));
  if (print_help_if_asked(args, "sweep", "--flops C1,C2,... [options]", flags,
                          "The isoFLOP curves behind `modar optimal`, for plots like the MoD "
                          "paper's figure 4: per budget and architecture, one row per N_f bin "
                          "(the bin's best shape that fits), the row `recommended` = what "
                          "`modar optimal` recommends.  Empty eps / loss cells: no prior (loss "
                          "unknown).")) {
    return 0;
  }
  const ParsedArgs parsed = parse_args(args, flags, "sweep", 0, 0);
  if (!parsed.has("--flops")) {
    throw ConfigError(
        "--flops: missing; allowed: one or more FLOP budgets, e.g. --flops 1e19,1e20");
  }
  const bool jsonl = parsed.has("--jsonl");
  const auto output = parsed.value("--output");
  if (output) {
    check_output_path("--output", *output, "", "");  // a directory: refused before the work
  }
  const RunControl control = progress_on_stderr(parsed.has("--quiet"));
  // Rows are formatted as they come; the output is written once at the end,
  // so a failing or interrupted sweep prints one line and no partial table.
  std::string buffer = jsonl ? "" : sweep_csv_header() + "\n";
  const SweepSummary summary = with_typed_flags(parsed, planner_flag_keys(), [&] {
    const SweepRequest request = sweep_request(parsed);
    const InterruptScope ctrl_c;  // Ctrl-C: the sweep stops at its next check, exit 130
    return sweep(
        request,
        [&](const SweepRow& row) { buffer += (jsonl ? to_json_line(row) : to_csv_line(row)) + "\n"; },
        control);
  });
  for (size_t i = 0; i < summary.notes.size() && i < 20; ++i) {
    std::fprintf(stderr, "modar sweep: note: %s\n",
                 name_typed_flags(summary.notes[i], parsed, planner_flag_keys()).c_str());
  }
  if (output) {
    write_file_atomically(*output, buffer, "sweep output");
  } else {
    std::fputs(buffer.c_str(), stdout);
  }
  return 0;
}

}  // namespace modar::cli
