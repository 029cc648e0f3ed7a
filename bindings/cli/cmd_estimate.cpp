// `modar estimate CONFIG`: FLOPs, parameters, memory and step time of one
// configuration, as a readable report or (--json) the document described in
// docs/cost_model.md.
#include <cstdio>
#include <string>

#include "cli_util.hpp"
#include "commands.hpp"
#include "modar/base/errors.hpp"
#include "modar/base/text.hpp"
#include "modar/cost_model.hpp"
#include "modar/parallel.hpp"
#include "modar/planner.hpp"

namespace modar::cli {
namespace {

const std::vector<FlagSpec>& estimate_flags() {
  static const std::vector<FlagSpec> flags = {
      {"--set", true, true, "KEY=VALUE",
       "override a config key, e.g. mod.capacity=0.125 (repeatable)"},
      {"--attention-flops", true, false, "causal|full|flash",
       "attention FLOP convention (default: the config's counting.attention_flops, causal)"},
      config_profile_flag(),
      {"--step", true, false, "train|decode", "which step to estimate (default train)"},
      {"--ops", false, false, "", "also list every lowered op record"},
      {"--json", false, false, "", "print the JSON document instead of the report"},
      {"--megatron-args", true, false, "TEXT",
       "read the configuration from Megatron-LM arguments instead of CONFIG (docs/export.md)"},
  };
  return flags;
}

std::string model_line(const Config& c) {
  const ModelConfig& m = c.model;
  return "d_model " + std::to_string(m.d_model) + ", n_layers " + std::to_string(m.n_layers) +
         ", heads " + std::to_string(m.n_heads) + " (kv " + std::to_string(m.resolved_kv_heads()) +
         ", d_head " + std::to_string(m.resolved_d_head()) + "), d_ff " +
         std::to_string(m.resolved_d_ff()) + " " + to_string(m.mlp) + ", vocab " +
         std::to_string(m.vocab_size) +
         (m.padded_vocab(c.parallel.tensor) != m.vocab_size
              ? " (padded to " + std::to_string(m.padded_vocab(c.parallel.tensor)) + ")"
              : std::string()) +
         (m.tie_embeddings ? " (tied)" : " (untied head)") + ", seq_len " +
         std::to_string(m.seq_len) + (m.qkv_bias ? ", QKV bias" : "") +
         (m.qk_norm != QkNorm::none ? std::string(", QK-norm ") + to_string(m.qk_norm) : "");
}

std::string mod_line(const Config& c, const LayerCounts& counts) {
  if (!c.mod.enabled()) {
    return "none";
  }
  return "capacity " + format_number(c.mod.capacity) + ", every " + std::to_string(c.mod.every) +
         ", offset " + std::to_string(c.mod.offset) + ": " + std::to_string(counts.routed_layers) +
         " of " + std::to_string(c.model.n_layers) +
         " layers routed, k = " + std::to_string(counts.routed_tokens_per_sequence) +
         " tokens per sequence; g = " + to_string(c.mod.router_scale) + ", causal router " +
         to_string(c.mod.causal_router);
}

std::string dar_line(const Config& c, const LayerCounts& counts) {
  if (!c.dar.enabled()) {
    return "none";
  }
  return std::string(to_string(c.dar.variant)) + ", K = " + std::to_string(c.dar.block_layers) +
         " layers per block, N = " + std::to_string(counts.dar_blocks) +
         " blocks, n = " + std::to_string(counts.dar_streams) + " stream(s)";
}

// The cluster section (docs/cluster.md): layout, time split, stages, and
// with --ops every communication op.
std::string cluster_report(const ClusterEstimate& c, bool list_ops) {
  std::string out;
  out += "parallel    tensor " + std::to_string(c.tensor) +
         (c.sequence_parallel ? " (+SP)" : "") +
         (c.context > 1 ? " x context " + std::to_string(c.context) : std::string()) +
         " x pipeline " + std::to_string(c.pipeline);
  if (c.virtual_stages > 1) {
    out += " (interleaved, v " + std::to_string(c.virtual_stages) + ")";
  }
  out += " x data " + std::to_string(c.data);
  if (c.expert > 1 || c.expert_tensor != c.tensor) {
    // Megatron-Core's folding of the expert layers (docs/cluster.md).
    out += " (experts: expert " + std::to_string(c.expert) + " x expert tensor " +
           std::to_string(c.expert_tensor) + " x expert data " + std::to_string(c.expert_data) +
           ")";
  }
  out += ", ZeRO " + std::to_string(c.zero) +
         ", micro-batch " + std::to_string(c.micro_batch) + " x " +
         std::to_string(c.micro_batches) + " per pipeline, " + std::to_string(c.nodes) +
         " node(s) of " + std::to_string(c.gpus_per_node) + " GPUs (tensor " +
         to_string(c.tensor_level) +
         (c.context > 1 ? std::string(", context ") + to_string(c.context_level) : std::string()) +
         ", pipeline " + to_string(c.pipeline_level) + ", data " +
         to_string(c.data_level) + ")\n";
  Table split({"step time part", "seconds", "share"});
  auto row = [&](const char* name, double seconds) {
    split.add_row({name, format_seconds(seconds),
                   format_percent(c.step_s > 0 ? seconds / c.step_s : 0.0)});
  };
  const double stage_comm = c.exposed_comm_s - c.grad_reduce_exposed_s - c.param_gather_exposed_s;
  row("compute (m x slowest stage)", c.compute_s);
  row("exposed comm (TP, CP, EP, PP, ZeRO-3)", stage_comm);
  row("pipeline bubble", c.bubble_s);
  row("exposed gradient reduction", c.grad_reduce_exposed_s);
  row("exposed parameter gather", c.param_gather_exposed_s);
  row("optimizer (sharded)", c.optimizer_s);
  row("gradient norm", c.grad_norm_s);
  if (c.step_overhead_s > 0) {
    row("host time per step", c.step_overhead_s);
  }
  split.add_rule();
  row("step", c.step_s);
  out += split.render();
  out += "overlapped comm " + format_seconds(c.overlapped_comm_s) + " (hidden behind compute)\n";
  Table stages({"stage", "layers (chunks)", "routed", "compute/mb", "comm/mb", "send/mb",
                "peak memory", "fits"});
  for (size_t i = 0; i < c.stages.size(); ++i) {
    const StageSummary& s = c.stages[i];
    std::string chunks;
    for (size_t j = 0; j < s.chunk_layers.size(); ++j) {
      if (j > 0) {
        chunks += ',';  // (not a string concatenation: GCC 12 -Wrestrict false positive)
      }
      chunks += std::to_string(s.chunk_first_layer[j]);
      chunks += '+';
      chunks += std::to_string(s.chunk_layers[j]);
    }
    stages.add_row({std::to_string(i), std::to_string(s.layers) + " (" + chunks + ")",
                    std::to_string(s.routed_layers), format_seconds(s.compute_s),
                    format_seconds(s.exposed_comm_s), format_bytes(s.send_bytes),
                    format_bytes(s.memory.peak), s.memory.fits ? "yes" : "NO"});
  }
  out += "pipeline stages (per micro-batch; chunks as first layer + count)\n" + stages.render();
  if (c.bank_send_bytes_uncached > 0) {
    out += "depth bank  sent across stages per micro-batch: " +
           format_bytes(c.bank_send_bytes_cached) + " with caching on the receiving rank, " +
           format_bytes(c.bank_send_bytes_uncached) + " without\n";
  }
  if (c.dar_replicated_s > 0) {
    out += "depth reads replicated on every tensor rank (no sequence parallelism): " +
           format_seconds(c.dar_replicated_s) + " per micro-batch of repeated work\n";
  }
  if (c.mod_score_gather_bytes > 0) {
    out += "MoD router scores all-gathered under SP: " + format_bytes(c.mod_score_gather_bytes) +
           " per micro-batch\n";
  }
  if (list_ops) {
    Table comm({"label", "kind", "group", "pass", "ranks", "level", "bytes", "per step", "time",
                "exposed"});
    for (const CommRecord& op : c.comm) {
      comm.add_row({op.label, to_string(op.kind), op.group, to_string(op.pass),
                    std::to_string(op.ranks), to_string(op.level), format_bytes(op.bytes),
                    format_number(op.count), format_seconds(op.time_s),
                    format_percent(op.exposed_fraction)});
    }
    out += "communication ops (busiest stage's view; bytes per collective)\n" + comm.render();
  }
  out += "\n";
  return out;
}

// Experts (docs/moe.md): the layout of the MoE layers and their routing.
// Built by appending (GCC 12's false -Wrestrict fires on long + chains).
std::string moe_line(const Config& config) {
  const MoeConfig& moe = config.moe;
  std::string out = std::to_string(moe.experts);
  out += " experts (width ";
  out += std::to_string(moe.resolved_expert_ffn(config.model));
  out += "), top-";
  out += std::to_string(moe.top_k);
  out += ", shared ";
  out += std::to_string(moe.shared_experts);
  if (moe.shared_experts > 0) {
    out += " (width ";
    out += std::to_string(moe.shared_ffn_total(config.model) / moe.shared_experts);
    out += moe.shared_expert_gate ? " each, gated)" : " each)";
  }
  out += ", ";
  out += std::to_string(moe.moe_layers(config.model.n_layers));
  out += " MoE layers (every ";
  out += std::to_string(moe.interval);
  out += " from layer ";
  out += std::to_string(moe.first_dense);
  out += "), ";
  if (moe.dropless()) {
    out += "dropless";
  } else {
    out += "capacity factor ";
    out += format_number(moe.capacity_factor);
  }
  out += ", mode ";
  out += to_string(moe.mode);
  if (moe.mode == MoeMode::integrated) {
    out += ", null experts ";
    out += std::to_string(moe.null_experts);
  }
  out += ", load imbalance ";
  out += format_number(moe.load_imbalance);
  out += ", expert parallel ";
  out += std::to_string(config.parallel.expert);
  out += ", expert tensor ";
  out += std::to_string(config.parallel.resolved_expert_tensor());
  out += ", expert data ";
  out += std::to_string(std::max<int64_t>(1, config.parallel.expert_data(config.device.count)));
  return out;
}

std::string report(const Config& config, const DeviceProfile& profile, StepKind step,
                   const Estimate& e, const std::string& source, bool list_ops) {
  const LayerCounts counts = layer_counts(config);
  std::string out;
  out += "modar estimate: " + source + " (" + to_string(step) + " step, profile " + profile.name +
         (profile.measured ? ", measured" : ", datasheet, not measured") + ")\n\n";
  out += "model       " + model_line(config) + "\n";
  out += "mod         " + mod_line(config, counts) + "\n";
  out += "dar         " + dar_line(config, counts) + "\n";
  if (config.moe.enabled()) {
    out += "moe         " + moe_line(config) + "\n";
  }
  out += "train       micro_batch " + std::to_string(config.train.micro_batch) + ", global_batch " +
         std::to_string(config.train.global_batch > 0
                            ? config.train.global_batch
                            : config.train.micro_batch * config.device.count) +
         " sequences (" + std::to_string(e.time.accumulation_steps) +
         " micro-batch(es) per step per device), " + to_string(config.train.dtype) + ", " +
         to_string(config.train.optimizer) + ", recompute " + recompute_text(config.train) +
         ", " + std::to_string(config.device.count) + " device(s)\n\n";

  out += "parameters  total " + format_count(e.params.total) + " (" + format_sci(e.params.total) +
         "), non-embedding " + format_count(e.params.non_embedding) + ", FLOP-active N_f " +
         format_count(e.params.flop_active);
  if (config.moe.enabled()) {
    out += ", active ";
    out += format_count(e.params.active);
    out += " (routed experts ";
    out += format_count(e.params.experts);
    out += ")";
  }
  out += "\n";
  out += "FLOPs/token forward " + format_sci(e.flops.forward_per_token) + " (attention " +
         format_sci(e.flops.forward_attention_per_token, 3) + ", router " +
         format_sci(e.flops.forward_router_per_token, 3) + ", depth reads " +
         format_sci(e.flops.forward_dar_per_token, 3) + ")";
  if (step == StepKind::train) {
    out += ", backward " + format_sci(e.flops.backward_per_token) + ", train " +
           format_sci(e.flops.train_per_token);
    if (e.flops.recompute_per_token > 0) {
      out += ", recompute " + format_sci(e.flops.recompute_per_token);
    }
  }
  out += "\n";
  out += "FLOPs/step  model " + format_sci(e.flops.train_per_step) + ", hardware " +
         format_sci(e.flops.hardware_per_step) + " over " + format_count(e.flops.tokens_per_step) +
         " tokens\n\n";

  Table table({"op kind", "count", "FLOPs", "bytes", "time", "share"});
  // Cluster: the ops of one model replica on one device (before tensor /
  // pipeline splitting); shares of their own sum, not of the cluster step.
  double share_of = e.time.step_s;
  if (e.cluster) {
    share_of = 0.0;
    for (const OpKindTime& kind : e.time.by_kind) {
      share_of += kind.time_s;
    }
  }
  double flops = 0, bytes = 0;
  int64_t count = 0;
  for (const OpKindTime& kind : e.time.by_kind) {
    if (kind.count == 0) {
      continue;
    }
    table.add_row({to_string(kind.kind), std::to_string(kind.count), format_sci(kind.flops, 3),
                   format_bytes(kind.bytes), format_seconds(kind.time_s),
                   format_percent(share_of > 0 ? kind.time_s / share_of : 0.0)});
    flops += kind.flops;
    bytes += kind.bytes;
    count += kind.count;
  }
  table.add_rule();
  table.add_row({e.cluster ? "total (one replica, serial)" : "total", std::to_string(count),
                 format_sci(flops, 3), format_bytes(bytes),
                 format_seconds(e.cluster ? share_of : e.time.step_s), "100.0%"});
  out += e.cluster ? "ops per step of one model replica on ONE device (before tensor / pipeline "
                     "splitting; the cluster step is below)\n"
                   : "ops per step (all micro-batches; FLOPs of every op, counted or not)\n";
  out += table.render() + "\n";

  const MemoryBreakdown& mem = e.memory;
  Table memory({"memory per device", "bytes", ""});
  for (const MemoryPart& part : kMemoryParts) {
    const double bytes = mem.*part.bytes;
    if (part.listed_when_zero || bytes > 0.0) {
      memory.add_row({part.label, format_bytes(bytes), format_sci(bytes, 3)});
    }
  }
  memory.add_rule();
  memory.add_row({"peak", format_bytes(mem.peak), format_sci(mem.peak, 3)});
  out += memory.render();
  out += "device memory " + format_bytes(mem.capacity) + ": " +
         (mem.fits ? "fits" : "DOES NOT FIT") + "\n";
  if (!mem.fits && step == StepKind::train) {
    // What would fit, with the numbers (planner/memory_advice.cpp).
    out += "  " + memory_advice(config, profile) + "\n";
  }
  out += "\n";

  // (Appended piece by piece: one long chain trips GCC 12's false -Wrestrict.)
  out += "time        step " + format_seconds(e.time.step_s);
  out += " (micro-batch " + format_seconds(e.time.micro_batch_s);
  out += " x " + std::to_string(e.time.accumulation_steps);
  out += " + optimizer " + format_seconds(e.time.optimizer_s);
  out += " + grad norm " + format_seconds(e.time.grad_norm_s);
  if (e.time.step_overhead_s > 0) {
    out += " + host " + format_seconds(e.time.step_overhead_s);
  }
  out += "), ";
  out += format_count(e.time.tokens_per_s) + " tokens/s, MFU " + format_percent(e.time.mfu);
  if (config.attention_flops != AttentionFlops::full) {
    out += " (";
    out += to_string(config.attention_flops);
    out += " attention; " + format_percent(e.time.mfu_full_attention) + " full square)";
  }
  if (e.time.hfu != e.time.mfu) {
    out += ", HFU " + format_percent(e.time.hfu);
  }
  out += "\n";
  if (e.time.published_mfu > 0) {
    out += "trust       MFU " + format_percent(e.time.mfu_as_published) +
           " counted as the published figure (";
    out += e.time.published_mfu_attention_flops;
    out += " attention) is " + std::string(e.time.mfu_beyond_published ? "ABOVE" : "within") +
           " the best published for this device class, " + format_percent(e.time.published_mfu) +
           (e.time.mfu_beyond_published ? " (mfu_beyond_published: optimistic)" : "") + "\n";
  }
  out += "timing      " + std::to_string(e.time.ops_interpolated) + " op records interpolated, " +
         std::to_string(e.time.ops_extrapolated) + " extrapolated, " +
         std::to_string(e.time.ops_roofline) + " roofline only, " +
         std::to_string(e.time.ops_kernel_model) + " GPU kernel model" +
         (e.time.extrapolated ? " (EXTRAPOLATED outside the measured grid)" : "") + "\n\n";

  if (e.cluster) {
    out += cluster_report(*e.cluster, list_ops);
  }
  if (list_ops) {
    Table ops({"#", "pass", "label", "kind", "dims", "x", "FLOPs", "bytes"});
    const std::vector<OpRecord> lowered = lower(config, step);
    for (size_t i = 0; i < lowered.size(); ++i) {
      const OpRecord& op = lowered[i];
      std::string dims;
      for (int d = 0; d < op_dims_count(op.shape.kind); ++d) {
        if (d > 0) {
          dims += ',';
        }
        dims += std::to_string(op.shape.dims[static_cast<size_t>(d)]);
      }
      // Decode MoD: the routed branches per possible routed count, with its probability.
      const std::string copies =
          op.weight == 1.0 ? std::to_string(op.multiplicity)
                           : std::to_string(op.multiplicity) + " p" + format_sci(op.weight, 3);
      ops.add_row({std::to_string(i), to_string(op.pass), op.label, to_string(op.shape.kind), dims,
                   copies, format_sci(op.flops, 3), format_bytes(op.bytes)});
    }
    out += "lowered ops (one micro-batch; x = multiplicity, p = expected runs per step)\n" +
           ops.render() + "\n";
  }
  out += "conventions " + e.conventions + "\n";
  return out;
}

}  // namespace

int cmd_estimate(const Args& args) {
  const std::vector<FlagSpec>& flags = estimate_flags();
  if (print_help_if_asked(args, "estimate",
                          "CONFIG | --megatron-args TEXT [--set KEY=VALUE ...] [options]", flags,
                          "FLOPs, parameters, memory and step time of one configuration.\n"
                          "CONFIG is a TOML file (docs/config.md; examples in examples/configs/) "
                          "or a Hugging Face config.json (docs/hf_import.md).")) {
    return 0;
  }
  const ParsedArgs parsed = parse_args(args, flags, "estimate", 0, 1,
                                       "CONFIG (a TOML file or a Hugging Face config.json)");
  std::vector<std::string> sets = parsed.values("--set");
  if (const auto convention = parsed.value("--attention-flops")) {
    parse_attention_flops(*convention, "--attention-flops");  // reject before loading
    sets.push_back("counting.attention_flops=" + *convention);
  }
  if (const auto profile_name = parsed.value("--profile")) {
    sets.push_back("device.profile=" + *profile_name);
  }
  const StepKind step =
      parse_choice("--step", parsed.value_or("--step", "train"), {"train", "decode"}) == 0
          ? StepKind::train
          : StepKind::decode;
  static const std::vector<FlagKey> kFlagKeys = {{"--profile", "device.profile"},
                                                 {"--attention-flops", "counting.attention_flops"}};
  const Config config =
      with_typed_flags(parsed, kFlagKeys, [&] { return load_config_source(parsed, sets); });
  const std::string source =
      parsed.positional.empty() ? std::string("Megatron-LM arguments") : parsed.positional[0];
  const DeviceProfile profile =
      with_typed_flags(parsed, kFlagKeys, [&] { return load_profile(config.device.profile); });
  const Estimate e =
      with_typed_flags(parsed, kFlagKeys, [&] { return estimate(config, profile, step); });
  const std::string text = parsed.has("--json")
                               ? estimate_to_json(config, profile, step, e)
                               : report(config, profile, step, e, source, parsed.has("--ops"));
  std::fputs(text.c_str(), stdout);
  return std::fflush(stdout) == 0 ? 0 : 1;
}

}  // namespace modar::cli
