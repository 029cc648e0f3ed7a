// modar/cost_model.hpp: lower a Config into ops and count FLOPs, parameters,
// memory and time.  This is the only place those numbers are computed; the
// planner and the bindings call it, never recompute.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "modar/config.hpp"
#include "modar/ops.hpp"
#include "modar/profile.hpp"

namespace modar {

enum class StepKind { train, decode };
const char* to_string(StepKind step);

// FLOPs (per the counting convention) and minimum bytes moved by ONE op of
// this shape in this pass.  The single place where per-op costs are defined:
// the lowering, the timing model and the profiler all call it.  Attention
// FLOPs follow `convention`; the time model uses AttentionFlops::flash, which
// is what a causal FlashAttention kernel executes (half square forward, 2.5x
// forward in backward).
struct OpCost {
  double flops = 0.0;
  double bytes = 0.0;
};
OpCost op_cost(const OpShape& shape, Pass pass, AttentionFlops convention = AttentionFlops::causal);

// Lowering: the op list of one step (training: forward + backward (+ recompute)
// of one micro-batch plus the optimizer update; decode: one token per sequence
// with a KV cache of seq_len tokens).  Identical layers are merged through
// OpRecord::multiplicity.  Order: forward ops, then recompute ops, then
// backward ops (reverse layer order), then the optimizer update.
std::vector<OpRecord> lower(const Config& config, StepKind step = StepKind::train);
// The same into a caller-owned buffer: it is cleared and refilled, its
// capacity kept, so repeated lowering allocates nothing after warm-up.
using OpList = std::vector<OpRecord>;
void lower_into(const Config& config, StepKind step, OpList& ops);

// Shape facts of a configuration that several counts share.
struct LayerCounts {
  int64_t routed_layers = 0;               // MoD-routed layers
  int64_t full_layers = 0;                 // n_layers - routed_layers
  int64_t routed_tokens_per_sequence = 0;  // k (training / prefill)
  int64_t dar_blocks = 0;                  // N (0 without DAR)
  int64_t dar_streams = 0;                 // n (0 without DAR, 1 for attnres)
  int64_t moe_full_layers = 0;             // MoE layers among the full layers
  int64_t moe_routed_layers = 0;           // MoE layers among the MoD-routed ones (staged)
};
LayerCounts layer_counts(const Config& config);

struct ParamCounts {
  double total = 0;
  double non_embedding = 0;
  double flop_active = 0;  // N_f: forward FLOPs per token without attention / 2
  // Experts (docs/model.md experts): the routed experts' parameters (all experts of all MoE
  // layers, inside total), and the parameters one token touches (total less
  // the experts it is not routed to: top_k of E, times E / (E + Z) for
  // integrated MoDE's null experts).  Dense: experts = 0, active = total.
  double experts = 0;
  double active = 0;
};

struct FlopCounts {
  // All per-token numbers divide by the tokens of the step (training: micro
  // batch x seq_len; decode: the new tokens, one per sequence).
  double forward_per_token = 0;
  double forward_attention_per_token = 0;  // the sequence-attention part of forward
  double forward_router_per_token = 0;     // MoD router / predictor part of forward
  double forward_dar_per_token = 0;        // AttnRes / DAR depth-read part of forward
  double backward_per_token = 0;
  double recompute_per_token = 0;
  double train_per_token = 0;    // model FLOPs: forward + backward
  double train_per_step = 0;     // model FLOPs per optimizer step (global batch)
  double hardware_per_step = 0;  // + recompute
  double tokens_per_step = 0;    // global batch x seq_len (decode: new tokens)
  // train_per_step with every attention op counted by one convention,
  // whatever counting.attention_flops says: causal (half of a causal op's
  // s_q x s_k square) and full (the whole square: Megatron-LM's, MosaicML's
  // and most published MFUs' count).  Backward 2x forward in both.
  double train_per_step_causal_attention = 0;
  double train_per_step_full_attention = 0;
};

struct MemoryBreakdown {  // bytes per device
  double weights = 0;
  double gradients = 0;
  double optimizer = 0;
  double activations = 0;  // saved for backward at the peak
  double dar_bank = 0;     // history bank + per-token fp32 statistics
  // AttnRes / DAR: the partial block states P^{i-1} (and their fp32 rstd) that
  // each branch at block position i >= 2 merges, one per stream, kept for the
  // merge's backward (docs/moe.md "Every term of the increments").
  double dar_partials = 0;
  // DAR only: each branch's output y, kept for the write gates' gradient
  // d beta = <dP, y> (the branch itself does not keep its output).
  double dar_branch_outputs = 0;
  // dar.kernel = prefix only: what the DAR paper's prefix kernels keep for the
  // backward beyond the bank (fp32 logits and shifted scores, the retrieved
  // states; docs/moe.md "The DAR paper's implementation").
  double dar_retained = 0;
  // dar.kernel = prefix with the packs kept (dar.packs; the paper's AttnRes
  // arm): every read's packed normalised keys and values, kept for the
  // backward instead of rebuilt (docs/moe.md "Which packs are kept").
  double dar_packs = 0;
  double kv_cache = 0;     // decode only
  double router_buffers = 0;
  double workspace = 0;  // transient peak (logits, attention scratch)
  double peak = 0;       // peak over the step (not a sum of buckets)
  double capacity = 0;   // the device's memory (profile)
  bool fits = true;      // peak <= device memory
};

// The parts of a MemoryBreakdown (every field but peak, capacity and fits),
// one row each, in the order every writer lists them: `modar estimate`'s
// memory table, the JSON documents (estimate, optimal, layout), the Python
// estimate columns (memory.breakdown.<key>), the planner's binding
// constraint and the peak's sum.  Every part is bytes per device.  A new part
// is a field above and a row here.
struct MemoryPart {
  double MemoryBreakdown::*bytes;  // the field
  const char* key;                 // JSON / Python name (planner JSON: key + "_bytes")
  const char* label;               // text tables and messages
  bool listed_when_zero;           // text tables skip the DAR-only parts when 0
};
inline constexpr MemoryPart kMemoryParts[] = {
    {&MemoryBreakdown::weights, "weights", "weights", true},
    {&MemoryBreakdown::gradients, "gradients", "gradients", true},
    {&MemoryBreakdown::optimizer, "optimizer", "optimizer states", true},
    {&MemoryBreakdown::activations, "activations", "activations", true},
    {&MemoryBreakdown::dar_bank, "dar_bank", "dar bank", true},
    {&MemoryBreakdown::dar_partials, "dar_partials", "dar partials P^{i-1}", false},
    {&MemoryBreakdown::dar_branch_outputs, "dar_branch_outputs", "dar branch outputs y", false},
    {&MemoryBreakdown::dar_retained, "dar_retained", "dar retained (prefix kernels)", false},
    {&MemoryBreakdown::dar_packs, "dar_packs", "dar packs kept (prefix kernels)", false},
    {&MemoryBreakdown::kv_cache, "kv_cache", "kv cache", true},
    {&MemoryBreakdown::router_buffers, "router_buffers", "router buffers", true},
    {&MemoryBreakdown::workspace, "workspace", "workspace (peak transient)", true},
};

struct OpKindTime {
  OpKind kind;
  int64_t count = 0;  // op instances (with multiplicity)
  double flops = 0;
  double bytes = 0;
  double time_s = 0;
};

struct TimeEstimate {
  double step_s = 0;        // one optimizer step (all micro-batches)
  double tokens_per_s = 0;  // per the whole job (all devices)
  double mfu = 0;           // model FLOPs / (time * peak * devices)
  double hfu = 0;
  // The MFU with attention's whole s x s square counted (flops.
  // train_per_step_full_attention), the count of the published MFUs.
  double mfu_full_attention = 0;
  bool extrapolated = false;       // some op was outside the profile's measured grid
  bool calibrated = false;         // the profile had measurements for some op of the step
  double micro_batch_s = 0;        // forward + backward (+ recompute) of one micro-batch
  double optimizer_s = 0;          // the optimizer update (once per step)
  double grad_norm_s = 0;          // gradient norm and clipping (once per step)
  // Host time (profile kernel.step_overhead_s, kernel.micro_batch_overhead_s):
  // once per step, and once per micro-batch (inside micro_batch_s).
  double step_overhead_s = 0;
  double micro_batch_overhead_s = 0;
  int64_t accumulation_steps = 1;  // micro-batches per optimizer step per device
  int64_t ops_interpolated = 0;    // op records timed inside a measured grid
  int64_t ops_extrapolated = 0;    // op records timed by fitted efficiency x roofline
  int64_t ops_roofline = 0;        // op records with no measurement of their kind
  int64_t ops_kernel_model = 0;    // op records timed by the GPU kernel model (not measured)
  // Trust (docs/kernel_model.md "Trust"): the MFU, counted as the published
  // figure counts its FLOPs (mfu_as_published, under
  // published_mfu_attention_flops), exceeds the best published for the
  // profile's device class (kernel.device_class); published_mfu is that
  // figure (0: the profile names no class) and published_mfu_source where it
  // was published (static strings).
  bool mfu_beyond_published = false;
  double published_mfu = 0;
  double mfu_as_published = 0;
  const char* published_mfu_attention_flops = "";
  const char* published_mfu_source = "";
  std::array<OpKindTime, kOpKindCount> by_kind{};
};

struct ClusterEstimate;  // modar/parallel.hpp

struct Estimate {
  ParamCounts params;
  FlopCounts flops;
  MemoryBreakdown memory;
  TimeEstimate time;
  std::string conventions;  // human-readable summary of the counting conventions
  // Set by estimate() for a training step when [parallel] is not at its
  // defaults or device.count > 1 (modar/parallel.hpp): then memory is the
  // busiest device's and time the cluster step; by_kind stays the ops of one
  // model replica's micro-batches on one device.
  std::shared_ptr<const ClusterEstimate> cluster;
};

// The rates the time model uses, resolved from a profile's [ceilings] and
// [kernel] (profile.hpp): an explicit [kernel] efficiency x its datasheet
// peak, else the [ceilings] achievable figure, else the peak.
struct KernelRates {
  double gemm_flops = 0.0;       // FLOP/s of 16-bit GEMMs (kernel.gemm_efficiency)
  double attention_flops = 0.0;  // FLOP/s of 16-bit attention (kernel.attention_efficiency)
  double fp32_flops = 0.0;       // FLOP/s of fp32 / fp64 ops ([ceilings] only)
  double bandwidth = 0.0;        // bytes/s: GEMMs' and attention's memory-bound regime
  std::array<double, kMemoryFamilyCount> family_bandwidth{};  // bytes/s per family
  double launch_overhead_s = 0.0;
  KernelParams params;  // every field resolved (resolve_kernel_params)
  // The bandwidth of an op kind: its family's, else the base.
  double bandwidth_of(OpKind kind) const {
    MemoryFamily family = MemoryFamily::elementwise;
    return memory_family_of(kind, &family) ? family_bandwidth[static_cast<size_t>(family)]
                                           : bandwidth;
  }
  double bandwidth_of(MemoryFamily family) const {
    return family_bandwidth[static_cast<size_t>(family)];
  }
};
KernelRates kernel_rates(const DeviceProfile& profile);

// Time prediction from a profile, with the measurements pre-indexed by op
// kind / pass / dtype (build once, reuse for many configurations).  Inside a
// measured grid: multilinear interpolation of log(time) in log(dims);
// outside: the kind's fitted efficiency (geometric mean of measured /
// roofline) times the roofline; kinds never measured: plain roofline
// max(flops / peak, bytes / bandwidth) + launch overhead.
class TimingModel {
 public:
  explicit TimingModel(const DeviceProfile& profile);
  ~TimingModel();
  TimingModel(TimingModel&&) noexcept;
  TimingModel& operator=(TimingModel&&) noexcept;
  TimingModel(const TimingModel&) = delete;
  TimingModel& operator=(const TimingModel&) = delete;

