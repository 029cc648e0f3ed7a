// Shared by the fuzz targets: a property check that aborts (libFuzzer and the
// replay runner report the abort with the input), and input splitting.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace modar::fuzz {

// abort() with a message when a property does not hold: a bug, not bad input.
inline void require(bool ok, const char* what, const std::string& detail = "") {
  if (!ok) {
    std::fprintf(stderr, "fuzz property violated: %s\n%s\n", what, detail.c_str());
    std::abort();
  }
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

}  // namespace modar::fuzz
