// tests/cpp/common/cli_run.hpp: run the built `modar` CLI in a shell and
// collect its exit code, stdout and stderr (the CLI tests' one runner).
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace modar_test {

struct CliResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A per-process temporary path: <gtest temp dir>/<tag><pid>_<name>.
inline std::string temp_path_for(const std::string& tag, const std::string& name) {
  return testing::TempDir() + "/" + tag + std::to_string(::getpid()) + "_" + name;
}

// `<prefix>modar <arguments>` with stdin closed; `stem` names the capture
// files (removed afterwards).
inline CliResult run_cli(const std::string& stem, const std::string& prefix,
                         const std::string& arguments) {
  const std::string command = prefix + std::string(MODAR_CLI_PATH) + " " + arguments + " >" +
                              stem + ".out 2>" + stem + ".err </dev/null";
  const int status = std::system(command.c_str());
  CliResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(stem + ".out");
  r.err = slurp(stem + ".err");
  std::remove((stem + ".out").c_str());
  std::remove((stem + ".err").c_str());
  return r;
}

// run_cli with capture files <tag><pid>_<n>, n counting this process's calls:
// unique per process and call, as ctest runs a file's tests as parallel
// processes.
inline CliResult run_cli_numbered(const std::string& tag, const std::string& prefix,
                                  const std::string& arguments) {
  static int calls = 0;
  return run_cli(temp_path_for(tag, std::to_string(++calls)), prefix, arguments);
}

}  // namespace modar_test
