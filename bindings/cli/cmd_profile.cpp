// `modar profile`: time the runtime's ops on this machine and write a device
// profile (runtime/profiler.cpp; format: profiles/README.md, docs/profiler.md).
#include <algorithm>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "cli_util.hpp"
#include "commands.hpp"
#include "modar/base/errors.hpp"
#include "modar/base/interrupt.hpp"
#include "modar/profile.hpp"
#include "modar/runtime/backend.hpp"
#include "modar/runtime/comm.hpp"
#include "modar/runtime/comm_profile.hpp"
#include "modar/runtime/profiler.hpp"
#include "runtime_flags.hpp"

namespace modar::cli {
namespace {

const std::vector<FlagSpec> kFlags = {
    {"--backend", true, false, "cpu|cuda", "the backend whose ops are timed (default cpu)"},
    {"--out", true, false, "PATH", "where the profile is written (required)"},
    {"--quick", false, false, "",
     "the quick grid (minutes on 2 CPU cores) instead of the full one"},
    {"--resume", false, false, "", "continue an interrupted run from PATH.partial"},
    {"--threads", true, false, "N",
     "CPU threads (OpenMP / Eigen); default 1 (see --clock), 0 = all cores"},
    {"--dtype", true, false, "fp32|bf16",
     "data type of the timed ops (default: cpu fp32, cuda bf16)"},
    {"--budget", true, false, "SECONDS", "time budget per shape (default 0.08 quick, 0.25 full)"},
    {"--rotate-bytes", true, false, "BYTES",
     "rotate input copies until they exceed this many bytes (default 2 x last-level cache / L2)"},
    {"--gpu-l2-bytes", true, false, "BYTES",
     "GPU L2 size (the backend does not report it; default 50 MiB)"},
    {"--gpu-memory-bytes", true, false, "BYTES", "GPU memory (default 80e9)"},
    {"--max-point-bytes", true, false, "BYTES",
     "bound the grid: skip (and record) shapes whose tensors exceed BYTES (default: no bound)"},
    {"--clock", true, false, "wall|cpu",
     "what a sample measures: wall time, or process CPU time per thread (cpu backend only; "
     "robust on a shared, loaded machine; best with --threads 1).  Default: cpu on the cpu "
     "backend, wall on cuda"},
    {"--kinds", true, false, "K1,K2",
     "only these op kinds of the grid (e.g. gemm,attention): a reduced grid for a fast look"},
    {"--max-dim", true, false, "N", "only grid points whose every dimension is <= N"},
    {"--no-ceilings", false, false, "",
     "keep placeholder ceilings instead of measuring them (about 20 s on a CPU): for a quick "
     "look at a few --kinds; estimates then lean on the measured points only"},
    {"--rounds", true, false, "N",
     "interleaved rounds per point (default 3): each batch of points is timed N times over, "
     "the point's time the median of all its samples, the rounds' spread recorded"},
    {"--drift-tolerance", true, false, "FRACTION",
     "how far the drift sentinel (a 256^3 GEMM timed before and after every batch) may move "
     "before the batch is measured again, then marked (default 0.10; 0 = no sentinel)"},
    {"--max-seconds", true, false, "S",
     "bound the whole run to S seconds: the most expensive points that do not fit the "
     "estimate are left out, measuring stops when S is spent; both are reported"},
    {"--dry-run", false, false, "",
     "print the resolved settings (JSON: threads, clock, budget, points, estimated duration, "
     "the points within --max-seconds) and exit"},
    quiet_flag(),
    // ---- --comm: the collectives instead of the ops (run under mpirun) ----
    {"--comm", false, false, "",
     "measure the collectives (all_reduce, reduce_scatter, all_gather, all_to_all, send_recv) "
     "over message and group sizes under mpirun, and write the profile's [network] tables"},
    {"--base", true, false, "NAME|PATH",
     "--comm: the profile whose [network] is replaced (default: PATH of --out when it exists, "
     "else cpu-generic / h200)"},
    {"--collectives", true, false, "K1,K2", "--comm: only these collectives (default all five)"},
    {"--group-sizes", true, false, "G1,G2",
     "--comm: group sizes (default 2, 4, 8, ... up to the ranks per node, and that count)"},
    {"--min-bytes", true, false, "BYTES", "--comm: smallest message (default 1024)"},
    {"--max-bytes", true, false, "BYTES",
     "--comm: largest message (default 16 MiB cpu, 1 GiB cuda)"},
    {"--arrival", true, false, "cold|hot",
     "--comm: cold (default on cpu): before each timed call every rank spins 2 ms of CPU time, "
     "and the call is timed from the last rank's arrival to its end, as a training step meets "
     "it; hot (default and only choice on cuda): back-to-back calls, nccl-tests' way"},
    {"--compute-before-ms", true, false, "MS",
     "--comm, cold arrival: the CPU time every rank spins before each timed call (default 2)"},
};

constexpr const char* kDescription =
    "Times every op kind of the shared vocabulary, forward and backward, over a grid of\n"
    "shapes (random inputs, warm-up, rotated input copies, median of repeats), measures the\n"
    "ceilings (largest GEMM, large copy, tiny-op dispatch), and writes a TOML profile that\n"
    "`modar estimate --set device.profile=PATH` and `modar validate --profile PATH` read.\n"
    "Progress with an ETA goes to stderr; a killed run continues with --resume.\n"
    "\n"
    "With --comm (run under mpirun, e.g. `mpirun -np 8 modar profile --comm --backend cuda\n"
    "--out node.toml`): times each collective over message sizes and group sizes with\n"
    "nccl-tests' definitions (algbw = size / time, busbw = algbw x bus factor; warm-up, median\n"
    "of samples, spread) on MPI (cpu) or NCCL (cuda), prints the table, and writes --base with\n"
    "its [network] replaced by the measured tables (atomically; rank 0 writes).  On the cpu\n"
    "backend each call is timed cold by default (--arrival): after 2 ms of compute on every\n"
    "rank, from the last rank's arrival to the end, as `modar validate --parallel` times a\n"
    "step's calls.\n";

// The request fields behind `modar profile`'s flags (the library's errors
// name the fields; the CLI the flags the user typed).
const std::vector<FlagKey> kProfileFlagKeys = {
    {"--threads", "threads"},           {"--budget", "budget_s"},
    {"--rotate-bytes", "rotation_bytes"}, {"--gpu-l2-bytes", "device_cache_bytes"},
    {"--gpu-memory-bytes", "device_memory_bytes"}, {"--max-point-bytes", "max_point_bytes"},
    {"--max-dim", "max_dim"},           {"--kinds", "kinds"},
    {"--dtype", "dtype"},               {"--clock", "clock"},
    {"--rounds", "rounds"},             {"--drift-tolerance", "drift_tolerance"},
    {"--max-seconds", "max_seconds"},
};

// `modar profile --comm`: every rank runs it; rank 0 prints and writes.
int cmd_profile_comm(const ParsedArgs& parsed) {
  for (const char* op_only :
       {"--quick", "--resume", "--threads", "--rotate-bytes", "--gpu-l2-bytes",
        "--gpu-memory-bytes", "--max-point-bytes", "--clock", "--kinds", "--max-dim",
        "--no-ceilings", "--rounds", "--drift-tolerance", "--max-seconds"}) {
    if (parsed.has(op_only)) {
      throw ConfigError(std::string(op_only) +
                        ": not used with --comm (it sets the op profiler; see modar profile --help)");
    }
  }
  const std::string backend_name = backend_flag(parsed);
  if (!parsed.has("--out")) {
    throw ConfigError("--out is missing: give the path of the profile to write, e.g. --out "
                      "profiles/cpu-comm.toml");
  }
  const std::string out_path = *parsed.value("--out");
  runtime::CommProfileRequest request;
  if (parsed.has("--collectives")) {
    for (const std::string& name : parse_list("--collectives", *parsed.value("--collectives"))) {
      Collective kind;
      if (!parse_collective(name, &kind)) {
        throw ConfigError("--collectives: '" + name +
                          "' is not a collective; allowed: all_reduce, reduce_scatter, "
                          "all_gather, all_to_all, send_recv");
      }
      request.kinds.push_back(kind);
    }
  }
  if (parsed.has("--group-sizes")) {
    for (const std::string& g : parse_list("--group-sizes", *parsed.value("--group-sizes"))) {
      request.group_sizes.push_back(parse_int_in_range("--group-sizes", g, 2, 1 << 20));
    }
  }
  set_if_given(parsed, "--min-bytes", request.min_bytes, parse_positive_int);
  set_if_given(parsed, "--max-bytes", request.max_bytes, parse_positive_int);
  if (parsed.has("--arrival")) {
    const std::vector<std::string> arrivals = {"cold", "hot"};
    request.arrival = parse_choice("--arrival", *parsed.value("--arrival"), arrivals) == 0
                          ? runtime::CommArrival::cold
                          : runtime::CommArrival::hot;
  }
  set_if_given(parsed, "--compute-before-ms", request.compute_before_s,
               [](const std::string& flag, const std::string& text) {
                 return parse_positive_double(flag, text) * 1e-3;
               });
  set_if_given(parsed, "--budget", request.budget_s, parse_positive_double);
  set_if_given(parsed, "--dtype", request.dtype,
               [](const std::string& flag, const std::string& text) {
                 return runtime::scalar_type(parse_timed_dtype(flag, text));
               });
  // The base profile is read before anything is measured: a bad path fails
  // in a second, not after the run.
  std::string base_name = parsed.value_or("--base", "");
  if (base_name.empty()) {
    std::FILE* existing = std::fopen(out_path.c_str(), "r");
    if (existing != nullptr) {
      std::fclose(existing);
      base_name = out_path;
    } else {
      base_name = backend_name == "cpu" ? "cpu-generic" : "h200";
    }
  }
  const DeviceProfile base = load_profile(base_name);
  if ((base.backend == "cpu" && backend_name == "cuda") ||
      (base.backend == "cuda" && backend_name == "cpu")) {
    throw ConfigError("--base " + base_name + ": a " + base.backend +
                      " profile; --backend " + backend_name + " needs a " + backend_name +
                      " or datasheet profile");
  }

  std::unique_ptr<runtime::Backend> backend = backend_of_flag(backend_name);
  std::unique_ptr<runtime::Communicator> world = runtime::make_world_communicator(*backend);
  const runtime::CommProfileOptions resolved =
      runtime::resolve_comm_profile_options(request, backend->device(), world->size());
  if (parsed.has("--dry-run")) {
    if (world->rank() == 0) {
      std::printf(
          "profile --comm: %d rank(s), engine %s, %zu collective(s), sizes %lld..%lld B "
          "x%g, budget %g s per point, arrival %s, base %s -> %s\n",
          world->size(), world->engine().c_str(), resolved.kinds.size(),
          static_cast<long long>(resolved.min_bytes), static_cast<long long>(resolved.max_bytes),
          resolved.size_factor, resolved.budget_s, runtime::to_string(resolved.arrival),
          base_name.c_str(), out_path.c_str());
    }
    return 0;
  }
  request.progress = (parsed.has("--quiet") || world->rank() != 0) ? nullptr : stderr;
  runtime::CommProfileResult result;
  try {
    // Ctrl-C on a rank sets the flag the profile polls at every sample; the
    // ranks agree on it there and all stop at the same sample (exit 130,
    // nothing written).
    const InterruptScope ctrl_c;
    result = runtime::run_comm_profile(*backend, *world, request);
  } catch (const ConfigError&) {
    throw;  // the same on every rank (checked before any communication)
  } catch (const Interrupted&) {
    throw;  // every rank stops at the same sample
  } catch (const std::exception& e) {
    // One rank's engine failure: the others would wait forever in the next
    // collective; end the whole job.
    std::fprintf(stderr, "modar profile: rank %d: %s\n", world->rank(), e.what());
    runtime::abort_world(1);
  }
  DeviceProfile profile = runtime::with_measured_network(base, result);
  std::string stem = out_path.substr(out_path.find_last_of('/') == std::string::npos
                                         ? 0
                                         : out_path.find_last_of('/') + 1);
  if (stem.size() > 5 && stem.substr(stem.size() - 5) == ".toml") {
    stem.resize(stem.size() - 5);
  }
  profile.name = stem.empty() ? base.name : stem;
  // Rank 0 writes; every rank learns whether it worked (exit codes agree).
  double written = 1.0;
  std::string error;
  if (world->rank() == 0) {
    try {
      check_profile_usable(parse_profile_toml(to_toml(profile), out_path), out_path);
      save_profile_atomically(profile, out_path);
    } catch (const std::exception& e) {
      written = 0.0;
      error = e.what();
    }
  }
  std::unique_ptr<runtime::Backend> host = runtime::make_cpu_backend();
  std::unique_ptr<runtime::Communicator> control =
      backend->device() == runtime::DeviceKind::cpu ? world->split(0, world->rank())
                                                    : runtime::make_world_communicator(*host);
  control->broadcast(runtime::make_view(&written, runtime::ScalarType::fp64,
                                        runtime::DeviceKind::cpu, {1}),
                     0);
  if (written == 0.0) {
    throw FileError(world->rank() == 0 ? error : "rank 0 could not write " + out_path);
  }
  if (world->rank() == 0) {
    std::fputs(runtime::comm_profile_table(result).c_str(), stdout);
    std::printf("wrote %s: [network] of %s measured with %s, %d ranks (%d per node), %zu points; "
                "intra-node busbw %.3f GB/s, latency %.2f us\n",
                out_path.c_str(), base.name.c_str(), world->engine().c_str(), result.world_size,
                result.ranks_per_node, result.measurements.size(),
                result.intra_node.bus_bandwidth / 1e9, result.intra_node.latency_s * 1e6);
  }
  return 0;
}

}  // namespace

int cmd_profile(const Args& args) {
  if (print_help_if_asked(
          args, "profile",
          "--backend cpu|cuda --out PATH [--quick] [--resume] | --comm (under mpirun)", kFlags,
          kDescription)) {
    return 0;
  }
  const ParsedArgs parsed = parse_args(args, kFlags, "profile", 0, 0);
  if (parsed.has("--comm")) {
    return cmd_profile_comm(parsed);
  }
  for (const char* comm_only : {"--base", "--collectives", "--group-sizes", "--min-bytes",
                                "--max-bytes", "--arrival", "--compute-before-ms"}) {
    if (parsed.has(comm_only)) {
      throw ConfigError(std::string(comm_only) + ": only used with --comm");
    }
  }
  // Only what the user said; the defaults belong to the library
  // (runtime::resolve_profile_options), shared with modar.profile().
  runtime::ProfileRequest request;
  request.backend = backend_flag(parsed);
  if (!parsed.has("--out")) {
    throw ConfigError(
        "--out is missing: give the path of the profile to write, e.g. --out "
        "profiles/cpu-measured-quick.toml");
  }
  request.out_path = *parsed.value("--out");
  request.quick = parsed.has("--quick");
  request.resume = parsed.has("--resume");
  // The library checks the ranges and names the fields; an int field's
  // value must fit an int first.
  set_if_given(parsed, "--threads", request.threads, parse_int32);
  set_if_given(parsed, "--dtype", request.dtype, parse_timed_dtype);
  set_if_given(parsed, "--budget", request.budget_s, parse_double);
  set_if_given(parsed, "--rotate-bytes", request.rotation_bytes, parse_int);
  set_if_given(parsed, "--gpu-l2-bytes", request.device_cache_bytes, parse_int);
  set_if_given(parsed, "--max-point-bytes", request.max_point_bytes, parse_int);
  // Written as 80e9 as often as 80000000000: a number, whole bytes.
  set_if_given(parsed, "--gpu-memory-bytes", request.device_memory_bytes,
               [](const std::string& flag, const std::string& text) {
                 const double bytes = parse_double(flag, text);
                 return bytes >= 9.2e18 ? int64_t{-1} : static_cast<int64_t>(std::max(-1.0, bytes));
               });
  set_if_given(parsed, "--clock", request.clock, parse_clock);
  set_if_given(parsed, "--kinds", request.kinds, parse_list);
  set_if_given(parsed, "--max-dim", request.max_dim, parse_int);
  request.measure_ceilings = !parsed.has("--no-ceilings");
  set_if_given(parsed, "--rounds", request.rounds, parse_int32);
  set_if_given(parsed, "--drift-tolerance", request.drift_tolerance, parse_double);
  set_if_given(parsed, "--max-seconds", request.max_seconds, parse_double);

  std::unique_ptr<runtime::Backend> backend = backend_of_flag(request.backend);
  runtime::ProfileOptions options = with_typed_flags(parsed, kProfileFlagKeys, [&] {
    return runtime::resolve_profile_options(request, *backend);
  });
  if (parsed.has("--dry-run")) {
    const runtime::ProfileDurationEstimate estimate = runtime::estimate_profile_duration(
        *backend, options,
        options.points.empty()
            ? runtime::profile_grid(options.grid, backend->device(), options.dtype)
            : options.points);
    std::fputs(runtime::profile_settings_json(options, &estimate).c_str(), stdout);
    return 0;
  }
  options.progress = parsed.has("--quiet") ? nullptr : stderr;
  // Ctrl-C: the run stops between grid points (OUT.partial keeps them), exit 130.
  const InterruptScope ctrl_c;
  options.should_stop = [] { return interrupt_requested(); };
  const DeviceProfile profile = runtime::run_profile(*backend, options);
  const auto recorded = [&profile](const char* key, const char* otherwise) {
    const auto it = profile.provenance.find(key);
    return it == profile.provenance.end() ? std::string(otherwise) : it->second;
  };
  std::printf(
      "wrote %s: %zu measurements (%s grid, %s, backend %s), skipped %s, not measured "
      "(max_seconds) %s\n",
      options.out_path.c_str(), profile.measurements.size(), runtime::to_string(options.grid),
      to_string(options.dtype), options.backend_name.c_str(),
      profile.provenance.at("skipped_count").c_str(), recorded("unmeasured_count", "0").c_str());
  std::printf(
      "noise: %s rounds per point, round spread median %s; sentinel drift %s "
      "(tolerance %s), %s batches measured again, %s points marked drift\n",
      recorded("rounds", "1").c_str(), recorded("round_spread_median", "-").c_str(),
      recorded("drift", "-").c_str(), recorded("drift_tolerance", "-").c_str(),
      recorded("drift_remeasured_batches", "0").c_str(),
      recorded("drift_marked_points", "0").c_str());
  std::printf("ceilings: %s\n", profile.provenance.at("ceilings_how").c_str());
  return 0;
}

}  // namespace modar::cli
