// Internal pieces shared by optimal.cpp, optimal_json.cpp and sweep.cpp.  Not a public header.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "modar/planner.hpp"

namespace modar {
class JsonWriter;
}

namespace modar::detail {

// The "parallel" object of a planned configuration: the layout fields
// (write_parallel_layout_json), then global_batch and recompute.  optimal's
// recommendations and sweep's JSON lines both write it (planner/optimal_json.cpp).
void write_planned_parallel_json(JsonWriter& json, const Config& layout);

// Validate a budget value given on the CLI / API; throws ConfigError.
void check_budget(const char* flag, const std::optional<double>& value);

// Configuration of an architecture on top of the user's base configuration.
Config arch_config(const Config& base, const ArchSpec& arch);

// The isoFLOP curve's candidates: for each target N_f on a log grid
// [center / half_width, center * half_width] with ratio `step`, the closest
// shape (depth-preferred); consecutive duplicates removed; sorted by N_f.
std::vector<ShapeCandidate> canonical_curve(const Config& arch_base, double center_n_f,
                                            double half_width, double step,
                                            const ShapeSearchOptions& options);

// The N_f window canonical_curve() enumerates shapes in.
struct NfWindow {
  double low = 0.0;
  double high = 0.0;
};
NfWindow canonical_curve_window(double center_n_f, double half_width);
// canonical_curve() from an already enumerated table (sorted by N_f, as
// enumerate_shapes returns it) whose window contains this curve's window:
// the shapes outside canonical_curve_window() are ignored, so one table
// enumerated over several budgets' windows serves them all (modar sweep).
std::vector<ShapeCandidate> canonical_curve_from_table(const std::vector<ShapeCandidate>& table,
                                                       double center_n_f, double half_width,
                                                       double step,
                                                       const ShapeSearchOptions& options);

// N_f of the smallest / largest shape the search options allow.
double smallest_shape_n_f(const Config& arch_base, const ShapeSearchOptions& options);
double largest_shape_n_f(const Config& arch_base, const ShapeSearchOptions& options);

// Tokens per optimizer step of a configuration (global batch * seq_len).
double tokens_per_step(const Config& config);

}  // namespace modar::detail
