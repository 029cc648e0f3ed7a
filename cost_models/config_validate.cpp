// validate(): every range and cross-field rule of a Config, in one place, so
// that a config built in code, read from TOML or edited with --set is held
// to the same rules.  Each field's own range is checked before any product
// of fields is formed (no overflow), then the cross-field rules, then the
// [moe] and [parallel] / [cluster] blocks.  Errors are one-line ConfigErrors
// naming the key, the value and what is allowed.
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "config_keys.hpp"
#include "modar/base/errors.hpp"
#include "modar/base/text.hpp"
#include "modar/config.hpp"

namespace modar {
namespace {

using detail::fail;

// Every size-like field is bounded before any product of fields is formed,
// so no check below can overflow (2^24 * 2^24 = 2^48 fits in int64_t).
constexpr int64_t kMaxDimension = int64_t{1} << 24;

void require_positive(const char* key, int64_t value) {
  if (value <= 0) {
    fail(key, std::to_string(value), "must be a positive integer");
  }
  if (value > kMaxDimension) {
    fail(key, std::to_string(value), "must be <= 16777216");
  }
}
void require_non_negative(const char* key, int64_t value, const char* meaning_of_zero) {
  if (value < 0) {
    fail(key, std::to_string(value), std::string("must be >= 0 (0 = ") + meaning_of_zero + ")");
  }
  if (value > kMaxDimension) {
    fail(key, std::to_string(value), "must be <= 16777216");
  }
}

// ---- [moe] checks (docs/model.md experts) ------------------------------------------
void require_finite_range(const char* key, double value, double low, double high,
                          const char* allowed) {
  if (!(std::isfinite(value) && value >= low && value <= high)) {
    fail(key, format_number(value), allowed);
  }
}

void validate_moe(const Config& config) {
  const MoeConfig& e = config.moe;
  const ModelConfig& m = config.model;
  require_non_negative("moe.experts", e.experts, "dense, no experts");
  if (e.experts > 65536) {
    fail("moe.experts", std::to_string(e.experts), "must be <= 65536");
  }
  require_positive("moe.top_k", e.top_k);
  require_non_negative("moe.expert_ffn", e.expert_ffn, "model.d_ff resolved");
  require_non_negative("moe.shared_experts", e.shared_experts, "none");
  if (e.shared_experts > 64) {
    fail("moe.shared_experts", std::to_string(e.shared_experts), "must be <= 64");
  }
  require_non_negative("moe.shared_expert_ffn", e.shared_expert_ffn, "the routed experts' width");
  require_positive("moe.interval", e.interval);
  require_non_negative("moe.first_dense", e.first_dense, "no leading dense layers");
  require_non_negative("moe.null_experts", e.null_experts, "none");
  if (e.null_experts > 65536) {
    fail("moe.null_experts", std::to_string(e.null_experts), "must be <= 65536");
  }
  require_finite_range("moe.capacity_factor", e.capacity_factor, 0.0, 1024.0,
                       "must be in [0, 1024] (0 = dropless)");
  require_finite_range("moe.aux_loss_coef", e.aux_loss_coef, 0.0, 1e6,
                       "must be a finite number >= 0");
  require_finite_range("moe.z_loss_coef", e.z_loss_coef, 0.0, 1e6, "must be a finite number >= 0");
  require_finite_range("moe.load_imbalance", e.load_imbalance, 1.0, 65536.0,
                       "must be a finite number >= 1 (busiest expert's tokens / mean)");
  if (e.experts == 0) {
    if (e.mode != MoeMode::none) {
      fail("moe.mode", std::string("\"") + to_string(e.mode) + "\"",
           "needs moe.experts > 0 (MoDE routes among experts)");
    }
    if (e.null_experts > 0) {
      fail("moe.null_experts", std::to_string(e.null_experts),
           "needs moe.experts > 0 and moe.mode = \"integrated\"");
    }
    return;  // the other keys are not read by a dense model
  }
  if (e.shared_experts == 0 && e.shared_expert_ffn > 0) {
    fail("moe.shared_expert_ffn", std::to_string(e.shared_expert_ffn),
         "needs moe.shared_experts > 0 (the width of each shared expert)");
  }
  if (e.shared_experts == 0 && e.shared_expert_gate) {
    fail("moe.shared_expert_gate", "true", "needs moe.shared_experts > 0 (it gates their output)");
  }
  if (e.first_dense >= m.n_layers) {
    fail("moe.first_dense", std::to_string(e.first_dense),
         "must be < model.n_layers = " + std::to_string(m.n_layers) +
             " (at least one MoE layer; set moe.experts = 0 for a dense model)");
  }
  if (e.null_experts > 0 && e.mode != MoeMode::integrated) {
    fail("moe.null_experts", std::to_string(e.null_experts),
         "needs moe.mode = \"integrated\" (null experts are integrated MoDE's no-op choices)");
  }
  if (e.top_k > e.choices()) {
    fail("moe.top_k", std::to_string(e.top_k),
         "must be <= moe.experts" +
             std::string(e.mode == MoeMode::integrated ? " + moe.null_experts = " : " = ") +
             std::to_string(e.choices()));
  }
  const double max_imbalance = static_cast<double>(e.choices()) / static_cast<double>(e.top_k);
  if (e.load_imbalance > max_imbalance) {
    fail("moe.load_imbalance", format_number(e.load_imbalance),
         "must be <= (moe.experts + null experts) / moe.top_k = " + format_number(max_imbalance) +
             " (the busiest expert receives at most every token)");
  }
  if (e.mode == MoeMode::staged && !config.mod.enabled()) {
    fail("moe.mode", "\"staged\"", "needs MoD routing around the blocks (set mod.every > 0)");
  }
  if (e.mode == MoeMode::integrated && config.mod.enabled()) {
    fail("moe.mode", "\"integrated\"",
         "routes inside the FFN with dense attention; needs mod.every = 0 (use \"staged\" "
         "for MoD around the block)");
  }
  if (e.mode == MoeMode::none && config.mod.enabled()) {
    fail("moe.mode", "\"none\"",
         "with mod.every > 0 and moe.experts > 0 must be \"staged\" (MoD around the block, "
         "experts inside)");
  }
  if (e.resolved_expert_ffn(m) % config.parallel.tensor != 0) {
    fail("parallel.tensor", std::to_string(config.parallel.tensor),
         "must divide the expert width moe.expert_ffn = " +
             std::to_string(e.resolved_expert_ffn(m)));
  }
  if (e.shared_ffn_total(m) % config.parallel.tensor != 0) {
    fail("parallel.tensor", std::to_string(config.parallel.tensor),
         "must divide the shared experts' width moe.shared_experts x moe.shared_expert_ffn = " +
             std::to_string(e.shared_ffn_total(m)));
  }
}

// ---- [parallel] / [cluster] checks (cluster-scale planning) -----------------
// Kept in one block, apart from the model checks above.
void validate_parallel(const Config& config) {
  const ParallelConfig& p = config.parallel;
  const ModelConfig& m = config.model;
  const int64_t kMaxParallel = int64_t{1} << 20;
  const std::pair<const char*, int64_t> sizes[] = {{"parallel.tensor", p.tensor},
                                                   {"parallel.pipeline", p.pipeline},
                                                   {"parallel.virtual_stages", p.virtual_stages}};
  for (const auto& [key, value] : sizes) {
    require_positive(key, value);
    if (value > kMaxParallel) {
      fail(key, std::to_string(value), "must be <= 1048576");
    }
  }
  require_positive("parallel.expert", p.expert);
  if (p.expert > 1 && config.moe.experts == 0) {
    fail("parallel.expert", std::to_string(p.expert),
         "must be 1 without experts (set moe.experts > 0 for expert parallelism)");
  }
  if (p.expert > 1 && config.moe.experts % p.expert != 0) {
    fail("parallel.expert", std::to_string(p.expert),
         "must divide moe.experts = " + std::to_string(config.moe.experts));
  }
  if (p.zero < 0 || p.zero > 3) {
    fail("parallel.zero", std::to_string(p.zero), "must be 0, 1, 2 or 3 (3 = FSDP full shard)");
  }
  if (m.n_heads > 0 && m.n_heads % p.tensor != 0) {
    fail("parallel.tensor", std::to_string(p.tensor),
         "must divide model.n_heads = " + std::to_string(m.n_heads));
  }
  if (m.n_heads > 0 && m.resolved_kv_heads() % p.tensor != 0) {
    fail("parallel.tensor", std::to_string(p.tensor),
         "must divide the KV heads (model.n_kv_heads = " + std::to_string(m.resolved_kv_heads()) +
             ")");
  }
  if (m.resolved_d_ff() % p.tensor != 0) {
    fail("parallel.tensor", std::to_string(p.tensor),
         "must divide the MLP width d_ff = " + std::to_string(m.resolved_d_ff()));
  }
  if (p.sequence_parallel && p.tensor == 1) {
    fail("parallel.sequence_parallel", "true", "needs parallel.tensor > 1");
  }
  if (p.sequence_parallel && m.seq_len % p.tensor != 0) {
    fail("parallel.tensor", std::to_string(p.tensor),
         "must divide model.seq_len = " + std::to_string(m.seq_len) +
             " with parallel.sequence_parallel = true");
  }
  if (p.schedule == PipelineSchedule::one_f_one_b && p.virtual_stages != 1) {
    fail("parallel.virtual_stages", std::to_string(p.virtual_stages),
         "must be 1 with parallel.schedule = \"1f1b\" (use \"interleaved\")");
  }
  if (p.schedule == PipelineSchedule::interleaved && p.pipeline < 2) {
    fail("parallel.schedule", "\"interleaved\"", "needs parallel.pipeline >= 2");
  }
  if (p.pipeline * p.virtual_stages > m.n_layers) {
    fail("parallel.pipeline", std::to_string(p.pipeline),
         "parallel.pipeline * parallel.virtual_stages must be <= model.n_layers = " +
             std::to_string(m.n_layers));
  }
  const int64_t model_parallel = p.tensor * p.pipeline;
  if (config.device.count % model_parallel != 0) {
    fail("device.count", std::to_string(config.device.count),
         "must be a multiple of parallel.tensor * parallel.pipeline = " +
             std::to_string(model_parallel));
  }
  if (p.expert > 1 && p.data(config.device.count) % p.expert != 0) {
    fail("parallel.expert", std::to_string(p.expert),
         "must divide the data-parallel size device.count / (parallel.tensor * "
         "parallel.pipeline) = " +
             std::to_string(p.data(config.device.count)) +
             " (expert parallelism is carved out of data parallelism)");
  }
  if (p.zero > 0 && p.data(config.device.count) < 2) {
    fail("parallel.zero", std::to_string(p.zero),
         "needs a data-parallel size >= 2 (device.count / (parallel.tensor * parallel.pipeline))");
  }
  const ClusterConfig& cl = config.cluster;
  require_non_negative("cluster.gpus_per_node", cl.gpus_per_node, "the profile's network");
  require_non_negative("cluster.nodes", cl.nodes, "device.count / cluster.gpus_per_node");
  if (cl.gpus_per_node > 1024) {
    fail("cluster.gpus_per_node", std::to_string(cl.gpus_per_node), "must be <= 1024");
  }
  if (cl.gpus_per_node > 0 && p.tensor > cl.gpus_per_node) {
    fail("parallel.tensor", std::to_string(p.tensor),
         "must be <= cluster.gpus_per_node = " + std::to_string(cl.gpus_per_node) +
             " (a tensor group stays inside a node)");
  }
  if (cl.nodes > 0) {
    const int64_t per_node = cl.gpus_per_node > 0 ? cl.gpus_per_node : 8;
    if (cl.nodes * per_node < config.device.count ||
        (cl.nodes - 1) * per_node >= config.device.count) {
      fail("cluster.nodes", std::to_string(cl.nodes),
           "must hold device.count = " + std::to_string(config.device.count) + " at " +
               std::to_string(per_node) + " GPUs per node (ceil(device.count / gpus_per_node))");
    }
  }
}
}  // namespace

void validate(const Config& config) {
  const ModelConfig& m = config.model;
  const ModConfig& mod = config.mod;
  const DarConfig& dar = config.dar;
  const TrainConfig& t = config.train;

  // 1. Each field's own range (so a huge value is blamed on itself, never on
  //    a field it is later combined with).
  require_positive("model.d_model", m.d_model);
  require_positive("model.n_layers", m.n_layers);
  require_positive("model.n_heads", m.n_heads);
  require_non_negative("model.n_kv_heads", m.n_kv_heads, "same as n_heads");
  require_non_negative("model.d_head", m.d_head, "d_model / n_heads");
  require_non_negative("model.d_ff", m.d_ff, "the default width of the MLP kind");
  require_positive("model.vocab_size", m.vocab_size);
  require_positive("model.seq_len", m.seq_len);
  if (!(std::isfinite(m.norm_eps) && m.norm_eps > 0.0)) {
    fail("model.norm_eps", format_number(m.norm_eps), "must be a finite number > 0");
  }
  if (!(std::isfinite(mod.capacity) && mod.capacity > 0.0 && mod.capacity <= 1.0)) {
    fail("mod.capacity", format_number(mod.capacity), "must be in (0, 1]");
  }
  require_non_negative("mod.every", mod.every, "no MoD");
  require_non_negative("mod.offset", mod.offset, "route layers 0, every, 2 every, ...");
  require_positive("mod.predictor_hidden", mod.predictor_hidden);
  if (dar.block_layers < 1 || dar.block_layers > m.n_layers) {
    // K is only read when DAR is on: a dense 1-layer model keeps the default K = 2.
    if (dar.enabled() || dar.block_layers < 1) {
      fail("dar.block_layers", std::to_string(dar.block_layers),
           "must be in [1, model.n_layers = " + std::to_string(m.n_layers) + "]");
    }
  }
  if (dar.streams < 1 || dar.streams > 16) {
    fail("dar.streams", std::to_string(dar.streams), "must be in [1, 16]");
  }
  require_positive("train.micro_batch", t.micro_batch);
  require_non_negative("train.global_batch", t.global_batch, "micro_batch * device.count");
  if (t.global_batch > (int64_t{1} << 40)) {
    fail("train.global_batch", std::to_string(t.global_batch), "must be <= 2^40");
  }
  require_positive("device.count", config.device.count);
  if (t.dtype != DType::bf16 && t.dtype != DType::fp32 && t.dtype != DType::fp16) {
    fail("train.dtype", to_string(t.dtype), "must be \"bf16\", \"fp16\" or \"fp32\"");
  }
  if (config.device.profile.empty()) {
    fail("device.profile", "\"\"", "must name an embedded profile or a profile file path");
  }
  if (config.device.profile.size() > 4096) {
    fail("device.profile", config.device.profile,
         "must be at most 4096 characters (a profile name or a file path)");
  }
  for (const char ch : config.device.profile) {
    if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) {
      fail("device.profile", config.device.profile,
           "must not contain control characters (a profile name or a file path)");
    }
  }

