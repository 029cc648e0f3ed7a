// The parameters `modar calibrate` fits: the time model's named, settable
// parameters of a device profile (modar/calibrate.hpp).
//
// The table is the kernel model's own (profile_parameters(): the [kernel]
// efficiencies, per-step and per-micro-batch overhead, the launch cost;
// docs/kernel_model.md), read and set through it so calibrate fits exactly
// what the estimator uses, plus the fp32 rate, which the [kernel]
// efficiencies do not describe (fp32 ops keep the [ceilings] figures).  Each
// is addressed by its TOML key (section.key) and read with its default
// resolved (an unset efficiency is what the profile's ceilings imply), so a
// fit starts from exactly what the estimator used.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "modar/base/errors.hpp"
#include "modar/base/text.hpp"
#include "modar/calibrate.hpp"

namespace modar {
namespace {

constexpr const char* kFp32Rate = "ceilings.achievable_flops_fp32";

const std::vector<CalibrationParameter>& table() {
  static const std::vector<CalibrationParameter> parameters = [] {
    std::vector<CalibrationParameter> out;
    for (const ProfileParameter& p : profile_parameters()) {
      const bool seconds = p.name.size() > 2 && p.name.substr(p.name.size() - 2) == "_s";
      out.push_back({p.name, p.unit, p.min, p.max, p.meaning, seconds, ""});
    }
    out.push_back({kFp32Rate, "FLOP/s", 1e6, 1e19,
                   "the fp32 rate the time model's compute-bound fp32 ops reach", false,
                   "ceilings.peak_flops_fp32"});
    return out;
  }();
  return parameters;
}

const CalibrationParameter& find_parameter(const std::string& name) {
  std::vector<std::string> names;
  for (const CalibrationParameter& p : table()) {
    if (p.name == name) {
      return p;
    }
    names.push_back(p.name);
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
  return table();
}

std::vector<std::string> default_calibration_parameters() {
  return {"kernel.gemm_efficiency", "kernel.attention_efficiency", "kernel.memory_efficiency",
          "kernel.collective_efficiency_intra_node", "kernel.collective_efficiency_inter_node"};
}

double calibration_parameter_value(const DeviceProfile& profile, const std::string& name) {
  find_parameter(name);
  if (name == kFp32Rate) {
    return profile.ceilings.roofline_flops(DType::fp32);
  }
  return profile_parameter(profile, name);
}

void set_calibration_parameter(DeviceProfile& profile, const std::string& name, double value) {
  const CalibrationParameter& p = find_parameter(name);
  if (!std::isfinite(value) || value < p.min || value > p.max) {
    throw ConfigError(p.name + " = " + format_number(value) + ": must be in [" +
                      format_number(p.min) + ", " + format_number(p.max) + "] (" + p.unit + ")");
  }
  if (name == kFp32Rate) {
    profile.ceilings.achievable_flops_fp32 = value;
  } else if (name == "ceilings.launch_overhead_s") {
    // The profile reader takes 0 or [1e-12, 1] s: a fit at ~0 is 0.
    set_profile_parameter(profile, name, value < 1e-12 ? 0.0 : value);
  } else {
    set_profile_parameter(profile, name, value);
  }
}

std::pair<double, double> calibration_parameter_range(const DeviceProfile& profile,
                                                      const std::string& name) {
  const CalibrationParameter& p = find_parameter(name);
  double high = p.max;
  if (name == kFp32Rate && profile.ceilings.peak_flops_fp32 > 0.0) {
    high = std::min(high, profile.ceilings.peak_flops_fp32);
  }
  return {p.min, std::max(high, p.min)};
}

}  // namespace modar
