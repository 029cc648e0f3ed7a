// modar/cost_model.hpp: lower a Config into ops and count FLOPs, parameters,
// memory and time.  This is the only place those numbers are computed; the
// planner and the bindings call it, never recompute.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "modar/config.hpp"
#include "modar/ops.hpp"
#include "modar/profile.hpp"

namespace modar {

enum class StepKind { train, decode };

// Lowering: the op list of one step (training: forward + backward (+ recompute)
// of one micro-batch plus the optimizer update; decode: one token per sequence
// with a KV cache of seq_len tokens).  Identical layers are merged through
// OpRecord::multiplicity.
std::vector<OpRecord> lower(const Config& config, StepKind step = StepKind::train);

struct ParamCounts {
  double total = 0;
  double non_embedding = 0;
  double flop_active = 0;  // N_f: forward FLOPs per token without attention / 2
};

struct FlopCounts {
  double forward_per_token = 0;
  double backward_per_token = 0;
  double recompute_per_token = 0;
  double train_per_token = 0;  // model FLOPs: forward + backward
  double train_per_step = 0;   // model FLOPs per optimizer step (global batch)
  double hardware_per_step = 0;  // + recompute
};

struct MemoryBreakdown {  // bytes per device
  double weights = 0;
  double gradients = 0;
  double optimizer = 0;
  double activations = 0;  // saved for backward at the peak
  double dar_bank = 0;     // history bank + per-token fp32 statistics
  double kv_cache = 0;     // decode only
  double router_buffers = 0;
  double workspace = 0;    // transient peak (logits, attention scratch)
  double peak = 0;         // peak over the step (not a sum of buckets)
  bool fits = true;        // peak <= device memory
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
  bool extrapolated = false;  // some op was outside the profile's measured grid
  std::array<OpKindTime, kOpKindCount> by_kind{};
};

struct Estimate {
  ParamCounts params;
  FlopCounts flops;
  MemoryBreakdown memory;
  TimeEstimate time;
  std::string conventions;  // human-readable summary of the counting conventions
};

ParamCounts count_params(const Config& config);
FlopCounts count_flops(const Config& config);
MemoryBreakdown estimate_memory(const Config& config, const DeviceProfile& profile,
                                StepKind step = StepKind::train);
// Predicted time of one op (one copy) on a profile; sets *extrapolated.
double predict_op_time_s(const OpRecord& op, const DeviceProfile& profile, bool* extrapolated);
Estimate estimate(const Config& config, const DeviceProfile& profile,
                  StepKind step = StepKind::train);

}  // namespace modar
