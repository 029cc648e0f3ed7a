// bindings/python/bind_config.cpp -- modar::Config (include/modar/config.hpp).
//
// The Python Config keeps a C++ Config and is built through the C++ API, never
// through TOML text: each key is a modar::ConfigKey, each Python value set
// with its own type (int, float, bool, str), and validate() is the CLI's.  So a
// dict key or a string value can only ever name one key and set one value.
// The sections are bound as well (config.model.d_model = 1024), and
// to_dict() reads the core's config_values() literals (valid JSON).
#include <pybind11/stl.h>

#include <charconv>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "config_access.hpp"
#include "modar/base/errors.hpp"
#include "modar/base/files.hpp"
#include "modar/base/text.hpp"
#include "modar/config.hpp"
#include "modar/export.hpp"
#include "modar/hf_config.hpp"

namespace modar::python {

std::string shown(const std::string& text, size_t max_chars) {
  return shown_value(text, max_chars);
}

const std::vector<KeyInfo>& key_infos() {
  static const std::vector<KeyInfo> infos = [] {
    std::vector<KeyInfo> out;
    const std::vector<std::string>& keys = config_keys();
    for (size_t i = 0; i < keys.size(); ++i) {
      out.push_back({keys[i], ConfigKey(keys[i]), i});
    }
    return out;
  }();
  return infos;
}

const KeyInfo* find_key(const std::string& dotted_key) {
  for (const KeyInfo& info : key_infos()) {
    if (info.key == dotted_key) {
      return &info;
    }
  }
  return nullptr;
}

void fail_unknown_key(const std::string& dotted_key) {
  const std::string suggestion = nearest_name(dotted_key, config_keys());
  std::string message = "unknown configuration key '" + shown(dotted_key) + "'";
  if (!suggestion.empty()) {
    message += " (did you mean '" + suggestion + "'?)";
  }
  message +=
      "; allowed: section.key with sections model, mod, dar, train, device, counting (see "
      "docs/config.md)";
  throw ConfigError(message);
}

namespace {

std::string python_repr(py::handle value) {
  return shown(py::repr(value).cast<std::string>());
}

[[noreturn]] void fail_python_type(const KeyInfo& info, py::handle value) {
  throw ConfigError(info.key + " = " + python_repr(value) + ": unsupported value type " +
                    std::string(py::str(value.get_type().attr("__name__"))) +
                    "; allowed: int, float, bool, str");
}

}  // namespace

void set_value(Config& config, const KeyInfo& info, py::handle value) {
  py::object converted;
  if (!PyBool_Check(value.ptr()) && !PyLong_Check(value.ptr()) && !PyFloat_Check(value.ptr()) &&
      !PyUnicode_Check(value.ptr())) {
    if (py::hasattr(value, "__fspath__")) {  // a path for device.profile
      converted = py::module_::import("os").attr("fspath")(value);
    } else if (py::hasattr(value, "item") && py::hasattr(value, "ndim") &&
               py::int_(value.attr("ndim")).cast<int>() == 0) {  // a numpy scalar
      converted = value.attr("item")();
    } else if (py::hasattr(value, "__index__")) {
      converted = py::reinterpret_steal<py::object>(PyNumber_Index(value.ptr()));
      if (!converted) {
        throw py::error_already_set();
      }
    } else {
      fail_python_type(info, value);
    }
    value = converted;
  }
  if (PyBool_Check(value.ptr())) {
    info.setter.set_boolean(config, value.ptr() == Py_True);
  } else if (PyLong_Check(value.ptr())) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
    if (overflow != 0) {
      throw ConfigError(info.key + " = " + python_repr(value) +
                        ": out of range; allowed: a 64-bit integer (see docs/config.md for the "
                        "key's range)");
    }
    info.setter.set_integer(config, static_cast<int64_t>(v));
  } else if (PyFloat_Check(value.ptr())) {
    info.setter.set_real(config, PyFloat_AS_DOUBLE(value.ptr()));
  } else if (PyUnicode_Check(value.ptr())) {
    info.setter.set_text(config, value.cast<std::string>());
  } else {
    fail_python_type(info, value);
  }
}

void set_value(Config& config, const std::string& dotted_key, py::handle value) {
  const KeyInfo* info = find_key(dotted_key);
  if (info == nullptr) {
    fail_unknown_key(dotted_key);
  }
  set_value(config, *info, value);
}

