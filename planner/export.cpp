// Launch arguments out of a planned configuration (include/modar/export.hpp):
// Megatron-LM's command line from a Config, and a Megatron-LM command line
// read back as a Config.
//
// Every argument name below is one of megatron/training/arguments.py's (the
// version is cited in docs/export.md); each modar key maps to the argument
// that makes Megatron-LM build what modar planned: RMSNorm, RoPE and no
// biases (Megatron's defaults are LayerNorm, learned positions and biases),
// the planned dropout (modar's default none, Megatron's 0.1), vocabulary
// padding, context and expert tensor parallelism, the planned pipeline split.
// What Megatron-LM cannot express is written as comments, never dropped.
#include "modar/export.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "modar/base/errors.hpp"
#include "modar/base/text.hpp"
#include "modar/cost_model.hpp"
#include "modar/parallel.hpp"
#include "modar/profile.hpp"

namespace modar {

std::vector<std::pair<std::string, std::string>> LaunchArguments::flat() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const LaunchArgumentGroup& group : groups) {
    for (const LaunchArgument& argument : group.arguments) {
      out.emplace_back(argument.name, argument.value);
    }
  }
  return out;
}

namespace {

std::string integer_text(int64_t value) {
  return std::to_string(value);
}

// A dropout probability as Megatron-LM's defaults are written ("0.0", "0.1").
std::string format_dropout(double probability) {
  return probability == 0.0 ? "0.0" : format_number(probability);
}

// Sequences per optimizer step and the data-parallel size (expert
// parallelism is carved out of the data-parallel group).
int64_t data_parallel(const Config& c) {
  return std::max<int64_t>(1, c.parallel.data(c.device.count));
}
int64_t global_batch(const Config& c) {
  return c.train.global_batch > 0 ? c.train.global_batch : c.train.micro_batch * data_parallel(c);
}

// The planned layers per model chunk, in model order (chunk k of the p v
// chunks holds the layers after chunk k - 1's).
std::vector<int64_t> planned_chunk_layers(const Config& config) {
  const DeviceProfile profile = load_profile(config.device.profile);
  const Estimate planned = estimate(config, profile);
  std::vector<std::pair<int64_t, int64_t>> chunks;  // (first layer, layers)
  if (planned.cluster) {
    for (const StageSummary& stage : planned.cluster->stages) {
      for (size_t i = 0; i < stage.chunk_layers.size(); ++i) {
        chunks.emplace_back(stage.chunk_first_layer[i], stage.chunk_layers[i]);
      }
    }
  }
  std::sort(chunks.begin(), chunks.end());
  std::vector<int64_t> sizes;
  for (const auto& [first, layers] : chunks) {
    sizes.push_back(layers);
  }
  return sizes;
}

// --pipeline-model-parallel-layout: stages split by '|', one 't' per
// transformer layer, 'E' (embedding) on the first chunk, 'L' (loss) on the last.
std::string layout_string(const std::vector<int64_t>& sizes) {
  std::string out;
  for (size_t i = 0; i < sizes.size(); ++i) {
    out += i == 0 ? "E" : "|";
    out += std::string(static_cast<size_t>(sizes[i]), 't');
  }
  return out + "L";
}

// The pipeline arguments for the planned split.
void pipeline_arguments(const Config& config, std::vector<LaunchArgument>& args) {
  const ParallelConfig& p = config.parallel;
  args.push_back({"--pipeline-model-parallel-size", integer_text(p.pipeline), ""});
  if (p.pipeline == 1) {
    return;
  }
  const std::vector<int64_t> sizes = planned_chunk_layers(config);
  const int64_t chunks = p.pipeline * p.virtual_stages;
  if (static_cast<int64_t>(sizes.size()) != chunks) {
    throw ConfigError("parallel.pipeline = " + std::to_string(p.pipeline) +
                      ": the planned split has " + std::to_string(sizes.size()) +
                      " chunks, expected pipeline x virtual_stages = " + std::to_string(chunks));
  }
  const bool even =
      std::all_of(sizes.begin(), sizes.end(), [&](int64_t s) { return s == sizes[0]; });
  // (Appended piece by piece: `"," + text` trips GCC 12's false -Wrestrict.)
  std::string split;
  for (const int64_t s : sizes) {
    if (!split.empty()) {
      split += ',';
    }
    split += std::to_string(s);
  }
  const std::string planned = "modar's planned layers per " +
                              std::string(p.virtual_stages > 1 ? "chunk" : "stage") + ": " + split;
  if (even) {
    if (p.virtual_stages > 1) {
      args.push_back(
          {"--num-layers-per-virtual-pipeline-stage", integer_text(sizes[0]),
           "interleaved 1F1B, " + std::to_string(p.virtual_stages) + " chunks per stage"});
    }
    return;
  }
  const bool middle_even =
      p.virtual_stages == 1 &&
      std::all_of(sizes.begin() + 1, sizes.end() - 1, [&](int64_t s) { return s == sizes[1]; });
  if (middle_even) {
    args.push_back({"--decoder-first-pipeline-num-layers", integer_text(sizes.front()),
                    planned + " (balanced by predicted time)"});
    args.push_back({"--decoder-last-pipeline-num-layers", integer_text(sizes.back()), ""});
    return;
  }
  args.push_back({"--pipeline-model-parallel-layout", "\"" + layout_string(sizes) + "\"",
                  planned + " (balanced by predicted time)"});
}

void model_arguments(const Config& config, LaunchArguments& out) {
  const ModelConfig& m = config.model;
  LaunchArgumentGroup group{"MODEL_ARGS", {}};
  auto& a = group.arguments;
  a.push_back({"--num-layers", integer_text(m.n_layers), ""});
  a.push_back({"--hidden-size", integer_text(m.d_model), ""});
  a.push_back({"--ffn-hidden-size", integer_text(m.resolved_d_ff()), ""});
  a.push_back({"--num-attention-heads", integer_text(m.n_heads), ""});
  a.push_back({"--kv-channels", integer_text(m.resolved_d_head()), ""});
  if (m.resolved_kv_heads() < m.n_heads) {
    a.push_back({"--group-query-attention", "", ""});
    a.push_back({"--num-query-groups", integer_text(m.resolved_kv_heads()), ""});
  }
  a.push_back({"--seq-length", integer_text(m.seq_len), ""});
  a.push_back({"--max-position-embeddings", integer_text(m.seq_len),
               "RoPE: the longest position the run uses"});
  a.push_back({"--vocab-size", integer_text(m.vocab_size), ""});
  a.push_back({"--make-vocab-size-divisible-by", integer_text(m.make_vocab_size_divisible_by),
               "the vocabulary padded to a multiple of this x TP = " +
                   integer_text(m.padded_vocab(config.parallel.tensor))});
  a.push_back({"--position-embedding-type", "rope", ""});
  a.push_back({"--normalization", "RMSNorm", ""});
  a.push_back({"--norm-epsilon", format_number(m.norm_eps), ""});
  a.push_back({"--disable-bias-linear", "", "modar's model has no biases but Q/K/V's (below)"});
  if (m.qkv_bias) {
    a.push_back({"--add-qkv-bias", "", ""});
  }
  if (m.mlp == MlpKind::swiglu) {
    a.push_back({"--swiglu", "", ""});
  } else if (m.mlp == MlpKind::geglu) {
    out.not_expressible.push_back(
        "model.mlp = \"geglu\": gated GELU has no argument here; without one Megatron-LM runs a "
        "plain GELU MLP of --ffn-hidden-size");
  }
  if (!m.tie_embeddings) {
    a.push_back({"--untie-embeddings-and-output-weights", "", ""});
  }
  if (m.qk_norm != QkNorm::none) {
    a.push_back({"--qk-layernorm", "",
                 m.qk_norm == QkNorm::projection
                     ? "per head in Megatron-LM; modar's model.qk_norm = \"projection\" normalises "
                       "the whole Q and K projections (OLMoE)"
                     : ""});
  }
  a.push_back({"--attention-dropout", format_dropout(config.train.attention_dropout),
               config.train.attention_dropout > 0.0 ? "" : "Megatron-LM's default is 0.1"});
  a.push_back({"--hidden-dropout", format_dropout(config.train.hidden_dropout), ""});
  out.groups.push_back(std::move(group));
}

// --moe-layer-freq: 1, or the per-layer pattern (1 = MoE) for leading dense
// layers or an interval.
std::string moe_layer_pattern(const Config& config) {
  const MoeConfig& e = config.moe;
  const int64_t layers = config.model.n_layers;
  if (e.first_dense == 0 && e.interval == 1) {
    return "1";
  }
  std::string out = "\"";
  if (e.interval == 1) {
    out += "([0]*";
    out += std::to_string(e.first_dense);
    out += "+[1]*";
    out += std::to_string(layers - e.first_dense);
    out += ")\"";
    return out;
  }
  out += '[';
  for (int64_t l = 0; l < layers; ++l) {
    if (l > 0) {
      out += ',';
    }
    out += e.is_moe_layer(l) ? '1' : '0';
  }
  out += "]\"";
  return out;
}

void moe_arguments(const Config& config, LaunchArguments& out) {
  const MoeConfig& e = config.moe;
  if (!e.enabled()) {
    return;
  }
  LaunchArgumentGroup group{"MOE_ARGS", {}};
  auto& a = group.arguments;
  a.push_back({"--num-experts", integer_text(e.experts), ""});
  a.push_back({"--moe-router-topk", integer_text(e.top_k), ""});
  a.push_back({"--moe-ffn-hidden-size", integer_text(e.resolved_expert_ffn(config.model)), ""});
  if (e.shared_experts > 0) {
    a.push_back({"--moe-shared-expert-intermediate-size",
                 integer_text(e.shared_ffn_total(config.model)),
                 std::to_string(e.shared_experts) + " shared expert(s), one FFN of their total "
                                                    "width"});
    if (e.shared_expert_gate) {
      out.not_expressible.push_back(
          "moe.shared_expert_gate = true: the sigmoid gate on the shared experts has no argument "
          "in the cited arguments.py (later Megatron-Core: --moe-shared-expert-gate)");
    }
  }
  a.push_back({"--moe-layer-freq", moe_layer_pattern(config), ""});
  a.push_back({"--moe-grouped-gemm", "", ""});
  a.push_back({"--moe-token-dispatcher-type", to_string(e.token_dispatcher), ""});
  // Where the routing weights multiply (moe.router_weights): Megatron-Core
  // weights the experts' activation by default, or their input.
  if (e.router_weights == RouterWeights::input) {
    a.push_back({"--moe-apply-probs-on-input", "", ""});
  } else if (e.router_weights == RouterWeights::output) {
    out.not_expressible.push_back(
        "moe.router_weights = \"output\": Megatron-Core weights the experts' activation (or "
        "their input); it has no argument that keeps the expert output for the weights");
  }
  a.push_back({"--moe-router-load-balancing-type", "aux_loss", ""});
  a.push_back({"--moe-aux-loss-coeff", format_number(e.aux_loss_coef), ""});
  if (e.z_loss_coef > 0.0) {
    a.push_back({"--moe-z-loss-coeff", format_number(e.z_loss_coef), ""});
  }
  if (!e.dropless()) {
    a.push_back({"--moe-expert-capacity-factor", format_number(e.capacity_factor), ""});
    a.push_back({"--moe-pad-expert-input-to-capacity", "", "modar runs the padded capacity slots"});
  }
  if (e.load_imbalance > 1.0) {
    out.not_expressible.push_back("moe.load_imbalance = " + format_number(e.load_imbalance) +
                                  ": a planning assumption about routing, not a setting");
  }
  out.groups.push_back(std::move(group));
}

void parallel_arguments(const Config& config, LaunchArguments& out) {
  const ParallelConfig& p = config.parallel;
  LaunchArgumentGroup group{"PARALLEL_ARGS", {}};
  auto& a = group.arguments;
  a.push_back({"--tensor-model-parallel-size", integer_text(p.tensor), ""});
  if (p.sequence_parallel) {
    a.push_back({"--sequence-parallel", "", ""});
  }
  pipeline_arguments(config, a);
  a.push_back({"--context-parallel-size", integer_text(p.context), ""});
  if (config.moe.enabled()) {
    a.push_back({"--expert-model-parallel-size", integer_text(p.expert), ""});
    a.push_back({"--expert-tensor-parallel-size", integer_text(p.resolved_expert_tensor()),
                 p.expert_tensor > 0 ? "" : "parallel.expert_tensor = 0: the tensor size"});
  }
  if (p.zero == 3) {
    a.push_back({"--use-megatron-fsdp", "",
                 "parallel.zero = 3: parameters, gradients and "
                 "optimizer states sharded"});
    a.push_back({"--data-parallel-sharding-strategy", "optim_grads_params", ""});
  }
  if (p.zero >= 1) {
    a.push_back({"--use-distributed-optimizer", "",
                 p.zero == 3 ? ""
                             : "parallel.zero = " + std::to_string(p.zero) +
                                   ": Megatron-LM's distributed optimizer shards the optimizer "
                                   "states and reduce-scatters the gradients"});
  }
  if (p.overlap_grad_reduce && data_parallel(config) > 1) {
    a.push_back({"--overlap-grad-reduce", "", ""});
    if (p.overlap_param_gather && p.zero >= 1) {
      a.push_back({"--overlap-param-gather", "", ""});
    }
  }
  out.groups.push_back(std::move(group));
}

void training_arguments(const Config& config, LaunchArguments& out) {
  const TrainConfig& t = config.train;
  LaunchArgumentGroup group{"TRAINING_ARGS", {}};
  auto& a = group.arguments;
  a.push_back({"--micro-batch-size", integer_text(t.micro_batch), ""});
  a.push_back({"--global-batch-size", integer_text(global_batch(config)),
               std::to_string(global_batch(config) / (t.micro_batch * data_parallel(config))) +
                   " micro-batch(es) per step on each data-parallel rank"});
  if (t.dtype == DType::bf16) {
    a.push_back({"--bf16", "", ""});
  } else if (t.dtype == DType::fp16) {
    a.push_back({"--fp16", "", ""});
  }
  // train.grad_reduce_in_fp32 where it is not Megatron's default for the
  // dtype (fp32 main gradients for bf16, the parameters' dtype for fp16).
  if (t.dtype == DType::fp16 && t.grad_reduce_in_fp32 == GradReduceInFp32::fp32) {
    a.push_back({"--accumulate-allreduce-grads-in-fp32", "", ""});
  } else if (t.dtype == DType::bf16 && t.grad_reduce_in_fp32 == GradReduceInFp32::param_dtype) {
    a.push_back({"--grad-reduce-in-bf16", "", ""});
  }
  if (t.recompute_granularity == RecomputeGranularity::selective) {
    // Megatron's own granularity and modules (train.recompute_granularity).
    a.push_back({"--recompute-granularity", "selective", ""});
    a.push_back({"--recompute-modules", t.recompute_modules, ""});
  } else if (t.recompute == Recompute::full ||
             t.recompute_granularity == RecomputeGranularity::full) {
    a.push_back({"--recompute-granularity", "full", ""});
    a.push_back({"--recompute-method", "uniform", ""});
    a.push_back({"--recompute-num-layers", "1", ""});
  } else if (t.recompute == Recompute::selective) {
    a.push_back({"--recompute-granularity", "selective",
                 "modar's selective recompute re-runs norms and activations: Megatron-LM's "
                 "nearest modules"});
    a.push_back(
        {"--recompute-modules", config.moe.enabled() ? "layernorm moe_act" : "layernorm", ""});
    out.not_expressible.push_back(
        "train.recompute = \"selective\": Megatron-LM recomputes the dense MLP's activation only "
        "with the whole MLP (--recompute-modules mlp); modar re-runs the activation alone");
  }
  a.push_back({"--attention-backend", is_fused(t.attention_kernel) ? "flash" : "unfused", ""});
  if (t.attention_kernel == AttentionKernel::triton ||
      t.attention_kernel == AttentionKernel::flash1) {
    out.not_expressible.push_back(std::string("train.attention_kernel = \"") +
                                  to_string(t.attention_kernel) +
                                  "\": Megatron-LM has no such attention backend; written as "
                                  "--attention-backend flash");
  }
  if (t.grad_accumulation == GradAccumulation::unfused) {
    a.push_back({"--no-gradient-accumulation-fusion", "", ""});
  }
  out.groups.push_back(std::move(group));
}

void modar_only_settings(const Config& config, LaunchArguments& out) {
  const ModConfig& mod = config.mod;
  if (mod.enabled()) {
    out.not_expressible.push_back(
        "Mixture-of-Depths: mod.capacity = " + format_number(mod.capacity) + ", mod.every = " +
        std::to_string(mod.every) + ", mod.offset = " + std::to_string(mod.offset) +
        ", mod.router_scale = \"" + to_string(mod.router_scale) + "\", mod.causal_router = \"" +
        to_string(mod.causal_router) + "\"");
  }
  const DarConfig& dar = config.dar;
  if (dar.enabled()) {
    out.not_expressible.push_back("depth residuals: dar.variant = \"" +
                                  std::string(to_string(dar.variant)) +
                                  "\", dar.block_layers = " + std::to_string(dar.block_layers) +
                                  ", dar.streams = " + std::to_string(dar.resolved_streams()));
  }
  if (config.moe.mode != MoeMode::none) {
    out.not_expressible.push_back(
        "MoDE: moe.mode = \"" + std::string(to_string(config.moe.mode)) + "\"" +
        (config.moe.mode == MoeMode::integrated
             ? ", moe.null_experts = " + std::to_string(config.moe.null_experts)
             : std::string()));
  }
}

}  // namespace

