// modar/profile.hpp: device profiles (TOML files in profiles/, or embedded).
//
// A profile holds the device's measured (or datasheet) ceilings and, when the
// profiler made it, the measured time of each op kind over a grid of shapes.
// Prediction (cost_models/timing.cpp): inside an op kind's measured grid,
// interpolate log(time) in log(shape) space; outside, use a fitted
// efficiency x roofline; every prediction says whether it extrapolated.
// The file format is documented in profiles/README.md.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "modar/ops.hpp"

namespace modar {

struct DeviceCeilings {
  double peak_flops_bf16 = 0.0;    // FLOP/s, dense matrix (the MFU denominator)
  double peak_flops_fp32 = 0.0;    // FLOP/s
  double memory_bandwidth = 0.0;   // bytes/s
  double launch_overhead_s = 0.0;  // per op launch
  double memory_bytes = 0.0;       // device memory capacity
  // Ceilings the roofline uses (what a good kernel reaches: measured GEMM
  // rate, device copy rate).  0 = use the peak.  MFU always divides by peak.
  double achievable_flops_bf16 = 0.0;
  double achievable_flops_fp32 = 0.0;
  double achievable_bandwidth = 0.0;

  // FLOP/s the roofline uses for an op of this dtype (fp16 counts as bf16).
  double roofline_flops(DType dtype) const {
    if (dtype == DType::fp32 || dtype == DType::fp64) {
      return achievable_flops_fp32 > 0 ? achievable_flops_fp32 : peak_flops_fp32;
    }
    return achievable_flops_bf16 > 0 ? achievable_flops_bf16 : peak_flops_bf16;
  }
  double roofline_bandwidth() const {
    return achievable_bandwidth > 0 ? achievable_bandwidth : memory_bandwidth;
  }
  // The MFU denominator for a training dtype.
  double peak_flops(DType dtype) const {
    return (dtype == DType::fp32 || dtype == DType::fp64) ? peak_flops_fp32 : peak_flops_bf16;
  }
};

struct OpMeasurement {
  OpShape shape;
  Pass pass = Pass::forward;
  double median_s = 0.0;
  double spread = 0.0;  // (p90 - p10) / median
  int64_t repeats = 0;
};

// ---- [network]: the interconnect of a multi-GPU system (cluster planning) ----
// Two levels: inside a node (NVLink / NVSwitch) and between nodes (InfiniBand /
// RoCE).  bus_bandwidth is the NCCL "bus bandwidth" per GPU the model uses
// (nccl-tests convention: busbw = algbw x 2(p-1)/p for all-reduce, x (p-1)/p
// for reduce-scatter / all-gather / all-to-all, x 1 for send/recv), so a
// measured busbw plugs straight in; link_bandwidth is the datasheet number
// (documentation only).  Optional measured tables (message bytes -> seconds
// at a group size) replace the formula inside their range, interpolated in
// log space like op times.
enum class Collective : uint8_t { all_reduce, reduce_scatter, all_gather, all_to_all, send_recv };
inline constexpr int kCollectiveCount = 5;
const char* to_string(Collective kind);
bool parse_collective(const std::string& name, Collective* kind);

struct CollectiveTable {
  Collective kind = Collective::all_reduce;
  int64_t ranks = 2;                // group size the table was measured at
  std::vector<double> sizes_bytes;  // ascending
  std::vector<double> times_s;      // one per size
};

struct NetworkLevel {
  std::string name;             // "NVLink 3 / NVSwitch", "HDR InfiniBand", ...
  double bus_bandwidth = 0.0;   // bytes/s per GPU the model uses (achieved NCCL busbw)
  double link_bandwidth = 0.0;  // bytes/s per GPU per direction, datasheet (not used in time)
  double latency_s = 0.0;       // per algorithm step
  std::vector<CollectiveTable> tables;
};

struct NetworkProfile {
  bool present = false;     // the profile has a [network] section
  int64_t gpus_per_node = 8;
  NetworkLevel intra_node;  // level 0
  NetworkLevel inter_node;  // level 1
};

struct DeviceProfile {
  std::string name;       // "h200", "h200-measured", "cpu-generic", ...
  std::string backend;    // "cuda" | "cpu" | "datasheet"
  bool measured = false;  // false: ceilings from a datasheet, no op table
  DeviceCeilings ceilings;
  std::map<std::string, std::string> provenance;  // device, clocks, versions, date, how measured
  std::vector<OpMeasurement> measurements;
  NetworkProfile network;  // [network]; absent: single-device profile
};

// Load by name (an embedded profile) or path (a run never reads the source tree). Throws
// FileError / ConfigError naming the file, the field and what is allowed.
DeviceProfile load_profile(const std::string& name_or_path);
DeviceProfile parse_profile_toml(const std::string& toml_text, const std::string& source_name);
// What load_profile checks before a profile may time anything (parse_profile_toml
// also reads the profiler's checkpoints, so it does not): provenance.status is
// "complete" when present, provenance.measurement_count matches the file, the
// ceilings and medians lie in physical bands (no denormal / huge values that
// make step times 0, inf or NaN).  Throws FileError / ConfigError.
void check_profile_usable(const DeviceProfile& profile, const std::string& source_name);
// True when some measurement of the profile is of this dtype.
bool profile_measures_dtype(const DeviceProfile& profile, DType dtype);
// A measured profile timing a dtype it never measured would fall back to the
// roofline while claiming its op table: refuse (ConfigError naming
// train.dtype).  Datasheet profiles (no measurements) pass.
void check_profile_dtype(const DeviceProfile& profile, DType dtype);
std::string to_toml(const DeviceProfile& profile);
// Write atomically (temp file + rename): a killed writer never leaves a
// half-written profile behind.
void save_profile_atomically(const DeviceProfile& profile, const std::string& path);
// Names of the embedded profiles ("h200", "cpu-generic", ...).
std::vector<std::string> embedded_profile_names();
// The TOML text an embedded profile was compiled from ("" if no such name).
std::string embedded_profile_text(const std::string& name);

}  // namespace modar
