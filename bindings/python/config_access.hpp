// bindings/python/config_access.hpp -- typed access to a modar::Config by
// dotted key, shared by bind_config.cpp (modar.Config) and bind_estimate.cpp
// (the batched estimate).
//
// No TOML text is ever assembled: a key is a modar::ConfigKey, a Python value
// is set with its own type (set_integer / set_real / set_boolean / set_text),
// so a key or a string can never carry a second assignment.  Unknown keys
// raise ConfigError naming the key.  Reading goes through the key's TOML
// literal (config_values(), documented as valid JSON).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "modar/config.hpp"

namespace modar::python {

struct KeyInfo {
  std::string key;   // "model.d_model"
  ConfigKey setter;  // the core's typed access to it
  size_t index;      // position in config_keys() / config_values()
};

// Every key, in config_keys() order; nullptr for an unknown key.
const std::vector<KeyInfo>& key_infos();
const KeyInfo* find_key(const std::string& dotted_key);
// ConfigError: "unknown configuration key 'x'; did you mean 'y'? ..." (the key
// shown with control characters escaped).
[[noreturn]] void fail_unknown_key(const std::string& dotted_key);

// Set one key from a Python value: bool, int (also numpy integers), float, str
// (also os.PathLike); the core refuses a value of the wrong type for the key
// (ConfigError naming the key, as for TOML).  No validation.
void set_value(Config& config, const KeyInfo& info, py::handle value);
void set_value(Config& config, const std::string& dotted_key, py::handle value);
py::object get_value(const Config& config, const KeyInfo& info);
// {section: {key: value}} in config_keys() order (what tomllib reads from to_toml()).
py::dict config_to_dict(const Config& config);

// modar::validate() behind a check that keeps the core's arithmetic on
// train.micro_batch * device.count from wrapping (the core forms the product
// before bounding its factors; see the report of issue 9): both bounded by
// the core's own limit first.
void validate_checked(const Config& config);

// A value shown in a one-line message (modar::shown_value, 80 characters by default).
std::string shown(const std::string& text, size_t max_chars = 80);

}  // namespace modar::python