LaunchArguments megatron_arguments(const Config& config, const std::string& source) {
  validate(config);
  LaunchArguments out;
  out.header.push_back("Megatron-LM arguments written by `modar export` (docs/export.md)" +
                       (source.empty() ? std::string() : " from " + shown_value(source, 200)));
  const int64_t gpus = config.device.count;
  out.header.push_back(
      "world size " + std::to_string(gpus) + " GPUs = tensor " +
      std::to_string(config.parallel.tensor) +
      (config.parallel.context > 1 ? " x context " + std::to_string(config.parallel.context)
                                   : std::string()) +
      " x pipeline " +
      std::to_string(config.parallel.pipeline) + " x data " +
      std::to_string(data_parallel(config)) +
      (config.parallel.expert > 1
           ? " (expert parallel " + std::to_string(config.parallel.expert) + " inside data)"
           : std::string()) +
      "; launch: torchrun --nproc-per-node <GPUs per node> --nnodes <nodes> pretrain_gpt.py "
      "\"${MODEL_ARGS[@]}\" ... plus your data, tokenizer, optimizer and schedule arguments");
  model_arguments(config, out);
  moe_arguments(config, out);
  parallel_arguments(config, out);
  training_arguments(config, out);
  modar_only_settings(config, out);
  return out;
}

