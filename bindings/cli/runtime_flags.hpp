// The flags of the commands that run the runtime (`modar profile`, `modar
// profile --comm`, `modar validate`), read once: --backend cpu|cuda and the
// backend it names, --clock wall|cpu, --dtype fp32|bf16.  Each parser has the
// (flag, text) shape of cli_util's parse_* functions, for set_if_given.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cli_util.hpp"
#include "modar/base/errors.hpp"
#include "modar/runtime/backend.hpp"
#include "modar/runtime/profiler.hpp"
#include "modar/runtime/tensor.hpp"

namespace modar::cli {

// --backend's value: "cpu" (the default) or "cuda".
inline std::string backend_flag(const ParsedArgs& parsed) {
  const std::vector<std::string> backends = {"cpu", "cuda"};
  return backends[parse_choice("--backend", parsed.value_or("--backend", "cpu"), backends)];
}

// The backend --backend names; one this build or machine lacks is a
// ConfigError naming the flag.
inline std::unique_ptr<runtime::Backend> backend_of_flag(const std::string& name) {
  try {
    return runtime::make_backend(name);
  } catch (const BackendError& e) {
    throw ConfigError("--backend " + name + ": " + e.what());
  }
}

inline runtime::Clock parse_clock(const std::string& flag, const std::string& text) {
  return parse_choice(flag, text, {"wall", "cpu"}) == 0 ? runtime::Clock::wall
                                                        : runtime::Clock::cpu;
}

// The timed data type: fp32 or bf16 (runtime::scalar_type converts it).
inline DType parse_timed_dtype(const std::string& flag, const std::string& text) {
  return parse_choice(flag, text, {"fp32", "bf16"}) == 0 ? DType::fp32 : DType::bf16;
}

}  // namespace modar::cli
