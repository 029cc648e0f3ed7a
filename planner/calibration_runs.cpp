// The runs file of `modar calibrate`: one measured job per CSV row,
// `name,config,overrides,step_s[,peak_memory_gib]` (modar/calibrate.hpp).
//
// Every bad cell is one line naming the file and line, the row's name, the
// column, the value and what is allowed; a config path is relative to the
// CSV's folder; overrides are space-separated section.key=value exactly as
// `--set` takes them, applied after the file and before validation (so an
// override may repair what the file alone fails on, as with --set).
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "modar/base/errors.hpp"
#include "modar/base/files.hpp"
#include "modar/base/text.hpp"
#include "modar/calibrate.hpp"

namespace modar {
namespace {

constexpr uint64_t kMaxRunsCsvBytes = uint64_t{64} << 20;
constexpr size_t kMaxRuns = 100000;
constexpr double kMaxStepSeconds = 1e7;
constexpr double kMaxPeakGib = 1e6;

const char* const kColumns[] = {"name", "config", "overrides", "step_s", "peak_memory_gib"};

std::string lower_ascii(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) {
    return static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  });
  return text;
}

// One CSV record (RFC 4180 quoting, one line): fields trimmed outside quotes.
// Returns false on an unterminated quote or text after a closing quote.
bool split_csv_record(const std::string& line, std::vector<std::string>* fields) {
  fields->clear();
  std::string field;
  size_t i = 0;
  const size_t n = line.size();
  while (true) {
    while (i < n && (line[i] == ' ' || line[i] == '\t')) {
      ++i;
    }
    field.clear();
    if (i < n && line[i] == '"') {
      ++i;
      bool closed = false;
      while (i < n) {
        if (line[i] == '"') {
          if (i + 1 < n && line[i + 1] == '"') {
            field += '"';
            i += 2;
            continue;
          }
          ++i;
          closed = true;
          break;
        }
        field += line[i++];
      }
      if (!closed) {
        return false;
      }
      while (i < n && (line[i] == ' ' || line[i] == '\t')) {
        ++i;
      }
      if (i < n && line[i] != ',') {
        return false;
      }
    } else {
      while (i < n && line[i] != ',') {
        field += line[i++];
      }
      field = trim(field);
    }
    fields->push_back(field);
    if (i >= n) {
      return true;
    }
    ++i;  // the comma
  }
}

struct Columns {
  std::map<std::string, size_t> index;  // column name -> field index
  size_t count = 0;
  bool has(const std::string& name) const { return index.count(name) > 0; }
};

Columns parse_header(const std::vector<std::string>& fields, const std::string& where) {
  Columns columns;
  columns.count = fields.size();
  const std::vector<std::string> known(std::begin(kColumns), std::end(kColumns));
  for (size_t i = 0; i < fields.size(); ++i) {
    const std::string name = lower_ascii(fields[i]);
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      std::string message = where + "header column '" + shown_value(fields[i]) + "' is not known";
      const std::string suggestion = nearest_name(name, known);
      if (!suggestion.empty()) {
        message += " (did you mean '" + suggestion + "'?)";
      }
      throw FileError(message +
                      "; allowed: name, config, overrides, step_s and optionally peak_memory_gib");
    }
    if (columns.has(name)) {
      throw FileError(where + "header column '" + name + "' appears twice");
    }
    columns.index[name] = i;
  }
  for (const char* required : {"name", "config", "overrides", "step_s"}) {
    if (!columns.has(required)) {
      throw FileError(where + "the header lacks the column '" + std::string(required) +
                      "'; required: name, config, overrides, step_s (optional: peak_memory_gib)");
    }
  }
  return columns;
}

std::vector<std::string> split_overrides(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string word;
  while (in >> word) {
    out.push_back(word);
  }
  return out;
}

// The row's config: the file (or the defaults), then the overrides, then
// validation; errors name the row and the column(s).
Config load_row_config(CalibrationRun& run, const std::string& base_dir, const std::string& where) {
  for (const std::string& assignment : run.overrides) {
    try {
      Config probe;  // key, syntax and type of each override on its own
      apply_override(probe, assignment);
    } catch (const std::exception& e) {
      throw FileError(where + "column 'overrides' = '" + shown_value(assignment) +
                      "': " + e.what());
    }
  }
  std::string columns = "column 'config' = '" + shown_value(run.config_path) + "'";
  if (!run.overrides.empty()) {
    std::string joined;
    for (const std::string& o : run.overrides) {
      joined += (joined.empty() ? "" : " ") + o;
    }
    columns = "columns 'config' = '" + shown_value(run.config_path) + "' and 'overrides' = '" +
              shown_value(joined) + "'";
  }
  try {
    if (run.config_path.empty()) {
      Config config;
      for (const std::string& assignment : run.overrides) {
        apply_override(config, assignment);
      }
      validate(config);
      return config;
    }
    std::filesystem::path path(run.config_path);
    if (path.is_relative()) {
      path = std::filesystem::path(base_dir) / path;
    }
    return load_config_file(path.string(), run.overrides);
  } catch (const std::exception& e) {
    throw FileError(where + columns + ": " + e.what());
  }
}