std::string render_launch_arguments(const LaunchArguments& arguments) {
  std::string out;
  for (const std::string& line : arguments.header) {
    out += "# " + line + "\n";
  }
  for (const LaunchArgumentGroup& group : arguments.groups) {
    out += group.name + "=(\n";
    for (const LaunchArgument& argument : group.arguments) {
      if (!argument.comment.empty()) {
        out += "    # " + argument.comment + "\n";
      }
      out += "    " + argument.name + (argument.value.empty() ? "" : " " + argument.value) + "\n";
    }
    out += ")\n";
  }
  if (!arguments.not_expressible.empty()) {
    out +=
        "# Not expressible as Megatron-LM arguments (modar plans them; Megatron-LM runs "
        "without):\n";
    for (const std::string& line : arguments.not_expressible) {
      out += "#   " + line + "\n";
    }
  }
  return out;
}

// ---- Megatron-LM arguments -> Config -------------------------------------------

namespace {

// Shell-like words: quotes removed, '#' comments and "\" line continuations
// skipped, bash array brackets ("NAME=(" and ")") dropped.
std::vector<std::string> shell_words(const std::string& text) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  char quote = 0;
  auto finish = [&] {
    if (in_word && !(word.size() >= 2 && word.compare(word.size() - 2, 2, "=(") == 0) &&
        word != ")" && word != "(") {
      words.push_back(word);
    }
    word.clear();
    in_word = false;
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (quote != 0) {
      if (ch == quote) {
        quote = 0;
      } else {
        word += ch;
      }
      continue;
    }
    if (ch == '\'' || ch == '"') {
      quote = ch;
      in_word = true;
    } else if (ch == '\\' && i + 1 < text.size() && (text[i + 1] == '\n' || text[i + 1] == '\r')) {
      ++i;
    } else if (ch == '#' && !in_word) {
      while (i < text.size() && text[i] != '\n') {
        ++i;
      }
    } else if (std::isspace(static_cast<unsigned char>(ch))) {
      finish();
    } else {
      word += ch;
      in_word = true;
    }
  }
  if (quote != 0) {
    throw ConfigError("Megatron-LM arguments: an unclosed " + std::string(1, quote) +
                      " quote; allowed: a command line with balanced quotes");
  }
  finish();
  return words;
}

