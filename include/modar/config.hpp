// modar/config.hpp: the model / training / device configuration.
//
// One struct per TOML section ([model], [mod], [dar], [moe], [train], [device], ...); the
// field names ARE the TOML keys (an interface: see README "Configuration").
// Parsing and validation live in cost_models/config.cpp; the planner, the
// runtime, the CLI and the Python bindings all read the same structs.
//
// Conventions fixed by docs/model.md:
//  * a value of 0 for n_kv_heads / d_head / d_ff means "the default"
//    (n_heads, d_model / n_heads, 4d for GELU or 8d/3 rounded up to a multiple
//    of 64 for SwiGLU); use the resolved_*() accessors, never the raw field.
//  * MoD: layer l (0-based) is routed iff every > 0 and
//    l % every == offset % every.  Default every = 0 (no MoD); the paper's
//    variant is every = 2, offset = 1 (layers 1, 3, 5, ...).
//    routed tokens per sequence k = clamp(round(capacity * seq_len), 1, seq_len).
//  * DAR: K = block_layers layers per block, S = 2K branches per block,
//    N = ceil(L / K) blocks, n = streams (attnres forces n = 1).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "modar/config_enums.hpp"

namespace modar {

struct ModelConfig {
  int64_t d_model = 2048;
  int64_t n_layers = 24;
  int64_t n_heads = 16;
  int64_t n_kv_heads = 0;  // 0 = n_heads (MHA)
  int64_t d_head = 0;      // 0 = d_model / n_heads
  int64_t d_ff = 0;        // 0 = default for the MLP kind
  MlpKind mlp = MlpKind::gelu;
  int64_t vocab_size = 50304;
  // Megatron-LM's --make-vocab-size-divisible-by: the embedding and the head
  // hold the vocabulary padded up to a multiple of this x the tensor size
  // (Megatron-LM's default is 128; modar's 1 keeps the vocabulary as given
  // on one device and pads to a multiple of the tensor size, as a vocab-
  // parallel embedding must).
  int64_t make_vocab_size_divisible_by = 1;
  bool tie_embeddings = false;
  int64_t seq_len = 2048;
  double norm_eps = 1e-6;
  bool qkv_bias = false;  // biases on the Q, K and V projections (Qwen2); no other biases
  QkNorm qk_norm = QkNorm::none;

  // Three matrices (gate, up, down) instead of two.
  bool gated_mlp() const { return mlp != MlpKind::gelu; }
  int64_t resolved_kv_heads() const { return n_kv_heads > 0 ? n_kv_heads : n_heads; }
  // The vocabulary the embedding and head hold under tensor size `tensor`:
  // vocab_size rounded up to a multiple of make_vocab_size_divisible_by x tensor.
  int64_t padded_vocab(int64_t tensor) const {
    const int64_t multiple = make_vocab_size_divisible_by * tensor;
    return multiple > 1 ? (vocab_size + multiple - 1) / multiple * multiple : vocab_size;
  }
  int64_t resolved_d_head() const { return d_head > 0 ? d_head : d_model / n_heads; }
  int64_t resolved_d_ff() const {
    if (d_ff > 0)
      return d_ff;
    if (!gated_mlp())
      return 4 * d_model;
    const int64_t raw = (8 * d_model + 2) / 3;  // round(8d/3)
    return ((raw + 63) / 64) * 64;
  }
};

struct ModConfig {
  double capacity = 0.125;  // fraction of tokens a routed layer processes, (0, 1]
  int64_t every = 0;        // 0 = no MoD; route every `every`-th layer
  int64_t offset = 1;       // phase: layer l routed iff l % every == offset % every
  RouterScale router_scale = RouterScale::linear;
  CausalRouter causal_router = CausalRouter::none;
  int64_t predictor_hidden = 256;

  bool enabled() const { return every > 0; }
  bool is_routed(int64_t layer) const { return every > 0 && (layer % every) == (offset % every); }
  // k = clamp(round(c * s), 1, s)
  int64_t routed_tokens_per_sequence(int64_t seq_len) const;
};

struct DarConfig {
  DarVariant variant = DarVariant::none;
  int64_t block_layers = 2;  // K; K = 1 is "Full" AttnRes / DAR
  int64_t streams = 2;       // n; forced to 1 for attnres
  DarKernel kernel = DarKernel::fused;  // time and memory only (config_enums.hpp)
  DarPacks packs = DarPacks::paper;     // prefix kernel only (config_enums.hpp)
  // Prefix kernel only: the fraction of the profile's ceilings.memory_bandwidth
  // the paper's Triton kernels reach (every dar.* op record); docs/moe.md
  // "The prefix kernels' bandwidth".
  double prefix_memory_efficiency = 0.62;

