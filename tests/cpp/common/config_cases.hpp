// tests/cpp/common/config_cases.hpp: the table-driven config tests (errors
// and stated defaults).
// tests/data/config_errors.toml holds one array of tables per test, each row
// a list of "section.key=value" overrides and the one-line error validate()
// must give after them ("no error" for a config that must pass).  A test
// runs its table on its own base config: config_case_errors() returns, per
// row, what happened and what was expected, with the row's line in the file
// for the failure message.
#pragma once

#include <toml++/toml.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "config_error_of.hpp"
#include "modar/config.hpp"

namespace modar_test {

struct ConfigCaseResult {
  std::string where;     // "config_errors.toml:<line>"
  std::string actual;    // error_of(): "ConfigError: <message>" or "no error"
  std::string expected;  // the row's error with "ConfigError: " before it, or "no error"
};

inline std::string test_data_path(const std::string& file) {
  return std::string(MODAR_SOURCE_DIR) + "/tests/data/" + file;
}

// tests/data/<file>, parsed.
struct DataFile {
  std::string name;
  toml::table root;
  // root[key] as a Node (toml::array of rows, toml::table of keys); throws
  // when it is missing or empty.
  template <class Node>
  const Node& part(const std::string& key) const {
    const Node* node = root[key].as<Node>();
    if (node == nullptr || node->empty())
      throw std::runtime_error(name + ": no rows or keys under '" + key + "'");
    return *node;
  }
  std::string line_of(const toml::node& node) const {
    return name + ":" + std::to_string(node.source().begin.line);
  }
};
inline DataFile read_data_file(const std::string& file) {
  return {file, toml::parse_file(test_data_path(file))};
}

// Every row of [[table]], applied to a copy of `base`.  A missing file or
// table throws (the test then fails).
inline std::vector<ConfigCaseResult> config_case_errors(const std::string& table,
                                                        const modar::Config& base) {
  const DataFile file = read_data_file("config_errors.toml");
  std::vector<ConfigCaseResult> results;
  for (const toml::node& row : file.part<toml::array>(table)) {
    ConfigCaseResult result;
    result.where = file.line_of(row);
    const toml::table* fields = row.as_table();
    const toml::array* set_list = fields ? (*fields)["set"].as_array() : nullptr;
    const std::optional<std::string> error =
        fields ? (*fields)["error"].value<std::string>() : std::nullopt;
    if (set_list == nullptr || !error)
      throw std::runtime_error(result.where + ": a row needs set = [...] and error = '...'");
    std::vector<std::string> sets;
    for (const toml::node& set : *set_list) {
      if (!set.is_string())
        throw std::runtime_error(result.where + ": set holds \"section.key=value\" strings");
      sets.push_back(*set.value<std::string>());
    }
    result.expected = *error == "no error" ? *error : "ConfigError: " + *error;
    result.actual = error_of([&] {
      modar::Config config = base;
      for (const std::string& assignment : sets)
        modar::apply_override(config, assignment);
      modar::validate(config);
    });
    results.push_back(result);
  }
  return results;
}

// Config values a test states by hand in a data file: every key of every
// section of tests/data/<file> (a config TOML: config_defaults.toml, a model
// of models/), its literal in `config` (actual) beside the file's (expected,
// read with the config reader).
inline std::vector<ConfigCaseResult> keys_as_stated(const std::string& file_name,
                                                    const modar::Config& config) {
  const DataFile file = read_data_file(file_name);
  const modar::Config stated = modar::load_config_file(test_data_path(file.name));
  std::vector<ConfigCaseResult> results;
  for (const auto& [section, keys] : file.root) {
    for (const auto& [name, node] : file.part<toml::table>(std::string(section.str()))) {
      const modar::ConfigKey key(std::string(section.str()) + "." + std::string(name.str()));
      results.push_back({file.line_of(node), key.literal(config), key.literal(stated)});
    }
  }
  if (results.empty())
    throw std::runtime_error(file.name + ": no keys");
  return results;
}

}  // namespace modar_test