// Megatron-LM's --moe-layer-freq pattern: a Python list expression of digits,
// commas, brackets, parentheses, + and * ("([0]*3+[1]*29)").
class PatternParser {
 public:
  explicit PatternParser(std::string text) : text_(std::move(text)) {}
  std::vector<int64_t> parse() {
    std::vector<int64_t> out = sum();
    if (pos_ != text_.size()) {
      fail();
    }
    return out;
  }

 private:
  std::vector<int64_t> sum() {
    std::vector<int64_t> out = product();
    while (peek('+')) {
      ++pos_;
      const std::vector<int64_t> more = product();
      out.insert(out.end(), more.begin(), more.end());
      limit(out);
    }
    return out;
  }
  std::vector<int64_t> product() {
    std::vector<int64_t> out = atom();
    while (peek('*')) {
      ++pos_;
      const int64_t times = number();
      std::vector<int64_t> repeated;
      for (int64_t i = 0; i < times; ++i) {
        repeated.insert(repeated.end(), out.begin(), out.end());
        limit(repeated);
      }
      out = std::move(repeated);
    }
    return out;
  }
  std::vector<int64_t> atom() {
    if (peek('(')) {
      ++pos_;
      std::vector<int64_t> out = sum();
      expect(')');
      return out;
    }
    expect('[');
    std::vector<int64_t> out;
    while (!peek(']')) {
      out.push_back(number());
      limit(out);
      if (!peek(',')) {
        break;
      }
      ++pos_;
    }
    expect(']');
    return out;
  }
  int64_t number() {
    int64_t value = 0;
    const size_t start = pos_;
    while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
      value = value * 10 + (text_[pos_++] - '0');
      if (value > kMaxLayers) {
        fail();
      }
    }
    if (pos_ == start) {
      fail();
    }
    return value;
  }
  bool peek(char ch) const { return pos_ < text_.size() && text_[pos_] == ch; }
  void expect(char ch) {
    if (!peek(ch)) {
      fail();
    }
    ++pos_;
  }
  void limit(const std::vector<int64_t>& list) const {
    if (static_cast<int64_t>(list.size()) > kMaxLayers) {
      fail();
    }
  }
  [[noreturn]] void fail() const {
    throw ConfigError("--moe-layer-freq = " + shown_value(text_) +
                      ": not a layer pattern; allowed: an integer N or a list expression such "
                      "as ([0]*1+[1]*27)");
  }
  static constexpr int64_t kMaxLayers = 1 << 16;
  std::string text_;
  size_t pos_ = 0;
};