double positive_cell(const std::string& cell, double max, const std::string& where,
                     const char* column, const char* allowed) {
  double value = 0.0;
  if (!parse_finite_number_text(cell, &value) || !(value > 0.0) || value > max) {
    throw FileError(where + "column '" + column + "' = '" + shown_value(cell) + "': must be " +
                    allowed);
  }
  return value;
}

}  // namespace

std::vector<CalibrationRun> parse_calibration_runs(const std::string& csv_text,
                                                   const std::string& source_name,
                                                   const std::string& base_dir) {
  std::istringstream in(csv_text);
  std::string line;
  int64_t line_number = 0;
  bool have_header = false;
  Columns columns;
  std::vector<std::string> fields;
  std::vector<CalibrationRun> runs;
  std::map<std::string, int64_t> names;
  while (std::getline(in, line)) {
    ++line_number;
    if (line_number == 1 && line.compare(0, 3, "\xEF\xBB\xBF") == 0) {
      line.erase(0, 3);  // UTF-8 byte-order mark (Excel's "CSV UTF-8")
    }
    if (!line.empty() && line.back() == '\r') {
      line.pop_back();  // CRLF
    }
    const std::string trimmed = trim(line);
    const std::string at = source_name + ":" + std::to_string(line_number) + ": ";
    if (trimmed.empty() || trimmed[0] == '#') {
      continue;
    }
    if (!split_csv_record(trimmed, &fields)) {
      throw FileError(at + "unterminated or misplaced double quote in '" + shown_value(trimmed) +
                      "'; allowed: RFC 4180 quoting (\"\" for a quote inside quotes)");
    }
    if (!have_header) {
      columns = parse_header(fields, at);
      have_header = true;
      continue;
    }
    if (fields.size() != columns.count) {
      throw FileError(at + std::to_string(fields.size()) + " fields, but the header has " +
                      std::to_string(columns.count) + "; allowed: one field per header column");
    }
    if (runs.size() >= kMaxRuns) {
      throw FileError(at + "more than " + std::to_string(kMaxRuns) + " runs");
    }
    const auto cell = [&](const char* column) -> const std::string& {
      return fields[columns.index.at(column)];
    };
    CalibrationRun run;
    run.line = line_number;
    run.name = cell("name");
    if (run.name.empty()) {
      throw FileError(at + "column 'name' = '': must be a non-empty name for the run");
    }
    const std::string where = at + "row '" + shown_value(run.name) + "', ";
    if (const auto seen = names.find(run.name); seen != names.end()) {
      throw FileError(where + "column 'name' = '" + shown_value(run.name) +
                      "': already used at line " + std::to_string(seen->second) +
                      "; allowed: a name no other row has");
    }
    names[run.name] = line_number;
    run.config_path = cell("config");
    run.overrides = split_overrides(cell("overrides"));
    run.step_s = positive_cell(cell("step_s"), kMaxStepSeconds, where, "step_s",
                               "a positive decimal number of seconds per optimizer step "
                               "(at most 1e7)");
    if (columns.has("peak_memory_gib") && !cell("peak_memory_gib").empty()) {
      run.peak_memory_gib =
          positive_cell(cell("peak_memory_gib"), kMaxPeakGib, where, "peak_memory_gib",
                        "empty or a positive decimal number of GiB (at most 1e6)");
    }
    run.config = load_row_config(run, base_dir, where);
    runs.push_back(std::move(run));
  }
  if (!have_header) {
    throw FileError(source_name +
                    ": empty; expected a header line name,config,overrides,step_s and one row "
                    "per measured run");
  }
  if (runs.empty()) {
    throw FileError(source_name + ": a header and no runs; allowed: one row per measured run");
  }
  return runs;
}

std::vector<CalibrationRun> load_calibration_runs(const std::string& path) {
  const std::string text = read_input_file(path, "runs file", kMaxRunsCsvBytes);
  const std::string base_dir = std::filesystem::path(path).parent_path().string();
  return parse_calibration_runs(text, shown_value(path, 200), base_dir.empty() ? "." : base_dir);
}

std::vector<std::string> calibration_run_inputs(const std::vector<CalibrationRun>& runs,
                                                const std::string& base_dir) {
  std::vector<std::string> paths;
  for (const CalibrationRun& run : runs) {
    if (run.config_path.empty()) {
      continue;
    }
    std::filesystem::path path(run.config_path);
    if (path.is_relative()) {
      path = std::filesystem::path(base_dir) / path;
    }
    if (std::find(paths.begin(), paths.end(), path.string()) == paths.end()) {
      paths.push_back(path.string());
    }
  }
  return paths;
}

}  // namespace modar
