// tests/cpp/common/config_error_of.hpp: what an action on a config throws, as
// one string ("ConfigError: <message>", "FileError: <message>" or "no error"),
// for the tests that check an error names the field, the value and what is
// allowed.  Any other exception escapes and fails the test.
#pragma once

#include <functional>
#include <string>

#include "modar/base/errors.hpp"

namespace modar_test {

inline std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const modar::ConfigError& e) {
    return std::string("ConfigError: ") + e.what();
  } catch (const modar::FileError& e) {
    return std::string("FileError: ") + e.what();
  }
  return "no error";
}

}  // namespace modar_test
