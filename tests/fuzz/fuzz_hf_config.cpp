// Fuzz target: the Hugging Face config.json importer (import_hf_config, the
// code every config reader and Config.from_hf use for a JSON config).
//
// Input: a config.json document (any bytes).
// Properties (a violation aborts):
//  * only modar::ConfigError / modar::FileError escape, each one line; no
//    sanitizer report, no hang (nesting is bounded);
//  * the import's summary is one line;
//  * a config that imports and validates round-trips through TOML: to_toml()
//    parses back to the same values.
#include <cstdint>
#include <string>

#include "fuzz_util.hpp"
#include "modar/base/errors.hpp"
#include "modar/config.hpp"
#include "modar/hf_config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  modar::HfImport imported;
  try {
    imported = modar::import_hf_config(input, "config.json");
    modar::validate(imported.config);
  } catch (const modar::ConfigError& e) {
    modar::fuzz::require(std::string(e.what()).find('\n') == std::string::npos,
                         "a ConfigError message spans lines", e.what());
    return 0;
  } catch (const modar::FileError& e) {
    modar::fuzz::require(std::string(e.what()).find('\n') == std::string::npos,
                         "a FileError message spans lines", e.what());
    return 0;
  }
  const std::string summary = modar::hf_import_summary(imported, "config.json", {});
  modar::fuzz::require(summary.find('\n') == std::string::npos, "the summary spans lines", summary);
  const auto [text, back] =
      modar::fuzz::round_trip(imported.config, modar::parse_config_toml, "an imported config");
  modar::fuzz::require(modar::config_values(back) == modar::config_values(imported.config),
                       "to_toml() does not read back to the same values", text);
  return 0;
}
