// Internal: parsing a TOML text with one clear error line, reading a TOML
// number, how a TOML value is shown in an error message, and an optional
// section table.
#pragma once

#include <toml++/toml.h>

#include <algorithm>
#include <optional>
#include <string>

#include "modar/base/errors.hpp"
#include "modar/base/text.hpp"

namespace modar::detail {

// The document of `toml_text`; malformed TOML is one FileError line
// "<source>:<line>:<column>: malformed TOML: <what>" (values escaped and cut).
inline toml::table parse_toml_text(const std::string& toml_text, const std::string& source_name) {
  try {
    return toml::parse(toml_text, source_name);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    std::string description(e.description());
    std::replace(description.begin(), description.end(), '\n', ' ');
    throw FileError(shown_value(source_name, 200) + ":" + std::to_string(where.line) + ":" +
                    std::to_string(where.column) + ": malformed TOML: " +
                    shown_value(description, 300));
  }
}

// The value of a TOML integer or float as a double; nullopt for any other
// node (the caller names the field and what it allows in its own error).
inline std::optional<double> toml_number(const toml::node& node) {
  if (const auto* v = node.as_integer()) {
    return static_cast<double>(v->get());
  }
  if (const auto* v = node.as_floating_point()) {
    return v->get();
  }
  return std::nullopt;
}

inline std::string toml_node_text(const toml::node& node) {
  if (const auto* v = node.as_string()) {
    return "\"" + v->get() + "\"";
  }
  if (const auto* v = node.as_integer()) {
    return std::to_string(v->get());
  }
  if (const auto* v = node.as_floating_point()) {
    return toml_float_literal(v->get());  // 2.0 as written, not as the integer 2
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

// The optional table root[name] of a profile ([kernel], [network]): nullptr
// when absent; any other value is the one-line ConfigError
// "<source>: <name> = <value>: must be a table [<name>]".
inline const toml::table* optional_section_table(const toml::table& root, const std::string& name,
                                                 const std::string& source) {
  const toml::node* node = root.get(name);
  if (node == nullptr) {
    return nullptr;
  }
  const toml::table* table = node->as_table();
  if (table == nullptr) {
    throw ConfigError(source + ": " + name + " = " + toml_node_text(*node) + ": must be a table [" +
                      name + "]");
  }
  return table;
}

}  // namespace modar::detail
