// modar: command-line entry point.  Dispatches to the subcommands and maps
// typed errors to exit codes: bad input -> 2 (one line naming the field, the
// value and what is allowed), internal failure -> 1.  Nothing reaches the user
// as an uncaught exception.
#include <malloc.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "cli_util.hpp"
#include "commands.hpp"
#include "modar/base/errors.hpp"
#include "modar/base/interrupt.hpp"
#include "modar/base/text.hpp"
#include "modar/config.hpp"

namespace {

// One row per command: its name, what it does (the usage line) and its
// entry point.  A new command is one row here and its cmd_<name>.cpp.
struct Command {
  const char* name;
  const char* synopsis;
  const char* summary;
  int (*run)(const modar::cli::Args&);
};

constexpr Command kCommands[] = {
    {"estimate", "CONFIG", "FLOPs, parameters, memory and step time of one configuration",
     modar::cli::cmd_estimate},
    {"layout", "CONFIG", "every parallel layout of the model on N GPUs, ranked by step time",
     modar::cli::cmd_layout},
    {"optimal", "", "isoFLOP- / wall-clock-optimal model and configuration for a budget",
     modar::cli::cmd_optimal},
    {"sweep", "", "the isoFLOP curves behind optimal, as CSV or JSON lines", modar::cli::cmd_sweep},
    {"fit", "RUNS.csv", "fit a scaling law to your own runs", modar::cli::cmd_fit},
    {"calibrate", "RUNS.csv", "fit a profile's time-model parameters to measured step times",
     modar::cli::cmd_calibrate},
    {"profile", "", "time the runtime's ops on this machine, write a device profile",
     modar::cli::cmd_profile},
    {"validate", "", "measured vs predicted step time and memory on held-out configurations",
     modar::cli::cmd_validate},
    {"export", "CONFIG", "Megatron-LM launch arguments for a configuration's model and layout",
     modar::cli::cmd_export},
};

std::string usage() {
  std::string text = "usage: modar <command> [options]\n\ncommands:\n";
  for (const Command& command : kCommands) {
    std::string left = std::string(command.name) + " " + command.synopsis;
    left.resize(std::max<size_t>(left.size() + 2, 20), ' ');
    text += "  " + left + command.summary + "\n";
  }
  return text + "\n`modar <command> --help` describes each command.\n";
}

std::string command_names() {
  std::string names;
  for (const Command& command : kCommands) {
    names += (names.empty() ? "" : ", ") + std::string(command.name);
  }
  return names;
}

}  // namespace

int main(int argc, char** argv) {
  // The heap grows and shrinks in steps of 64 MiB more than asked: the
  // planner's searches allocate and free tens of MB per shape, and glibc's
  // default (128 KiB) gave the memory back and faulted it in again each time
  // (the documented h100 call: 42,787 minor faults and 0.17-0.19 s of system
  // time -> 19,711 and 0.09 s).  Pages are still only touched when used.
  mallopt(M_TOP_PAD, 64 << 20);
  if (argc < 2) {
    std::fputs(usage().c_str(), stderr);
    return 2;
  }
  const std::string name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") {
    std::fputs(usage().c_str(), stdout);
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
    const auto line = [](const char* what) {
      modar::cli::close_progress_line();
      return modar::shown_value(what, 2000);
    };
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
      modar::cli::close_progress_line();
      std::fprintf(stderr, "modar %s: error: out of memory\n", command.name);
      return 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "modar %s: internal error: %s\n", command.name, line(e.what()).c_str());
      return 1;
    }
  }
  std::fprintf(stderr, "modar: error: unknown command '%s'; allowed: %s\n",
               modar::shown_value(name).c_str(), command_names().c_str());
  return 2;
}
