// The JSON document of an estimate (`modar estimate --json`, Python to_dict()).
#include "modar/estimate_json.hpp"

#include <algorithm>
#include <string>

#include "modar/base/json.hpp"
#include "modar/cost_model.hpp"
#include "modar/parallel.hpp"

namespace modar {

void write_params_json(JsonWriter& json, const ParamCounts& params) {
  json.key("params").begin_object();
  json.field("total", params.total);
  json.field("non_embedding", params.non_embedding);
  json.field("flop_active", params.flop_active);
  json.field("experts", params.experts);  // routed experts' parameters (0 when dense)
  json.field("active", params.active);    // parameters one token touches (= total when dense)
  json.end_object();
}

void write_time_rates_json(JsonWriter& json, const TimeEstimate& time) {
  json.field("step_s", time.step_s);
  json.field("tokens_per_s", time.tokens_per_s);
  json.field("mfu", time.mfu);
  json.field("mfu_full_attention", time.mfu_full_attention);
  json.field("hfu", time.hfu);
  json.field("mfu_beyond_published", time.mfu_beyond_published);
  json.field("mfu_as_published", time.mfu_as_published);
  json.field("published_mfu", time.published_mfu);
  json.field("published_mfu_attention_flops", time.published_mfu_attention_flops);
  json.field("published_mfu_source", time.published_mfu_source);
}

void write_memory_parts_json(JsonWriter& json, const MemoryBreakdown& memory,
                             std::string_view key_suffix) {
  for (const MemoryPart& part : kMemoryParts) {
    std::string key(part.key);
    key += key_suffix;
    json.field(key, memory.*part.bytes);
  }
}

ParallelLayoutJson parallel_layout_json(const Config& config) {
  ParallelLayoutJson layout;
  layout.tensor = config.parallel.tensor;
  layout.sequence_parallel = config.parallel.sequence_parallel;
  layout.context = config.parallel.context;
  layout.pipeline = config.parallel.pipeline;
  layout.virtual_stages = config.parallel.virtual_stages;
  layout.data = std::max<int64_t>(1, config.parallel.data(config.device.count));
  layout.zero = config.parallel.zero;
  layout.micro_batch = config.train.micro_batch;
  layout.expert = config.parallel.expert;
  layout.expert_tensor = config.parallel.resolved_expert_tensor();
  layout.expert_data = std::max<int64_t>(1, config.parallel.expert_data(config.device.count));
  return layout;
}

ParallelLayoutJson parallel_layout_json(const ClusterEstimate& cluster) {
  ParallelLayoutJson layout;
  layout.tensor = cluster.tensor;
  layout.sequence_parallel = cluster.sequence_parallel;
  layout.context = cluster.context;
  layout.pipeline = cluster.pipeline;
  layout.virtual_stages = cluster.virtual_stages;
  layout.data = cluster.data;
  layout.zero = cluster.zero;
  layout.micro_batch = cluster.micro_batch;
  layout.expert = cluster.expert;
  layout.expert_tensor = cluster.expert_tensor;
  layout.expert_data = cluster.expert_data;
  return layout;
}

void write_parallel_layout_json(JsonWriter& json, const ParallelLayoutJson& layout) {
  json.field("tensor", layout.tensor);
  json.field("sequence_parallel", layout.sequence_parallel);
  json.field("context", layout.context);
  json.field("pipeline", layout.pipeline);
  json.field("virtual_stages", layout.virtual_stages);
  json.field("data", layout.data);
  json.field("zero", layout.zero);
  json.field("micro_batch", layout.micro_batch);
  json.field("expert", layout.expert);
  json.field("expert_tensor", layout.expert_tensor);
  json.field("expert_data", layout.expert_data);
}

std::string estimate_to_json(const Config& config, const DeviceProfile& profile, StepKind step,
                             const Estimate& e) {
  JsonWriter json;
  json.begin_object();
  json.field("step", to_string(step));

  json.key("config").begin_object();
  std::string section;
  for (const auto& [dotted, literal] : config_values(config)) {
    const size_t dot = dotted.find('.');
    const std::string this_section = dotted.substr(0, dot);
    if (this_section != section) {
      if (!section.empty()) {
        json.end_object();
      }
      json.key(this_section).begin_object();
      section = this_section;
    }
    json.key(dotted.substr(dot + 1)).raw(literal);
  }
  if (!section.empty()) {
    json.end_object();
  }
  json.end_object();

  const LayerCounts counts = layer_counts(config);
  json.key("shape").begin_object();
  json.field("d_head", config.model.resolved_d_head());
  json.field("n_kv_heads", config.model.resolved_kv_heads());
  json.field("d_ff", config.model.resolved_d_ff());
  json.field("routed_layers", counts.routed_layers);
  json.field("routed_tokens_per_sequence", counts.routed_tokens_per_sequence);
  json.field("dar_blocks", counts.dar_blocks);
  json.field("dar_streams", counts.dar_streams);
  json.end_object();

  write_params_json(json, e.params);

  json.key("flops").begin_object();
  json.field("forward_per_token", e.flops.forward_per_token);
  json.field("forward_attention_per_token", e.flops.forward_attention_per_token);
  json.field("forward_router_per_token", e.flops.forward_router_per_token);
  json.field("forward_dar_per_token", e.flops.forward_dar_per_token);
  json.field("backward_per_token", e.flops.backward_per_token);
  json.field("recompute_per_token", e.flops.recompute_per_token);
  json.field("train_per_token", e.flops.train_per_token);
  json.field("train_per_step", e.flops.train_per_step);
  json.field("train_per_step_causal_attention", e.flops.train_per_step_causal_attention);
  json.field("train_per_step_full_attention", e.flops.train_per_step_full_attention);
  json.field("hardware_per_step", e.flops.hardware_per_step);
  json.field("tokens_per_step", e.flops.tokens_per_step);
  json.end_object();

  json.key("memory").begin_object();
  json.field("peak_bytes", e.memory.peak);
  json.field("capacity_bytes", e.memory.capacity);
  json.field("fits", e.memory.fits);
  json.key("breakdown").begin_object();
  write_memory_parts_json(json, e.memory, "");
  json.end_object();
  json.end_object();

  json.key("time").begin_object();
  write_time_rates_json(json, e.time);
  json.field("micro_batch_s", e.time.micro_batch_s);
  json.field("optimizer_s", e.time.optimizer_s);
  json.field("grad_norm_s", e.time.grad_norm_s);
  json.field("step_overhead_s", e.time.step_overhead_s);
  json.field("micro_batch_overhead_s", e.time.micro_batch_overhead_s);
  json.field("accumulation_steps", e.time.accumulation_steps);
  json.field("calibrated", e.time.calibrated);
  json.field("extrapolated", e.time.extrapolated);
  json.field("ops_interpolated", e.time.ops_interpolated);
  json.field("ops_extrapolated", e.time.ops_extrapolated);
  json.field("ops_roofline", e.time.ops_roofline);
  json.field("ops_kernel_model", e.time.ops_kernel_model);
  json.key("by_kind").begin_array();
  for (const OpKindTime& kind : e.time.by_kind) {
    if (kind.count == 0) {
      continue;
    }
    json.begin_object();
    json.field("kind", to_string(kind.kind));
    json.field("count", kind.count);
    json.field("flops", kind.flops);
    json.field("bytes", kind.bytes);
    json.field("time_s", kind.time_s);
    json.field("share", e.time.step_s > 0 ? kind.time_s / e.time.step_s : 0.0);
    json.end_object();
  }
  json.end_array();
  json.end_object();

  if (e.cluster) {
    // The cluster model (docs/cluster.md): layout, time split, stages, comm ops.
    const ClusterEstimate& c = *e.cluster;
    json.key("parallel").begin_object();
    json.key("layout").begin_object();
    write_parallel_layout_json(json, parallel_layout_json(c));
    json.field("micro_batches", c.micro_batches);
    json.field("gpus_per_node", c.gpus_per_node);
    json.field("nodes", c.nodes);
    json.field("tensor_level", to_string(c.tensor_level));
    json.field("pipeline_level", to_string(c.pipeline_level));
    json.field("data_level", to_string(c.data_level));
    json.end_object();
    json.key("time").begin_object();
    json.field("step_s", c.step_s);
    json.field("compute_s", c.compute_s);
    json.field("exposed_comm_s", c.exposed_comm_s);
    json.field("overlapped_comm_s", c.overlapped_comm_s);
    json.field("bubble_s", c.bubble_s);
    json.field("grad_reduce_exposed_s", c.grad_reduce_exposed_s);
    json.field("param_gather_exposed_s", c.param_gather_exposed_s);
    json.field("optimizer_s", c.optimizer_s);
    json.field("grad_norm_s", c.grad_norm_s);
    json.field("step_overhead_s", c.step_overhead_s);
    json.field("slowest_stage", c.slowest_stage);
    json.field("busiest_stage", c.busiest_stage);
    json.end_object();
    json.key("depth_and_routing").begin_object();
    json.field("bank_send_bytes_uncached", c.bank_send_bytes_uncached);
    json.field("bank_send_bytes_cached", c.bank_send_bytes_cached);
    json.field("dar_replicated_s", c.dar_replicated_s);
    json.field("mod_score_gather_bytes", c.mod_score_gather_bytes);
    json.end_object();
    json.key("stages").begin_array();
    for (const StageSummary& stage : c.stages) {
      json.begin_object();
      json.field("layers", stage.layers);
      json.field("routed_layers", stage.routed_layers);
      json.key("chunk_first_layer").begin_array();
      for (int64_t v : stage.chunk_first_layer) {
        json.value(v);
      }
      json.end_array();
      json.key("chunk_layers").begin_array();
      for (int64_t v : stage.chunk_layers) {
        json.value(v);
      }
      json.end_array();
      json.field("compute_s", stage.compute_s);
      json.field("exposed_comm_s", stage.exposed_comm_s);
      json.field("send_bytes", stage.send_bytes);
      json.field("bank_send_bytes", stage.bank_send_bytes);
      json.field("params", stage.params);
      json.field("peak_bytes", stage.memory.peak);
      json.field("fits", stage.memory.fits);
      json.end_object();
    }
    json.end_array();
    json.key("comm").begin_array();
    for (const CommRecord& op : c.comm) {
      json.begin_object();
      json.field("kind", to_string(op.kind));
      json.field("label", op.label);
      json.field("group", op.group);
      json.field("pass", to_string(op.pass));
      json.field("ranks", op.ranks);
      json.field("level", to_string(op.level));
      json.field("bytes", op.bytes);
      json.field("count", op.count);
      json.field("time_s", op.time_s);
      json.field("exposed_fraction", op.exposed_fraction);
      json.end_object();
    }
    json.end_array();
    json.end_object();
  }

  json.key("conventions").begin_object();
  json.field("text", e.conventions);
  json.field("attention_flops", to_string(config.attention_flops));
  json.field("flop_per_fma", int64_t{2});
  json.field("gemm_backward_factor", 2.0);
  json.field("profile", profile.name);
  json.field("profile_measured", profile.measured);
  json.field("recompute", recompute_text(config.train));
  json.end_object();

  json.end_object();
  return json.str() + "\n";
}

}  // namespace modar
