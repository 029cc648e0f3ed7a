// The flags `modar optimal` and `modar sweep` share (PlannerRunRequest: the
// fit, the eps overrides, the hardware, the base configuration, the shape
// search) and how they fill a request.
//
// The pattern every command follows: parse each flag the user gave into its
// request field (types only, nothing else); leave the others unset; let the
// library resolve and check (resolve_optimal, resolve_sweep, ...), whose
// errors name request fields that with_typed_flags() renames to the flags.
// Help texts show the defaults of the resolved empty request, so --help
// cannot disagree with what runs.
#pragma once

#include <string>
#include <vector>

#include "cli_util.hpp"
#include "modar/planner.hpp"

namespace modar::cli {

// The shared flags, their help showing the defaults of `defaults` (the
// resolved empty request).
std::vector<FlagSpec> planner_run_flags(const PlannerRun& defaults);
// Fill `request` (a PlannerRunRequest: OptimalRequest or SweepRequest) with
// the shared flags the user gave.
void parse_planner_run_flags(const ParsedArgs& parsed, PlannerRunRequest& request);
// The request fields and config keys behind the planner's flags (for
// with_typed_flags / name_typed_flags).
const std::vector<FlagKey>& planner_flag_keys();

// "a,b,c" -> values (cli_util's parse_list, each piece parsed).
std::vector<double> parse_double_list(const std::string& flag, const std::string& text);
std::vector<int64_t> parse_int_list(const std::string& flag, const std::string& text);
// A flag's number ("nan", "inf" and trailing garbage refused); its range is
// the library's.
double parse_number(const std::string& flag, const std::string& text);
// --flops: a FLOP budget, or a list of them; text that is not a number is
// refused naming the wall-clock budget flags (--gpu-hours, --days).
double parse_flop_budget(const std::string& flag, const std::string& text);
std::vector<double> parse_flop_budget_list(const std::string& flag, const std::string& text);

// "baseline, mod, dar, mod+dar, moe, moe+dar, ...": every architecture name.
std::string arch_list_text();
// The --arch flag of optimal and sweep, its help showing the defaults
// `archs` (the resolved empty request's).
FlagSpec arch_flag(const std::vector<ArchSpec>& archs);

// `modar optimal`'s flags and its request from them (cmd_optimal.cpp; also
// `modar export --from-optimal`).
std::vector<FlagSpec> optimal_flags();
OptimalRequest optimal_request(const ParsedArgs& parsed);

}  // namespace modar::cli
