#include "planner_text.hpp"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "modar/errors.hpp"
#include "modar/json.hpp"
#include "modar/planner.hpp"

namespace modar {

std::string format_toml_float(double value) {
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

void write_file_atomically(const std::string& path, const std::string& contents) {
  const std::string temp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    if (!out) {
      throw FileError(path + ": cannot write (" + std::strerror(errno) + ")");
    }
    out << contents;
    out.flush();
    if (!out) {
      std::remove(temp.c_str());
      throw FileError(path + ": write failed (" + std::strerror(errno) + ")");
    }
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    std::remove(temp.c_str());
    throw FileError(path + ": cannot rename the temporary file into place (" + reason + ")");
  }
}

void save_text_atomically(const std::string& path, const std::string& text) {
  write_file_atomically(path, text);
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

void json_optional(JsonWriter& json, std::string_view key, const std::optional<double>& value) {
  json.key(key);
  if (value) {
    json.value(*value);
  } else {
    json.null();
  }
}

}  // namespace modar
