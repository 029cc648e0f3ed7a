// bindings/python/bind_estimate.cpp -- device profiles (include/modar/profile.hpp)
// and the cost model's estimate (include/modar/cost_model.hpp).
#include <pybind11/stl.h>

#include <string>

#include "bindings.hpp"
#include "modar/cost_model.hpp"
#include "modar/errors.hpp"
#include "modar/profile.hpp"

namespace modar::python {

void bind_estimate(py::module_& m) {
  py::class_<DeviceProfile>(m, "DeviceProfile", "A loaded device profile (opaque; see to_toml)")
      .def_readonly("name", &DeviceProfile::name)
      .def_readonly("backend", &DeviceProfile::backend)
      .def_readonly("measured", &DeviceProfile::measured);

  m.def(
      "load_profile", [](const std::string& name_or_path) { return load_profile(name_or_path); },
      py::arg("name_or_path"),
      "An embedded profile name or a profile TOML path; FileError / ConfigError otherwise.");
  m.def(
      "parse_profile_toml",
      [](const std::string& text, const std::string& source) {
        return parse_profile_toml(text, source);
      },
      py::arg("toml_text"), py::arg("source_name") = "<string>");
  m.def(
      "profile_to_toml", [](const DeviceProfile& p) { return to_toml(p); }, py::arg("profile"));
  m.def("save_profile", &save_profile_atomically, py::arg("profile"), py::arg("path"),
        "Write the profile TOML atomically (temporary file + rename).");
  m.def("embedded_profile_names", &embedded_profile_names);
  m.def("default_profile_name", []() { return default_profile_name(); });

  m.def(
      "estimate",
      [](const Config& config, const DeviceProfile& profile, const std::string& step_name) {
        StepKind step = StepKind::train;
        if (step_name == "decode") {
          step = StepKind::decode;
        } else if (step_name != "train") {
          throw ConfigError("step = \"" + step_name + "\": allowed: train, decode");
        }
        const Estimate result = estimate(config, profile, step);
        return estimate_to_json(config, profile, step, result);
      },
      py::arg("config"), py::arg("profile"), py::arg("step") = "train",
      py::call_guard<py::gil_scoped_release>(),
      "FLOPs, parameters, memory and step time; the `modar estimate --json` document.");
}

}  // namespace modar::python
