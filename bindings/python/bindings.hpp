// bindings/python/bindings.hpp: the per-area pieces of modar._core.
//
// module.cpp defines the one PYBIND11_MODULE and calls each bind_<area>();
// each area's file binds its public header and nothing else (pybind11's
// TEST_SUBMODULE pattern).  Results cross the boundary as the same JSON text
// the CLI prints with --json, so Python's .to_dict() IS the CLI document and
// no number is recomputed in Python.
#pragma once

#include <pybind11/pybind11.h>

namespace modar::python {

namespace py = pybind11;

void bind_errors(py::module_& m);
void bind_config(py::module_& m);
void bind_estimate(py::module_& m);
void bind_planner(py::module_& m);
void bind_layout(py::module_& m);
void bind_runtime(py::module_& m);

}  // namespace modar::python
