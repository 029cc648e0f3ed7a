// modar/runtime/host_facts.hpp: the host machine (CPU model, caches, memory),
// read from /proc and sysfs; empty / 0 where unreadable; and the launcher's
// environment (node-local rank), which the backends read before any
// communicator exists (a CUDA backend picks its GPU by it).
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

// The value of environment variable `name`; nullptr when unset or empty.
const char* environment_value(const char* name);
// This process's rank among the processes a launcher (mpirun, srun) started on
// THIS node, from the launcher's environment (OMPI_COMM_WORLD_LOCAL_RANK,
// MPI_LOCALRANKID, SLURM_LOCALID, LOCAL_RANK); 0 when not launched.  Used to
// pick a GPU before MPI or NCCL are initialised.
int launcher_local_rank();
// Whether a launcher started this process (its environment says so).
bool launched_by_mpirun();

}  // namespace modar::runtime