  // roofline: the plain roofline of a profile without kernel.sm_count;
  // kernel_model: the shape-aware GPU kernel model (kernel_model.hpp).
  enum class Source : uint8_t { roofline, interpolated, extrapolated, kernel_model };
  // Seconds for one copy of an op of this shape; *source says how it was obtained.
  double op_time_s(const OpShape& shape, Pass pass, Source* source) const;
  // The same for a lowered op, reusing its FLOPs / bytes (the fast path).
  double op_time_s(const OpRecord& op, Source* source) const;
  double roofline_s(const OpShape& shape, Pass pass) const;
  // `seconds` of a memory-bound op of `kind` (one copy, launch included) at
  // `efficiency` x ceilings.memory_bandwidth instead of its family's rate:
  // the time above the launch scaled by family rate / that rate.  Unchanged
  // for efficiency <= 0, GEMMs and attention, or a profile without a bandwidth.
  double at_memory_efficiency_s(double seconds, OpKind kind, double efficiency) const;
  // The profile this model reads; it must outlive the TimingModel.
  const DeviceProfile& profile() const { return *profile_; }
  // The profile's resolved rates ([ceilings] and [kernel]).
  const KernelRates& rates() const { return rates_; }
  // True when ops the profile did not measure use the GPU kernel model.
  bool shape_aware() const { return shape_aware_; }

