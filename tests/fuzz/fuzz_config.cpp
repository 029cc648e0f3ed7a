// Fuzz target: the config reader (TOML text) and `--set` overrides, as the
// CLI uses them (load_config_file(path, overrides): parse, apply each
// override in order, validate).
//
// Input: a TOML document, optionally followed by a line `%%` and then one
// `section.key=value` assignment per line (what `--set` passes).
// Properties (a violation aborts):
//  * only modar::ConfigError / modar::FileError escape (anything else is an
//    "internal error" of the CLI), no sanitizer report, no hang;
//  * a config that is accepted round-trips: to_toml() parses back to the same
//    values and the same text.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "fuzz_util.hpp"
#include "modar/base/errors.hpp"
#include "modar/config.hpp"

namespace {

std::filesystem::path g_file;  // the TOML text is written here for load_config_file

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_file = modar::fuzz::scratch_folder("config") / "config.toml";
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  // Named references, not structured bindings: Clang before 16 does not let
  // the lambda below capture those.
  const auto split = modar::fuzz::split_at_marker(input, "%%");
  const std::string& toml_text = split.first;
  const std::vector<std::string>& overrides = split.second;
  const std::optional<modar::Config> parsed = modar::fuzz::accepted([&] {
    if (overrides.empty()) {
      return modar::parse_config_toml(toml_text, "fuzz.toml");
    }
    modar::fuzz::write_file(g_file, toml_text);
    return modar::load_config_file(g_file.string(), overrides);
  });
  if (!parsed) {
    return 0;
  }
  const modar::Config& config = *parsed;
  // Accepted: to_toml() must read back to the same configuration.
  const auto [text, back] =
      modar::fuzz::round_trip(config, modar::parse_config_toml, "an accepted config");
  modar::fuzz::require(modar::config_values(back) == modar::config_values(config),
                       "to_toml() does not read back to the same values", text);
  return 0;
}
