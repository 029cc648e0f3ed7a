// The parameters `modar calibrate` fits: a small table of named, settable
// numbers of a device profile that the estimator reads (modar/calibrate.hpp).
//
// Each is addressed by its TOML key in the profile (section.key), has a unit
// and an allowed range, and is read with its default resolved (an achievable
// ceiling of 0 means the peak), so a fit starts from exactly what the
// estimator used.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "modar/calibrate.hpp"
#include "modar/errors.hpp"

namespace modar {
namespace {

struct Slot {
  CalibrationParameter parameter;
  double (*get)(const DeviceProfile&);
  void (*set)(DeviceProfile&, double);
  double (*cap)(const DeviceProfile&) = nullptr;  // the physical bound (0 = none)
};

const std::vector<Slot>& slots() {
  static const std::vector<Slot> table = {
      {{"ceilings.achievable_flops_bf16", "FLOP/s", 1e6, 1e19,
        "the 16-bit matrix rate the time model's compute-bound ops reach", false,
        "ceilings.peak_flops_bf16"},
       [](const DeviceProfile& p) { return p.ceilings.roofline_flops(DType::bf16); },
       [](DeviceProfile& p, double v) { p.ceilings.achievable_flops_bf16 = v; },
       [](const DeviceProfile& p) { return p.ceilings.peak_flops_bf16; }},
      {{"ceilings.achievable_flops_fp32", "FLOP/s", 1e6, 1e19,
        "the fp32 rate the time model's compute-bound ops reach", false,
        "ceilings.peak_flops_fp32"},
       [](const DeviceProfile& p) { return p.ceilings.roofline_flops(DType::fp32); },
       [](DeviceProfile& p, double v) { p.ceilings.achievable_flops_fp32 = v; },
       [](const DeviceProfile& p) { return p.ceilings.peak_flops_fp32; }},
      {{"ceilings.achievable_bandwidth", "bytes/s", 1e6, 1e16,
        "the memory bandwidth memory-bound ops reach", false, "ceilings.memory_bandwidth"},
       [](const DeviceProfile& p) { return p.ceilings.roofline_bandwidth(); },
       [](DeviceProfile& p, double v) { p.ceilings.achievable_bandwidth = v; },
       [](const DeviceProfile& p) { return p.ceilings.memory_bandwidth; }},
      {{"network.intra_node.bus_bandwidth", "bytes/s per GPU", 1e6, 1e14,
        "the NCCL bus bandwidth collectives get inside a node", false,
        "network.intra_node.link_bandwidth"},
       [](const DeviceProfile& p) { return p.network.intra_node.bus_bandwidth; },
       [](DeviceProfile& p, double v) { p.network.intra_node.bus_bandwidth = v; },
       [](const DeviceProfile& p) { return p.network.intra_node.link_bandwidth; }},
      {{"network.inter_node.bus_bandwidth", "bytes/s per NIC", 1e6, 1e14,
        "the NCCL bus bandwidth collectives get between nodes", false,
        "network.inter_node.link_bandwidth"},
       [](const DeviceProfile& p) { return p.network.inter_node.bus_bandwidth; },
       [](DeviceProfile& p, double v) { p.network.inter_node.bus_bandwidth = v; },
       [](const DeviceProfile& p) { return p.network.inter_node.link_bandwidth; }},
      {{"ceilings.launch_overhead_s", "seconds per op", 0.0, 1.0,
        "the launch / latency cost added to every op", true, ""},
       [](const DeviceProfile& p) { return p.ceilings.launch_overhead_s; },
       [](DeviceProfile& p, double v) {
         // The profile reader takes 0 or [1e-12, 1] s: a fit at ~0 is 0.
         p.ceilings.launch_overhead_s = v < 1e-12 ? 0.0 : v;
       },
       nullptr},
  };
  return table;
}

const Slot& find_slot(const std::string& name) {
  std::vector<std::string> names;
  for (const Slot& slot : slots()) {
    if (slot.parameter.name == name) {
      return slot;
    }
    names.push_back(slot.parameter.name);
  }
  std::string message = "parameter '" + shown_value(name) + "': no such profile parameter";
  const std::string suggestion = nearest_name(name, names);
  if (!suggestion.empty()) {
    message += "; did you mean '" + suggestion + "'?";
  }
  message += "; allowed: ";
  for (size_t i = 0; i < names.size(); ++i) {
    message += (i == 0 ? "" : ", ") + names[i];
  }
  throw ConfigError(message);
}

}  // namespace

const std::vector<CalibrationParameter>& calibration_parameters() {
  static const std::vector<CalibrationParameter> table = [] {
    std::vector<CalibrationParameter> out;
    for (const Slot& slot : slots()) {
      out.push_back(slot.parameter);
    }
    return out;
  }();
  return table;
}

std::vector<std::string> default_calibration_parameters() {
  return {"ceilings.achievable_flops_bf16", "ceilings.achievable_flops_fp32",
          "ceilings.achievable_bandwidth", "network.intra_node.bus_bandwidth",
          "network.inter_node.bus_bandwidth"};
}

double calibration_parameter_value(const DeviceProfile& profile, const std::string& name) {
  return find_slot(name).get(profile);
}

void set_calibration_parameter(DeviceProfile& profile, const std::string& name, double value) {
  const Slot& slot = find_slot(name);
  const CalibrationParameter& p = slot.parameter;
  if (!std::isfinite(value) || value < p.min || value > p.max) {
    throw ConfigError(p.name + " = " + format_number(value) + ": must be in [" +
                      format_number(p.min) + ", " + format_number(p.max) + "] (" + p.unit + ")");
  }
  slot.set(profile, value);
}

std::pair<double, double> calibration_parameter_range(const DeviceProfile& profile,
                                                      const std::string& name) {
  const Slot& slot = find_slot(name);
  double high = slot.parameter.max;
  if (slot.cap != nullptr && slot.cap(profile) > 0.0) {
    high = std::min(high, slot.cap(profile));
  }
  return {slot.parameter.min, std::max(high, slot.parameter.min)};
}

}  // namespace modar
