// The planner benchmarks' clock: this process's CPU time in seconds (the
// figure for "one core" on a shared machine).
#pragma once

#include <ctime>

inline double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}