struct MegatronReader {
  Config config;
  std::vector<std::string> notes;
  std::vector<std::string> unknown;
  std::set<std::string> seen;
  int64_t world_size = 0;  // torchrun --nproc-per-node x --nnodes, when given
  int64_t nodes = 1;
  int64_t layers_per_virtual = 0;
  int64_t expert_tensor = 0;
  std::string layer_freq;
  bool recompute_selective = false;  // --recompute-granularity selective
  std::string recompute_modules;     // --recompute-modules (default core_attn)

  [[noreturn]] static void bad(const std::string& flag, const std::string& value,
                               const std::string& allowed) {
    throw ConfigError(flag + " = " + shown_value(value) + ": " + allowed +
                      " (Megatron-LM arguments)");
  }
  static std::string one(const std::string& flag, const std::vector<std::string>& values) {
    if (values.empty()) {
      throw ConfigError(flag + ": needs a value (Megatron-LM arguments)");
    }
    return values.front();
  }
  static int64_t integer(const std::string& flag, const std::vector<std::string>& values) {
    const std::string text = one(flag, values);
    int64_t value = 0;
    if (!parse_integer_text(text, &value)) {
      bad(flag, text, "must be an integer");
    }
    return value;
  }
  static double real(const std::string& flag, const std::vector<std::string>& values) {
    const std::string text = one(flag, values);
    double value = 0.0;
    if (!parse_finite_number_text(text, &value)) {
      bad(flag, text, "must be a finite number");
    }
    return value;
  }

  void apply_layer_freq();
  void finish();
};

// --moe-layer-freq: N (layer l is MoE iff l % N == 0) or a 0/1 pattern of
// --num-layers entries that modar's first_dense / interval express.
void MegatronReader::apply_layer_freq() {
  MoeConfig& e = config.moe;
  const int64_t layers = config.model.n_layers;
  int64_t every = 0;
  if (parse_integer_text(layer_freq, &every)) {
    if (every < 1) {
      bad("--moe-layer-freq", layer_freq, "must be >= 1");
    }
    e.first_dense = 0;
    e.interval = every;
    return;
  }
  const std::vector<int64_t> pattern = PatternParser(layer_freq).parse();
  if (static_cast<int64_t>(pattern.size()) != layers) {
    bad("--moe-layer-freq", layer_freq,
        "the pattern has " + std::to_string(pattern.size()) +
            " entries; must have --num-layers = " + std::to_string(layers));
  }
  std::vector<int64_t> moe_layers;
  for (int64_t l = 0; l < layers; ++l) {
    if (pattern[l] != 0 && pattern[l] != 1) {
      bad("--moe-layer-freq", layer_freq, "entries must be 0 (dense) or 1 (MoE)");
    }
    if (pattern[l] == 1) {
      moe_layers.push_back(l);
    }
  }
  if (moe_layers.empty()) {
    bad("--moe-layer-freq", layer_freq, "has no MoE layer (1)");
  }
  e.first_dense = moe_layers.front();
  e.interval = moe_layers.size() > 1 ? moe_layers[1] - moe_layers[0] : layers;
  for (int64_t l = 0; l < layers; ++l) {
    if (e.is_moe_layer(l) != (pattern[l] == 1)) {
      bad("--moe-layer-freq", layer_freq,
          "modar models the MoE layers as a first one then every interval-th (moe.first_dense, "
          "moe.interval); this pattern is not");
    }
  }
}

// ---- the Megatron-LM arguments read: one row per argument ---------------------

using Values = std::vector<std::string>;
using FlagAction = void (*)(MegatronReader&, const std::string& flag, const Values& values);
struct FlagRule {
  const char* flag;
  FlagAction apply;
};

// Rows for an argument that sets one field of a section.
template <auto Section, auto Field>
FlagRule integer_flag(const char* flag) {
  return {flag, [](MegatronReader& r, const std::string& f, const Values& v) {
            (r.config.*Section).*Field = MegatronReader::integer(f, v);
          }};
}
template <auto Section, auto Field>
FlagRule real_flag(const char* flag) {
  return {flag, [](MegatronReader& r, const std::string& f, const Values& v) {
            (r.config.*Section).*Field = MegatronReader::real(f, v);
          }};
}
// An argument read without a field of its own: finish() looks at whether it
// was given (reader.seen), or it only bounds something modar does not keep.
FlagRule read_only(const char* flag) {
  return {flag, [](MegatronReader&, const std::string&, const Values&) {}};
}
// An argument modar reads but models another way: a note, once.
template <const char* kWhy>
FlagRule noted(const char* flag) {
  return {flag, [](MegatronReader& r, const std::string& f, const Values&) {
            r.notes.push_back(f + ": " + kWhy);
          }};
}

constexpr char kBalanced[] =
    "modar balances the pipeline stages by predicted time "
    "(parallel.balance_stages)";
constexpr char kPerLayer[] = "modar's recompute is per layer, every layer (train.recompute)";
constexpr char kGelu[] = "modelled as GELU (same shapes)";

