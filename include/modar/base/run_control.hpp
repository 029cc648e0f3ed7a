// modar/base/run_control.hpp: progress and Ctrl-C for every long call.
//
// A long computation (optimal, sweep, fit, profile, validate, ...) takes a
// RunControl from its caller and reports through a RunReporter:
//
//   RunReporter reporter(control, "the sweep", total_curves);
//   for (...) {
//     reporter.check();        // throws Interrupted when asked to stop
//     ...
//     reporter.advance();      // progress with elapsed time and ETA, rate-limited
//   }
//
// Stopping has one path: the caller's should_stop() (Python: a pending
// KeyboardInterrupt) or the process-wide flag (request_interrupt) (the CLI's
// SIGINT handler) makes check() throw modar::Interrupted; the CLI exits 130
// with nothing written, Python raises KeyboardInterrupt.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "modar/base/interrupt.hpp"

namespace modar {

// One progress report.
struct RunProgress {
  std::string what;        // the call, e.g. "optimal", "sweep", "fit"
  std::string stage;       // what it is doing now, e.g. "mod: isoFLOP argmin"
  int64_t done = 0;        // units of work done
  int64_t total = -1;      // units in all (-1: unknown)
  std::string unit;        // "steps", "curves", "bootstrap samples"
  double elapsed_s = 0.0;  // wall time since the call began
  double eta_s = -1.0;     // estimated wall time left (-1: unknown)
  bool final = false;      // the last report of the call
};

struct RunControl {
  // Called at most every `progress_interval_s`, and once at the end (final,
  // done = total) when the call succeeds; may be empty.  A display decides
  // itself what to show (modar's stays quiet for calls under a second).
  std::function<void(const RunProgress&)> progress;
  // Asked between chunks of work; true stops the call (Interrupted).  May be
  // empty: the process-wide flag is asked anyway.
  std::function<bool()> should_stop;
  double progress_interval_s = 0.25;
};

// The library's side of a RunControl: rate-limited reports with an ETA, and
// the stop checks.  Not thread-safe (one reporter per call, on its thread).
class RunReporter {
 public:
  RunReporter(const RunControl& control, std::string what, std::string unit, int64_t total = -1);
  ~RunReporter();
  RunReporter(const RunReporter&) = delete;
  RunReporter& operator=(const RunReporter&) = delete;

  // Throws Interrupted("interrupted (Ctrl-C) during <what>") when the caller
  // or the process asks to stop.
  void check();
  // `n` more units done (checks first, then reports when due).
  void advance(int64_t n = 1);
  // Inside a long unit: check, and report (elapsed, the stage) when due, so
  // that a display shows the call is alive.
  void tick();
  void set_stage(std::string stage);
  void set_total(int64_t total);
  // The last report (final, done = total).
  void finish();

  int64_t done() const { return done_; }
  double elapsed_s() const;

 private:
  void report(bool final);

  const RunControl& control_;
  RunProgress progress_;
  int64_t done_ = 0;
  bool reported_ = false;
  bool finished_ = false;
  bool polled_ = false;
  std::chrono::steady_clock::time_point last_poll_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_report_;
};

// One report as text, for the front ends' printers:
// "optimal: 5/16 steps (mod: isoFLOP argmin), 3.4 s, ETA 6.0 s".
std::string progress_line(const RunProgress& progress);

}  // namespace modar
