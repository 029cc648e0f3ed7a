// The [kernel] section of a profile: read and written by profile.cpp through
// these two hooks (cost_models/kernel_model/kernel_params.cpp).
#pragma once

#include <toml++/toml.h>

#include <string>

#include "modar/profile.hpp"

namespace modar::detail {

// Reads root["kernel"] when present into profile.kernel (strict: unknown keys
// and values outside a parameter's range are one-line ConfigErrors naming the
// field; a [kernel] efficiency beside the [ceilings] achievable figure it
// replaces is refused).  Call after [ceilings] is read.
void parse_kernel_section(const toml::table& root, const std::string& source,
                          DeviceProfile& profile);
// The [kernel] table as TOML text (only the fields the profile sets; "" when none).
std::string kernel_to_toml(const KernelParams& kernel);

}  // namespace modar::detail