const std::vector<FlagRule>& megatron_flag_rules() {
  using M = ModelConfig;
  using E = MoeConfig;
  using P = ParallelConfig;
  using T = TrainConfig;
  static const std::vector<FlagRule> rules = {
      // the model
      integer_flag<&Config::model, &M::n_layers>("--num-layers"),
      integer_flag<&Config::model, &M::d_model>("--hidden-size"),
      integer_flag<&Config::model, &M::d_ff>("--ffn-hidden-size"),
      integer_flag<&Config::model, &M::n_heads>("--num-attention-heads"),
      integer_flag<&Config::model, &M::d_head>("--kv-channels"),
      integer_flag<&Config::model, &M::n_kv_heads>("--num-query-groups"),  // with GQA (finish)
      integer_flag<&Config::model, &M::seq_len>("--seq-length"),
      integer_flag<&Config::model, &M::vocab_size>("--vocab-size"),
      integer_flag<&Config::model, &M::vocab_size>("--padded-vocab-size"),
      integer_flag<&Config::model, &M::make_vocab_size_divisible_by>(
          "--make-vocab-size-divisible-by"),
      real_flag<&Config::model, &M::norm_eps>("--norm-epsilon"),
      {"--swiglu", [](MegatronReader& r, const std::string&,
                      const Values&) { r.config.model.mlp = MlpKind::swiglu; }},
      {"--add-qkv-bias", [](MegatronReader& r, const std::string&,
                            const Values&) { r.config.model.qkv_bias = true; }},
      {"--qk-layernorm", [](MegatronReader& r, const std::string&,
                            const Values&) { r.config.model.qk_norm = QkNorm::head; }},
      {"--normalization",
       [](MegatronReader& r, const std::string& f, const Values& v) {
         if (MegatronReader::one(f, v) != "RMSNorm") {
           r.notes.push_back(f + " " + shown_value(v.front()) +
                             ": modelled as RMSNorm (its shifts are not counted)");
         }
       }},
      {"--position-embedding-type",
       [](MegatronReader& r, const std::string& f, const Values& v) {
         if (MegatronReader::one(f, v) != "rope") {
           r.notes.push_back(f + " " + shown_value(v.front()) +
                             ": modelled as RoPE (a learned table is not counted)");
         }
       }},
      noted<kGelu>("--squared-relu"),
      noted<kGelu>("--openai-gelu"),
      read_only("--group-query-attention"),
      read_only("--disable-bias-linear"),
      read_only("--untie-embeddings-and-output-weights"),
      read_only("--max-position-embeddings"),
      read_only("--use-rotary-position-embeddings"),
      // the experts
      integer_flag<&Config::moe, &E::experts>("--num-experts"),
      integer_flag<&Config::moe, &E::top_k>("--moe-router-topk"),
      integer_flag<&Config::moe, &E::expert_ffn>("--moe-ffn-hidden-size"),
      real_flag<&Config::moe, &E::capacity_factor>("--moe-expert-capacity-factor"),
      real_flag<&Config::moe, &E::aux_loss_coef>("--moe-aux-loss-coeff"),
      real_flag<&Config::moe, &E::z_loss_coef>("--moe-z-loss-coeff"),
      {"--moe-shared-expert-intermediate-size",
       [](MegatronReader& r, const std::string& f, const Values& v) {
         r.config.moe.shared_experts = 1;  // one FFN of the total width
         r.config.moe.shared_expert_ffn = MegatronReader::integer(f, v);
       }},
      {"--moe-shared-expert-gate", [](MegatronReader& r, const std::string&,
                                      const Values&) { r.config.moe.shared_expert_gate = true; }},
      {"--moe-layer-freq", [](MegatronReader& r, const std::string& f,
                              const Values& v) { r.layer_freq = MegatronReader::one(f, v); }},
      // (modar models grouped GEMMs, the all-to-all and padded capacity already)
      read_only("--moe-grouped-gemm"),
      {"--moe-token-dispatcher-type",
       [](MegatronReader& r, const std::string& f, const Values& v) {
         const std::string kind = MegatronReader::one(f, v);
         if (kind != "alltoall" && kind != "allgather") {
           MegatronReader::bad(f, kind, "modar models alltoall and allgather");
         }
         r.config.moe.token_dispatcher =
             kind == "alltoall" ? TokenDispatcher::alltoall : TokenDispatcher::allgather;
       }},
      {"--moe-apply-probs-on-input",
       [](MegatronReader& r, const std::string&, const Values&) {
         r.config.moe.router_weights = RouterWeights::input;
       }},
      read_only("--moe-router-load-balancing-type"),
      read_only("--moe-pad-expert-input-to-capacity"),
      read_only("--moe-permute-fusion"),
      // the layout
      integer_flag<&Config::parallel, &P::tensor>("--tensor-model-parallel-size"),
      integer_flag<&Config::parallel, &P::pipeline>("--pipeline-model-parallel-size"),
      integer_flag<&Config::parallel, &P::virtual_stages>("--num-virtual-stages-per-pipeline-rank"),
      integer_flag<&Config::parallel, &P::expert>("--expert-model-parallel-size"),
      {"--num-layers-per-virtual-pipeline-stage",
       [](MegatronReader& r, const std::string& f, const Values& v) {
         r.layers_per_virtual = MegatronReader::integer(f, v);
       }},
      {"--expert-tensor-parallel-size",
       [](MegatronReader& r, const std::string& f, const Values& v) {
         r.expert_tensor = MegatronReader::integer(f, v);
       }},
      integer_flag<&Config::parallel, &P::context>("--context-parallel-size"),
      {"--sequence-parallel", [](MegatronReader& r, const std::string&,
                                 const Values&) { r.config.parallel.sequence_parallel = true; }},
      {"--use-distributed-optimizer",
       [](MegatronReader& r, const std::string&, const Values&) {
         r.config.parallel.zero = std::max<int64_t>(r.config.parallel.zero, 1);
       }},
      {"--use-megatron-fsdp",
       [](MegatronReader& r, const std::string&, const Values&) { r.config.parallel.zero = 3; }},
      {"--use-torch-fsdp2",
       [](MegatronReader& r, const std::string&, const Values&) { r.config.parallel.zero = 3; }},
      {"--data-parallel-sharding-strategy",
       [](MegatronReader& r, const std::string& f, const Values& v) {
         const std::string s = MegatronReader::one(f, v);
         r.config.parallel.zero = s == "optim_grads_params" ? 3
                                  : s == "optim_grads"      ? 2
                                  : s == "optim"            ? 1
                                                            : 0;
       }},
      read_only("--overlap-grad-reduce"),
      read_only("--overlap-param-gather"),
      noted<kBalanced>("--decoder-first-pipeline-num-layers"),
      noted<kBalanced>("--decoder-last-pipeline-num-layers"),
      noted<kBalanced>("--pipeline-model-parallel-layout"),
      {"--nproc-per-node", [](MegatronReader& r, const std::string& f,
                              const Values& v) { r.world_size = MegatronReader::integer(f, v); }},
      {"--nproc_per_node", [](MegatronReader& r, const std::string& f,
                              const Values& v) { r.world_size = MegatronReader::integer(f, v); }},
      {"--nnodes", [](MegatronReader& r, const std::string& f,
                      const Values& v) { r.nodes = MegatronReader::integer(f, v); }},
      // training
      integer_flag<&Config::train, &T::micro_batch>("--micro-batch-size"),
      integer_flag<&Config::train, &T::global_batch>("--global-batch-size"),
      {"--bf16", [](MegatronReader& r, const std::string&,
                    const Values&) { r.config.train.dtype = DType::bf16; }},
      {"--fp16", [](MegatronReader& r, const std::string&,
                    const Values&) { r.config.train.dtype = DType::fp16; }},
      {"--accumulate-allreduce-grads-in-fp32",
       [](MegatronReader& r, const std::string&, const Values&) {
         r.config.train.grad_reduce_in_fp32 = GradReduceInFp32::fp32;
       }},
      {"--grad-reduce-in-bf16",
       [](MegatronReader& r, const std::string&, const Values&) {
         r.config.train.grad_reduce_in_fp32 = GradReduceInFp32::param_dtype;
       }},
      // Full recompute is modar's train.recompute = "full" (the same plan);
      // selective is Megatron's own (train.recompute_granularity, with
      // --recompute-modules or its default core_attn: finish()).
      {"--recompute-granularity",
       [](MegatronReader& r, const std::string& f, const Values& v) {
         const std::string g = MegatronReader::one(f, v);
         if (g != "full" && g != "selective") {
           MegatronReader::bad(f, g, "must be full or selective");
         }
         r.recompute_selective = g == "selective";
         r.config.train.recompute = g == "full" ? Recompute::full : Recompute::none;
       }},
      {"--recompute-activations",
       [](MegatronReader& r, const std::string&, const Values&) {
         r.recompute_selective = true;
       }},
      {"--recompute-modules",
       [](MegatronReader& r, const std::string& f, const Values& v) {
         if (v.empty()) {
           MegatronReader::bad(f, "", "names the modules to recompute");
         }
         std::string modules;
         for (const std::string& name : v) {
           modules += (modules.empty() ? "" : " ") + name;
         }
         r.recompute_modules = modules;
       }},
      noted<kPerLayer>("--recompute-method"),
      noted<kPerLayer>("--recompute-num-layers"),
      {"--attention-backend",
       [](MegatronReader& r, const std::string& f, const Values& v) {
         r.config.train.attention_kernel = MegatronReader::one(f, v) == "unfused"
                                               ? AttentionKernel::unfused
                                               : AttentionKernel::flash;
       }},
      {"--no-gradient-accumulation-fusion",
       [](MegatronReader& r, const std::string&, const Values&) {
         r.config.train.grad_accumulation = GradAccumulation::unfused;
       }},
      real_flag<&Config::train, &T::attention_dropout>("--attention-dropout"),
      real_flag<&Config::train, &T::hidden_dropout>("--hidden-dropout"),
  };
  return rules;
}

