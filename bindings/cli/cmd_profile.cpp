// PLACEHOLDER: replaced by the issue that builds `modar profile`.
#include <cstdio>

#include "commands.hpp"

namespace modar::cli {

int cmd_profile(const Args&) {
  std::fputs("modar profile: not built yet\n", stderr);
  return 1;
}

}  // namespace modar::cli
