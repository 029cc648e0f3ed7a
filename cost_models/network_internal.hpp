// The [network] section of a profile: read and written by profile.cpp through
// these two hooks (cost_models/network.cpp).
#pragma once

#include <toml++/toml.h>

#include <string>

#include "modar/profile.hpp"

namespace modar::detail {

// Reads root["network"] when present (strict: unknown keys, bad values and
// missing levels are one-line ConfigErrors naming the field).
void parse_network_section(const toml::table& root, const std::string& source,
                           NetworkProfile& network);
// The [network] tables as TOML text ("" when the profile has none).
std::string network_to_toml(const NetworkProfile& network);

}  // namespace modar::detail
