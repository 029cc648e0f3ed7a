// Numbers as text, text as numbers and the message helpers of
// modar/base/text.hpp.
#include "modar/base/text.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "modar/base/json.hpp"

namespace modar {

// ---- numbers as text ----------------------------------------------------------

std::string format_number(double value) {
  if (std::isnan(value)) {
    return "nan";
  }
  if (std::isinf(value)) {
    return value > 0 ? "inf" : "-inf";
  }
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, result.ptr);
}

std::string toml_float_literal(double value) {
  std::string text = format_number(value);
  if (text.find_first_of(".eEn") == std::string::npos) {
    text += ".0";
  }
  return text;
}

// TOML basic strings take exactly JSON's escapes (\" \\ \n \t \r \uXXXX).
std::string toml_quote(const std::string& text) {
  return json_quote(text);
}

namespace {

std::string printf_number(const char* format, int precision, double value) {
  char buffer[512];  // "%.*f" of 1e300 needs ~310 characters
  std::snprintf(buffer, sizeof buffer, format, precision, value);
  return buffer;
}

// Three significant figures for values already scaled into [1, 1000).
std::string three_significant(double value) {
  const double magnitude = std::fabs(value);
  return format_fixed(value, magnitude >= 100 ? 0 : (magnitude >= 10 ? 1 : 2));
}

struct Unit {
  double scale;
  const char* suffix;
};

// `value` in the largest unit it reaches (units largest first), else `plain`.
template <size_t N>
std::string in_units(double value, const Unit (&units)[N], const char* plain_suffix) {
  if (!std::isfinite(value)) {
    return format_number(value);
  }
  for (const Unit& unit : units) {
    if (std::fabs(value) >= unit.scale) {
      return three_significant(value / unit.scale) + unit.suffix;
    }
  }
  return three_significant(value) + plain_suffix;
}

}  // namespace

std::string format_fixed(double value, int decimals) {
  return printf_number("%.*f", decimals, value);
}

std::string format_sci(double value, int decimals) {
  return printf_number("%.*e", decimals, value);
}

std::string format_general(double value, int significant_digits) {
  return printf_number("%.*g", significant_digits, value);
}

std::string format_count(double value) {
  static const Unit kUnits[] = {{1e15, " P"}, {1e12, " T"}, {1e9, " G"}, {1e6, " M"}, {1e3, " k"}};
  return in_units(value, kUnits, "");
}

std::string format_bytes(double bytes) {
  static const Unit kUnits[] = {
      {1099511627776.0, " TiB"}, {1073741824.0, " GiB"}, {1048576.0, " MiB"}, {1024.0, " KiB"}};
  return in_units(bytes, kUnits, " B");
}

std::string format_seconds(double seconds) {
  if (!std::isfinite(seconds)) {
    return format_number(seconds);
  }
  const double magnitude = std::fabs(seconds);
  if (magnitude >= 86400.0 * 2) {
    return three_significant(seconds / 86400.0) + " d";
  }
  if (magnitude >= 3600.0 * 2) {
    return three_significant(seconds / 3600.0) + " h";
  }
  if (magnitude >= 1.0 || magnitude == 0.0) {
    return three_significant(seconds) + " s";
  }
  if (magnitude >= 1e-3) {
    return three_significant(seconds * 1e3) + " ms";
  }
  if (magnitude >= 1e-6) {
    return three_significant(seconds * 1e6) + " us";
  }
  return three_significant(seconds * 1e9) + " ns";
}

std::string format_percent(double fraction) {
  if (!std::isfinite(fraction)) {
    return format_number(fraction);
  }
  return format_fixed(fraction * 100.0, std::fabs(fraction) < 0.001 ? 3 : 1) + "%";
}

// ---- text as numbers ----------------------------------------------------------

namespace {

// The whole text as one T by std::from_chars (`format...`: its chars_format for
// reals), after an optional leading '+' (from_chars takes none).
template <class T, class... Format>
bool parse_whole_text(const std::string& text, T* out, Format... format) {
  if (text.empty()) {
    return false;
  }
  const char* begin = text.data();
  const char* end = begin + text.size();
  if (*begin == '+') {
    ++begin;
  }
  const auto result = std::from_chars(begin, end, *out, format...);
  return result.ec == std::errc() && result.ptr == end;
}

}  // namespace

