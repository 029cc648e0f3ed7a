// modar/profile.hpp: device profiles (TOML files in profiles/, or embedded).
//
// A profile holds the device's measured (or datasheet) ceilings and, when the
// profiler made it, the measured time of each op kind over a grid of shapes.
// Prediction (cost_models/timing.cpp): inside an op kind's measured grid,
// interpolate log(time) in log(shape) space; outside, use a fitted
// efficiency x roofline; every prediction says whether it extrapolated.
// The file format is documented in profiles/README.md.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "modar/config_enums.hpp"
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
  // The profiler's interleaved rounds (docs/profiler.md, "Noise"): how many
  // rounds timed the point, the (max - min) / median of the rounds' medians,
  // and whether the drift sentinel saw the machine's speed change while it
  // was measured (after re-measuring).  0 / false in profiles without rounds.
  int64_t rounds = 0;
  double round_spread = 0.0;
  bool drift = false;
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

// ---- [kernel]: the named, settable parameters of the time model -----------
// What `modar calibrate` fits and what a user sets to describe a real stack
// (docs/kernel_model.md: each with its unit, range, default and source).
// Every efficiency is a fraction of a datasheet peak in the profile's
// [ceilings]; 0 = not set in the profile: derived from [ceilings] (the
// achievable ceilings, else the peak), so a profile without [kernel] times
// exactly as before.
//
// Memory-bound op families, each with its own achievable fraction of HBM
// bandwidth (a fused norm streams better than a gather of scattered rows).
enum class MemoryFamily : uint8_t {
  norm,            // rmsnorm
  elementwise,     // activations, residual adds, gradient accumulation
  rope,            // rotary embedding
  softmax,         // the score passes of unfused attention (softmax, dropout)
  routing,         // MoD router GEMV, top-k, MoE router softmax / top-k
  gather_scatter,  // MoD gather / scatter-add, MoE permute / unpermute
  depth_read,      // AttnRes / DAR depth reads, coefficients, bank writes
  embedding,       // embedding lookup and its gradient
  loss,            // cross-entropy
  optimizer,       // the AdamW step
  grad_norm,       // gradient norm and clipping (once per step)
};
inline constexpr int kMemoryFamilyCount = 11;
const char* to_string(MemoryFamily family);
// The family whose bandwidth fraction times a memory-bound op kind (GEMMs,
// attention and expert GEMMs: their memory-bound regime, the base fraction).
bool memory_family_of(OpKind kind, MemoryFamily* family);

struct KernelParams {
  double gemm_efficiency = 0.0;       // of peak_flops_bf16: the largest GEMMs' rate
  double attention_efficiency = 0.0;  // of peak_flops_bf16: flash attention at its best shape
  double memory_efficiency = 0.0;     // of memory_bandwidth: memory-bound kernels
  std::array<double, kMemoryFamilyCount> family_memory_efficiency{};  // 0 = memory_efficiency
  double collective_efficiency_intra_node = 0.0;  // of network.intra_node.bus_bandwidth
  double collective_efficiency_inter_node = 0.0;  // of network.inter_node.bus_bandwidth
  double step_overhead_s = 0.0;                   // host time per optimizer step (seconds)
  double micro_batch_overhead_s = 0.0;            // host time per micro-batch (seconds)
  // The share of the GEMM model's tile / wave quantization loss a GEMM pays:
  // 1 = the model's loss in full, 0 = every GEMM at the asymptote (its
  // compute is 2 m n k / rate).  A value in [0, 1]; negative = not set (1).
  double gemm_quantization = -1.0;
  // Device facts of the GPU kernel model (not fitted): sm_count > 0 engages
  // the shape-aware model (kernel_model.hpp) for every op kind the profile
  // did not measure; device_class names the published-MFU class ("a100",
  // "hopper"; docs/kernel_model.md "Trust").
  int64_t sm_count = 0;
  std::string device_class;
};

struct DeviceProfile {
  std::string name;       // "h200", "h200-measured", "cpu-generic", ...
  std::string backend;    // "cuda" | "cpu" | "datasheet"
  bool measured = false;  // false: ceilings from a datasheet, no op table
  DeviceCeilings ceilings;
  std::map<std::string, std::string> provenance;  // device, clocks, versions, date, how measured
  std::vector<OpMeasurement> measurements;
  NetworkProfile network;  // [network]; absent: single-device profile
  KernelParams kernel;     // [kernel]; unset fields derived (resolve_kernel_params)
};

// ---- trust: the best training MFU published per device class --------------
// The figure is an MFU under its source's FLOP count: `attention_flops` says
// how that count takes causal attention (full: the whole s x s square, as
// Megatron-LM's, MosaicML's and the FlashAttention-2 paper's formulas do;
// causal: half of it, modar's default).  The flag compares modar's MFU
// counted the same way (docs/kernel_model.md "Trust").
struct PublishedMfu {
  const char* device_class = "";  // "a100", "hopper"
  double mfu = 0.0;               // model FLOPs utilization, fraction
  AttentionFlops attention_flops = AttentionFlops::full;  // causal | full
  const char* source = "";        // where it was published
};
// nullptr for an unknown class (and for "").
const PublishedMfu* published_mfu_of(const std::string& device_class);
// The profile's class (kernel.device_class), or nullptr when it has none.
const PublishedMfu* published_mfu(const DeviceProfile& profile);

// The [kernel] parameters with every unset field derived: gemm_efficiency =
// achievable_flops_bf16 / peak_flops_bf16 (1 without an achievable ceiling),
// attention_efficiency = gemm_efficiency, memory_efficiency =
// achievable_bandwidth / memory_bandwidth (1 without one), each family =
// memory_efficiency, collective efficiencies 1, overheads 0.
KernelParams resolve_kernel_params(const DeviceProfile& profile);

// ---- the parameter table (what `modar calibrate` fits) ---------------------
// Each parameter by its TOML key ("kernel.gemm_efficiency",
// "ceilings.launch_overhead_s", ...), its unit and its allowed range.
struct ProfileParameter {
  std::string name;  // the TOML key, section.key
  std::string unit;  // what the number means
  double min = 0.0;  // allowed range, inclusive
  double max = 0.0;
  std::string meaning;  // one line
};
const std::vector<ProfileParameter>& profile_parameters();
// The resolved value of a parameter (defaults applied).  ConfigError for an
// unknown name (one line listing the names).
double profile_parameter(const DeviceProfile& profile, const std::string& name);
// Sets a parameter; ConfigError "<name> = <value>: must be in [min, max]
// (<unit>)" outside its range.  Setting kernel.gemm_efficiency (or
// memory_efficiency) clears ceilings.achievable_flops_bf16 (achievable_bandwidth),
// which it replaces.
void set_profile_parameter(DeviceProfile& profile, const std::string& name, double value);

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
// train.attention_kernel = a named FlashAttention generation needs a GPU
// kernel-model profile (kernel.sm_count) whose device class has a published
// rate for it (docs/kernel_model.md "Attention kernel generations");
// ConfigError naming the field, the value and what is allowed otherwise.
void check_attention_kernel(const DeviceProfile& profile, AttentionKernel kernel);
std::string to_toml(const DeviceProfile& profile);
// Write atomically (temp file + rename): a killed writer never leaves a
// half-written profile behind.
void save_profile_atomically(const DeviceProfile& profile, const std::string& path);
// Names of the embedded profiles ("h200", "cpu-generic", ...).
std::vector<std::string> embedded_profile_names();
// The TOML text an embedded profile was compiled from ("" if no such name).
std::string embedded_profile_text(const std::string& name);

}  // namespace modar
