// Internal: how a TOML value is shown in an error message.
#pragma once

#include <toml++/toml.h>

#include <string>

#include "modar/config.hpp"

namespace modar::detail {

inline std::string toml_node_text(const toml::node& node) {
  if (const auto* v = node.as_string()) {
    return "\"" + v->get() + "\"";
  }
  if (const auto* v = node.as_integer()) {
    return std::to_string(v->get());
  }
  if (const auto* v = node.as_floating_point()) {
    std::string text = format_number(v->get());
    if (text.find_first_of(".eEn") == std::string::npos) {
      text += ".0";  // show 2.0 as written, not as the integer 2
    }
    return text;
  }
  if (const auto* v = node.as_boolean()) {
    return v->get() ? "true" : "false";
  }
  if (node.is_table()) {
    return "a table";
  }
  if (node.is_array()) {
    return "an array";
  }
  return "a date/time";
}

}  // namespace modar::detail
