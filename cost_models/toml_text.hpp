// Internal: how a TOML value is shown in an error message.
#pragma once

#include <string>
#include <toml++/toml.h>

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
    return format_number(v->get());
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
