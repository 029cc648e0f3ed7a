// runtime/core/host_facts.cpp: what the host machine is (/proc, sysfs), for the
// CPU backend's DeviceFacts and the profiler's provenance, and what a launcher
// (mpirun, srun) told this process in its environment.
#include "modar/runtime/host_facts.hpp"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace modar::runtime {

std::string read_text_or_empty(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return std::string();
  }
  std::ostringstream content;
  content << in.rdbuf();
  return content.str();
}

std::string trim_text(std::string text) {
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) {
    return std::string();
  }
  const auto last = text.find_last_not_of(" \t\r\n");
  return text.substr(first, last - first + 1);
}

namespace {

// "1024K" / "32M" / "48K" -> bytes (sysfs cache sizes).
int64_t parse_cache_size(const std::string& text) {
  const std::string value = trim_text(text);
  if (value.empty()) {
    return 0;
  }
  char* end = nullptr;
  const long long number = std::strtoll(value.c_str(), &end, 10);
  int64_t scale = 1;
  if (end != nullptr && (*end == 'K' || *end == 'k'))
    scale = 1024;
  if (end != nullptr && (*end == 'M' || *end == 'm'))
    scale = 1024 * 1024;
  if (end != nullptr && (*end == 'G' || *end == 'g'))
    scale = int64_t{1024} * 1024 * 1024;
  return static_cast<int64_t>(number) * scale;
}

int64_t meminfo_bytes(const std::string& meminfo, const std::string& key) {
  const auto at = meminfo.find(key + ":");
  if (at == std::string::npos) {
    return 0;
  }
  return static_cast<int64_t>(std::strtoll(meminfo.c_str() + at + key.size() + 1, nullptr, 10)) *
         1024;
}

}  // namespace

HostFacts read_host_facts() {
  HostFacts facts;
  const std::string cpuinfo = read_text_or_empty("/proc/cpuinfo");
  const auto at = cpuinfo.find("model name");
  if (at != std::string::npos) {
    const auto colon = cpuinfo.find(':', at);
    const auto end = cpuinfo.find('\n', at);
    facts.cpu_model = trim_text(cpuinfo.substr(colon + 1, end - colon - 1));
  }
  for (size_t pos = cpuinfo.find("processor"); pos != std::string::npos;
       pos = cpuinfo.find("processor", pos + 1)) {
    if (pos == 0 || cpuinfo[pos - 1] == '\n') {
      ++facts.logical_cpus;
    }
  }
  for (int index = 0; index < 8; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index);
    const std::string level = trim_text(read_text_or_empty(dir + "/level"));
    const std::string type = trim_text(read_text_or_empty(dir + "/type"));
    if (level.empty()) {
      continue;
    }
    const int64_t size = parse_cache_size(read_text_or_empty(dir + "/size"));
    if (type == "Instruction") {
      continue;
    }
    if (level == "2") {
      facts.l2_cache_bytes = size;
    }
    facts.last_level_cache_bytes = std::max(facts.last_level_cache_bytes, size);
  }
  const std::string meminfo = read_text_or_empty("/proc/meminfo");
  facts.memory_total_bytes = meminfo_bytes(meminfo, "MemTotal");
  facts.memory_available_bytes = meminfo_bytes(meminfo, "MemAvailable");
  return facts;
}

const char* environment_value(const char* name) {
  const char* value = std::getenv(name);
  return (value != nullptr && *value != '\0') ? value : nullptr;
}

int launcher_local_rank() {
  for (const char* name :
       {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK"}) {
    if (const char* value = environment_value(name)) {
      char* end = nullptr;
      const long rank = std::strtol(value, &end, 10);
      if (end != value && *end == '\0' && rank >= 0 && rank < (1L << 20)) {
        return static_cast<int>(rank);
      }
    }
  }
  return 0;
}

bool launched_by_mpirun() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"}) {
    if (environment_value(name) != nullptr) {
      return true;
    }
  }
  return false;
}

}  // namespace modar::runtime