  // 2. Cross-field rules (every operand is bounded above, no overflow).
  if (m.d_head == 0 && m.d_model % m.n_heads != 0) {
    fail("model.n_heads", std::to_string(m.n_heads),
         "must divide model.d_model = " + std::to_string(m.d_model) +
             " (or set model.d_head explicitly)");
  }
  if (m.n_kv_heads > m.n_heads) {
    fail("model.n_kv_heads", std::to_string(m.n_kv_heads),
         "must be <= model.n_heads = " + std::to_string(m.n_heads));
  }
  if (m.n_heads % m.resolved_kv_heads() != 0) {
    fail("model.n_kv_heads", std::to_string(m.n_kv_heads),
         "must divide model.n_heads = " + std::to_string(m.n_heads));
  }
  if (mod.every > 0 && mod.offset >= mod.every) {
    fail("mod.offset", std::to_string(mod.offset),
         "must be < mod.every = " + std::to_string(mod.every));
  }
  if (mod.every > 0 && mod.offset >= m.n_layers) {
    // Layer l is routed iff l % every == offset: with offset >= n_layers no
    // layer is, and the "MoD" model would silently be the dense one.
    fail("mod.every", std::to_string(mod.every),
         "routes 0 of model.n_layers = " + std::to_string(m.n_layers) +
             " layers (first routed layer: mod.offset = " + std::to_string(mod.offset) +
             "); need mod.offset < model.n_layers, e.g. mod.every <= model.n_layers");
  }
  if ((dar.variant == DarVariant::dar) && dar.streams < 2) {
    fail("dar.streams", std::to_string(dar.streams),
         "must be >= 2 for dar.variant = \"dar\" (keys come from another stream)");
  }
  if ((dar.variant == DarVariant::fixedkv || dar.variant == DarVariant::crossv) &&
      dar.streams != 2) {
    fail("dar.streams", std::to_string(dar.streams),
         std::string("must be 2 for dar.variant = \"") + to_string(dar.variant) + "\"");
  }
  validate_moe(config);       // [moe] (block above)
  validate_parallel(config);  // [parallel] / [cluster] (block above)
  // <= 2^48: both factors are bounded by their own range checks.
  const int64_t per_micro_step = t.micro_batch * config.parallel.data(config.device.count);
  if (t.global_batch > 0 && t.global_batch % per_micro_step != 0) {
    fail("train.global_batch", std::to_string(t.global_batch),
         config.parallel.is_default()
             ? "must be a multiple of train.micro_batch * device.count = " +
                   std::to_string(per_micro_step)
             : "must be a multiple of train.micro_batch * data-parallel size (device.count / "
               "(parallel.tensor * parallel.pipeline)) = " +
                   std::to_string(per_micro_step));
  }
  // Products the lowering forms in 64-bit integers (rows x widths) and the
  // parameter count must stay far from overflow.
  const double tokens = static_cast<double>(t.micro_batch) * static_cast<double>(m.seq_len);
  if (tokens > static_cast<double>(int64_t{1} << 34)) {
    fail(
        "train.micro_batch", std::to_string(t.micro_batch),
        "train.micro_batch * model.seq_len = " + format_number(tokens) + " must be <= 2^34 tokens");
  }
  if (config.moe.enabled()) {
    // Expert slots x widths are 64-bit products in the lowering (docs/model.md experts).
    const MoeConfig& e = config.moe;
    const double capacity =
        e.dropless()
            ? tokens
            : std::min(tokens, std::ceil(e.capacity_factor * tokens * static_cast<double>(e.top_k) /
                                         static_cast<double>(e.choices())));
    const double slots = e.dropless() ? tokens * static_cast<double>(e.top_k)
                                      : capacity * static_cast<double>(e.experts);
    const double widest = static_cast<double>(
        std::max<int64_t>({m.d_model, 2 * e.resolved_expert_ffn(m), 2 * e.shared_ffn_total(m)}));
    if (slots * widest > static_cast<double>(int64_t{1} << 56)) {
      fail("moe.experts", std::to_string(e.experts),
           "expert slots x width = " + format_number(slots * widest) +
               " must be <= 2^56 (check moe.top_k, moe.capacity_factor, moe.expert_ffn, "
               "train.micro_batch)");
    }
  }
  const double width = static_cast<double>(
      std::max<int64_t>({m.d_model, m.resolved_d_ff(),
                         m.resolved_d_head() * (m.n_heads + 2 * m.resolved_kv_heads())}));
  const double rough_params =
      static_cast<double>(m.n_layers) * 3.0 * width * width +
      2.0 * static_cast<double>(m.vocab_size) * static_cast<double>(m.d_model);
  const MoeConfig& e = config.moe;
  const double expert_params =
      e.enabled()
          ? static_cast<double>(m.n_layers) * 3.0 * static_cast<double>(m.d_model) *
                (static_cast<double>(e.resolved_expert_ffn(m)) * static_cast<double>(e.experts) +
                 static_cast<double>(e.shared_ffn_total(m)))
          : 0.0;
  if (expert_params > 1e17) {
    fail("moe.experts", std::to_string(e.experts),
         "the experts would exceed 1e17 parameters (check moe.expert_ffn, moe.experts, "
         "model.n_layers)");
  }
  if (rough_params > 1e17) {
    fail(
        "model.n_layers", std::to_string(m.n_layers),
        "the model would exceed 1e17 parameters (check model.d_model, model.d_ff, model.n_layers)");
  }
}

}  // namespace modar
