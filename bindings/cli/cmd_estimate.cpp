// PLACEHOLDER: replaced by the issue that builds `modar estimate`.
#include <cstdio>

#include "commands.hpp"

namespace modar::cli {

int cmd_estimate(const Args&) {
  std::fputs("modar estimate: not built yet\n", stderr);
  return 1;
}

}  // namespace modar::cli
