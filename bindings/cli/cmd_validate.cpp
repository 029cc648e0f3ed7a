// `modar validate`: measured vs predicted step time and peak memory on
// held-out configurations (runtime/validate.cpp).
#include <cstdio>
#include <cstdlib>
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
  runtime::ValidationOptions options;
  options.quick = parsed.has("--quick");
  if (parsed.has("--rounds")) {
    options.rounds = static_cast<int>(parse_positive_int("--rounds", *parsed.value("--rounds")));
  }
  // Default: the threads the profile was measured with (CPU backend).
  int threads = 0;
  const auto recorded_threads = profile.provenance.find("threads");
  if (backend_name == "cpu" && recorded_threads != profile.provenance.end()) {
    threads = std::atoi(recorded_threads->second.c_str());
  }
  if (parsed.has("--threads")) {
    threads = static_cast<int>(parse_positive_int("--threads", *parsed.value("--threads")));
  }
  runtime::set_cpu_threads(threads);
  // Default: the clock the profile was measured with.
  const auto recorded = profile.provenance.find("clock");
  const std::string default_clock =
      recorded != profile.provenance.end() && recorded->second == "cpu" ? "cpu" : "wall";
  const std::vector<std::string> clocks = {"wall", "cpu"};
  options.clock = parse_choice("--clock", parsed.value_or("--clock", default_clock), clocks) == 0
                      ? runtime::Clock::wall
                      : runtime::Clock::cpu;
  if (options.clock == runtime::Clock::cpu && backend_name != "cpu") {
    throw ConfigError(
        "--clock cpu: only the cpu backend can be timed by CPU time; use --clock wall");
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
