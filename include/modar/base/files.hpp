// modar/base/files.hpp: reading user-named input files and writing outputs.
//
// Inputs are bounded regular files (a config, a profile, a runs CSV: never a
// directory, a device or /dev/zero); outputs are written atomically (to a
// temporary beside the target, then renamed over it), so an interrupted or
// failed run never leaves a half-written file or overwrites a good one.
#pragma once

#include <cstdint>
#include <string>

namespace modar {

// The whole of a user-named input file (config, profile, runs CSV): it must
// be a regular file (not a directory, device or FIFO) of at most `max_bytes`
// bytes; anything else is a modar::FileError naming `what` and the path.
std::string read_input_file(const std::string& path, const std::string& what, uint64_t max_bytes);

// Write `contents` to <path>.tmp.<pid>, then rename it over <path>; on any
// failure the temporary is removed, <path> is untouched and a FileError names
// `what` and the path ("profile file '/x/p.toml': cannot write (...)").
void write_file_atomically(const std::string& path, const std::string& contents,
                           const std::string& what = "output file");

// This machine's load average, "1.05 0.98 0.91" (1, 5 and 15 minutes, from
// /proc/loadavg), or "unknown" where there is none.  Written beside every
// timing a shared machine takes.
std::string load_average();

}  // namespace modar
