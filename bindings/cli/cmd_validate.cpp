// `modar validate`: measured vs predicted step time and peak memory on
// held-out configurations (runtime/validate.cpp).
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "cli_util.hpp"
#include "commands.hpp"
#include "modar/errors.hpp"
#include "modar/runtime/backend.hpp"
#include "modar/runtime/profiler.hpp"
#include "modar/runtime/validate.hpp"

namespace modar::cli {
namespace {

const std::vector<FlagSpec> kFlags = {
    {"--profile", true, false, "PATH", "a profile written by `modar profile` (required)"},
    {"--backend", true, false, "cpu|cuda", "the backend to run on (default cpu)"},
    {"--json", false, false, "", "print JSON (cases[], step_time, memory) instead of the table"},
    {"--quick", false, false, "", "fewer, smaller held-out configurations"},
    {"--rounds", true, false, "N", "interleaved timing rounds per case (default 7)"},
    {"--threads", true, false, "N", "CPU threads (default: the profile's provenance.threads)"},
    {"--clock", true, false, "wall|cpu",
     "what a sample measures: wall time or process CPU time per thread (cpu backend only); "
     "default: the profile's provenance.clock"},
    {"--dry-run", false, false, "", "print the resolved settings (JSON) and exit"},
    {"--quiet", false, false, "", "no progress lines on stderr"},
};

constexpr const char* kDescription =
    "Runs held-out configurations (not on the profile's grid: dense, MoD at several\n"
    "capacities, AttnRes, DAR; single layers and whole small training steps) on the\n"
    "runtime and compares the median measured step time and peak memory with the cost\n"
    "model's prediction from the profile.  error = (predicted - measured) / measured.\n";

}  // namespace

int cmd_validate(const Args& args) {
  if (wants_help(args)) {
    std::fputs(usage_text("validate", "--profile PATH [--backend cpu|cuda] [--json] [--quick]",
                          kFlags, kDescription)
                   .c_str(),
               stdout);
    return 0;
  }
  const ParsedArgs parsed = parse_args(args, kFlags, "validate", 0, 0);
  if (!parsed.has("--profile")) {
    throw ConfigError("--profile is missing: give a profile written by `modar profile --out PATH`");
  }
  const std::vector<std::string> backends = {"cpu", "cuda"};
  const std::string backend_name =
      backends[parse_choice("--backend", parsed.value_or("--backend", "cpu"), backends)];
  const DeviceProfile profile =
      runtime::load_measured_profile(*parsed.value("--profile"), backend_name);
  // Only what the user said; the defaults (the profile's clock and threads)
  // belong to the library (runtime::resolve_validation_options), shared with
  // modar.validate().
  runtime::ValidationRequest request;
  request.backend = backend_name;
  request.quick = parsed.has("--quick");
  const auto int_flag = [&](const char* flag) {
    const int64_t value = parse_positive_int(flag, *parsed.value(flag));
    if (value > std::numeric_limits<int>::max()) {
      throw ConfigError(std::string(flag) + " = " + *parsed.value(flag) + ": out of range");
    }
    return static_cast<int>(value);
  };
  if (parsed.has("--rounds")) {
    request.rounds = int_flag("--rounds");
  }
  if (parsed.has("--threads")) {
    request.threads = int_flag("--threads");
  }
  if (parsed.has("--clock")) {
    const std::vector<std::string> clocks = {"wall", "cpu"};
    request.clock = parse_choice("--clock", *parsed.value("--clock"), clocks) == 0
                        ? runtime::Clock::wall
                        : runtime::Clock::cpu;
  }
  runtime::ValidationOptions options = runtime::resolve_validation_options(request, profile);
  if (parsed.has("--dry-run")) {
    std::fputs(runtime::validation_settings_json(options, request, profile).c_str(), stdout);
    return 0;
  }
  options.progress = parsed.has("--quiet") ? nullptr : stderr;
  std::unique_ptr<runtime::Backend> backend;
  try {
    backend = runtime::make_backend(backend_name);
  } catch (const BackendError& e) {
    throw ConfigError(std::string("--backend ") + backend_name + ": " + e.what());
  }
  const runtime::ValidationReport report = runtime::run_validation(*backend, profile, options);
  const std::string text =
      parsed.has("--json") ? runtime::validation_json(report) : runtime::validation_text(report);
  std::fputs(text.c_str(), stdout);
  return 0;
}

}  // namespace modar::cli
