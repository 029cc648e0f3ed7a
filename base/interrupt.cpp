// The process-wide Ctrl-C flag of modar/base/interrupt.hpp.
#include "modar/base/interrupt.hpp"

#include <atomic>
#include <string>

namespace modar {
namespace {

std::atomic<bool> g_interrupt{false};
static_assert(std::atomic<bool>::is_always_lock_free, "request_interrupt must be signal-safe");

}  // namespace

void request_interrupt() noexcept {
  g_interrupt.store(true, std::memory_order_relaxed);
}

void clear_interrupt() noexcept {
  g_interrupt.store(false, std::memory_order_relaxed);
}

bool interrupt_requested() noexcept {
  return g_interrupt.load(std::memory_order_relaxed);
}

void throw_if_interrupted(const char* what) {
  if (interrupt_requested()) {
    throw Interrupted(std::string("interrupted (Ctrl-C) during ") + what);
  }
}

}  // namespace modar
