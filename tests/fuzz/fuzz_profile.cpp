// Fuzz target: the device-profile reader (parse_profile_toml), as used by
// load_profile() for a path given with --profile / device.profile.
//
// Input: the profile's TOML text.
// Properties (a violation aborts):
//  * only modar::ConfigError / modar::FileError escape, no sanitizer report;
//  * an accepted profile round-trips: to_toml() parses back to a profile
//    whose to_toml() is the same text;
//  * an accepted profile can be used: estimate() of a tiny model in fp32 and
//    bf16 (the measured-op lookup and the roofline) and its JSON throw nothing
//    but modar errors and trip no sanitizer.
#include <cstdint>
#include <exception>
#include <string>

#include "fuzz_util.hpp"
#include "modar/base/errors.hpp"
#include "modar/config.hpp"
#include "modar/cost_model.hpp"
#include "modar/profile.hpp"

namespace {

modar::Config tiny_config(modar::DType dtype) {
  modar::Config config;
  config.model = {.d_model = 64, .n_layers = 2, .n_heads = 4, .vocab_size = 256, .seq_len = 32};
  config.mod.every = 2;
  config.train = {.micro_batch = 2, .dtype = dtype};
  return config;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const std::optional<modar::DeviceProfile> parsed =
      modar::fuzz::accepted([&] { return modar::parse_profile_toml(text, "fuzz-profile.toml"); });
  if (!parsed) {
    return 0;
  }
  const modar::DeviceProfile& profile = *parsed;
  modar::fuzz::round_trip(profile, modar::parse_profile_toml, "an accepted profile");
  for (const modar::DType dtype : {modar::DType::fp32, modar::DType::bf16}) {
    const modar::Config config = tiny_config(dtype);
    try {
      const modar::Estimate result = modar::estimate(config, profile);
      (void)modar::estimate_to_json(config, profile, modar::StepKind::train, result);
    } catch (const modar::ConfigError&) {
    } catch (const modar::FileError&) {
    }
  }
  return 0;
}