bool parse_integer_text(const std::string& text, int64_t* out) {
  return parse_whole_text(text, out);
}

bool parse_finite_number_text(const std::string& text, double* out) {
  return parse_whole_text(text, out, std::chars_format::general) && std::isfinite(*out);
}

// ---- text in messages -----------------------------------------------------------

size_t utf8_sequence_length(std::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char b0 = byte(i);
  size_t extra = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
  if (b0 < 0x80) {
    return 1;
  } else if (b0 >= 0xC2 && b0 <= 0xDF) {
    extra = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    extra = 2;
    lo = b0 == 0xE0 ? 0xA0 : 0x80;  // E0 80..9F would be overlong
    hi = b0 == 0xED ? 0x9F : 0xBF;  // ED A0..BF would be a surrogate
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    extra = 3;
    lo = b0 == 0xF0 ? 0x90 : 0x80;  // F0 80..8F would be overlong
    hi = b0 == 0xF4 ? 0x8F : 0xBF;  // F4 90.. would be above U+10FFFF
  } else {
    return 0;  // a continuation byte, C0/C1 (overlong) or F5..FF
  }
  if (i + extra >= text.size()) {
    return 0;
  }
  for (size_t k = 1; k <= extra; ++k) {
    const unsigned char b = byte(i + k);
    const unsigned char min = k == 1 ? lo : 0x80, max = k == 1 ? hi : 0xBF;
    if (b < min || b > max) {
      return 0;
    }
  }
  return extra + 1;
}

bool is_valid_utf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const size_t length = utf8_sequence_length(text, i);
    if (length == 0) {
      return false;
    }
    i += length;
  }
  return true;
}

std::string shown_value(const std::string& text, size_t max_chars) {
  std::string out;
  size_t shown = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if (shown >= max_chars) {
      out += "...(" + std::to_string(text.size()) + " characters)";
      break;
    }
    const auto ch = static_cast<unsigned char>(text[i]);
    if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\r') {
      out += "\\r";
    } else if (ch == '\t') {
      out += "\\t";
    } else if (ch < 0x20 || ch == 0x7f) {
      static const char* const kHex = "0123456789abcdef";
      out += "\\x";
      out += kHex[ch >> 4];
      out += kHex[ch & 0xF];
    } else {
      out += static_cast<char>(ch);
    }
    ++shown;
  }
  return out;
}

int64_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<int64_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) {
    row[j] = static_cast<int64_t>(j);
  }
  for (size_t i = 1; i <= a.size(); ++i) {
    int64_t diagonal = row[0];
    row[0] = static_cast<int64_t>(i);
    for (size_t j = 1; j <= b.size(); ++j) {
      const int64_t above = row[j];
      const int64_t substitution = diagonal + (a[i - 1] == b[j - 1] ? 0 : 1);
      row[j] = std::min({above + 1, row[j - 1] + 1, substitution});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::string nearest_name(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  int64_t best_distance = 0;
  for (const std::string& candidate : candidates) {
    const int64_t distance = edit_distance(word, candidate);
    if (best.empty() || distance < best_distance) {
      best = candidate;
      best_distance = distance;
    }
  }
  // A plausible typo: at most a third of the word changed (and at least 2 edits allowed).
  const int64_t allowed = std::max<int64_t>(2, static_cast<int64_t>(word.size()) / 3);
  return best_distance <= allowed ? best : std::string();
}

std::string trim(const std::string& text) {
  const auto begin = text.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) {
    return "";
  }
  const auto end = text.find_last_not_of(" \t\r\n");
  return text.substr(begin, end - begin + 1);
}

std::vector<std::string> split_trimmed(const std::string& text, char separator) {
  std::vector<std::string> pieces;
  std::string::size_type start = 0;
  while (true) {
    const auto next = text.find(separator, start);
    pieces.push_back(trim(text.substr(start, next - start)));
    if (next == std::string::npos) {
      break;
    }
    start = next + 1;
  }
  return pieces;
}

}  // namespace modar
