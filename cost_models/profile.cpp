// Device profiles: reading / writing the TOML format of profiles/README.md,
// the embedded defaults (profiles/*.toml compiled in), and atomic saving.
#include "modar/profile.hpp"

#include <toml++/toml.h>

#include <cmath>
#include <cstdio>
#include <sstream>

#include "modar/base/errors.hpp"
#include "modar/base/files.hpp"
#include "modar/base/json.hpp"
#include "modar/base/text.hpp"
#include "modar/kernel_model.hpp"
#include "modar/profile_io.hpp"
#include "profile_sections.hpp"
#include "toml_text.hpp"

namespace modar {
namespace detail {
const std::vector<std::pair<const char*, const char*>>& embedded_profile_texts();
}  // namespace detail

namespace {

[[noreturn]] void fail_field(const std::string& source, const std::string& field,
                             const std::string& value, const std::string& allowed) {
  throw ConfigError(shown_value(source, 200) + ": " + field + " = " + shown_value(value) + ": " +
                    allowed);
}

// A profile is at most a few MB (the full CPU grid is ~1 MB); 64 MiB bounds
// what a mistyped path (/dev/zero, a core dump) can make us read.
constexpr uint64_t kMaxProfileBytes = uint64_t{64} << 20;

double read_number(const toml::node& node, const std::string& source, const std::string& field) {
  const std::optional<double> value = detail::toml_number(node);
  if (!value) {
    fail_field(source, field, detail::toml_node_text(node), "must be a number");
  }
  if (!std::isfinite(*value)) {
    fail_field(source, field, format_number(*value), "must be a finite number");
  }
  return *value;
}

double read_non_negative(const toml::table& table, const char* key, const std::string& source,
                         const std::string& prefix, bool required) {
  const toml::node* node = table.get(key);
  if (node == nullptr) {
    if (required) {
      throw ConfigError(source + ": " + prefix + key + " is missing (required)");
    }
    return 0.0;
  }
  const double value = read_number(*node, source, prefix + key);
  if (value < 0.0 || (required && value == 0.0)) {
    fail_field(source, prefix + key, format_number(value),
               required ? "must be > 0" : "must be >= 0");
  }
  return value;
}

std::string read_string(const toml::table& table, const char* key, const std::string& source,
                        const std::string& fallback) {
  const toml::node* node = table.get(key);
  if (node == nullptr) {
    return fallback;
  }
  if (!node->is_string()) {
    const std::string shown_text = detail::toml_node_text(*node);
    fail_field(source, key, shown_text, "must be a string");
  }
  return node->as_string()->get();
}

bool looks_like_path(const std::string& name) {
  return name.find('/') != std::string::npos || name.find('\\') != std::string::npos ||
         (name.size() > 5 && name.compare(name.size() - 5, 5, ".toml") == 0);
}

// A provenance entry the tools read back must parse strictly.
void check_integer_provenance(const DeviceProfile& profile, const char* key,
                              const std::string& source) {
  const auto it = profile.provenance.find(key);
  int64_t value = 0;
  if (it != profile.provenance.end() && (!parse_integer_text(it->second, &value) || value < 0)) {
    fail_field(source, std::string("provenance.") + key, "\"" + it->second + "\"",
               "must be an integer >= 0");
  }
}

}  // namespace

// The one reader of profile files (bounded, regular files only: config.hpp).
std::string read_profile_file(const std::string& path) {
  return read_input_file(path, "profile file", kMaxProfileBytes);
}

DeviceProfile parse_profile_toml(const std::string& toml_text, const std::string& source_name) {
  const toml::table root = detail::parse_toml_text(toml_text, source_name);
  DeviceProfile profile;
  profile.name = read_string(root, "name", source_name, "");
  if (profile.name.empty()) {
    throw ConfigError(shown_value(source_name, 200) +
                      ": name is missing (required, e.g. name = \"h200\")");
  }
  profile.backend = read_string(root, "backend", source_name, "datasheet");
  if (const toml::node* measured = root.get("measured")) {
    if (!measured->is_boolean()) {
      const std::string shown_text = detail::toml_node_text(*measured);
      fail_field(source_name, "measured", shown_text, "must be true or false");
    }
    profile.measured = measured->as_boolean()->get();
  }
  if (const toml::node* provenance = root.get("provenance")) {
    if (!provenance->is_table()) {
      fail_field(source_name, "provenance", "a value", "must be a table [provenance]");
    }
    for (const auto& [key, node] : *provenance->as_table()) {
      profile.provenance[std::string(key.str())] =
          node.is_string() ? node.as_string()->get() : detail::toml_node_text(node);
    }
  }
  const toml::table* ceilings = root["ceilings"].as_table();
  if (ceilings == nullptr) {
    throw ConfigError(source_name + ": [ceilings] is missing (required)");
  }
  DeviceCeilings& c = profile.ceilings;
  const std::string prefix = "ceilings.";
  c.peak_flops_bf16 = read_non_negative(*ceilings, "peak_flops_bf16", source_name, prefix, true);
  c.peak_flops_fp32 = read_non_negative(*ceilings, "peak_flops_fp32", source_name, prefix, true);
  c.memory_bandwidth = read_non_negative(*ceilings, "memory_bandwidth", source_name, prefix, true);
  c.memory_bytes = read_non_negative(*ceilings, "memory_bytes", source_name, prefix, true);
  c.launch_overhead_s =
      read_non_negative(*ceilings, "launch_overhead_s", source_name, prefix, false);
  c.achievable_flops_bf16 =
      read_non_negative(*ceilings, "achievable_flops_bf16", source_name, prefix, false);
  c.achievable_flops_fp32 =
      read_non_negative(*ceilings, "achievable_flops_fp32", source_name, prefix, false);
  c.achievable_bandwidth =
      read_non_negative(*ceilings, "achievable_bandwidth", source_name, prefix, false);
  for (const auto& [key, node] : *ceilings) {
    static const char* const kKnown[] = {"peak_flops_bf16",       "peak_flops_fp32",
                                         "memory_bandwidth",      "memory_bytes",
                                         "launch_overhead_s",     "achievable_flops_bf16",
                                         "achievable_flops_fp32", "achievable_bandwidth"};
    bool known = false;
    for (const char* name : kKnown) {
      known = known || key.str() == name;
    }
    if (!known) {
      throw ConfigError(source_name + ": unknown key 'ceilings." + std::string(key.str()) +
                        "'; allowed: peak_flops_bf16, peak_flops_fp32, memory_bandwidth, "
                        "memory_bytes, launch_overhead_s, achievable_flops_bf16, "
                        "achievable_flops_fp32, achievable_bandwidth");
    }
  }

  if (const toml::node* list = root.get("measurements")) {
    const toml::array* array = list->as_array();
    if (array == nullptr) {
      fail_field(source_name, "measurements", "a value",
                 "must be an array of tables [[measurements]]");
    }
    profile.measurements.reserve(array->size());
    for (size_t i = 0; i < array->size(); ++i) {
      const std::string where = "measurements[" + std::to_string(i) + "].";
      const toml::table* entry = array->get(i)->as_table();
      if (entry == nullptr) {
        fail_field(source_name, "measurements[" + std::to_string(i) + "]", "a value",
                   "must be a table");
      }
      OpMeasurement m;
      const std::string kind_name = read_string(*entry, "kind", source_name, "");
      if (!parse_op_kind(kind_name, &m.shape.kind)) {
        fail_field(source_name, where + "kind", "\"" + kind_name + "\"",
                   "must be an op kind of include/modar/ops.hpp (gemm, attention, ...)");
      }
      const std::string pass_name = read_string(*entry, "pass", source_name, "forward");
      if (!parse_pass(pass_name, &m.pass)) {
        fail_field(source_name, where + "pass", "\"" + pass_name + "\"",
                   "must be \"forward\", \"backward\" or \"recompute\"");
      }
      const std::string dtype_name = read_string(*entry, "dtype", source_name, "bf16");
      if (dtype_name == "bf16") {
        m.shape.dtype = DType::bf16;
      } else if (dtype_name == "fp32") {
        m.shape.dtype = DType::fp32;
      } else if (dtype_name == "fp16") {
        m.shape.dtype = DType::fp16;
      } else if (dtype_name == "fp64") {
        m.shape.dtype = DType::fp64;
      } else {
        fail_field(source_name, where + "dtype", "\"" + dtype_name + "\"",
                   "must be \"bf16\", \"fp16\", \"fp32\" or \"fp64\"");
      }
      const toml::array* dims = (*entry)["dims"].as_array();
      const int expected = op_dims_count(m.shape.kind);
      if (dims == nullptr || static_cast<int>(dims->size()) != expected) {
        fail_field(source_name, where + "dims",
                   dims == nullptr ? "missing" : "an array of " + std::to_string(dims->size()),
                   "must be an array of " + std::to_string(expected) + " integers for " +
                       kind_name + " (profiles/README.md)");
      }
      for (int d = 0; d < expected; ++d) {
        const toml::node* dim = dims->get(static_cast<size_t>(d));
        if (!dim->is_integer() || dim->as_integer()->get() < 0) {
          const std::string shown_text = detail::toml_node_text(*dim);
          fail_field(source_name, where + "dims[" + std::to_string(d) + "]", shown_text,
                     "must be an integer >= 0");
        }
        m.shape.dims[static_cast<size_t>(d)] = dim->as_integer()->get();
      }
      const toml::node* median = entry->get("median_s");
      if (median == nullptr) {
        throw ConfigError(source_name + ": " + where + "median_s is missing (required)");
      }
      m.median_s = read_number(*median, source_name, where + "median_s");
      if (m.median_s <= 0.0) {
        fail_field(source_name, where + "median_s", format_number(m.median_s), "must be > 0");
      }
      if (const toml::node* spread = entry->get("spread")) {
        m.spread = read_number(*spread, source_name, where + "spread");
        if (m.spread < 0.0) {
          fail_field(source_name, where + "spread", format_number(m.spread),
                     "must be >= 0 ((p90 - p10) / median)");
        }
      }
      if (const toml::node* repeats = entry->get("repeats")) {
        if (!repeats->is_integer() || repeats->as_integer()->get() < 0) {
          fail_field(source_name, where + "repeats", "a value", "must be an integer >= 0");
        }
        m.repeats = repeats->as_integer()->get();
      }
      if (const toml::node* rounds = entry->get("rounds")) {
        if (!rounds->is_integer() || rounds->as_integer()->get() < 0) {
          fail_field(source_name, where + "rounds", "a value", "must be an integer >= 0");
        }
        m.rounds = rounds->as_integer()->get();
      }
      if (const toml::node* round_spread = entry->get("round_spread")) {
        m.round_spread = read_number(*round_spread, source_name, where + "round_spread");
        if (!(m.round_spread >= 0.0 && std::isfinite(m.round_spread))) {
          fail_field(source_name, where + "round_spread", format_number(m.round_spread),
                     "must be a finite number >= 0 ((max - min) / median of the rounds)");
        }
      }
      if (const toml::node* drift = entry->get("drift")) {
        if (!drift->is_boolean()) {
          fail_field(source_name, where + "drift", detail::toml_node_text(*drift),
                     "must be true or false");
        }
        m.drift = drift->as_boolean()->get();
      }
      profile.measurements.push_back(m);
    }
  }
  // Provenance the tools read back (validate's defaults, the checks below).
  for (const char* key : {"measurement_count", "skipped_count", "threads", "logical_cpus"}) {
    check_integer_provenance(profile, key, source_name);
  }
  if (const auto clock = profile.provenance.find("clock");
      clock != profile.provenance.end() && clock->second != "wall" && clock->second != "cpu") {
    fail_field(source_name, "provenance.clock", "\"" + clock->second + "\"",
               "must be \"wall\" or \"cpu\"");
  }
  if (const auto dtype = profile.provenance.find("dtype"); dtype != profile.provenance.end()) {
    const std::string& name = dtype->second;
    if (name != "bf16" && name != "fp16" && name != "fp32" && name != "fp64") {
      fail_field(source_name, "provenance.dtype", "\"" + name + "\"",
                 "must be \"bf16\", \"fp16\", \"fp32\" or \"fp64\"");
    }
  }
  detail::parse_network_section(root, source_name, profile.network);  // [network] (network.cpp)
  detail::parse_kernel_section(root, source_name, profile);           // [kernel] (kernel_model/)
  return profile;
}

void check_profile_usable(const DeviceProfile& profile, const std::string& source_name) {
  const std::string source = shown_value(source_name, 200);
  if (const auto status = profile.provenance.find("status");
      status != profile.provenance.end() && status->second != "complete") {
    throw FileError(
        source + ": provenance.status = \"" + shown_value(status->second) +
        "\": a partial profile (the checkpoint of an interrupted `modar profile` "
        "run); allowed: a complete profile (resume the run from this checkpoint to finish it)");
  }
  if (const auto count = profile.provenance.find("measurement_count");
      count != profile.provenance.end()) {
    int64_t expected = -1;
    parse_integer_text(count->second, &expected);  // strict form checked by the parser
    if (expected != static_cast<int64_t>(profile.measurements.size())) {
      throw FileError(source + ": provenance.measurement_count = " + shown_value(count->second) +
                      " but the file holds " + std::to_string(profile.measurements.size()) +
                      " [[measurements]]: the profile is truncated or corrupted; measure it "
                      "again with `modar profile`");
    }
  }
  // Ceilings: a value outside these bands turns step times into 0, inf or NaN
  // (a denormal rate divides to inf; a huge one to 0).
  const DeviceCeilings& c = profile.ceilings;
  const struct {
    const char* field;
    double value;
    double low, high;
    bool zero_allowed;
    const char* allowed;
  } bands[] = {
      {"peak_flops_bf16", c.peak_flops_bf16, 1e6, 1e19, false, "in [1e6, 1e19] FLOP/s"},
      {"peak_flops_fp32", c.peak_flops_fp32, 1e6, 1e19, false, "in [1e6, 1e19] FLOP/s"},
      {"memory_bandwidth", c.memory_bandwidth, 1e6, 1e16, false, "in [1e6, 1e16] bytes/s"},
      {"memory_bytes", c.memory_bytes, 1e6, 1e16, false, "in [1e6, 1e16] bytes"},
      {"achievable_flops_bf16", c.achievable_flops_bf16, 1e6, 1e19, true,
       "0 (= the peak) or in [1e6, 1e19] FLOP/s"},
      {"achievable_flops_fp32", c.achievable_flops_fp32, 1e6, 1e19, true,
       "0 (= the peak) or in [1e6, 1e19] FLOP/s"},
      {"achievable_bandwidth", c.achievable_bandwidth, 1e6, 1e16, true,
       "0 (= the peak) or in [1e6, 1e16] bytes/s"},
      {"launch_overhead_s", c.launch_overhead_s, 1e-12, 1.0, true, "0 or in [1e-12, 1] seconds"},
  };
  for (const auto& band : bands) {
    const bool ok = (band.zero_allowed && band.value == 0.0) ||
                    (band.value >= band.low && band.value <= band.high);
    if (!ok) {
      throw ConfigError(source + ": ceilings." + band.field + " = " + format_number(band.value) +
                        ": must be " + band.allowed);
    }
  }
  for (size_t i = 0; i < profile.measurements.size(); ++i) {
    const OpMeasurement& m = profile.measurements[i];
    const std::string where = "measurements[" + std::to_string(i) + "].";
    if (!(m.median_s >= 1e-12 && m.median_s <= 1e6)) {
      throw ConfigError(source + ": " + where + "median_s = " + format_number(m.median_s) +
                        ": must be in [1e-12, 1e6] seconds");
    }
    if (!(m.spread >= 0.0 && std::isfinite(m.spread))) {
      throw ConfigError(source + ": " + where + "spread = " + format_number(m.spread) +
                        ": must be a finite number >= 0");
    }
  }
}

bool profile_measures_dtype(const DeviceProfile& profile, DType dtype) {
  for (const OpMeasurement& m : profile.measurements) {
    if (m.shape.dtype == dtype) {
      return true;
    }
  }
  return false;
}

void check_profile_dtype(const DeviceProfile& profile, DType dtype) {
  if (!profile.measured || profile.measurements.empty() || profile_measures_dtype(profile, dtype)) {
    return;
  }
  std::string measured;
  for (const DType d : {DType::fp32, DType::bf16, DType::fp16, DType::fp64}) {
    if (profile_measures_dtype(profile, d)) {
      measured += (measured.empty() ? "" : ", ") + std::string(to_string(d));
    }
  }
  throw ConfigError(std::string("train.dtype = ") + to_string(dtype) + ": device.profile = \"" +
                    shown_value(profile.name) + "\" measured only " + measured +
                    " ops; allowed: train.dtype = " + measured.substr(0, measured.find(',')) +
                    ", a profile measured in " + to_string(dtype) +
                    " (the profiler's dtype), or a datasheet profile");
}

void check_attention_kernel(const DeviceProfile& profile, AttentionKernel kernel) {
  if (!is_fused(kernel) || kernel == AttentionKernel::flash ||
      (profile.kernel.sm_count > 0 &&
       flash_generation_factor(profile.kernel.device_class, kernel) > 0.0)) {
    return;
  }
  const std::string head = std::string("train.attention_kernel = \"") + to_string(kernel) +
                           "\": device.profile = \"" + shown_value(profile.name) + "\" ";
  const std::string known = flash_generations_of(profile.kernel.device_class);
  if (profile.kernel.sm_count <= 0 || known.empty()) {
    throw ConfigError(head +
                      "is not a GPU kernel-model profile with a kernel.device_class (the "
                      "FlashAttention generation its attention rate describes); allowed there: "
                      "\"flash\" (the profile's own rate) or \"unfused\"");
  }
  throw ConfigError(head + "(kernel.device_class \"" + profile.kernel.device_class +
                    "\") has no published rate for it; allowed: \"flash\", \"unfused\", " + known);
}

std::string to_toml(const DeviceProfile& profile) {
  std::ostringstream out;
  out << "# modar device profile (format: profiles/README.md)\n";
  out << "name = " << toml_quote(profile.name) << "\n";
  out << "backend = " << toml_quote(profile.backend) << "\n";
  out << "measured = " << (profile.measured ? "true" : "false") << "\n\n";
  out << "[provenance]\n";
  for (const auto& [key, value] : profile.provenance) {
    out << toml_quote(key) << " = " << toml_quote(value) << "\n";
  }
  const DeviceCeilings& c = profile.ceilings;
  out << "\n[ceilings]\n";
  out << "peak_flops_bf16 = " << toml_float_literal(c.peak_flops_bf16) << "\n";
  out << "peak_flops_fp32 = " << toml_float_literal(c.peak_flops_fp32) << "\n";
  out << "memory_bandwidth = " << toml_float_literal(c.memory_bandwidth) << "\n";
  out << "achievable_flops_bf16 = " << toml_float_literal(c.achievable_flops_bf16) << "\n";
  out << "achievable_flops_fp32 = " << toml_float_literal(c.achievable_flops_fp32) << "\n";
  out << "achievable_bandwidth = " << toml_float_literal(c.achievable_bandwidth) << "\n";
  out << "launch_overhead_s = " << toml_float_literal(c.launch_overhead_s) << "\n";
  out << "memory_bytes = " << toml_float_literal(c.memory_bytes) << "\n";
  for (const OpMeasurement& m : profile.measurements) {
    out << "\n[[measurements]]\n";
    out << "kind = \"" << to_string(m.shape.kind) << "\"\n";
    out << "pass = \"" << to_string(m.pass) << "\"\n";
    out << "dtype = \"" << to_string(m.shape.dtype) << "\"\n";
    out << "dims = [";
    for (int d = 0; d < op_dims_count(m.shape.kind); ++d) {
      out << (d ? ", " : "") << m.shape.dims[static_cast<size_t>(d)];
    }
    out << "]\n";
    out << "median_s = " << toml_float_literal(m.median_s) << "\n";
    out << "spread = " << toml_float_literal(m.spread) << "\n";
    out << "repeats = " << m.repeats << "\n";
    if (m.rounds > 0) {
      out << "rounds = " << m.rounds << "\n";
      out << "round_spread = " << toml_float_literal(m.round_spread) << "\n";
    }
    if (m.drift) {
      out << "drift = true\n";
    }
  }
  out << detail::kernel_to_toml(profile.kernel);    // [kernel] (kernel_model/)
  out << detail::network_to_toml(profile.network);  // [network] (network.cpp)
  return out.str();
}

void save_profile_atomically(const DeviceProfile& profile, const std::string& path) {
  write_file_atomically(path, to_toml(profile), "profile file");
}

std::vector<std::string> embedded_profile_names() {
  std::vector<std::string> names;
  for (const auto& [name, text] : detail::embedded_profile_texts()) {
    names.emplace_back(name);
  }
  return names;
}

const std::string& default_profile_name() {
  static const std::string name = [] {
    for (const auto& [embedded_name, text] : detail::embedded_profile_texts()) {
      if (std::string(embedded_name) == "h200-measured") {
        return std::string("h200-measured");
      }
    }
    return std::string("h200");
  }();
  return name;
}

std::string embedded_profile_text(const std::string& name) {
  for (const auto& [embedded_name, text] : detail::embedded_profile_texts()) {
    if (name == embedded_name) {
      return text;
    }
  }
  return std::string();
}

DeviceProfile load_profile(const std::string& name_or_path) {
  if (name_or_path.empty()) {
    throw ConfigError("device.profile = \"\": must name an embedded profile or a profile file");
  }
  if (name_or_path.size() > 4096) {
    throw ConfigError("device.profile = \"" + shown_value(name_or_path) +
                      "\": must be at most 4096 characters (a profile name or a file path)");
  }
  const auto checked = [](DeviceProfile profile, const std::string& source) {
    check_profile_usable(profile, source);
    return profile;
  };
  if (!looks_like_path(name_or_path)) {
    const std::string text = embedded_profile_text(name_or_path);
    if (!text.empty()) {
      const std::string source = "embedded profile '" + name_or_path + "'";
      return checked(parse_profile_toml(text, source), source);
    }
    // Only the embedded profiles answer to a bare name: a run never reads the
    // build machine's source tree (a profile saved after the build is loaded
    // by its path).
    const std::vector<std::string> names = embedded_profile_names();
    std::string message =
        "device.profile = \"" + shown_value(name_or_path) + "\": no such profile; allowed: ";
    for (size_t i = 0; i < names.size(); ++i) {
      message += (i ? ", " : "") + names[i];
    }
    message += ", or a path to a profile .toml file";
    // "h100" means the H100 profiles (h100-80gb-dgx), not the one typo away
    // (h200): names that start with what was typed come first.
    std::vector<std::string> started;
    for (const std::string& name : names) {
      if (!name_or_path.empty() && name.rfind(name_or_path, 0) == 0) {
        started.push_back(name);
      }
    }
    const std::string suggestion =
        started.size() == 1 ? started.front() : nearest_name(name_or_path, names);
    if (started.size() > 1) {
      message += " (did you mean one of";
      for (const std::string& name : started) {
        message += " '" + name + "'";
      }
      message += "?)";
    } else if (!suggestion.empty()) {
      message += " (did you mean '" + suggestion + "'?)";
    }
    throw ConfigError(message);
  }
  return checked(parse_profile_toml(read_profile_file(name_or_path), name_or_path), name_or_path);
}

}  // namespace modar
