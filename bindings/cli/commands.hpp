// The `modar` subcommands.  Each lives in its own cmd_<name>.cpp, takes the
// arguments after the subcommand name, writes to stdout (results) / stderr
// (progress), and returns the exit code.  Bad input is thrown as
// modar::ConfigError / modar::FileError; main() turns it into one line on
// stderr and exit code 2.
#pragma once

#include <string>
#include <vector>

namespace modar::cli {

using Args = std::vector<std::string>;

int cmd_estimate(const Args& args);
int cmd_optimal(const Args& args);
int cmd_sweep(const Args& args);
int cmd_fit(const Args& args);
int cmd_calibrate(const Args& args);
int cmd_profile(const Args& args);
int cmd_validate(const Args& args);
int cmd_layout(const Args& args);
int cmd_export(const Args& args);

}  // namespace modar::cli
