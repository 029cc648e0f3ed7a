// Bounded input files, atomic output files and the load average of
// modar/base/files.hpp.
#include "modar/base/files.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "modar/base/errors.hpp"
#include "modar/base/text.hpp"

namespace modar {

namespace {

// "'<path>'" with the path escaped and cut for a one-line message.  (Appended
// piece by piece: `"'" + text + "'"` trips GCC 12's false -Wrestrict.)
std::string quoted_path(const std::string& path) {
  std::string shown = "'";
  shown += shown_value(path, 200);
  shown += '\'';
  return shown;
}

}  // namespace

std::string read_input_file(const std::string& path, const std::string& what, uint64_t max_bytes) {
  const std::string shown = quoted_path(path);
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    const int error = errno;
    throw FileError(what + " " + shown + ": cannot open (" +
                    (error == ENOENT || error == EACCES || error == ENOTDIR
                         ? std::string("missing or unreadable")
                         : std::string(std::strerror(error))) +
                    ")");
  }
  if (S_ISDIR(info.st_mode)) {
    throw FileError(what + " " + shown + ": is a directory; allowed: a regular file");
  }
  if (!S_ISREG(info.st_mode)) {
    throw FileError(what + " " + shown +
                    ": not a regular file (a device, FIFO or socket); allowed: a regular file");
  }
  const auto too_large = [&] {
    return FileError(what + " " + shown + ": larger than " + std::to_string(max_bytes) +
                     " bytes; allowed: a file of at most " + std::to_string(max_bytes) + " bytes");
  };
  if (static_cast<uint64_t>(info.st_size) > max_bytes) {
    throw too_large();
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw FileError(what + " " + shown + ": cannot open (missing or unreadable)");
  }
  // Read at most max_bytes + 1 bytes: files whose size stat() does not know
  // (/proc) or that grow while read stay bounded.
  std::string content;
  char buffer[1 << 16];
  while (in) {
    in.read(buffer, sizeof buffer);
    const auto got = static_cast<size_t>(in.gcount());
    if (content.size() + got > max_bytes) {
      throw too_large();
    }
    content.append(buffer, got);
  }
  if (in.bad()) {
    throw FileError(what + " " + shown + ": read error");
  }
  return content;
}

void write_file_atomically(const std::string& path, const std::string& contents,
                           const std::string& what) {
  const std::string shown = what + " " + quoted_path(path);
  const std::string temporary = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) {
      throw FileError(shown + ": cannot write (" + std::strerror(errno) + ")");
    }
    out << contents;
    out.flush();
    if (!out) {
      const std::string reason = std::strerror(errno);
      out.close();
      std::remove(temporary.c_str());
      throw FileError(shown + ": write failed (" + reason + ")");
    }
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    std::remove(temporary.c_str());
    throw FileError(shown + ": cannot rename the temporary file into place (" + reason + ")");
  }
}

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string one_minute, five_minutes, fifteen_minutes;
  in >> one_minute >> five_minutes >> fifteen_minutes;
  return one_minute.empty() ? std::string("unknown")
                            : one_minute + " " + five_minutes + " " + fifteen_minutes;
}

}  // namespace modar
