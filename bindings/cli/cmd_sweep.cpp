// PLACEHOLDER: replaced by the issue that builds `modar sweep`.
#include <cstdio>

#include "commands.hpp"

namespace modar::cli {

int cmd_sweep(const Args&) {
  std::fputs("modar sweep: not built yet\n", stderr);
  return 1;
}

}  // namespace modar::cli