namespace {

// A config_values() literal -> the Python value (int, float, bool, str).
py::object literal_to_python(const std::string& literal, ConfigValueType type) {
  switch (type) {
    case ConfigValueType::integer: {
      int64_t v = 0;
      std::from_chars(literal.data(), literal.data() + literal.size(), v);
      return py::int_(v);
    }
    case ConfigValueType::real: {
      double v = 0.0;
      std::from_chars(literal.data(), literal.data() + literal.size(), v);
      return py::float_(v);
    }
    case ConfigValueType::boolean:
      return py::bool_(literal == "true");
    case ConfigValueType::choice:
    case ConfigValueType::text:
      break;
  }
  // A JSON string: "...", escapes \" \\ \u00XX.
  std::string out;
  for (size_t i = 1; i + 1 < literal.size(); ++i) {
    if (literal[i] == '\\' && i + 2 < literal.size()) {
      const char next = literal[i + 1];
      if (next == 'u' && i + 5 < literal.size()) {
        out += static_cast<char>(std::stoi(literal.substr(i + 2, 4), nullptr, 16));
        i += 5;
      } else {
        out += next;
        ++i;
      }
    } else {
      out += literal[i];
    }
  }
  return py::str(out);
}

}  // namespace

py::object get_value(const Config& config, const KeyInfo& info) {
  return literal_to_python(info.setter.literal(config), info.setter.type());
}

py::dict config_to_dict(const Config& config) {
  py::dict out;
  py::dict section;
  std::string current;
  for (const KeyInfo& info : key_infos()) {
    const size_t dot = info.key.find('.');
    const std::string name = info.key.substr(0, dot);
    if (name != current) {
      section = py::dict();
      out[py::str(name)] = section;
      current = name;
    }
    section[py::str(info.key.substr(dot + 1))] = get_value(config, info);
  }
  return out;
}

void validate_checked(const Config& config) {
  // The core forms train.micro_batch * device.count before it bounds either
  // factor; bound them first with the core's own limit and message.
  constexpr int64_t kMaxDimension = int64_t{1} << 24;
  if (config.train.micro_batch > kMaxDimension) {
    throw ConfigError("train.micro_batch = " + std::to_string(config.train.micro_batch) +
                      ": must be <= 16777216");
  }
  if (config.device.count > kMaxDimension) {
    throw ConfigError("device.count = " + std::to_string(config.device.count) +
                      ": must be <= 16777216");
  }
  validate(config);
}

namespace {

// The fields of one section as properties named after their keys; each read
// and write goes through the key (a section holds no Config, so a scratch one
// carries the section while its key is read or set).
template <typename Section>
void section_properties(py::class_<Section>& cls, Section Config::*section, const char* name) {
  const std::string prefix = std::string(name) + ".";
  for (const KeyInfo& info : key_infos()) {
    if (info.key.compare(0, prefix.size(), prefix) != 0) {
      continue;
    }
    const KeyInfo* key = &info;
    cls.def_property(
        info.key.substr(prefix.size()).c_str(),
        [key, section](const Section& s) {
          Config scratch;
          scratch.*section = s;
          return get_value(scratch, *key);
        },
        [key, section](Section& s, py::handle value) {
          Config scratch;
          scratch.*section = s;
          set_value(scratch, *key, value);
          s = scratch.*section;
        });
  }
  cls.def("__repr__", [section, name](const Section& s) {
    Config scratch;
    scratch.*section = s;
    return std::string("<modar._core.") + name + " " +
           py::repr(config_to_dict(scratch)[py::str(name)]).cast<std::string>() + ">";
  });
}

template <typename Section>
void bind_section(py::module_& m, py::class_<Config>& config, const char* class_name,
                  const char* name, Section Config::*section) {
  py::class_<Section> cls(m, class_name);
  section_properties(cls, section, name);
  config.def_property(
      name, [section](Config& c) -> Section& { return c.*section; },
      [section](Config& c, const Section& s) { c.*section = s; }, py::return_value_policy::reference_internal);
}

}  // namespace

