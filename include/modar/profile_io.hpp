// modar/profile_io.hpp: the one reader of profile files (load_profile, the
// profiler's checkpoint and the strict loader of measured profiles).
#pragma once

#include <string>

namespace modar {

// The text of a profile file; FileError("profile file '...': cannot open ...").
std::string read_profile_file(const std::string& path);

}  // namespace modar
