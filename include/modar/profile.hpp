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

struct DeviceProfile {
  std::string name;       // "h200", "h200-measured", "cpu-generic", ...
  std::string backend;    // "cuda" | "cpu" | "datasheet"
  bool measured = false;  // false: ceilings from a datasheet, no op table
  DeviceCeilings ceilings;
  std::map<std::string, std::string> provenance;  // device, clocks, versions, date, how measured
  std::vector<OpMeasurement> measurements;
};

// Load by name (an embedded profile) or path (a run never reads the source tree). Throws
// FileError / ConfigError naming the file, the field and what is allowed.
DeviceProfile load_profile(const std::string& name_or_path);
DeviceProfile parse_profile_toml(const std::string& toml_text, const std::string& source_name);
std::string to_toml(const DeviceProfile& profile);
// Write atomically (temp file + rename): a killed writer never leaves a
// half-written profile behind.
void save_profile_atomically(const DeviceProfile& profile, const std::string& path);
// Names of the embedded profiles ("h200", "cpu-generic", ...).
std::vector<std::string> embedded_profile_names();
// The TOML text an embedded profile was compiled from ("" if no such name).
std::string embedded_profile_text(const std::string& name);

}  // namespace modar
