// bindings/python/bind_config.cpp -- modar::Config (include/modar/config.hpp).
//
// The Python Config keeps a C++ Config and goes through the same parser and
// validator as the CLI: a dict or keyword arguments are written as a TOML
// document and parsed by parse_config_toml(), so messages and rules are the
// CLI's own.  to_toml() is the C++ serialiser; to_dict() parses that text.
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "modar/config.hpp"

namespace modar::python {

void bind_config(py::module_& m) {
  py::class_<modar::Config>(m, "Config", "A validated model / training / device configuration")
      .def(py::init<>())
      .def("__copy__", [](const modar::Config& c) { return modar::Config(c); })
      .def_property_readonly("profile", [](const modar::Config& c) { return c.device.profile; });

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
  m.def(
      "validate_config", [](const modar::Config& c) { modar::validate(c); }, py::arg("config"),
      "Check every field; raises ConfigError (a ValueError) naming the field.");
  m.def(
      "config_to_toml", [](const modar::Config& c) { return modar::to_toml(c); },
      py::arg("config"));
  m.def(
      "config_keys", []() { return modar::config_keys(); },
      "Every valid dotted key, e.g. 'mod.capacity'.");
}

}  // namespace modar::python
