// modar/base/clock.hpp: the clocks the profiler, the communication profile
// and validation read: a monotonic wall clock and this process's CPU time
// (seconds since an arbitrary origin: only differences mean anything), and
// the UTC time of day as the text profiles and reports record.
#pragma once

#include <string>

namespace modar {

// Monotonic wall-clock seconds (std::chrono::steady_clock).
double steady_now_s();

// CPU seconds used by this process, all its threads (CLOCK_PROCESS_CPUTIME_ID).
double process_cpu_s();

// Now, in UTC, as ISO 8601 "2026-12-02T09:30:00Z".
std::string utc_now_iso8601();

}  // namespace modar
