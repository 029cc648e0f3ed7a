// RunReporter and progress_line of modar/base/run_control.hpp.
#include "modar/base/run_control.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>

namespace modar {

namespace {

// should_stop() may be expensive (Python takes the GIL to look for a
// pending signal): asked at most this often; the process flag every time.
constexpr double kStopPollInterval_s = 0.05;

double seconds_between(std::chrono::steady_clock::time_point a,
                       std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::string duration_text(double seconds) {
  char buffer[48];
  if (seconds < 60.0) {
    std::snprintf(buffer, sizeof buffer, "%.1f s", seconds);
  } else if (seconds < 3600.0) {
    std::snprintf(buffer, sizeof buffer, "%d min %02d s", static_cast<int>(seconds / 60.0),
                  static_cast<int>(std::fmod(seconds, 60.0)));
  } else {
    std::snprintf(buffer, sizeof buffer, "%.1f h", seconds / 3600.0);
  }
  return buffer;
}

}  // namespace

RunReporter::RunReporter(const RunControl& control, std::string what, std::string unit,
                         int64_t total)
    : control_(control), start_(std::chrono::steady_clock::now()), last_report_(start_) {
  progress_.what = std::move(what);
  progress_.unit = std::move(unit);
  progress_.total = total;
}

RunReporter::~RunReporter() = default;

double RunReporter::elapsed_s() const {
  return seconds_between(start_, std::chrono::steady_clock::now());
}

void RunReporter::check() {
  if (interrupt_requested()) {
    throw Interrupted("interrupted (Ctrl-C) during the " + progress_.what);
  }
  if (control_.should_stop) {
    const auto now = std::chrono::steady_clock::now();
    if (!polled_ || seconds_between(last_poll_, now) >= kStopPollInterval_s) {
      polled_ = true;
      last_poll_ = now;
      if (control_.should_stop()) {
        throw Interrupted("interrupted during the " + progress_.what);
      }
    }
  }
}

void RunReporter::advance(int64_t n) {
  done_ += n;
  tick();
}

void RunReporter::tick() {
  check();
  if (control_.progress) {
    const auto now = std::chrono::steady_clock::now();
    if (seconds_between(last_report_, now) >= control_.progress_interval_s) {
      last_report_ = now;
      report(false);
    }
  }
}

void RunReporter::set_stage(std::string stage) {
  progress_.stage = std::move(stage);
}

void RunReporter::set_total(int64_t total) {
  progress_.total = total;
}

void RunReporter::finish() {
  if (finished_) {
    return;
  }
  finished_ = true;
  if (control_.progress) {
    if (progress_.total >= 0) {
      done_ = std::max(done_, progress_.total);
    }
    report(true);
  }
}

void RunReporter::report(bool final) {
  progress_.done = done_;
  progress_.elapsed_s = elapsed_s();
  progress_.eta_s = -1.0;
  if (final) {
    progress_.eta_s = 0.0;
  } else if (progress_.total > 0 && done_ > 0) {
    const double left = double(std::max<int64_t>(0, progress_.total - done_));
    progress_.eta_s = progress_.elapsed_s * left / double(done_);
  }
  progress_.final = final;
  reported_ = true;
  control_.progress(progress_);
}

std::string progress_line(const RunProgress& p) {
  // Appended piece by piece: one long chain trips GCC 12's false -Wrestrict.
  std::string line = p.what;
  line += ": ";
  line += std::to_string(p.done);
  if (p.total >= 0) {
    line += '/';
    line += std::to_string(p.total);
  }
  line += ' ';
  line += p.unit;
  if (!p.stage.empty()) {
    line += " (";
    line += p.stage;
    line += ')';
  }
  line += ", ";
  line += duration_text(p.elapsed_s);
  if (p.final) {
    line += ", done";
  } else if (p.eta_s >= 0) {
    line += ", ETA " + duration_text(p.eta_s);
  }
  return line;
}

}  // namespace modar
