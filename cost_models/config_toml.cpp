// The config as text and back: reading a TOML document (or a Hugging Face
// config.json, cost_models/hf_config.cpp) or --set "section.key=value" text
// into the key table's rows (type checks only: the ranges are validate()'s,
// config_validate.cpp), load_config_file / load_config_document, and to_toml,
// which walks the same table so that its output reads back.
#include <toml++/toml.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "config_keys.hpp"
#include "modar/base/errors.hpp"
#include "modar/base/files.hpp"
#include "modar/base/text.hpp"
#include "modar/config.hpp"
#include "modar/hf_config.hpp"
#include "toml_text.hpp"

namespace modar {
namespace {

using namespace detail;  // the key table and its errors (config_keys.hpp)

Value value_from_text(const KeySpec& spec, const std::string& text) {
  Value value;
  switch (spec.type) {
    case KeyType::integer:
      if (!parse_integer_text(text, &value.integer)) {
        fail(spec.key, text, "must be an integer");
      }
      break;
    case KeyType::real:
      if (!parse_finite_number_text(text, &value.real)) {
        fail(spec.key, text, "must be a finite number");
      }
      break;
    case KeyType::boolean:
      if (text == "true") {
        value.boolean = true;
      } else if (text == "false") {
        value.boolean = false;
      } else {
        fail(spec.key, text, "must be true or false");
      }
      break;
    case KeyType::choice: {
      std::string bare = text;
      if (bare.size() >= 2 && bare.front() == '"' && bare.back() == '"') {
        bare = bare.substr(1, bare.size() - 2);
      }
      value.integer = choice_index(spec, bare, text);
      break;
    }
    case KeyType::text:
      value.text = text;
      if (value.text.size() >= 2 && value.text.front() == '"' && value.text.back() == '"') {
        value.text = value.text.substr(1, value.text.size() - 2);
      }
      break;
  }
  return value;
}

std::string describe_node(const toml::node& node) {
  return detail::toml_node_text(node);
}

Value value_from_node(const KeySpec& spec, const toml::node& node) {
  Value value;
  const std::string shown = describe_node(node);
  switch (spec.type) {
    case KeyType::integer:
      if (!node.is_integer()) {
        fail(spec.key, shown, "must be an integer");
      }
      value.integer = node.as_integer()->get();
      break;
    case KeyType::real:
      if (node.is_integer()) {
        value.real = static_cast<double>(node.as_integer()->get());
      } else if (node.is_floating_point()) {
        value.real = node.as_floating_point()->get();
        if (!std::isfinite(value.real)) {
          fail(spec.key, shown, "must be a finite number");
        }
      } else {
        fail(spec.key, shown, "must be a number");
      }
      break;
    case KeyType::boolean:
      if (!node.is_boolean()) {
        fail(spec.key, shown, "must be true or false");
      }
      value.boolean = node.as_boolean()->get();
      break;
    case KeyType::choice:
      if (!node.is_string()) {
        fail(spec.key, shown, "must be " + join_names(spec.choices));
      }
      value.integer = choice_index(spec, node.as_string()->get(), shown);
      break;
    case KeyType::text:
      if (!node.is_string()) {
        fail(spec.key, shown, "must be a string");
      }
      value.text = node.as_string()->get();
      break;
  }
  return value;
}

// A config is a few hundred bytes; 16 MiB leaves room for comments and
// refuses /dev/zero-like inputs long before memory runs out.
constexpr uint64_t kMaxConfigBytes = uint64_t{16} << 20;

std::string read_whole_file(const std::string& path, const char* what) {
  return read_input_file(path, what, kMaxConfigBytes);
}

}  // namespace

namespace {

Config parse_config_toml_unvalidated(const std::string& toml_text, const std::string& source_name) {
  const toml::table root = detail::parse_toml_text(toml_text, source_name);
  Config config;
  const std::string where = " in " + shown_value(source_name, 200);
  for (const auto& [section_key, section_node] : root) {
    const std::string section(section_key.str());
    if (!section_node.is_table()) {
      // A top-level key: either a misplaced key (e.g. "capacity = 0.5") or garbage.
      fail_unknown_key(section, where + " (keys belong in a [section])");
    }
    for (const auto& [name_key, node] : *section_node.as_table()) {
      const std::string dotted = section + "." + std::string(name_key.str());
      const KeySpec* spec = find_spec(dotted);
      if (spec == nullptr) {
        fail_unknown_key(dotted, where);
      }
      spec->set(config, value_from_node(*spec, node));
    }
  }
  return config;
}

}  // namespace

Config parse_config_toml(const std::string& toml_text, const std::string& source_name) {
  Config config = parse_config_toml_unvalidated(toml_text, source_name);
  validate(config);
  return config;
}

Config load_config_file(const std::string& path) {
  return load_config_document(path, {}).config;
}

Config load_config_file(const std::string& path, const std::vector<std::string>& overrides) {
  return load_config_document(path, overrides).config;
}

ConfigDocument load_config_document(const std::string& path,
                                    const std::vector<std::string>& overrides) {
  const std::string text = read_whole_file(path, "config file");
  ConfigDocument document;
  std::optional<HfImport> imported;
  if (looks_like_json(text)) {
    imported = import_hf_config(text, path);
    document.config = imported->config;
  } else {
    document.config = parse_config_toml_unvalidated(text, path);
  }
  std::vector<std::string> overridden;
  for (const std::string& assignment : overrides) {
    apply_override(document.config, assignment);
    std::string key = assignment.substr(0, assignment.find('='));
    key.erase(0, key.find_first_not_of(" \t"));
    key.erase(key.find_last_not_of(" \t") + 1);
    overridden.push_back(key);
  }
  validate(document.config);
  if (imported) {
    document.notes = hf_import_summary(*imported, path, overridden);
  }
  return document;
}

void apply_override(Config& config, const std::string& dotted_key, const std::string& value) {
  const KeySpec* spec = find_spec(dotted_key);
  if (spec == nullptr) {
    fail_unknown_key(dotted_key, " in --set");
  }
  spec->set(config, value_from_text(*spec, value));
}

void apply_override(Config& config, const std::string& assignment) {
  const size_t equals = assignment.find('=');
  if (equals == std::string::npos || equals == 0) {
    throw ConfigError("--set " + shown_value(assignment) +
                      ": must be section.key=value, e.g. mod.capacity=0.125");
  }
  std::string key = assignment.substr(0, equals);
  std::string value = assignment.substr(equals + 1);
  auto trim = [](std::string& s) {
    const size_t first = s.find_first_not_of(" \t");
    const size_t last = s.find_last_not_of(" \t");
    s = first == std::string::npos ? std::string() : s.substr(first, last - first + 1);
  };
  trim(key);
  trim(value);
  apply_override(config, key, value);
}

std::string to_toml(const Config& config) {
  std::string out = "# modar configuration (see docs/config.md)\n";
  std::string current_section;
  for (const KeySpec& spec : key_specs()) {
    const std::string dotted = spec.key;
    const size_t dot = dotted.find('.');
    const std::string section = dotted.substr(0, dot);
    if (section != current_section) {
      out += (current_section.empty() ? "\n[" : "\n[") + section + "]\n";
      current_section = section;
    }
    out += dotted.substr(dot + 1) + " = " + spec.get(config) + "\n";
  }
  return out;
}

}  // namespace modar
