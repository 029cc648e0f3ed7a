// The named, settable parameters of the time model (profile section [kernel])
// and the parameter table `modar calibrate` fits: names, units, ranges,
// derived defaults, the TOML reader and writer.  docs/kernel_model.md lists
// each parameter with its source.
//
// An unset [kernel] field is derived from [ceilings] (resolve_kernel_params),
// so a profile written before [kernel] existed times exactly as it did.
#include <algorithm>
#include <array>
#include <cmath>
#include <iterator>
#include <sstream>

#include "../profile_sections.hpp"
#include "../toml_text.hpp"
#include "modar/base/enum_names.hpp"
#include "modar/base/errors.hpp"
#include "modar/base/text.hpp"
#include "modar/cost_model.hpp"

namespace modar {

constexpr const char* kMemoryFamilyNames[] = {
    "norm",       "elementwise", "rope", "softmax",   "routing",  "gather_scatter",
    "depth_read", "embedding",   "loss", "optimizer", "grad_norm"};
static_assert(std::size(kMemoryFamilyNames) == kMemoryFamilyCount);
const char* to_string(MemoryFamily v) {
  return name_of(kMemoryFamilyNames, v);
}

// The family of each memory-bound kind.  GEMMs, attention and expert GEMMs
// are not listed: their memory-bound regime takes the base fraction.
struct KindFamily {
  OpKind kind;
  MemoryFamily family;
};
constexpr KindFamily kKindFamilies[] = {
    {OpKind::rmsnorm, MemoryFamily::norm},
    {OpKind::elementwise, MemoryFamily::elementwise},
    {OpKind::rope, MemoryFamily::rope},
    {OpKind::router, MemoryFamily::routing},
    {OpKind::topk, MemoryFamily::routing},
    {OpKind::moe_topk, MemoryFamily::routing},
    {OpKind::gather, MemoryFamily::gather_scatter},
    {OpKind::scatter_add, MemoryFamily::gather_scatter},
    {OpKind::permute, MemoryFamily::gather_scatter},
    {OpKind::unpermute, MemoryFamily::gather_scatter},
    {OpKind::depth_read_prefix, MemoryFamily::depth_read},
    {OpKind::depth_read_merge, MemoryFamily::depth_read},
    {OpKind::dar_coefficients, MemoryFamily::depth_read},
    {OpKind::dar_write, MemoryFamily::depth_read},
    {OpKind::embedding, MemoryFamily::embedding},
    {OpKind::cross_entropy, MemoryFamily::loss},
    {OpKind::optimizer_update, MemoryFamily::optimizer},
};
constexpr int kNoFamily = -1;

// kKindFamilies by kind (kNoFamily: a compute kind), built once at compile time.
constexpr std::array<int, kOpKindCount> kFamilyByKind = [] {
  std::array<int, kOpKindCount> by_kind{};
  by_kind.fill(kNoFamily);
  for (const KindFamily& row : kKindFamilies)
    by_kind[static_cast<size_t>(row.kind)] = static_cast<int>(row.family);
  return by_kind;
}();
// Each kind listed once, and every kind but the three compute kinds listed: a
// new kind fails here until it is given a family (or joins the compute kinds).
static_assert(std::size(kKindFamilies) + 3 == kOpKindCount);
static_assert(std::count(kFamilyByKind.begin(), kFamilyByKind.end(), kNoFamily) == 3);
static_assert(kFamilyByKind[static_cast<size_t>(OpKind::gemm)] == kNoFamily &&
              kFamilyByKind[static_cast<size_t>(OpKind::attention)] == kNoFamily &&
              kFamilyByKind[static_cast<size_t>(OpKind::expert_gemm)] == kNoFamily);

bool memory_family_of(OpKind kind, MemoryFamily* family) {
  const int found = kFamilyByKind[static_cast<size_t>(kind)];
  if (found == kNoFamily)
    return false;
  *family = static_cast<MemoryFamily>(found);
  return true;
}

namespace {

constexpr int64_t kMaxSmCount = 1024;

// The best MFU published per device class for bf16 training, each with the
// FLOP count it was computed with (docs/kernel_model.md "Trust": why these).
constexpr PublishedMfu kPublishedMfu[] = {
    {"a100", 0.72, AttentionFlops::full,
     "Dao 2023, FlashAttention-2 (arXiv 2307.08691) Table 1: GPT-style 2.7B at 8k context on "
     "8 A100-80GB SXM, bf16, 225 TFLOP/s per GPU = 72% MFU, FLOPs by Megatron-LM's formula "
     "(the whole attention square)"},
    {"hopper", 0.5937, AttentionFlops::full,
     "NVIDIA dgxc-benchmarking llama3.1/README_8b.md (commit 143b90dd): Llama 3.1 8B, NeMo "
     "24.09, BF16, 8 H100, 12.91 s per step, 59.37% MFU, FLOPs by its formula (the whole "
     "attention square)"},
};

std::string device_classes_allowed() {
  std::string text = "must be one of ";
  for (size_t i = 0; i < std::size(kPublishedMfu); ++i) {
    text += (i ? ", \"" : "\"") + std::string(kPublishedMfu[i].device_class) + "\"";
  }
  return text + " (the published-MFU class, docs/kernel_model.md)";
}

// One row of the parameter table.  `slot` is where the value lives in a
// profile (nullptr-free: every row has one).
struct Row {
  ProfileParameter parameter;
  double* (*slot)(DeviceProfile&);
  bool zero_is_a_value = false;  // unset is negative, not 0 (0 is in the range and written)
};

constexpr double kMinEfficiency = 0.01;

// The field of a profile a row reads and writes: section.*field (ceilings or kernel).
template <auto Section, auto Field>
double* slot(DeviceProfile& p) {
  return &(p.*Section.*Field);
}
template <auto Field>
constexpr auto kernel_slot = &slot<&DeviceProfile::kernel, Field>;
template <MemoryFamily F>
double* family_slot(DeviceProfile& p) {
  return &p.kernel.family_memory_efficiency[static_cast<size_t>(F)];
}

template <MemoryFamily F>
Row family_row(const char* what) {
  return {{std::string("kernel.memory_efficiency_") + to_string(F),
           "fraction of ceilings.memory_bandwidth", kMinEfficiency, 1.0,
           std::string("bandwidth fraction of ") + what + " (default: kernel.memory_efficiency)"},
          &family_slot<F>};
}

const std::vector<Row>& rows() {
  static const std::vector<Row> table = {
      {{"kernel.gemm_efficiency", "fraction of ceilings.peak_flops_bf16", kMinEfficiency, 1.0,
        "the rate the largest 16-bit GEMMs reach (maximum achievable matmul FLOPS)"},
       kernel_slot<&KernelParams::gemm_efficiency>},
      {{"kernel.gemm_quantization", "fraction of the GEMM model's tile / wave quantization loss",
        0.0, 1.0,
        "the share of the modelled tile / wave quantization loss GEMMs pay (1: all, 0: none)"},
       kernel_slot<&KernelParams::gemm_quantization>,
       true},
      {{"kernel.attention_efficiency", "fraction of ceilings.peak_flops_bf16", kMinEfficiency, 1.0,
        "the rate flash attention reaches at its best shape (default: gemm_efficiency)"},
       kernel_slot<&KernelParams::attention_efficiency>},
      {{"kernel.memory_efficiency", "fraction of ceilings.memory_bandwidth", kMinEfficiency, 1.0,
        "the bandwidth memory-bound kernels reach (each family below defaults to it)"},
       kernel_slot<&KernelParams::memory_efficiency>},
      family_row<MemoryFamily::norm>("RMSNorm"),
      family_row<MemoryFamily::elementwise>("activations, residual adds, gradient accumulation"),
      family_row<MemoryFamily::rope>("rotary embedding"),
      family_row<MemoryFamily::softmax>("unfused attention's softmax and dropout passes"),
      family_row<MemoryFamily::routing>("the MoD / MoE router and top-k"),
      family_row<MemoryFamily::gather_scatter>("MoD gather / scatter-add, MoE permute"),
      family_row<MemoryFamily::depth_read>("AttnRes / DAR depth reads and writes"),
      family_row<MemoryFamily::embedding>("the embedding lookup"),
      family_row<MemoryFamily::loss>("cross-entropy"),
      family_row<MemoryFamily::optimizer>("the AdamW step"),
      family_row<MemoryFamily::grad_norm>("gradient norm and clipping"),
      {{"kernel.collective_efficiency_intra_node", "fraction of network.intra_node.bus_bandwidth",
        kMinEfficiency, 1.0, "the bus bandwidth a job's collectives get inside a node"},
       kernel_slot<&KernelParams::collective_efficiency_intra_node>},
      {{"kernel.collective_efficiency_inter_node", "fraction of network.inter_node.bus_bandwidth",
        kMinEfficiency, 1.0, "the bus bandwidth a job's collectives get between nodes"},
       kernel_slot<&KernelParams::collective_efficiency_inter_node>},
      {{"kernel.step_overhead_s", "seconds per optimizer step", 0.0, 60.0,
        "host time per step (data loading, logging, synchronisation)"},
       kernel_slot<&KernelParams::step_overhead_s>},
      {{"kernel.micro_batch_overhead_s", "seconds per micro-batch", 0.0, 1.0,
        "host time per micro-batch (Python, kernel launches not hidden)"},
       kernel_slot<&KernelParams::micro_batch_overhead_s>},
      {{"ceilings.launch_overhead_s", "seconds per kernel", 0.0, 1.0,
        "the launch / latency cost of every kernel"},
       &slot<&DeviceProfile::ceilings, &DeviceCeilings::launch_overhead_s>},
  };
  return table;
}

const Row& find_row(const std::string& name) {
  for (const Row& row : rows()) {
    if (row.parameter.name == name) {
      return row;
    }
  }
  std::string message =
      "profile parameter '" + shown_value(name) + "': no such parameter; allowed: ";
  std::vector<std::string> names;
  for (const Row& row : rows()) {
    message += (names.empty() ? "" : ", ") + row.parameter.name;
    names.push_back(row.parameter.name);
  }
  const std::string suggestion = nearest_name(name, names);
  if (!suggestion.empty()) {
    message += " (did you mean '" + suggestion + "'?)";
  }
  throw ConfigError(message);
}

std::string range_text(const ProfileParameter& p) {
  return "must be in [" + format_number(p.min) + ", " + format_number(p.max) + "] (" + p.unit + ")";
}

void check_in_range(const ProfileParameter& p, double value, const std::string& where) {
  if (!std::isfinite(value) || value < p.min || value > p.max) {
    throw ConfigError(where + p.name + " = " + format_number(value) + ": " + range_text(p));
  }
}

// The achievable ceiling a [kernel] efficiency replaces (both set: ambiguous).
void check_not_both(const DeviceProfile& profile, const std::string& source) {
  const KernelParams& k = profile.kernel;
  if (k.gemm_efficiency > 0.0 && profile.ceilings.achievable_flops_bf16 > 0.0) {
    throw ConfigError(source + ": kernel.gemm_efficiency = " + format_number(k.gemm_efficiency) +
                      " beside ceilings.achievable_flops_bf16 = " +
                      format_number(profile.ceilings.achievable_flops_bf16) +
                      ": set one of them (gemm_efficiency x peak_flops_bf16 replaces the "
                      "achievable ceiling)");
  }
  if (k.memory_efficiency > 0.0 && profile.ceilings.achievable_bandwidth > 0.0) {
    throw ConfigError(source +
                      ": kernel.memory_efficiency = " + format_number(k.memory_efficiency) +
                      " beside ceilings.achievable_bandwidth = " +
                      format_number(profile.ceilings.achievable_bandwidth) +
                      ": set one of them (memory_efficiency x memory_bandwidth replaces the "
                      "achievable ceiling)");
  }
}

}  // namespace

const PublishedMfu* published_mfu_of(const std::string& device_class) {
  for (const PublishedMfu& entry : kPublishedMfu) {
    if (!device_class.empty() && device_class == entry.device_class) {
      return &entry;
    }
  }
  return nullptr;
}

const PublishedMfu* published_mfu(const DeviceProfile& profile) {
  return published_mfu_of(profile.kernel.device_class);
}

KernelParams resolve_kernel_params(const DeviceProfile& profile) {
  const DeviceCeilings& c = profile.ceilings;
  KernelParams k = profile.kernel;
  if (k.gemm_efficiency <= 0.0) {
    k.gemm_efficiency = c.achievable_flops_bf16 > 0.0 && c.peak_flops_bf16 > 0.0
                            ? c.achievable_flops_bf16 / c.peak_flops_bf16
                            : 1.0;
  }
  if (k.attention_efficiency <= 0.0) {
    k.attention_efficiency = k.gemm_efficiency;
  }
  if (k.memory_efficiency <= 0.0) {
    k.memory_efficiency = c.achievable_bandwidth > 0.0 && c.memory_bandwidth > 0.0
                              ? c.achievable_bandwidth / c.memory_bandwidth
                              : 1.0;
  }
  for (double& family : k.family_memory_efficiency) {
    if (family <= 0.0) {
      family = k.memory_efficiency;
    }
  }
  if (k.gemm_quantization < 0.0) {
    k.gemm_quantization = 1.0;
  }
  if (k.collective_efficiency_intra_node <= 0.0) {
    k.collective_efficiency_intra_node = 1.0;
  }
  if (k.collective_efficiency_inter_node <= 0.0) {
    k.collective_efficiency_inter_node = 1.0;
  }
  return k;
}

KernelRates kernel_rates(const DeviceProfile& profile) {
  const DeviceCeilings& c = profile.ceilings;
  const KernelParams& set = profile.kernel;
  KernelRates r;
  r.params = resolve_kernel_params(profile);
  // An explicit efficiency x the peak; else the achievable ceiling itself (not
  // achievable / peak x peak: a profile without [kernel] times bit for bit as
  // before).
  r.gemm_flops = set.gemm_efficiency > 0.0 ? set.gemm_efficiency * c.peak_flops_bf16
                                           : c.roofline_flops(DType::bf16);
  r.attention_flops =
      set.attention_efficiency > 0.0 ? set.attention_efficiency * c.peak_flops_bf16 : r.gemm_flops;
  r.fp32_flops = c.roofline_flops(DType::fp32);
  r.bandwidth = set.memory_efficiency > 0.0 ? set.memory_efficiency * c.memory_bandwidth
                                            : c.roofline_bandwidth();
  for (size_t f = 0; f < r.family_bandwidth.size(); ++f) {
    const double own = set.family_memory_efficiency[f];
    r.family_bandwidth[f] = own > 0.0 ? own * c.memory_bandwidth : r.bandwidth;
  }
  r.launch_overhead_s = c.launch_overhead_s;
  return r;
}

const std::vector<ProfileParameter>& profile_parameters() {
  static const std::vector<ProfileParameter> parameters = [] {
    std::vector<ProfileParameter> out;
    for (const Row& row : rows()) {
      out.push_back(row.parameter);
    }
    return out;
  }();
  return parameters;
}

double profile_parameter(const DeviceProfile& profile, const std::string& name) {
  const Row& row = find_row(name);
  DeviceProfile resolved = profile;
  resolved.kernel = resolve_kernel_params(profile);
  return *row.slot(resolved);
}

void set_profile_parameter(DeviceProfile& profile, const std::string& name, double value) {
  const Row& row = find_row(name);
  check_in_range(row.parameter, value, "");
  *row.slot(profile) = value;
  if (name == "kernel.gemm_efficiency") {
    profile.ceilings.achievable_flops_bf16 = 0.0;
  } else if (name == "kernel.memory_efficiency") {
    profile.ceilings.achievable_bandwidth = 0.0;
  }
}

namespace detail {

void parse_kernel_section(const toml::table& root, const std::string& source,
                          DeviceProfile& profile) {
  const toml::table* table = optional_section_table(root, "kernel", source);
  if (table == nullptr) {
    return;
  }
  for (const auto& [key, value] : *table) {
    const std::string name = "kernel." + std::string(key.str());
    if (name == "kernel.sm_count") {
      if (!value.is_integer() || value.as_integer()->get() < 1 ||
          value.as_integer()->get() > kMaxSmCount) {
        throw ConfigError(source + ": kernel.sm_count = " + toml_node_text(value) +
                          ": must be an integer in [1, " + std::to_string(kMaxSmCount) +
                          "] (streaming multiprocessors of the GPU)");
      }
      profile.kernel.sm_count = value.as_integer()->get();
      continue;
    }
    if (name == "kernel.device_class") {
      const std::string text = value.is_string() ? value.as_string()->get() : std::string();
      if (published_mfu_of(text) == nullptr) {
        throw ConfigError(source + ": kernel.device_class = " + toml_node_text(value) + ": " +
                          device_classes_allowed());
      }
      profile.kernel.device_class = text;
      continue;
    }
    const Row* row = nullptr;
    for (const Row& candidate : rows()) {
      if (candidate.parameter.name == name) {
        row = &candidate;
      }
    }
    if (row == nullptr) {
      std::string allowed = "sm_count, device_class";
      for (const Row& candidate : rows()) {
        if (candidate.parameter.name.rfind("kernel.", 0) == 0) {
          allowed += ", " + candidate.parameter.name.substr(7);
        }
      }
      throw ConfigError(source + ": unknown key '" + name + "'; allowed: " + allowed);
    }
    const std::optional<double> number = toml_number(value);
    if (!number) {
      throw ConfigError(source + ": " + name + " = " + toml_node_text(value) +
                        ": must be a number; " + range_text(row->parameter));
    }
    check_in_range(row->parameter, *number, source + ": ");
    *row->slot(profile) = *number;
  }
  check_not_both(profile, source);
}

std::string kernel_to_toml(const KernelParams& kernel) {
  DeviceProfile holder;
  holder.kernel = kernel;
  std::ostringstream out;
  for (const Row& row : rows()) {
    const std::string& name = row.parameter.name;
    if (name.rfind("kernel.", 0) != 0) {
      continue;
    }
    const double value = *row.slot(holder);
    if (value > 0.0 || (row.zero_is_a_value && value == 0.0)) {
      std::string text = format_number(value);
      if (text.find_first_of(".eEn") == std::string::npos) {
        text += ".0";
      }
      out << name.substr(7) << " = " << text << "\n";
    }
  }
  if (kernel.sm_count > 0) {
    out << "sm_count = " << kernel.sm_count << "\n";
  }
  if (!kernel.device_class.empty()) {
    out << "device_class = \"" << kernel.device_class << "\"\n";
  }
  const std::string body = out.str();
  return body.empty() ? std::string() : "\n[kernel]\n" + body;
}

}  // namespace detail
}  // namespace modar