void MegatronReader::finish() {
  ModelConfig& m = config.model;
  if (!seen.count("--group-query-attention")) {
    m.n_kv_heads = 0;  // --num-query-groups applies only with GQA
  }
  if (!seen.count("--swiglu")) {
    m.mlp = MlpKind::gelu;  // Megatron-LM's default MLP
  }
  m.tie_embeddings = !seen.count("--untie-embeddings-and-output-weights");
  // Megatron's own defaults written out are modar's defaults (0).
  if (m.d_head > 0 && m.n_heads > 0 && m.d_head * m.n_heads == m.d_model) {
    m.d_head = 0;
  }
  if (config.moe.expert_ffn > 0 && config.moe.expert_ffn == m.d_ff) {
    config.moe.expert_ffn = 0;
  }
  if (!seen.count("--disable-bias-linear")) {
    notes.push_back("no --disable-bias-linear: Megatron-LM's linear biases are not counted");
  }
  if (!seen.count("--normalization")) {
    notes.push_back("no --normalization: Megatron-LM's default LayerNorm modelled as RMSNorm");
  }
  ParallelConfig& p = config.parallel;
  p.overlap_grad_reduce = seen.count("--overlap-grad-reduce") > 0;
  p.overlap_param_gather = seen.count("--overlap-param-gather") > 0;
  if (layers_per_virtual > 0) {
    const int64_t per_stage = p.pipeline > 0 ? m.n_layers / p.pipeline : 0;
    if (layers_per_virtual > per_stage || per_stage % layers_per_virtual != 0) {
      bad("--num-layers-per-virtual-pipeline-stage", std::to_string(layers_per_virtual),
          "must divide the layers per pipeline stage = " + std::to_string(per_stage));
    }
    p.virtual_stages = per_stage / layers_per_virtual;
  }
  if (p.virtual_stages > 1) {
    p.schedule = PipelineSchedule::interleaved;
  }
  // An expert tensor size equal to the tensor size is modar's default (0).
  p.expert_tensor = expert_tensor > 0 && expert_tensor != p.tensor ? expert_tensor : 0;
  TrainConfig& t = config.train;
  if (recompute_selective) {
    t.recompute_granularity = RecomputeGranularity::selective;
    t.recompute_modules = recompute_modules.empty() ? "core_attn" : recompute_modules;
  } else if (!recompute_modules.empty()) {
    notes.push_back("--recompute-modules without --recompute-granularity selective: not used");
  }
  // Megatron-LM's defaults where the command line gives none.
  if (!seen.count("--make-vocab-size-divisible-by") && !seen.count("--padded-vocab-size")) {
    m.make_vocab_size_divisible_by = 128;
  }
  if (!seen.count("--attention-dropout")) {
    t.attention_dropout = 0.1;
  }
  if (!seen.count("--hidden-dropout")) {
    t.hidden_dropout = 0.1;
  }
  if (config.moe.experts > 0 && !layer_freq.empty()) {
    apply_layer_freq();
  }
  if (world_size > 0) {
    config.device.count = world_size * nodes;
  } else {
    config.device.count = p.tensor * p.context * p.pipeline;
    notes.push_back("device.count = " + std::to_string(config.device.count) +
                    ": the world size is the launcher's, not an argument (tensor x context x "
                    "pipeline, data-parallel size 1, taken); set yours with --set "
                    "device.count=N");
  }
}

}  // namespace

