// Flags shared by `modar optimal` and `modar sweep` (the base configuration,
// the shape search, the architecture knobs, the fit and the eps overrides).
#pragma once

#include <string>
#include <vector>

#include "cli_util.hpp"
#include "modar/planner.hpp"

namespace modar::cli {

std::vector<FlagSpec> planner_common_flags();
// --config / --set / --seq-len / --micro-batch / --global-batch / --recompute /
// --mlp / --vocab into a validated base Config.
Config planner_base_config(const ParsedArgs& parsed);
ShapeSearchOptions planner_shape_options(const ParsedArgs& parsed);
// "a,b,c" -> pieces (empty pieces are an error naming the flag).
std::vector<std::string> parse_list(const std::string& flag, const std::string& text);
std::vector<double> parse_positive_double_list(const std::string& flag, const std::string& text);
std::vector<int64_t> parse_positive_int_list(const std::string& flag, const std::string& text);
// --flops budget: a finite positive number ("0", "-1", "nan", "inf" rejected).
double parse_budget(const std::string& flag, const std::string& text);
// The config keys behind the planner flags (for name_typed_flags).
const std::vector<FlagKey>& planner_flag_keys();
// --every / --block-layers need that many layers: refuse values the shape
// search's depth range can never hold (instead of an empty answer).
void check_depth_knob(const std::string& flag, int64_t value, const ShapeSearchOptions& options,
                      const char* what);

// `modar optimal`'s flags and its request from them (cmd_optimal.cpp; also
// `modar export --from-optimal`).
std::vector<FlagSpec> optimal_flags();
OptimalRequest optimal_request(const ParsedArgs& parsed);

// --fit / --eps / --profile / --gpus / --gpus-per-node and, last, the base
// configuration: the fields OptimalRequest and SweepRequest share.
template <class Request>
void parse_planner_run_flags(const ParsedArgs& parsed, Request& request) {
  request.fit = parsed.value_or("--fit", "epoch");
  request.eps_overrides = parse_eps_overrides(parsed.value_or("--eps", ""));
  request.profile = parsed.value_or("--profile", default_profile_name());
  if (const auto v = parsed.value("--gpus")) {
    request.gpus = parse_positive_int("--gpus", *v);
  }
  if (const auto v = parsed.value("--gpus-per-node")) {
    request.gpus_per_node = parse_positive_int("--gpus-per-node", *v);
  }
  request.base = planner_base_config(parsed);
}

}  // namespace modar::cli
