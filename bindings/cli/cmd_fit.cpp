// PLACEHOLDER: replaced by the issue that builds `modar fit`.
#include <cstdio>

#include "commands.hpp"

namespace modar::cli {

int cmd_fit(const Args&) {
  std::fputs("modar fit: not built yet\n", stderr);
  return 1;
}

}  // namespace modar::cli
