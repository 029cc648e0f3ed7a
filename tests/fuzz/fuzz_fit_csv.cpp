// Fuzz target: the runs CSV of `modar fit` (parse_runs_csv), including the
// `config` column, whose cells name TOML configs relative to the CSV's folder.
//
// Input: the CSV text.  The folder holds two configs the seeds name
// (small.toml, valid; bad.toml, rejected).  Inputs containing '/' are skipped,
// so that a cell never names a file outside that folder (the config reader has
// its own target, fuzz_config).
// Properties (a violation aborts):
//  * only modar::FileError / modar::ConfigError escape, no sanitizer report;
//  * an accepted file has at least 5 runs, each with N, D and loss positive
//    and finite (what fit_runs() requires), at increasing 1-based lines.
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "fuzz_util.hpp"
#include "modar/base/errors.hpp"
#include "modar/planner.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const auto runs = modar::fuzz::accepted_runs_csv("csv", text, modar::parse_runs_csv);
  if (!runs) {
    return 0;
  }
  modar::fuzz::require(runs->size() >= 5, "accepted a CSV with fewer than 5 runs", text);
  modar::fuzz::require_increasing_lines(*runs, text);
  for (const modar::RunRecord& run : *runs) {
    const bool positive_finite = std::isfinite(run.n_flop_active) && run.n_flop_active > 0 &&
                                 std::isfinite(run.tokens) && run.tokens > 0 &&
                                 std::isfinite(run.loss) && run.loss > 0;
    modar::fuzz::require(positive_finite, "accepted a run with N, D or loss not positive finite",
                         "line " + std::to_string(run.line) + "\n" + text);
  }
  return 0;
}