 private:
  struct Index;
  double roofline_from_cost_s(OpKind kind, DType dtype, double executed_flops, double bytes) const;
  double calibrated_s(const OpShape& shape, Pass pass, double roofline, Source* source) const;
  // An op the profile did not measure: the kernel model (shape-aware GPU
  // profiles) or the roofline.
  double datasheet_s(const OpShape& shape, Pass pass, double roofline, Source* source) const;
  double calibrated_uncached_s(const OpShape& shape, Pass pass, double roofline,
                               Source* source) const;
  const DeviceProfile* profile_;
  Index* index_;              // null when the profile has no measurements
  uint64_t id_ = 0;           // unique per model: keys the per-thread kernel-model cache
  bool shape_aware_ = false;  // kernel.sm_count > 0: the GPU kernel model
  KernelRates rates_;
  // Per op kind: 1 / the 16-bit FLOP rate and 1 / the bandwidth (0 when unknown).
  std::array<double, kOpKindCount> seconds_per_flop16_{};
  std::array<double, kOpKindCount> seconds_per_byte_{};
  double seconds_per_flop_fp32_ = 0.0;
  double launch_overhead_s_ = 0.0;
};

// Inline: estimate_into calls it once per op record.
inline double TimingModel::roofline_from_cost_s(OpKind kind, DType dtype, double executed_flops,
                                                double bytes) const {
  const size_t k = static_cast<size_t>(kind);
  const double per_flop = (dtype == DType::fp32 || dtype == DType::fp64) ? seconds_per_flop_fp32_
                                                                         : seconds_per_flop16_[k];
  return std::max(executed_flops * per_flop, bytes * seconds_per_byte_[k]) + launch_overhead_s_;
}

inline double TimingModel::op_time_s(const OpRecord& op, Source* source) const {
  if (op.memory_efficiency > 0.0) {
    OpRecord family_rate = op;
    family_rate.memory_efficiency = 0.0;
    return at_memory_efficiency_s(op_time_s(family_rate, source), op.shape.kind,
                                  op.memory_efficiency);
  }
  if (op_kind_info(op.shape.kind).timing == OpTiming::per_pass_else_gemm) {
    return op_time_s(op.shape, op.pass, source);  // may be timed as a GEMM (ops.hpp)
  }
  // Only attention FLOPs depend on the counting convention; the time uses the
  // executed ones.  Every other kind's recorded FLOPs are the executed FLOPs.
  const double executed_flops = op.shape.kind == OpKind::attention
                                    ? op_cost(op.shape, op.pass, AttentionFlops::flash).flops
                                    : op.flops;
  const double roofline =
      roofline_from_cost_s(op.shape.kind, op.shape.dtype, executed_flops, op.bytes);
  if (index_ == nullptr) {
    if (!shape_aware_) {
      *source = Source::roofline;
      return roofline;
    }
    return datasheet_s(op.shape, op.pass, roofline, source);
  }
  return calibrated_s(op.shape, op.pass, roofline, source);
}

// Sets time.mfu, hfu and mfu_full_attention from the step's FLOPs over
// time.step_s x peak_flops (the whole job's peak FLOP/s), and the published-
// MFU fields from the profile's device class: mfu_beyond_published when the
// MFU counted as the published figure is above it (docs/kernel_model.md
// "Trust").  Call after time.step_s is set.
void set_utilization(const DeviceProfile& profile, const FlopCounts& flops, double peak_flops,
                     TimeEstimate& time);

ParamCounts count_params(const Config& config);
FlopCounts count_flops(const Config& config);
// Both of the above from one validation and one lowering (the planner's
// shape search): identical numbers, half the work.
struct ParamAndFlopCounts {
  ParamCounts params;
  FlopCounts flops;
};
ParamAndFlopCounts count_params_and_flops(const Config& config);
MemoryBreakdown estimate_memory(const Config& config, const DeviceProfile& profile,
                                StepKind step = StepKind::train);
// Predicted time of one op (one copy) on a profile; sets *extrapolated.
double predict_op_time_s(const OpRecord& op, const DeviceProfile& profile, bool* extrapolated);
Estimate estimate(const Config& config, const DeviceProfile& profile,
                  StepKind step = StepKind::train);

// The hot-path form of estimate() for sweeps: `timing` pre-indexes the
// profile, the lowering streams its ops straight into the sums (nothing is
// stored; `scratch` is kept for source compatibility and left untouched),
// `out` is overwritten (its string capacity is reused).  After the first call
// it allocates nothing.  No validation: call validate() on configurations
// that did not come from a validated source.
void estimate_into(const Config& config, const TimingModel& timing, StepKind step, OpList& scratch,
                   Estimate& out);
// The part of estimate() that estimate_into() leaves out: on a training step
// with a cluster engaged (cluster_engaged(), parallel.hpp), the cluster model
// replaces the single-device memory and time of `out` and sets out.cluster.
// A no-op otherwise.  estimate() = validate + estimate_into + this.
void apply_parallel_model(const Config& config, const TimingModel& timing, StepKind step,
                          Estimate& out);
// The conventions text of a single-device estimate rewritten for its cluster
// estimate (communication is modelled there: "one stream, no communication"
// goes, the layout and the step's parts come).
std::string cluster_conventions(const std::string& single_device, const ClusterEstimate& cluster);

// The --json document of `modar estimate` (also what the Python bindings'
// Estimate.to_dict() returns): keys documented in docs/cost_model.md.
std::string estimate_to_json(const Config& config, const DeviceProfile& profile, StepKind step,
                             const Estimate& estimate);

// The counting conventions as printed in every output.
std::string conventions_text(const Config& config, const DeviceProfile& profile, StepKind step);

}  // namespace modar
