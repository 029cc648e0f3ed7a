// `modar profile`: time the runtime's ops on this machine and write a device
// profile (runtime/profiler.cpp; format: profiles/README.md, docs/profiler.md).
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
    {"--dry-run", false, false, "",
     "print the resolved settings (JSON: threads, clock, budget, points...) and exit"},
    {"--quiet", false, false, "", "no progress lines on stderr"},
};

constexpr const char* kDescription =
    "Times every op kind of the shared vocabulary, forward and backward, over a grid of\n"
    "shapes (random inputs, warm-up, rotated input copies, median of repeats), measures the\n"
    "ceilings (largest GEMM, large copy, tiny-op dispatch), and writes a TOML profile that\n"
    "`modar estimate --set device.profile=PATH` and `modar validate --profile PATH` read.\n"
    "Progress with an ETA goes to stderr; a killed run continues with --resume.\n";

// An int flag that must fit an int (the library checks the range and names the field).
int parse_int_flag(const ParsedArgs& parsed, const char* flag) {
  const int64_t value = parse_int(flag, *parsed.value(flag));
  if (value < std::numeric_limits<int>::min() || value > std::numeric_limits<int>::max()) {
    throw ConfigError(std::string(flag) + " = " + *parsed.value(flag) + ": out of range");
  }
  return static_cast<int>(value);
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::string item;
  for (char c : text + ",") {
    if (c == ',') {
      if (!item.empty())
        items.push_back(item);
      item.clear();
    } else if (c != ' ') {
      item += c;
    }
  }
  return items;
}

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
  // Only what the user said; the defaults belong to the library
  // (runtime::resolve_profile_options), shared with modar.profile().
  runtime::ProfileRequest request;
  const std::vector<std::string> backends = {"cpu", "cuda"};
  request.backend =
      backends[parse_choice("--backend", parsed.value_or("--backend", "cpu"), backends)];
  if (!parsed.has("--out")) {
    throw ConfigError(
        "--out is missing: give the path of the profile to write, e.g. --out "
        "profiles/cpu-measured-quick.toml");
  }
  request.out_path = *parsed.value("--out");
  request.quick = parsed.has("--quick");
  request.resume = parsed.has("--resume");
  if (parsed.has("--threads")) {
    request.threads = parse_int_flag(parsed, "--threads");
  }
  if (parsed.has("--dtype")) {
    const std::vector<std::string> dtypes = {"fp32", "bf16"};
    request.dtype =
        parse_choice("--dtype", *parsed.value("--dtype"), dtypes) == 0 ? DType::fp32 : DType::bf16;
  }
  if (parsed.has("--budget")) {
    request.budget_s = parse_positive_double("--budget", *parsed.value("--budget"));
  }
  if (parsed.has("--rotate-bytes")) {
    request.rotation_bytes = parse_positive_int("--rotate-bytes", *parsed.value("--rotate-bytes"));
  }
  if (parsed.has("--gpu-l2-bytes")) {
    request.device_cache_bytes =
        parse_positive_int("--gpu-l2-bytes", *parsed.value("--gpu-l2-bytes"));
  }
  if (parsed.has("--max-point-bytes")) {
    request.max_point_bytes =
        parse_positive_int("--max-point-bytes", *parsed.value("--max-point-bytes"));
  }
  if (parsed.has("--gpu-memory-bytes")) {
    request.device_memory_bytes = static_cast<int64_t>(
        parse_positive_double("--gpu-memory-bytes", *parsed.value("--gpu-memory-bytes")));
  }
  if (parsed.has("--clock")) {
    const std::vector<std::string> clocks = {"wall", "cpu"};
    request.clock = parse_choice("--clock", *parsed.value("--clock"), clocks) == 0
                        ? runtime::Clock::wall
                        : runtime::Clock::cpu;
  }
  if (parsed.has("--kinds")) {
    request.kinds = split_list(*parsed.value("--kinds"));
  }
  if (parsed.has("--max-dim")) {
    request.max_dim = parse_positive_int("--max-dim", *parsed.value("--max-dim"));
  }

  std::unique_ptr<runtime::Backend> backend;
  try {
    backend = runtime::make_backend(request.backend);
  } catch (const BackendError& e) {
    throw ConfigError(std::string("--backend ") + request.backend + ": " + e.what());
  }
  runtime::ProfileOptions options = runtime::resolve_profile_options(request, *backend);
  if (parsed.has("--dry-run")) {
    std::fputs(runtime::profile_settings_json(options).c_str(), stdout);
    return 0;
  }
  options.progress = parsed.has("--quiet") ? nullptr : stderr;
  const DeviceProfile profile = runtime::run_profile(*backend, options);
  std::printf("wrote %s: %zu measurements (%s grid, %s, backend %s), skipped %s\n",
              options.out_path.c_str(), profile.measurements.size(),
              runtime::to_string(options.grid), to_string(options.dtype),
              options.backend_name.c_str(), profile.provenance.at("skipped_count").c_str());
  std::printf("ceilings: %s\n", profile.provenance.at("ceilings_how").c_str());
  return 0;
}

}  // namespace modar::cli
