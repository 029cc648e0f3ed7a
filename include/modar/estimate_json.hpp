// modar/estimate_json.hpp: the JSON blocks of an estimate that more than one
// document writes: `modar estimate --json` (estimate_to_json) and each
// recommendation of `modar optimal --json` (to_json(OptimalResult)).  One
// writer per block, so the two documents cannot drift apart in the names,
// order or units of what they share.
#pragma once

#include <cstdint>
#include <string_view>

#include "modar/cost_model.hpp"

namespace modar {

class JsonWriter;
struct ClusterEstimate;

// "params": {"total", "non_embedding", "flop_active"}.
void write_params_json(JsonWriter& json, const ParamCounts& params);

// Inside an open "time" object: "step_s", "tokens_per_s", "mfu", "hfu".
void write_time_rates_json(JsonWriter& json, const TimeEstimate& time);

// Inside an open object: every part of kMemoryParts ("weights", ...,
// "workspace"), each key followed by `key_suffix` ("" or "_bytes"); bytes per device.
void write_memory_parts_json(JsonWriter& json, const MemoryBreakdown& memory,
                             std::string_view key_suffix);

// The layout fields every "parallel" block starts with: "tensor",
// "sequence_parallel", "pipeline", "virtual_stages", "data", "zero", "micro_batch".
struct ParallelLayoutJson {
  int64_t tensor = 1;
  bool sequence_parallel = false;
  int64_t context = 1;
  int64_t pipeline = 1;
  int64_t virtual_stages = 1;
  int64_t data = 1;
  int64_t zero = 0;
  int64_t micro_batch = 1;
  int64_t expert = 1;         // EP
  int64_t expert_tensor = 1;  // the resolved expert tensor size
  int64_t expert_data = 1;    // expert-data-parallel size (Megatron-Core's folding)
};
// The layout of a configuration (data = device.count / (tensor x pipeline), at least 1).
ParallelLayoutJson parallel_layout_json(const Config& config);
// The layout a cluster estimate resolved.
ParallelLayoutJson parallel_layout_json(const ClusterEstimate& cluster);
// Inside an open "parallel" (or "layout") object.
void write_parallel_layout_json(JsonWriter& json, const ParallelLayoutJson& layout);

}  // namespace modar
