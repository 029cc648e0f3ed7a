// PLACEHOLDER: replaced by the issue that builds `modar optimal`.
#include <cstdio>

#include "commands.hpp"

namespace modar::cli {

int cmd_optimal(const Args&) {
  std::fputs("modar optimal: not built yet\n", stderr);
  return 1;
}

}  // namespace modar::cli