Config config_from_megatron_args(const std::string& text, std::string* notes) {
  MegatronReader reader;
  const std::vector<std::string> words = shell_words(text);
  for (size_t i = 0; i < words.size(); ++i) {
    const std::string& word = words[i];
    if (word.rfind("--", 0) != 0) {
      continue;  // the launcher and the script (torchrun, pretrain_gpt.py)
    }
    std::string flag = word;
    std::vector<std::string> values;
    const size_t equals = word.find('=');
    if (equals != std::string::npos) {
      flag = word.substr(0, equals);
      values.push_back(word.substr(equals + 1));
    } else {
      while (i + 1 < words.size() && words[i + 1].rfind("--", 0) != 0) {
        values.push_back(words[++i]);
      }
    }
    reader.seen.insert(flag);
    const std::vector<FlagRule>& rules = megatron_flag_rules();
    const auto rule =
        std::find_if(rules.begin(), rules.end(), [&](const FlagRule& r) { return flag == r.flag; });
    if (rule == rules.end()) {
      reader.unknown.push_back(shown_value(flag, 80));
    } else {
      rule->apply(reader, flag, values);
    }
  }
  reader.finish();
  if (notes != nullptr) {
    std::string line = "Megatron-LM arguments read";
    for (const std::string& note : reader.notes) {
      line += "; " + note;
    }
    if (!reader.unknown.empty()) {
      std::sort(reader.unknown.begin(), reader.unknown.end());
      reader.unknown.erase(std::unique(reader.unknown.begin(), reader.unknown.end()),
                           reader.unknown.end());
      line += "; not modelled:";
      for (size_t i = 0; i < reader.unknown.size(); ++i) {
        line += (i == 0 ? " " : ", ") + reader.unknown[i];
      }
    }
    *notes = line;
  }
  return reader.config;
}

Config config_from_recommendation_json(const std::string& json_text, const std::string& arch,
                                       const std::string& role, const std::string& source) {
  using Json = nlohmann::json;
  const std::string where = shown_value(source, 200);
  Json root;
  try {
    root = Json::parse(json_text, [](int depth, Json::parse_event_t, Json&) {
      if (depth > 32) {
        throw ConfigError("nested deeper than 32 levels");
      }
      return true;
    });
  } catch (const std::exception& e) {
    throw FileError(where + ": not valid JSON (" + shown_value(e.what(), 160) +
                    "); allowed: the document of `modar optimal --json`");
  }
  if (!root.is_object() || !root.contains("recommendations") ||
      !root["recommendations"].is_array()) {
    throw FileError(where +
                    ": no \"recommendations\" list; allowed: the document of "
                    "`modar optimal --json`");
  }
  std::vector<const Json*> matches;
  std::set<std::string> archs;
  for (const Json& rec : root["recommendations"]) {
    if (!rec.is_object() || !rec.contains("arch") || !rec["arch"].is_string() ||
        !rec.contains("config") || !rec["config"].is_object()) {
      throw FileError(where +
                      ": a recommendation without \"arch\" and \"config\"; allowed: the "
                      "document of `modar optimal --json` (modar 0.1 or later)");
    }
    const std::string rec_arch = rec["arch"].get<std::string>();
    archs.insert(rec_arch);
    const std::string rec_role = rec.value("role", std::string("isoflop_optimal"));
    if ((arch.empty() || rec_arch == arch) && rec_role == role) {
      matches.push_back(&rec);
    }
  }
  std::string names;
  for (const std::string& name : archs) {
    names += (names.empty() ? "" : ", ") + name;
  }
  if (matches.empty()) {
    throw ConfigError("pick = " + shown_value(arch.empty() ? role : arch + " (" + role + ")") +
                      ": no such recommendation in " + where + "; allowed: " + names);
  }
  if (matches.size() > 1) {
    throw ConfigError("pick = \"\": " + where + " recommends " + names +
                      "; name one (e.g. pick = " + *archs.begin() + ")");
  }
  Config config;
  for (const auto& [key, value] : (*matches.front())["config"].items()) {
    const ConfigKey setter(key);
    if (value.is_boolean()) {
      setter.set_boolean(config, value.get<bool>());
    } else if (value.is_number_integer()) {
      setter.set_integer(config, value.get<int64_t>());
    } else if (value.is_number()) {
      setter.set_real(config, value.get<double>());
    } else if (value.is_string()) {
      setter.set_text(config, value.get<std::string>());
    } else {
      throw ConfigError(key + " = " + shown_value(value.dump()) + ": not a value of " + where);
    }
  }
  validate(config);
  return config;
}

}  // namespace modar
