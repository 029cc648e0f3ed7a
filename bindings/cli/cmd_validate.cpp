// PLACEHOLDER: replaced by the issue that builds `modar validate`.
#include <cstdio>

#include "commands.hpp"

namespace modar::cli {

int cmd_validate(const Args&) {
  std::fputs("modar validate: not built yet\n", stderr);
  return 1;
}

}  // namespace modar::cli
