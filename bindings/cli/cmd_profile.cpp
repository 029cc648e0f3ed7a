// `modar profile`: time the runtime's ops on this machine and write a device
// profile (runtime/profiler.cpp; format: profiles/README.md, docs/profiler.md).
#include <cstdio>
#include <string>
#include <vector>

#include "cli_util.hpp"
#include "commands.hpp"
#include "modar/errors.hpp"
#include "modar/runtime/backend.hpp"
#include "modar/runtime/profiler.hpp"

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
    {"--quiet", false, false, "", "no progress lines on stderr"},
};

constexpr const char* kDescription =
    "Times every op kind of the shared vocabulary, forward and backward, over a grid of\n"
    "shapes (random inputs, warm-up, rotated input copies, median of repeats), measures the\n"
    "ceilings (largest GEMM, large copy, tiny-op dispatch), and writes a TOML profile that\n"
    "`modar estimate --set device.profile=PATH` and `modar validate --profile PATH` read.\n"
    "Progress with an ETA goes to stderr; a killed run continues with --resume.\n";

}  // namespace

int cmd_profile(const Args& args) {
  if (wants_help(args)) {
    std::fputs(usage_text("profile", "--backend cpu|cuda --out PATH [--quick] [--resume]", kFlags,
                          kDescription)
                   .c_str(),
               stdout);
    return 0;
  }
  const ParsedArgs parsed = parse_args(args, kFlags, "profile", 0, 0);
  runtime::ProfileOptions options;
  const std::vector<std::string> backends = {"cpu", "cuda"};
  options.backend_name =
      backends[parse_choice("--backend", parsed.value_or("--backend", "cpu"), backends)];
  if (!parsed.has("--out")) {
    throw ConfigError(
        "--out is missing: give the path of the profile to write, e.g. --out "
        "profiles/cpu-measured-quick.toml");
  }
  options.out_path = *parsed.value("--out");
  options.grid = parsed.has("--quick") ? runtime::GridSize::quick : runtime::GridSize::full;
  options.resume = parsed.has("--resume");
  // CPU default: one thread timed by CPU time, so that a profile taken on a
  // shared machine does not depend on the load at the time (docs/profiler.md).
  options.threads = options.backend_name == "cpu" ? 1 : 0;
  if (parsed.has("--threads")) {
    options.threads = static_cast<int>(parse_int("--threads", *parsed.value("--threads")));
    if (options.threads < 0) {
      throw ConfigError("--threads = " + *parsed.value("--threads") + ": must be >= 0 (0 = all)");
    }
  }
  const std::vector<std::string> dtypes = {"fp32", "bf16"};
  const std::string default_dtype = options.backend_name == "cpu" ? "fp32" : "bf16";
  options.dtype = parse_choice("--dtype", parsed.value_or("--dtype", default_dtype), dtypes) == 0
                      ? DType::fp32
                      : DType::bf16;
  options.timing.budget_s = options.grid == runtime::GridSize::quick ? 0.08 : 0.25;
  if (parsed.has("--budget")) {
    options.timing.budget_s = parse_positive_double("--budget", *parsed.value("--budget"));
  }
  if (parsed.has("--rotate-bytes")) {
    options.timing.rotation_bytes =
        parse_positive_int("--rotate-bytes", *parsed.value("--rotate-bytes"));
  }
  if (parsed.has("--gpu-l2-bytes")) {
    options.device_cache_bytes =
        parse_positive_int("--gpu-l2-bytes", *parsed.value("--gpu-l2-bytes"));
  }
  if (parsed.has("--max-point-bytes")) {
    options.timing.max_point_bytes =
        parse_positive_int("--max-point-bytes", *parsed.value("--max-point-bytes"));
  }
  if (parsed.has("--gpu-memory-bytes")) {
    options.device_memory_bytes = static_cast<int64_t>(
        parse_positive_double("--gpu-memory-bytes", *parsed.value("--gpu-memory-bytes")));
  }
  const std::vector<std::string> clocks = {"wall", "cpu"};
  options.timing.clock =
      parse_choice("--clock",
                   parsed.value_or("--clock", options.backend_name == "cpu" ? "cpu" : "wall"),
                   clocks) == 0
          ? runtime::Clock::wall
          : runtime::Clock::cpu;
  options.progress = parsed.has("--quiet") ? nullptr : stderr;

  std::unique_ptr<runtime::Backend> backend;
  try {
    backend = runtime::make_backend(options.backend_name);
  } catch (const BackendError& e) {
    throw ConfigError(std::string("--backend ") + options.backend_name + ": " + e.what());
  }
  if (options.timing.clock == runtime::Clock::cpu &&
      backend->device() != runtime::DeviceKind::cpu) {
    throw ConfigError(
        "--clock cpu: only the cpu backend can be timed by CPU time; use --clock wall");
  }
  const DeviceProfile profile = runtime::run_profile(*backend, options);
  std::printf("wrote %s: %zu measurements (%s grid, %s, backend %s), skipped %s\n",
              options.out_path.c_str(), profile.measurements.size(),
              runtime::to_string(options.grid), to_string(options.dtype),
              options.backend_name.c_str(), profile.provenance.at("skipped_count").c_str());
  std::printf("ceilings: %s\n", profile.provenance.at("ceilings_how").c_str());
  return 0;
}

}  // namespace modar::cli
