// bindings/python/progress.hpp -- reporting progress from a long C++ call
// that runs with the GIL released.
//
// The C++ loop calls tick(done, total) as often as it likes; at most every
// `interval_s` it takes the GIL, checks for Ctrl-C (KeyboardInterrupt
// propagates as py::error_already_set and unwinds the C++ call) and calls the
// Python callback, if any.  total < 0 means "unknown".
#pragma once

#include <chrono>
#include <cstdint>

#include "bindings.hpp"

namespace modar::python {

class ProgressTicker {
 public:
  ProgressTicker(py::object callback, double interval_s = 0.25)
      : callback_(std::move(callback)),
        interval_s_(interval_s),
        last_(std::chrono::steady_clock::now()) {}

  // Called with the GIL released.
  void tick(int64_t done, int64_t total, bool force = false) {
    const auto now = std::chrono::steady_clock::now();
    if (!force && std::chrono::duration<double>(now - last_).count() < interval_s_) {
      return;
    }
    last_ = now;
    py::gil_scoped_acquire acquire;
    if (PyErr_CheckSignals() != 0) {
      throw py::error_already_set();
    }
    if (!callback_.is_none()) {
      callback_(done, total);
    }
  }

 private:
  py::object callback_;
  double interval_s_;
  std::chrono::steady_clock::time_point last_;
};

}  // namespace modar::python
