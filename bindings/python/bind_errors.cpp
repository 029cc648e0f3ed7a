// bindings/python/bind_errors.cpp -- modar's typed errors as Python exceptions.
//
// Bad input (ConfigError, ShapeError) and unreadable / malformed files
// (FileError) become subclasses of ValueError, so `except ValueError` catches
// every user mistake; backend failures become RuntimeError.  The message is
// the C++ one unchanged: it names the field, the value and what is allowed.
#include "bindings.hpp"
#include "modar/errors.hpp"

namespace modar::python {

void bind_errors(py::module_& m) {
  py::register_exception<modar::ConfigError>(m, "ConfigError", PyExc_ValueError);
  py::register_exception<modar::FileError>(m, "FileError", PyExc_ValueError);
  py::register_exception<modar::ShapeError>(m, "ShapeError", PyExc_ValueError);
  py::register_exception<modar::BackendError>(m, "BackendError", PyExc_RuntimeError);
}

}  // namespace modar::python
