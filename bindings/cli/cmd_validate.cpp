// `modar validate`: measured vs predicted step time and peak memory on
// held-out configurations (runtime/validate.cpp).
#include <cstdio>
#include <exception>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "cli_util.hpp"
#include "commands.hpp"
#include "modar/base/errors.hpp"
#include "modar/runtime/backend.hpp"
#include "modar/runtime/comm.hpp"
#include "modar/runtime/host_facts.hpp"
#include "modar/runtime/profiler.hpp"
#include "modar/runtime/validate.hpp"
#include "modar/runtime/validate_parallel.hpp"
#include "runtime_flags.hpp"

namespace modar::cli {
namespace {

const std::vector<FlagSpec> kFlags = {
    {"--profile", true, false, "PATH", "a profile written by `modar profile` (required)"},
    {"--backend", true, false, "cpu|cuda", "the backend to run on (default cpu)"},
    {"--json", false, false, "", "print JSON (cases[], step_time, memory) instead of the table"},
    {"--quick", false, false, "", "fewer, smaller held-out configurations"},
    {"--rounds", true, false, "N",
     "interleaved timing rounds per case and repeat (default 5; --parallel: rounds, default 7)"},
    {"--repeats", true, false, "N",
     "independent repeats of the rounds (default 3): their medians give each case's run-to-run "
     "spread, which with the profile's round spread is the error's noise floor"},
    {"--refuse-under-load", false, false, "",
     "refuse (exit 3) a comparison the host check fails: the drift sentinel away from the "
     "profile's time or moving during the run, or other work saturating the CPUs; without it "
     "such a run is flagged with a warning"},
    {"--threads", true, false, "N", "CPU threads (default: the profile's provenance.threads)"},
    {"--clock", true, false, "wall|cpu",
     "what a sample measures: wall time or process CPU time per thread (cpu backend only); "
     "default: the profile's provenance.clock"},
    {"--parallel", false, false, "",
     "the multi-process cases (data, tensor + sequence, pipeline parallel, ZeRO, mixed) under "
     "mpirun -np 2 or 4: compute (CPU time) and communication (wall time) reported separately"},
    {"--cases", true, false, "N1,N2", "--parallel: only these cases (names as in the table)"},
    {"--dry-run", false, false, "", "print the resolved settings (JSON) and exit"},
    quiet_flag(),
};

constexpr const char* kDescription =
    "Runs held-out configurations (not on the profile's grid: dense, MoD at several\n"
    "capacities, AttnRes, DAR; single layers and whole small training steps) on the\n"
    "runtime and compares the median measured step time and peak memory with the cost\n"
    "model's prediction from the profile.  error = (predicted - measured) / measured.\n"
    "With --parallel (under mpirun, e.g. `mpirun -np 4 modar validate --parallel --profile\n"
    "profiles/cpu-comm.toml`): the multi-process training steps against the planner's cluster\n"
    "model and the profile's [network] tables (docs/profiler.md).\n";

// `modar validate --parallel`: every rank runs it; rank 0 prints.
int cmd_validate_parallel(const ParsedArgs& parsed, const std::string& backend_name) {
  for (const char* single : {"--threads", "--clock", "--repeats", "--refuse-under-load"}) {
    if (parsed.has(single)) {
      throw ConfigError(std::string(single) +
                        ": not used with --parallel (one thread per rank; compute is timed by "
                        "process CPU time, communication by wall time)");
    }
  }
  if (backend_name != "cpu") {
    throw ConfigError("--backend " + backend_name +
                      ": --parallel runs on the cpu backend only (compute is timed by process "
                      "CPU time)");
  }
  if (!runtime::launched_by_mpirun()) {
    throw ConfigError("--parallel: run under mpirun with 2 or 4 ranks, e.g. `mpirun -np 4 modar "
                      "validate --parallel --profile profiles/cpu-comm.toml`");
  }
  if (!runtime::mpi_available()) {
    throw ConfigError("--parallel: this build has no MPI (MODAR_MPI=OFF or no Open MPI found)");
  }
  const DeviceProfile profile =
      runtime::load_measured_profile(*parsed.value("--profile"), backend_name);
  runtime::ParallelValidationOptions options;
  options.quick = parsed.has("--quick");
  set_if_given(parsed, "--rounds", options.rounds,
               [](const std::string& flag, const std::string& text) {
                 return parse_int_in_range(flag, text, 1, 1000);
               });
  set_if_given(parsed, "--cases", options.only, parse_list);
  std::unique_ptr<runtime::Backend> backend = runtime::make_backend(backend_name);
  std::unique_ptr<runtime::Communicator> world = runtime::make_world_communicator(*backend);
  const std::vector<runtime::ParallelValidationCase> cases =
      runtime::parallel_validation_cases(world->size(), options.quick);
  if (parsed.has("--dry-run")) {
    if (world->rank() == 0) {
      std::printf("validate --parallel: %d ranks, profile %s, rounds %d, warm-up %d, cases:",
                  world->size(), profile.name.c_str(), options.rounds, options.warmup_steps);
      for (const auto& c : cases) {
        std::printf(" %s", c.name.c_str());
      }
      std::printf("\n");
    }
    return 0;
  }
  options.progress = parsed.has("--quiet") ? nullptr : stderr;
  runtime::ParallelValidationReport report;
  try {
    // Ctrl-C on a rank sets the flag the ranks agree on after each case build
    // and each round: all stop together (exit 130, nothing printed).
    const InterruptScope ctrl_c;
    report = runtime::run_parallel_validation(*backend, *world, profile, options);
  } catch (const ConfigError&) {
    throw;  // the same on every rank (the cases and layouts are checked alike)
  } catch (const Interrupted&) {
    throw;  // every rank stops at the same point
  } catch (const std::exception& e) {
    // One rank's failure: the others would wait forever in their next
    // collective; end the whole job.
    std::fprintf(stderr, "modar validate: rank %d: %s\n", world->rank(), e.what());
    runtime::abort_world(1);
  }
  if (world->rank() == 0) {
    const std::string text = parsed.has("--json") ? runtime::parallel_validation_json(report)
                                                  : runtime::parallel_validation_text(report);
    std::fputs(text.c_str(), stdout);
  }
  return 0;
}

}  // namespace

int cmd_validate(const Args& args) {
  if (print_help_if_asked(args, "validate",
                          "--profile PATH [--backend cpu|cuda] [--json] [--quick] [--parallel]",
                          kFlags, kDescription)) {
    return 0;
  }
  const ParsedArgs parsed = parse_args(args, kFlags, "validate", 0, 0);
  if (!parsed.has("--profile")) {
    throw ConfigError("--profile is missing: give a profile written by `modar profile --out PATH`");
  }
  const std::string backend_name = backend_flag(parsed);
  if (parsed.has("--parallel")) {
    try {
      return cmd_validate_parallel(parsed, backend_name);
    } catch (const ConfigError&) {
      // The same error on every rank: rank 0 alone prints it.
      if (runtime::launched_by_mpirun() && runtime::launcher_local_rank() != 0) {
        return 2;
      }
      throw;
    } catch (const Interrupted&) {
      if (runtime::launched_by_mpirun() && runtime::launcher_local_rank() != 0) {
        return 130;
      }
      throw;
    }
  }
  if (parsed.has("--cases")) {
    throw ConfigError("--cases: only used with --parallel");
  }
  const DeviceProfile profile =
      runtime::load_measured_profile(*parsed.value("--profile"), backend_name);
  // Only what the user said; the defaults (the profile's clock and threads)
  // belong to the library (runtime::resolve_validation_options), shared with
  // modar.validate().
  runtime::ValidationRequest request;
  request.backend = backend_name;
  request.quick = parsed.has("--quick");
  set_if_given(parsed, "--rounds", request.rounds, parse_positive_int32);
  set_if_given(parsed, "--repeats", request.repeats, parse_positive_int32);
  request.refuse_under_load = parsed.has("--refuse-under-load");
  set_if_given(parsed, "--threads", request.threads, parse_positive_int32);
  set_if_given(parsed, "--clock", request.clock, parse_clock);
  runtime::ValidationOptions options = runtime::resolve_validation_options(request, profile);
  if (parsed.has("--dry-run")) {
    std::fputs(runtime::validation_settings_json(options, request, profile).c_str(), stdout);
    return 0;
  }
  options.progress = parsed.has("--quiet") ? nullptr : stderr;
  std::unique_ptr<runtime::Backend> backend = backend_of_flag(backend_name);
  // Ctrl-C: the run stops between cases / rounds, exit 130, nothing printed.
  const InterruptScope ctrl_c;
  options.should_stop = [] { return interrupt_requested(); };
  runtime::ValidationReport report;
  try {
    report = runtime::run_validation(*backend, profile, options);
  } catch (const runtime::HostBusyError& e) {
    std::fprintf(stderr, "modar validate: %s\n", e.what());
    return 3;
  }
  const std::string text =
      parsed.has("--json") ? runtime::validation_json(report) : runtime::validation_text(report);
  std::fputs(text.c_str(), stdout);
  return 0;
}

}  // namespace modar::cli
