// bindings/python/module.cpp -- modar._core, the extension module behind the
// pure-Python package `modar` (bindings/python/modar/).
#include "bindings.hpp"

PYBIND11_MODULE(_core, m) {
  m.doc() = "modar C++ core: configuration, cost model, planner and runtime";
  m.attr("__version__") = "0.1.0";
  modar::python::bind_errors(m);
  modar::python::bind_config(m);
  modar::python::bind_estimate(m);
  modar::python::bind_planner(m);
  modar::python::bind_layout(m);
  modar::python::bind_runtime(m);
}
