// bindings/python/progress.hpp -- a RunControl for a long C++ call that runs
// with the GIL released (optimal, sweep, fit, estimate_batch, ...).
//
// The library reports through the RunControl (rate-limited, with an ETA); the
// hooks take the GIL, so that:
//  * progress: a Python callable gets (done, total) (total -1: unknown); with
//    print_line, one updating line "modar.sweep: ..., ETA 12 s" goes to
//    stderr once the call has run for about a second;
//  * should_stop: Python's signal handlers run (Ctrl-C): a pending
//    KeyboardInterrupt, or an exception the callable raised, stops the call;
//    the library throws modar::Interrupted and rethrow_pending() raises the
//    Python exception in its place when the call returns.
// No Python exception ever unwinds through the C++ call.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "bindings.hpp"
#include "modar/base/run_control.hpp"

namespace modar::python {

// A Python exception met inside a C++ call that runs without the GIL (a
// callback raised, or a signal handler did: Ctrl-C), kept until the call
// returns and then raised in its place.  Every use holds the GIL.
class PendingPythonError {
 public:
  explicit operator bool() const { return error_ != nullptr; }
  void keep(py::error_already_set&& error) {
    error_ = std::make_unique<py::error_already_set>(std::move(error));
  }
  // Runs Python's signal handlers; keeps what they raised.  True when one did.
  bool keep_signal() {
    if (PyErr_CheckSignals() != 0) {
      error_ = std::make_unique<py::error_already_set>();
      return true;
    }
    return false;
  }
  void forget() { error_.reset(); }
  // Raises the kept exception, if any.
  void rethrow() {
    if (error_) {
      error_->restore();
      error_.reset();
      throw py::error_already_set();
    }
  }

 private:
  std::unique_ptr<py::error_already_set> error_;
};

class PythonRunControl {
 public:
  // progress: None / False (quiet), True (a line on stderr) or a callable
  // taking (done, total).
  explicit PythonRunControl(py::object progress) : callback_(std::move(progress)) {
    const bool print_line = callback_.is(py::bool_(true));
    if (callback_.is_none() || callback_.is(py::bool_(false)) || print_line) {
      callback_ = py::none();
    }
    control_.progress_interval_s = 0.25;
    if (print_line || !callback_.is_none()) {
      control_.progress = [this, print_line](const RunProgress& p) {
        py::gil_scoped_acquire acquire;
        if (pending_) {
          return;
        }
        if (print_line) {
          show_line(p);
          return;
        }
        try {
          callback_(p.done, p.total);
        } catch (py::error_already_set& e) {
          pending_.keep(std::move(e));
        }
      };
    }
    control_.should_stop = [this] {
      py::gil_scoped_acquire acquire;
      return bool(pending_) || pending_.keep_signal();
    };
  }
  PythonRunControl(const PythonRunControl&) = delete;
  PythonRunControl& operator=(const PythonRunControl&) = delete;

  const RunControl& control() const { return control_; }

  // With the GIL held, after the call: raise what stopped it (KeyboardInterrupt
  // or the callback's exception), and end the stderr line.
  void rethrow_pending() {
    close_line();
    pending_.rethrow();
  }

  // Run `body` with the GIL released; an Interrupted it throws because
  // Python asked to stop becomes that Python exception.
  template <typename Body>
  auto run(Body body) -> decltype(body()) {
    std::optional<decltype(body())> result;
    try {
      py::gil_scoped_release release;
      result.emplace(body());
    } catch (const Interrupted&) {
      rethrow_pending();
      throw;
    } catch (...) {
      close_line();
      pending_.forget();
      throw;
    }
    rethrow_pending();
    return std::move(*result);
  }

 private:
  void show_line(const RunProgress& p) {
    if (!line_open_ && (p.final || p.elapsed_s < 1.0)) {
      return;  // quick calls stay quiet
    }
    const std::string line = "modar." + progress_line(p);
    std::fprintf(stderr, "\r%s\033[K%s", line.c_str(), p.final ? "\n" : "");
    std::fflush(stderr);
    line_open_ = !p.final;
  }

  void close_line() {
    if (line_open_) {
      std::fputc('\n', stderr);
      std::fflush(stderr);
      line_open_ = false;
    }
  }

  py::object callback_;
  RunControl control_;
  PendingPythonError pending_;
  bool line_open_ = false;
};

}  // namespace modar::python
