// runtime/bench/bench_main.hpp: how the runtime's benchmark programs end.
// A refused input (a file, a config, a backend this machine does not have)
// is one line "<program>: <message>" on stderr and exit status 2; any other
// failure the same line and status 1; a body that returns, status 0.
#pragma once

#include <cstdio>
#include <exception>

#include "modar/base/errors.hpp"

namespace modar::runtime {

// A refused input: the library's errors about what the user gave it.
inline bool is_refused_input(const std::exception& e) {
  return dynamic_cast<const BackendError*>(&e) != nullptr ||
         dynamic_cast<const FileError*>(&e) != nullptr ||
         dynamic_cast<const ConfigError*>(&e) != nullptr;
}

template <class Body>
int run_benchmark(const char* program, const Body& body) {
  try {
    body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return is_refused_input(e) ? 2 : 1;
  }
  return 0;
}

}  // namespace modar::runtime
