// Fuzz target: the runs CSV of `modar calibrate` (parse_calibration_runs):
// RFC 4180 quoting, the header, the name / step_s / peak_memory_gib cells, the
// `config` column (TOML paths relative to the CSV's folder) and the
// `overrides` column (space-separated section.key=value, as --set).
//
// Input: the CSV text.  The folder holds two configs the seeds name
// (small.toml, valid; bad.toml, rejected).  Inputs containing '/' are skipped,
// so that a cell never names a file outside that folder (the config reader has
// its own target, fuzz_config).
// Properties (a violation aborts):
//  * only modar::FileError / modar::ConfigError escape, no sanitizer report;
//  * an accepted file has at least one run; every run has a non-empty name no
//    other run has, a positive finite step_s, a positive finite peak memory
//    when one is given, a config that validates, and increasing 1-based lines.
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "fuzz_util.hpp"
#include "modar/base/errors.hpp"
#include "modar/calibrate.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const auto runs =
      modar::fuzz::accepted_runs_csv("calibrate", text, modar::parse_calibration_runs);
  if (!runs) {
    return 0;
  }
  modar::fuzz::require(!runs->empty(), "accepted a CSV without runs", text);
  modar::fuzz::require_increasing_lines(*runs, text);
  std::set<std::string> names;
  for (const modar::CalibrationRun& run : *runs) {
    const std::string where = "line " + std::to_string(run.line) + "\n" + text;
    modar::fuzz::require(!run.name.empty() && names.insert(run.name).second,
                         "accepted an empty or repeated run name", where);
    modar::fuzz::require(std::isfinite(run.step_s) && run.step_s > 0,
                         "accepted a step_s that is not positive finite", where);
    modar::fuzz::require(
        !run.peak_memory_gib || (std::isfinite(*run.peak_memory_gib) && *run.peak_memory_gib > 0),
        "accepted a peak_memory_gib that is not positive finite", where);
    try {
      modar::validate(run.config);
    } catch (const modar::ConfigError&) {
      modar::fuzz::require(false, "accepted a run whose config does not validate", where);
    }
  }
  return 0;
}
