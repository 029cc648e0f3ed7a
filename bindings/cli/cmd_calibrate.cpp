// `modar calibrate RUNS.csv --profile BASE --out calibrated.toml`: fit the
// profile's named time-model parameters to measured step times and write the
// calibrated profile (modar/calibrate.hpp, docs/calibrate.md).
#include <cstdio>
#include <filesystem>
#include <limits>
#include <string>

#include "cli_util.hpp"
#include "commands.hpp"
#include "modar/base/errors.hpp"
#include "modar/calibrate.hpp"
#include "modar/profile.hpp"

namespace modar::cli {

namespace {

std::string parameter_list() {
  std::string text;
  for (const CalibrationParameter& p : calibration_parameters()) {
    text += "  " + p.name + " (" + p.unit + "): " + p.meaning + "\n";
  }
  return text;
}

}  // namespace

int cmd_calibrate(const Args& args) {
  // The help's defaults are the library's (a request with nothing said).
  const CalibrateOptions d = resolve_calibrate_options(CalibrateRequest{}, DeviceProfile{});
  const std::vector<FlagSpec> flags = {
      {"--profile", true, false, "P", "base profile: an embedded name or a profile TOML"},
      {"--out", true, false, "PATH", "calibrated profile to write (atomically; never an input)"},
      {"--fit", true, false, "P1,P2", "parameters to fit (default: see below)"},
      {"--name", true, false, "NAME", "the calibrated profile's name (default BASE-calibrated)"},
      {"--no-loo", false, false, "", "skip the leave-one-out refits"},
      {"--max-iterations", true, false, "N",
       "Levenberg-Marquardt iterations (default " + std::to_string(d.max_iterations) + ")"},
      {"--json", false, false, "", "print JSON instead of the report"},
      quiet_flag(),
  };
  if (wants_help(args)) {
    std::string defaults;
    for (const std::string& name : default_calibration_parameters()) {
      defaults += (defaults.empty() ? "" : ", ") + name;
    }
    std::fputs(
        usage_text("calibrate", "RUNS.csv --profile BASE --out calibrated.toml [options]", flags,
                   "RUNS.csv: a header name,config,overrides,step_s[,peak_memory_gib] and "
                   "one row per measured job: config a TOML path relative to the CSV (empty "
                   "= the defaults), overrides space-separated section.key=value as --set "
                   "takes them, step_s the measured seconds per optimizer step.\n"
                   "Fitted by default: " +
                       defaults + "\nParameters:\n" + parameter_list())
            .c_str(),
        stdout);
    return 0;
  }
  const ParsedArgs parsed = parse_args(args, flags, "calibrate", 1, 1, "RUNS.csv");
  const std::string runs_path = parsed.positional[0];
  const auto profile_ref = parsed.value("--profile");
  const auto out = parsed.value("--out");
  if (!profile_ref) {
    throw ConfigError(
        "--profile: required (the base profile: an embedded name such as "
        "a100-80gb-dgx, or a profile TOML)");
  }
  if (!out) {
    throw ConfigError("--out: required (the calibrated profile TOML to write)");
  }
  // Before any work: never overwrite an input (the runs, the base profile,
  // any config a run reads) nor a directory.
  check_output_path("--out", *out, "runs file", runs_path);
  check_output_path("--out", *out, "base profile", *profile_ref);
  const DeviceProfile base = load_profile(*profile_ref);
  const std::vector<CalibrationRun> runs = load_calibration_runs(runs_path);
  const std::string base_dir = std::filesystem::path(runs_path).parent_path().string();
  for (const std::string& config :
       calibration_run_inputs(runs, base_dir.empty() ? "." : base_dir)) {
    check_output_path("--out", *out, "config file", config);
  }
  CalibrateRequest request;
  set_if_given(parsed, "--fit", request.parameters, parse_list);
  if (const auto v = parsed.value("--name")) {
    request.name = *v;
  }
  if (parsed.has("--no-loo")) {
    request.leave_one_out = false;
  }
  if (const auto v = parsed.value("--max-iterations")) {
    request.max_iterations = parse_int_in_range(
        "--max-iterations", *v, std::numeric_limits<int>::min(), std::numeric_limits<int>::max());
  }
  CalibrateOptions options = with_typed_flags(
      parsed, {{"--fit", "parameters"}, {"--name", "name"}, {"--max-iterations", "max_iterations"}},
      [&] { return resolve_calibrate_options(request, base); });
  if (!parsed.has("--quiet")) {
    options.progress = [](const std::string& message) {
      std::fprintf(stderr, "modar calibrate: %s\n", message.c_str());
    };
  }
  CalibrationResult result;
  {
    const InterruptScope ctrl_c;  // Ctrl-C: exit 130, nothing written
    result = calibrate(runs, base, options);
  }
  // Every setting that shapes the fit, so the command reproduces the profile.
  std::string command = "modar calibrate " + runs_path + " --profile " + *profile_ref;
  for (const char* flag : {"--fit", "--name", "--max-iterations"}) {
    if (const auto v = parsed.value(flag)) {
      command += std::string(" ") + flag + " " + *v;
    }
  }
  result.profile.provenance["calibration_command"] =
      command + (parsed.has("--no-loo") ? " --no-loo" : "") + " --out " + *out;
  check_output_path("--out", *out, "runs file", runs_path);  // (renamed meanwhile?)
  save_profile_atomically(result.profile, *out);
  if (parsed.has("--json")) {
    std::fputs(to_json(result).c_str(), stdout);
  } else {
    std::fputs(to_text(result).c_str(), stdout);
    std::printf("wrote %s (use: modar estimate CONFIG --profile %s)\n", out->c_str(), out->c_str());
  }
  return 0;
}

}  // namespace modar::cli
