// Where the tests find the source tree and the built `modar` CLI.
//
// Force-included into every test binary (tests/CMakeLists.txt,
// modar_test_paths).  The paths are defined in one generated source file of
// the build tree (test_paths.cpp), not as -D values on every test's command
// line: identical compile commands in every checkout and build directory
// let a compiler cache (ccache with base_dir) reuse the test objects.
#pragma once

namespace modar::test_paths {
const char* source_dir();  // the repository root (PROJECT_SOURCE_DIR)
const char* cli_path();    // the built `modar` executable
}  // namespace modar::test_paths

#define MODAR_SOURCE_DIR (::modar::test_paths::source_dir())
#define MODAR_CLI_PATH (::modar::test_paths::cli_path())
