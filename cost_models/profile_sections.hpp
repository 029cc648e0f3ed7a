// The sections of a profile that live beside profile.cpp: [kernel]
// (cost_models/kernel_model/kernel_params.cpp) and [network]
// (cost_models/network.cpp).  profile.cpp reads and writes each through its
// two hooks: parse_*_section (strict: unknown keys, bad values and missing
// parts are one-line ConfigErrors naming the field) and *_to_toml.
#pragma once

#include <toml++/toml.h>

#include <string>

#include "modar/profile.hpp"

namespace modar::detail {

// Reads root["kernel"] when present into profile.kernel (values outside a
// parameter's range refused; a [kernel] efficiency beside the [ceilings]
// achievable figure it replaces is refused).  Call after [ceilings] is read.
void parse_kernel_section(const toml::table& root, const std::string& source,
                          DeviceProfile& profile);
// The [kernel] table as TOML text (only the fields the profile sets; "" when none).
std::string kernel_to_toml(const KernelParams& kernel);

// Reads root["network"] when present (missing levels refused).
void parse_network_section(const toml::table& root, const std::string& source,
                           NetworkProfile& network);
// The [network] tables as TOML text ("" when the profile has none).
std::string network_to_toml(const NetworkProfile& network);

}  // namespace modar::detail
