// Fuzz target: the device-profile reader (parse_profile_toml), as used by
// load_profile() for a path given with --profile / device.profile.
//
// Input: the profile's TOML text.
// Properties (a violation aborts):
//  * only modar::ConfigError / modar::FileError escape, no sanitizer report;
//  * an accepted profile round-trips: to_toml() parses back to a profile
//    whose to_toml() is the same text.
#include <cstdint>
#include <exception>
#include <string>

#include "fuzz_util.hpp"
#include "modar/errors.hpp"
#include "modar/profile.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  modar::DeviceProfile profile;
  try {
    profile = modar::parse_profile_toml(text, "fuzz-profile.toml");
  } catch (const modar::ConfigError&) {
    return 0;
  } catch (const modar::FileError&) {
    return 0;
  }
  const std::string written = modar::to_toml(profile);
  modar::DeviceProfile back;
  try {
    back = modar::parse_profile_toml(written, "round-trip.toml");
  } catch (const std::exception& e) {
    modar::fuzz::require(false, "to_toml() of an accepted profile is rejected",
                         e.what() + ("\n" + written));
  }
  modar::fuzz::require(modar::to_toml(back) == written, "to_toml() of a profile is not stable",
                       written);
  return 0;
}
