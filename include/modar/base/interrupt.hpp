// modar/base/interrupt.hpp: Ctrl-C for the planner's long computations.
//
// A long computation (sweep, fit, optimal) polls the process-wide flag between
// chunks of work and throws Interrupted; the CLI sets the flag from its SIGINT
// handler and exits 130 with nothing written.  request_interrupt() is
// async-signal-safe (one lock-free atomic store).
#pragma once

#include <stdexcept>
#include <string>

namespace modar {

class Interrupted : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

void request_interrupt() noexcept;
void clear_interrupt() noexcept;
bool interrupt_requested() noexcept;
// Throws Interrupted("interrupted (Ctrl-C) during <what>") when requested.
void throw_if_interrupted(const char* what);

}  // namespace modar
