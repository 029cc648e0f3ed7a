// modar/base/errors.hpp: the typed errors every area throws.
//
// Rule: validate at the boundary (CLI, TOML, Python) and throw a typed error
// whose message names the field, the value and what is allowed, e.g.
// "mod.capacity = 1.5: must be in (0, 1]".  The CLI maps every modar::Error
// to exit code 2 and prints what() on one line; pybind11 maps the standard
// bases (std::invalid_argument -> ValueError, std::runtime_error ->
// RuntimeError) by itself.  Ctrl-C has its own type: modar/base/interrupt.hpp.
#pragma once

#include <stdexcept>
#include <string>

namespace modar {

// Bad user input: a config key, a CLI flag, a CSV cell, a profile entry.
class ConfigError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// A file that is missing, unreadable, malformed or of the wrong kind.
class FileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Tensor shapes / dtypes / devices that do not fit an op (runtime).
class ShapeError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// A backend failure (CUDA error, cuBLAS status, allocation failure).
class BackendError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace modar
