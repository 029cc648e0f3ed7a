// modar: command-line entry point.  Dispatches to the subcommands and maps
// typed errors to exit codes: bad input -> 2 (one line naming the field, the
// value and what is allowed), internal failure -> 1.  Nothing reaches the user
// as an uncaught exception.
#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "commands.hpp"
#include "modar/base/errors.hpp"
#include "modar/base/interrupt.hpp"
#include "modar/base/text.hpp"
#include "modar/config.hpp"

namespace {

constexpr const char* kUsage =
    "usage: modar <command> [options]\n"
    "\n"
    "commands:\n"
    "  estimate CONFIG   FLOPs, parameters, memory and step time of one configuration\n"
    "  layout CONFIG     every parallel layout of the model on N GPUs, ranked by step time\n"
    "  optimal           isoFLOP- / wall-clock-optimal model and configuration for a budget\n"
    "  sweep             every evaluated candidate as CSV or JSON lines\n"
    "  fit RUNS.csv      fit a scaling law to your own runs\n"
    "  calibrate RUNS.csv  fit a profile's time-model parameters to measured step times\n"
    "  profile           time the runtime's ops on this machine, write a device profile\n"
    "  validate          measured vs predicted step time and memory on held-out configurations\n"
    "  export CONFIG     Megatron-LM launch arguments for a configuration's model and layout\n"
    "\n"
    "`modar <command> --help` describes each command.\n";

struct Command {
  const char* name;
  int (*run)(const modar::cli::Args&);
};

constexpr Command kCommands[] = {
    {"estimate", modar::cli::cmd_estimate}, {"layout", modar::cli::cmd_layout},
    {"optimal", modar::cli::cmd_optimal},
    {"sweep", modar::cli::cmd_sweep},       {"fit", modar::cli::cmd_fit},
    {"profile", modar::cli::cmd_profile},   {"validate", modar::cli::cmd_validate},
    {"calibrate", modar::cli::cmd_calibrate},
    {"export", modar::cli::cmd_export},
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (name == "--version") {
    std::puts("modar 0.1.0");
    return 0;
  }
  const modar::cli::Args args(argv + 2, argv + argc);
  for (const Command& command : kCommands) {
    if (name != command.name) {
      continue;
    }
    // Every message is printed as ONE line: control characters escaped and
    // anything past 2000 characters cut (the library already shortens echoed
    // values; this is the net under it).
    const auto line = [](const char* what) { return modar::shown_value(what, 2000); };
    try {
      return command.run(args);
    } catch (const modar::Interrupted& e) {
      std::fprintf(stderr, "modar %s: %s; nothing written\n", command.name, line(e.what()).c_str());
      return 130;  // 128 + SIGINT, as a shell reports a Ctrl-C
    } catch (const modar::ConfigError& e) {
      std::fprintf(stderr, "modar %s: error: %s\n", command.name, line(e.what()).c_str());
      return 2;
    } catch (const modar::FileError& e) {
      std::fprintf(stderr, "modar %s: error: %s\n", command.name, line(e.what()).c_str());
      return 2;
    } catch (const std::invalid_argument& e) {
      std::fprintf(stderr, "modar %s: error: %s\n", command.name, line(e.what()).c_str());
      return 2;
    } catch (const std::bad_alloc&) {
      std::fprintf(stderr, "modar %s: error: out of memory\n", command.name);
      return 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "modar %s: internal error: %s\n", command.name,
                   line(e.what()).c_str());
      return 1;
    }
  }
  std::fprintf(stderr,
               "modar: error: unknown command '%s'; allowed: estimate, optimal, sweep, fit, "
               "profile, validate, calibrate, export\n",
               modar::shown_value(name).c_str());
  return 2;
}