  bool enabled() const { return variant != DarVariant::none; }
  int64_t resolved_streams() const {
    return variant == DarVariant::none ? 0 : (variant == DarVariant::attnres ? 1 : streams);
  }
  int64_t branches_per_block() const { return 2 * block_layers; }  // S
  // The prefix kernels keep each read's packed keys and values for the
  // backward (no rebuild); the one place dar.packs = paper is resolved.
  bool packs_kept() const {
    return enabled() && kernel == DarKernel::prefix &&
           (packs == DarPacks::kept ||
            (packs == DarPacks::paper && variant == DarVariant::attnres));
  }
  int64_t blocks(int64_t n_layers) const {
    return (n_layers + block_layers - 1) / block_layers;
  }  // N
  // Outputs of the coefficient head W_l: n (alpha) + n (beta) + transport params
  // (1 for n = 2: rho; n*n Sinkhorn logits for n > 2; 0 for n = 1).
  static int64_t transport_params(int64_t n) { return n <= 1 ? 0 : (n == 2 ? 1 : n * n); }
  int64_t coefficient_outputs() const {
    const int64_t n = resolved_streams();
    return n <= 1 ? 0 : 2 * n + transport_params(n);
  }
};

// ---- [moe]: experts and MoDE (docs/model.md experts; docs/moe.md) ----------------
//  * experts = E routed experts (0 = dense FFN everywhere), each an FFN of the
//    model's MLP kind and width expert_ffn (0 = model.d_ff resolved);
//    shared_experts see every token, each of width shared_expert_ffn (0 = the
//    routed experts' width), run as one FFN of width shared_experts x
//    shared_expert_ffn (Megatron's moe_shared_expert_intermediate_size).
//    shared_expert_gate: the shared output is scaled by sigmoid(u . w_g), a
//    d-vector per MoE layer (Qwen2-MoE).
//  * MoE layers: layer l (0-based) is MoE iff experts > 0, l >= first_dense and
//    (l - first_dense) % every == 0.
//  * Router: softmax over the E (+ Z null) choices, token-choice top_k, gates
//    renormalised over the chosen k.  Aux loss aux_loss_coef * E * sum_e f_e P_e
//    (Switch/GShard), router z-loss z_loss_coef * mean(logsumexp(logits)^2).
//  * Capacity: capacity_factor = 0 is dropless; > 0 gives every expert
//    ceil(capacity_factor * tokens * top_k / choices) slots (choices = E + Z),
//    assignments over it are dropped (the token keeps its residual).
//  * mode: "none" (plain MoE), "staged" (MoD routing around the block as set by
//    [mod], the MoE FFN inside routed blocks; needs mod.every > 0),
//    "integrated" (dense attention; the FFN router also chooses among
//    null_experts = Z no-op experts: a token routed to one skips the FFN).
//  * load_imbalance: busiest expert's tokens / mean tokens per expert, a cost
//    model parameter only (scales the grouped expert GEMM and the all-to-all).
struct MoeConfig {
  int64_t experts = 0;          // E; 0 = dense
  int64_t top_k = 1;            // experts per token
  int64_t expert_ffn = 0;       // 0 = model's d_ff (resolved)
  int64_t shared_experts = 0;   // experts every token passes through
  int64_t shared_expert_ffn = 0;    // width of each shared expert; 0 = the routed width
  bool shared_expert_gate = false;  // sigmoid(u . w_g) scales the shared output
  int64_t interval = 1;         // every interval-th layer (from first_dense) is MoE
  int64_t first_dense = 0;      // leading dense layers
  double capacity_factor = 0.0; // 0 = dropless
  double aux_loss_coef = 0.01;
  double z_loss_coef = 0.0;
  double load_imbalance = 1.0;  // >= 1, cost model only
  MoeMode mode = MoeMode::none;
  int64_t null_experts = 0;     // Z; integrated only
  RouterWeights router_weights = RouterWeights::activation;
  TokenDispatcher token_dispatcher = TokenDispatcher::alltoall;

