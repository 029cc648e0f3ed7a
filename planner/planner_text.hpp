// Internal text helpers of the planner: number formatting, TOML quoting, a
// small streaming JSON writer and atomic file writes.  Not a public header.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "modar/config.hpp"
#include "modar/json.hpp"

namespace modar {

// format_number(double) (shortest round-trip text) comes from modar/config.hpp.
// A TOML float literal (always has '.' or 'e').
std::string format_toml_float(double value);
std::string toml_quote(const std::string& text);
// Write to <path>.tmp.<pid> and rename over <path>; throws FileError.
void write_file_atomically(const std::string& path, const std::string& contents);
// Split on `separator`, trimming ASCII whitespace around each piece.
std::vector<std::string> split_trimmed(const std::string& text, char separator);
std::string trim(const std::string& text);

// JSON field helpers on top of modar/json.hpp.
void json_optional(JsonWriter& json, std::string_view key, const std::optional<double>& value);

}  // namespace modar
