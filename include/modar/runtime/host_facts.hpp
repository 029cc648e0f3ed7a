// modar/runtime/host_facts.hpp: the host machine (CPU model, caches, memory),
// read from /proc and sysfs; empty / 0 where unreadable.
#pragma once

#include <cstdint>
#include <string>

namespace modar::runtime {

struct HostFacts {
  std::string cpu_model;       // /proc/cpuinfo "model name"
  int64_t l2_cache_bytes = 0;  // per core, /sys/devices/system/cpu/cpu0/cache
  int64_t last_level_cache_bytes = 0;
  int64_t memory_total_bytes = 0;  // /proc/meminfo MemTotal
  int64_t memory_available_bytes = 0;
  int logical_cpus = 0;
};
HostFacts read_host_facts();

// A small system file (/proc, sysfs) as text; "" when it cannot be read.
std::string read_text_or_empty(const std::string& path);
// Without leading / trailing blanks and newlines.
std::string trim_text(std::string text);

}  // namespace modar::runtime
