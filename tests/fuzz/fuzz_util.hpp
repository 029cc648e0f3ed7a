// Shared by the fuzz targets: a property check that aborts (libFuzzer and the
// replay runner report the abort with the input), the parse that may refuse
// its input, the round-trip read back, input splitting and the scratch folder
// of the targets that read files.
#pragma once

#include <stdlib.h>  // mkdtemp

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "modar/base/errors.hpp"

namespace modar::fuzz {

// abort() with a message when a property does not hold: a bug, not bad input.
inline void require(bool ok, const char* what, const std::string& detail = "") {
  if (!ok) {
    std::fprintf(stderr, "fuzz property violated: %s\n%s\n", what, detail.c_str());
    std::abort();
  }
}

// What parse() returns, or nullopt when the library refuses the input with a
// ConfigError or FileError (bad input: the run passes, nothing more to
// check).  Any other exception escapes and is reported with the input.
template <class Parse>
auto accepted(const Parse& parse) -> std::optional<decltype(parse())> {
  try {
    return parse();
  } catch (const ConfigError&) {
    return std::nullopt;
  } catch (const FileError&) {
    return std::nullopt;
  }
}

// What to_toml() wrote of an accepted value, read back by `parse` (text ->
// value): a rejection is a property violation `what`, shown with the text.
template <class Parse>
auto read_back(const Parse& parse, const std::string& text, const char* what) {
  try {
    return parse(text);
  } catch (const std::exception& e) {
    require(false, what, e.what() + ("\n" + text));
  }
  std::abort();  // not reached: require(false, ...) aborts
}

// to_toml() of an accepted value (a Config, a DeviceProfile), read back by
// `parse` (text, source name -> value) and written again: a rejection, or a
// second text that differs, is a property violation about `what`.  Returns
// the text and the value read back.
template <class T, class Parse>
std::pair<std::string, T> round_trip(const T& value, const Parse& parse, const std::string& what) {
  std::string text = to_toml(value);
  T back = read_back([&](const std::string& t) { return parse(t, "round-trip.toml"); }, text,
                     ("to_toml() of " + what + " is rejected").c_str());
  require(to_toml(back) == text, ("to_toml() of " + what + " is not stable").c_str(), text);
  return {std::move(text), std::move(back)};
}

// Split at the first line that is exactly `marker`: (text before, lines after).
inline std::pair<std::string, std::vector<std::string>> split_at_marker(const std::string& input,
                                                                        const std::string& marker) {
  const std::string text = "\n" + input;  // a marker on the first line counts too
  const std::string needle = "\n" + marker + "\n";
  const size_t at = text.find(needle);
  if (at == std::string::npos) {
    return {input, {}};
  }
  std::vector<std::string> lines;
  size_t begin = at + needle.size();
  while (begin < text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) {
      end = text.size();
    }
    if (end > begin) {
      lines.push_back(text.substr(begin, end - begin));
    }
    begin = end + 1;
  }
  return {text.substr(1, at), lines};
}

inline void write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

// The one scratch folder of a target (<temp>/modar-fuzz-<tag>-XXXXXX), made
// by the first call and removed at exit.
inline std::filesystem::path& scratch_folder_path() {
  static std::filesystem::path path;
  return path;
}
inline void remove_scratch_folder() {
  std::error_code ignored;
  std::filesystem::remove_all(scratch_folder_path(), ignored);
}
inline const std::filesystem::path& scratch_folder(const std::string& tag) {
  std::filesystem::path& path = scratch_folder_path();
  if (path.empty()) {
    std::string pattern =
        (std::filesystem::temp_directory_path() / ("modar-fuzz-" + tag + "-XXXXXX")).string();
    if (mkdtemp(pattern.data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
    path = pattern;
    std::atexit(remove_scratch_folder);
  }
  return path;
}

// The folder the runs CSV targets' `config` cells are relative to: the
// scratch folder holding the two configs their seeds name, small.toml (valid)
// and bad.toml (rejected).
inline std::filesystem::path csv_config_folder(const std::string& tag) {
  const std::filesystem::path& dir = scratch_folder(tag);
  write_file(
      dir / "small.toml",
      "[model]\nd_model = 256\nn_layers = 4\nn_heads = 4\nseq_len = 512\n[mod]\nevery = 2\n");
  write_file(dir / "bad.toml", "[model]\nd_model = -1\n");
  return dir;
}

// The runs CSV targets' parse: `parse(text, "fuzz.csv", folder)`, with
// `folder` the csv_config_folder(tag) (made by the first call), or nullopt
// when the text contains '/' (skipped: a cell could name a file outside that
// folder) or the library refuses it (accepted()).
template <class Parse>
auto accepted_runs_csv(const std::string& tag, const std::string& text, const Parse& parse)
    -> std::optional<decltype(parse(text, std::string(), std::string()))> {
  static const std::string folder = csv_config_folder(tag).string();
  if (text.find('/') != std::string::npos) {
    return std::nullopt;
  }
  return accepted([&] { return parse(text, "fuzz.csv", folder); });
}

// Each run names the CSV line it came from: the lines must increase.
template <class Run>
void require_increasing_lines(const std::vector<Run>& runs, const std::string& text) {
  int64_t previous_line = 0;
  for (const Run& run : runs) {
    require(run.line > previous_line, "run line numbers do not increase", text);
    previous_line = run.line;
  }
}

}  // namespace modar::fuzz
