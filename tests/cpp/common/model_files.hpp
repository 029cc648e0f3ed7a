// tests/cpp/common/model_files.hpp: the tests' hand-described models, one
// TOML config each in tests/data/models/, read through the project's own
// config reader (load_config_file: parse, then validate), so every test that
// uses one also exercises the reader.  A model's numbers and the comments
// saying where they come from live in its file; the test that counts from
// them keeps its expected values next to its assertions.
//
// The directory is found from the source tree's root (MODAR_SOURCE_DIR, the
// build's generated test_paths.cpp), never from the working directory, so
// ctest in the build tree and a binary run by hand read the same files.
#pragma once

#include <string>

#include "modar/config.hpp"

namespace modar_test {

// tests/data/models/<name>.toml as a validated Config (modar::ConfigError /
// modar::FileError when the file is missing or wrong).
inline modar::Config model_file(const std::string& name) {
  return modar::load_config_file(std::string(MODAR_SOURCE_DIR) + "/tests/data/models/" + name +
                                 ".toml");
}

}  // namespace modar_test
