// `modar export`: a configuration as Megatron-LM launch arguments
// (docs/export.md).  The configuration comes from a config file (TOML or a
// Hugging Face config.json), from Megatron-LM arguments (--megatron-args),
// from `modar optimal --json`'s document, or from running optimal here
// (--from-optimal with optimal's flags).  All the mapping is
// modar::megatron_arguments(); this file picks the source.
#include <cstdio>

#include "cli_util.hpp"
#include "commands.hpp"
#include "modar/base/errors.hpp"
#include "modar/base/files.hpp"
#include "modar/base/text.hpp"
#include "modar/export.hpp"
#include "modar/hf_config.hpp"
#include "modar/planner.hpp"
#include "planner_cli.hpp"

namespace modar::cli {
namespace {

std::vector<FlagSpec> export_own_flags() {
  return {
      {"--format", true, false, "megatron", "the launcher's arguments to write (default megatron)"},
      {"--from-optimal", false, false, "",
       "run `modar optimal` with the other flags (its flags) and export a recommendation"},
      {"--pick", true, false, "ARCH",
       "which recommendation (--from-optimal or an optimal JSON): its architecture; needed when "
       "there are several"},
      {"--role", true, false, "optimal|parity-fastest",
       "the recommendation's role (default optimal: the isoFLOP-optimal one)"},
  };
}

std::vector<FlagSpec> export_flags() {
  std::vector<FlagSpec> flags = export_own_flags();
  flags.push_back(set_flag());
  flags.push_back({"--megatron-args", true, false, "TEXT",
                   "read the configuration from Megatron-LM arguments instead of CONFIG"});
  return flags;
}

std::string picked_role(const ParsedArgs& parsed) {
  const std::string role = parsed.value_or("--role", "optimal");
  return parse_choice("--role", role, {"optimal", "parity-fastest"}) == 0 ? "isoflop_optimal"
                                                                          : "parity_fastest";
}

struct ExportSource {
  Config config;
  std::string format;
};

ExportSource from_optimal(const Args& args) {
  std::vector<FlagSpec> flags = optimal_flags();
  for (const FlagSpec& own : export_own_flags()) {
    flags.push_back(own);
  }
  const ParsedArgs parsed = parse_args(args, flags, "export", 0, 0);
  // optimal's progress line and Ctrl-C (exit 130, nothing printed), as for
  // `modar optimal`.
  const RunControl control = progress_on_stderr(parsed.has("--quiet"));
  const OptimalResult result = with_typed_flags(parsed, planner_flag_keys(), [&] {
    const OptimalRequest request = optimal_request(parsed);
    const InterruptScope ctrl_c;
    return optimal(request, control);
  });
  const std::string role = picked_role(parsed);
  const std::string arch = parsed.value_or("--pick", "");
  const Recommendation* chosen = nullptr;
  std::string names;
  for (const Recommendation& rec : result.recommendations) {
    if (rec.role != role) {
      continue;
    }
    names += (names.empty() ? "" : ", ") + rec.arch;
    if (arch.empty() || rec.arch == arch) {
      if (chosen != nullptr && arch.empty()) {
        throw ConfigError("--pick: optimal recommends several architectures (" + names +
                          "...); name one, e.g. --pick " + chosen->arch);
      }
      chosen = chosen == nullptr ? &rec : chosen;
    }
  }
  if (chosen == nullptr) {
    throw ConfigError("--pick " + shown_value(arch) + ": no " +
                      (role == "isoflop_optimal" ? "optimal" : "parity-fastest") +
                      " recommendation of it; allowed: " + names);
  }
  return {chosen->config, parsed.value_or("--format", "megatron")};
}

}  // namespace

int cmd_export(const Args& args) {
  if (wants_help(args)) {
    std::vector<FlagSpec> all = export_flags();
    std::fputs(
        usage_text("export", "CONFIG | --megatron-args TEXT | --from-optimal ... [options]", all,
                   "Megatron-LM launch arguments for a configuration's model and layout "
                   "(docs/export.md).  CONFIG: a TOML file, a Hugging Face config.json or "
                   "the document of `modar optimal --json`.  With --from-optimal, every "
                   "`modar optimal` flag is accepted too.")
            .c_str(),
        stdout);
    return 0;
  }
  bool run_optimal = false;
  for (const std::string& arg : args) {
    run_optimal = run_optimal || arg == "--from-optimal";
  }
  Config config;
  std::string source;
  std::string format = "megatron";
  if (run_optimal) {
    ExportSource picked = from_optimal(args);
    config = std::move(picked.config);
    format = picked.format;
    source = "modar optimal";
  } else {
    const ParsedArgs parsed = parse_args(args, export_flags(), "export", 0, 1, "CONFIG");
    format = parsed.value_or("--format", "megatron");
    const std::vector<std::string>& sets = parsed.values("--set");
    const std::string text =
        parsed.positional.empty()
            ? std::string()
            : read_input_file(parsed.positional[0], "config file", uint64_t{16} << 20);
    if (looks_like_json(text) && text.find("\"recommendations\"") != std::string::npos) {
      // `modar optimal --json`'s document: one recommendation's configuration.
      source = parsed.positional[0];
      config = config_from_recommendation_json(text, parsed.value_or("--pick", ""),
                                               picked_role(parsed), source);
      for (const std::string& assignment : sets) {
        apply_override(config, assignment);
      }
      validate(config);
    } else {
      config = load_config_source(parsed, sets);
      source =
          parsed.positional.empty() ? std::string("Megatron-LM arguments") : parsed.positional[0];
    }
  }
  parse_choice("--format", format, {"megatron"});
  const std::string text = render_launch_arguments(megatron_arguments(config, source));
  std::fputs(text.c_str(), stdout);
  return 0;
}

}  // namespace modar::cli
