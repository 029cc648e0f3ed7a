// bindings/python/bind_errors.cpp -- modar's typed errors as Python exceptions.
//
// Bad input (ConfigError, ShapeError) and unreadable / malformed files
// (FileError) become subclasses of ValueError, so `except ValueError` catches
// every user mistake; backend failures become RuntimeError.  The message is
// the C++ one unchanged: it names the field, the value and what is allowed.
// A message that echoes bytes which are not UTF-8 (a Latin-1 CSV header, say)
// keeps them as \xNN escapes: the error stays the typed one naming the file,
// never a UnicodeDecodeError in its place.
#include <Python.h>

#include <cstring>

#include "bindings.hpp"
#include "modar/base/errors.hpp"

namespace modar::python {

namespace {

void set_error(PyObject* type, const char* what) {
  PyObject* message = PyUnicode_DecodeUTF8(what, static_cast<Py_ssize_t>(std::strlen(what)),
                                           "backslashreplace");
  if (message == nullptr) {
    return;  // the decoding error is set (cannot happen with backslashreplace)
  }
  PyErr_SetObject(type, message);
  Py_DECREF(message);
}

}  // namespace

void bind_errors(py::module_& m) {
  // Created once and never destroyed (no decref after the interpreter ends).
  static PyObject* const config_error =
      (new py::exception<ConfigError>(m, "ConfigError", PyExc_ValueError))->ptr();
  static PyObject* const file_error =
      (new py::exception<FileError>(m, "FileError", PyExc_ValueError))->ptr();
  static PyObject* const shape_error =
      (new py::exception<ShapeError>(m, "ShapeError", PyExc_ValueError))->ptr();
  static PyObject* const backend_error =
      (new py::exception<BackendError>(m, "BackendError", PyExc_RuntimeError))->ptr();
  py::register_exception_translator([](std::exception_ptr pointer) {
    try {
      if (pointer) {
        std::rethrow_exception(pointer);
      }
    } catch (const ConfigError& e) {
      set_error(config_error, e.what());
    } catch (const FileError& e) {
      set_error(file_error, e.what());
    } catch (const ShapeError& e) {
      set_error(shape_error, e.what());
    } catch (const BackendError& e) {
      set_error(backend_error, e.what());
    }
  });
}

}  // namespace modar::python
