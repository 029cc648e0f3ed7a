// tests/cpp/common/config_cases.hpp: the table-driven config-error tests.
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

// Every row of [[table]], applied to a copy of `base`.  A missing file or
// table throws (the test then fails).
inline std::vector<ConfigCaseResult> config_case_errors(const std::string& table,
                                                        const modar::Config& base) {
  const std::string path = std::string(MODAR_SOURCE_DIR) + "/tests/data/config_errors.toml";
  const toml::table root = toml::parse_file(path);
  const toml::array* rows = root[table].as_array();
  if (rows == nullptr || rows->empty())
    throw std::runtime_error(path + ": no [[" + table + "]] rows");
  std::vector<ConfigCaseResult> results;
  for (const toml::node& row : *rows) {
    ConfigCaseResult result;
    result.where = "config_errors.toml:" + std::to_string(row.source().begin.line);
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

}  // namespace modar_test