  bool enabled() const { return experts > 0; }
  bool is_moe_layer(int64_t layer) const {
    return experts > 0 && layer >= first_dense && (layer - first_dense) % interval == 0;
  }
  int64_t moe_layers(int64_t n_layers) const {
    return (experts > 0 && n_layers > first_dense) ? (n_layers - first_dense + interval - 1) / interval
                                                     : 0;
  }
  int64_t resolved_expert_ffn(const ModelConfig& model) const {
    return expert_ffn > 0 ? expert_ffn : model.resolved_d_ff();
  }
  // Width of the one FFN the shared experts run as: shared_experts x each
  // one's width (0 without shared experts).
  int64_t shared_ffn_total(const ModelConfig& model) const {
    return shared_experts *
           (shared_expert_ffn > 0 ? shared_expert_ffn : resolved_expert_ffn(model));
  }
  // Router choices: E real experts plus Z null experts (integrated MoDE).
  int64_t choices() const { return experts + (mode == MoeMode::integrated ? null_experts : 0); }
  bool dropless() const { return !(capacity_factor > 0.0); }
  // Slots per expert for `tokens` tokens entering the layer:
  // ceil(capacity_factor * tokens * top_k / choices); dropless: tokens (the
  // most one expert can receive, each token picks an expert at most once).
  int64_t expert_capacity(int64_t tokens) const;
};

struct TrainConfig {
  int64_t micro_batch = 8;   // sequences per device per micro-step
  int64_t global_batch = 0;  // sequences per optimizer step; 0 = micro_batch * device.count
  DType dtype = DType::bf16;
  Optimizer optimizer = Optimizer::adamw;
  Recompute recompute = Recompute::none;
  RecomputeGranularity recompute_granularity = RecomputeGranularity::none;  // Megatron-LM's
  // Megatron-LM's --recompute-modules (with recompute_granularity =
  // "selective"): names separated by spaces or commas from core_attn,
  // layernorm, mlp, moe_act, moe, shared_experts.
  std::string recompute_modules = "core_attn";
  AttentionKernel attention_kernel = AttentionKernel::flash;  // docs/cluster.md
  GradAccumulation grad_accumulation = GradAccumulation::fused;  // docs/cluster.md
  GradReduceInFp32 grad_reduce_in_fp32 = GradReduceInFp32::by_dtype;  // docs/cluster.md
  // Dropout probabilities (Megatron-LM --hidden-dropout, --attention-dropout;
  // Megatron-LM's default is 0.1 each, current LLM recipes use 0): > 0 saves
  // a 1-byte mask per element at each site and costs its passes
  // (docs/cluster.md "Dropout").  Hidden: the embedding output and each
  // layer's two branch outputs; attention: the softmax probabilities (a mask
  // only with the unfused kernel; FlashAttention regenerates it).
  double hidden_dropout = 0.0;
  double attention_dropout = 0.0;
};

// The default device profile: "h200-measured" when a measured H200 profile is
// embedded (profiles/h200-measured.toml, written by scripts/gpu-check.sh),
// otherwise the datasheet "h200".  Defined in cost_models/profile.cpp.
const std::string& default_profile_name();

struct DeviceConfig {
  std::string profile =
      default_profile_name();  // a name from profiles/ or a path to a TOML profile
  int64_t count = 1;
};

// ---- [parallel] and [cluster] (cluster-scale planning; docs/cluster.md) -------
// Device placement: rank = tensor + t * (stage + p * data_index), so a tensor
// group sits inside a node first, then the pipeline, then data parallelism.
// Defaults (all 1 / 0) and device.count = 1 are the single-device model.
// (PipelineSchedule: config_enums.hpp.)

struct ParallelConfig {
  int64_t tensor = 1;               // TP size t (Megatron column/row-parallel layers)
  bool sequence_parallel = false;   // SP over the tensor group (Korthikanti et al. 2022)
  int64_t context = 1;              // context parallelism CP c (ring attention, docs/cluster.md)
  int64_t pipeline = 1;             // PP size p
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
  int64_t virtual_stages = 1;       // v (interleaved 1F1B); 1 for one_f_one_b
  int64_t zero = 0;                 // ZeRO stage 0..3 over the data-parallel group (3 = FSDP)
  bool overlap_grad_reduce = true;  // DP gradient reduction overlapped with the backward
  bool overlap_param_gather = true; // ZeRO parameter all-gathers overlapped with compute
  TpCommOverlap tp_comm_overlap = TpCommOverlap::backward;  // docs/cluster.md "Overlap"
  int64_t expert = 1;               // expert parallelism EP (needs moe.experts % EP == 0)
  int64_t expert_tensor = 0;        // expert tensor parallelism ETP; 0 = the tensor size
  bool balance_stages = true;       // pipeline stages balanced by predicted time
  bool dar_bank_cache = true;       // DAR/AttnRes: receiving stages cache earlier blocks
  // data-parallel size: device.count / (tensor x context x pipeline).
  int64_t data(int64_t devices) const { return devices / (tensor * context * pipeline); }
  int64_t resolved_expert_tensor() const { return expert_tensor > 0 ? expert_tensor : tensor; }
  // Megatron-Core folds the expert layers' groups over the same ranks as the
  // dense layers' tensor x context x data (parallel_state: world size
  // divisible by expert_tensor x expert x pipeline): expert_tensor x expert x
  // expert_data = tensor x context x data ranks per pipeline stage.
  // Expert-data-parallel size:
  int64_t expert_data(int64_t devices) const {
    return tensor * context * data(devices) / (resolved_expert_tensor() * expert);
  }
  bool is_default() const {
    return tensor == 1 && !sequence_parallel && context == 1 && pipeline == 1 &&
           schedule == PipelineSchedule::one_f_one_b && virtual_stages == 1 && zero == 0 &&
           expert == 1 && expert_tensor == 0;
  }
};

struct ClusterConfig {
  int64_t gpus_per_node = 0;  // 0 = the profile's [network] gpus_per_node (8 if none)
  int64_t nodes = 0;          // 0 = ceil(device.count / gpus_per_node)
};

struct Config {
  ModelConfig model;
  ModConfig mod;
  DarConfig dar;
  MoeConfig moe;
  TrainConfig train;
  DeviceConfig device;
  ParallelConfig parallel;
  ClusterConfig cluster;
  AttentionFlops attention_flops = AttentionFlops::causal;  // counting convention only
};

// ---- parsing and validation (cost_models/config.cpp) ----------------------
// All of these throw modar::ConfigError (bad value / unknown key, with a
// "did you mean" suggestion) or modar::FileError (missing / malformed file).

// Parse a TOML document (text) into a Config; unknown sections/keys are errors.
Config parse_config_toml(const std::string& toml_text, const std::string& source_name = "<string>");
// A config file is a modar TOML file or a Hugging Face config.json (a JSON
// object: modar/hf_config.hpp, docs/hf_import.md).
Config load_config_file(const std::string& path);
// Read a file, apply "section.key=value" overrides in order, then validate (so
// an override may repair a value the file alone would fail on).
Config load_config_file(const std::string& path, const std::vector<std::string>& overrides);
// The same, with what the reader has to tell the user once: for a
// config.json, the defaults it took and the fields it does not model (one
// line, hf_import_summary; notes about keys the overrides set are left out);
// "" for a TOML file.
struct ConfigDocument {
  Config config;
  std::string notes;
};
ConfigDocument load_config_document(const std::string& path,
                                    const std::vector<std::string>& overrides);
// Apply one "section.key=value" override (CLI --set, Python kwargs).
void apply_override(Config& config, const std::string& assignment);
void apply_override(Config& config, const std::string& dotted_key, const std::string& value);
// Check every field (ranges, divisibility, NaN); throws ConfigError.
void validate(const Config& config);
// Serialise back to TOML (round-trips through parse_config_toml).
std::string to_toml(const Config& config);
// Every valid dotted key, e.g. "mod.capacity" (for suggestions and docs).
const std::vector<std::string>& config_keys();
// (dotted key, value as a TOML literal) for every key, in config_keys() order.
// The literals are valid JSON too (numbers, true/false, "strings").
std::vector<std::pair<std::string, std::string>> config_values(const Config& config);

// One key looked up once, then set on any number of configurations with a
// typed value and no text in between (the Python bindings: modar.Config and
// the batched estimate).  A value of the wrong type is refused as a TOML
// value of that type would be (an integer key refuses 1.5, true and "8"; a
// real key takes an integer; a choice takes one of its names, whole); ranges
// and cross-field rules stay validate()'s.  Unknown key: ConfigError naming
// it, with the nearest valid key.
enum class ConfigValueType { integer, real, boolean, choice, text };
class ConfigKey {
 public:
  explicit ConfigKey(const std::string& dotted_key);
  const char* name() const;  // "model.d_model"
  ConfigValueType type() const;
  void set_integer(Config& config, int64_t value) const;
  void set_real(Config& config, double value) const;  // finite
  void set_boolean(Config& config, bool value) const;
  void set_text(Config& config, const std::string& value) const;
  std::string literal(const Config& config) const;  // as in config_values()

 private:
  const void* spec_;
};

// enum <-> string (to_string, dtype_bytes): config_enums.hpp.
// What a configuration recomputes, in words: "none", "selective" (modar's),
// "full", "megatron selective (core_attn)", "megatron full".
std::string recompute_text(const TrainConfig& train);

// Parse an enum from its name; throws ConfigError naming `field`, the value and
// the allowed names.  Used by the TOML reader, --set and CLI flags.
AttentionFlops parse_attention_flops(const std::string& text, const std::string& field);

}  // namespace modar