void bind_config(py::module_& m) {
  py::class_<Config> config(m, "Config", "A model / training / device configuration (C++ struct)");
  bind_section(m, config, "ModelConfig", "model", &Config::model);
  bind_section(m, config, "ModConfig", "mod", &Config::mod);
  bind_section(m, config, "DarConfig", "dar", &Config::dar);
  bind_section(m, config, "TrainConfig", "train", &Config::train);
  bind_section(m, config, "DeviceConfig", "device", &Config::device);
  const KeyInfo* attention = find_key("counting.attention_flops");
  config.def(py::init<>())
      .def_property(
          "attention_flops", [attention](const Config& c) { return get_value(c, *attention); },
          [attention](Config& c, py::handle value) { set_value(c, *attention, value); })
      .def("copy", [](const Config& c) { return Config(c); })
      .def("__copy__", [](const Config& c) { return Config(c); })
      .def("__deepcopy__", [](const Config& c, py::handle) { return Config(c); })
      .def(
          "set", [](Config& c, const std::string& key, py::handle value) { set_value(c, key, value); },
          py::arg("key"), py::arg("value"),
          "Set one dotted key ('mod.capacity') to a typed value (int, float, bool, str); no "
          "validation (call validate()).")
      .def(
          "update",
          [](Config& c, const std::vector<std::pair<std::string, py::object>>& items) {
            for (const auto& [key, value] : items) {
              set_value(c, key, value);
            }
          },
          py::arg("items"), "Set several (dotted key, value) pairs in order; no validation.")
      .def(
          "get",
          [](const Config& c, const std::string& key) {
            const KeyInfo* info = find_key(key);
            if (info == nullptr) {
              fail_unknown_key(key);
            }
            return get_value(c, *info);
          },
          py::arg("key"))
      .def("validate", &validate_checked,
           "Check every field; raises ConfigError (a ValueError) naming the field.")
      .def("to_dict", &config_to_dict, "{section: {key: value}}, as tomllib reads to_toml().")
      .def("to_toml", [](const Config& c) { return to_toml(c); })
      .def("__eq__", [](const Config& a, const Config& b) { return to_toml(a) == to_toml(b); })
      .def_property_readonly("profile", [](const Config& c) { return c.device.profile; });

  m.def(
      "parse_config_toml",
      [](const std::string& text, const std::string& source) {
        return modar::parse_config_toml(text, source);
      },
      py::arg("toml_text"), py::arg("source_name") = "<string>",
      "Parse a TOML document into a Config (unknown keys are errors).");
  m.def(
      "load_config_file", [](const std::string& path) { return modar::load_config_file(path); },
      py::arg("path"));
  // Hugging Face config.json (modar/hf_config.hpp): (config, one-line notes).
  m.def(
      "import_hf_file",
      [](const std::string& path, const std::vector<std::string>& overridden) {
        // The config reader's bound on a config file (16 MiB).
        const std::string text = read_input_file(path, "Hugging Face config", uint64_t{16} << 20);
        const HfImport imported = import_hf_config(text, path);
        return py::make_tuple(imported.config, hf_import_summary(imported, path, overridden));
      },
      py::arg("path"), py::arg("overridden"),
      "Read a config.json: (Config, notes); not validated.");
  m.def(
      "import_hf_text",
      [](const std::string& text, const std::string& source,
         const std::vector<std::string>& overridden) {
        const HfImport imported = import_hf_config(text, source);
        return py::make_tuple(imported.config, hf_import_summary(imported, source, overridden));
      },
      py::arg("text"), py::arg("source"), py::arg("overridden"),
      "Read config.json text: (Config, notes); not validated.");
  // Megatron-LM arguments (modar/export.hpp, docs/export.md).
  m.def(
      "config_from_megatron_args",
      [](const std::string& text) {
        std::string notes;
        Config config = config_from_megatron_args(text, &notes);
        return py::make_tuple(config, notes);
      },
      py::arg("text"), "Megatron-LM arguments -> (Config, notes); not validated.");
  m.def(
      "megatron_arguments",
      [](const Config& config, const std::string& source) {
        return render_launch_arguments(megatron_arguments(config, source));
      },
      py::arg("config"), py::arg("source") = "",
      "The Megatron-LM launch arguments of a validated config (shell text).");
  m.def("validate_config", &validate_checked, py::arg("config"),
        "Check every field; raises ConfigError (a ValueError) naming the field.");
  m.def(
      "config_to_toml", [](const modar::Config& c) { return modar::to_toml(c); },
      py::arg("config"));
  m.def(
      "config_keys", []() { return modar::config_keys(); },
      "Every valid dotted key, e.g. 'mod.capacity'.");
  m.def(
      "config_key_types",
      []() {
        py::dict out;
        for (const KeyInfo& info : key_infos()) {
          static const char* const kNames[] = {"integer", "real", "boolean", "choice", "text"};
          out[py::str(info.key)] = kNames[static_cast<int>(info.setter.type())];
        }
        return out;
      },
      "{dotted key: 'integer' | 'real' | 'boolean' | 'choice' | 'text'}.");
}

}  // namespace modar::python
