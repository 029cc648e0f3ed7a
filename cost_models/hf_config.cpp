// Hugging Face config.json -> modar Config (include/modar/hf_config.hpp).
//
// A config.json is one JSON object of the model's hyper-parameters; its keys
// depend on model_type.  Each supported model_type is one row of kModelTypes
// (its key style, MLP, attention extras and expert layout); the readers below
// take every field through HfFields, which types it (naming the field, its
// value and the modar key it maps to on any error) and remembers it was read,
// so whatever is left over is listed once as "not modelled".  Which fields map
// where, and why: docs/hf_import.md.
#include "modar/hf_config.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "modar/base/errors.hpp"
#include "modar/base/text.hpp"

namespace modar {

namespace {

using Json = nlohmann::json;

// A config.json is flat with a few shallow objects (rope_scaling,
// quantization_config); anything nested deeper is not one.
constexpr int kMaxJsonDepth = 32;

// Fields about the checkpoint rather than the model's shape: never listed as
// "not modelled" (nothing a planner could model).
const std::set<std::string>& bookkeeping_fields() {
  static const std::set<std::string> fields = {"_name_or_path",
                                               "architectures",
                                               "auto_map",
                                               "bos_token_id",
                                               "dtype",
                                               "eos_token_id",
                                               "initializer_range",
                                               "model_type",
                                               "pad_token_id",
                                               "torch_dtype",
                                               "transformers_version",
                                               "use_cache",
                                               "tokenizer_class",
                                               "return_dict",
                                               "output_attentions",
                                               "output_hidden_states",
                                               "output_router_logits",
                                               "pretraining_tp",
                                               "id2label",
                                               "label2id"};
  return fields;
}

std::string shown_json(const Json& value) {
  return shown_value(value.dump(-1, ' ', false, Json::error_handler_t::replace));
}

// Typed, remembered reads of a config.json's top-level fields.
class HfFields {
 public:
  HfFields(const Json& root, std::string source) : root_(root), source_(std::move(source)) {}

  const std::string& source() const { return source_; }

  // Present and not null (Hugging Face writes null for "the default").
  bool present(const char* key) const {
    const auto it = root_.find(key);
    return it != root_.end() && !it->is_null();
  }

  // Marks `key` read without using it (its value is handled elsewhere).
  void read(const char* key) { read_.insert(key); }

  std::optional<int64_t> integer(const char* key, const char* maps_to) {
    read(key);
    if (!present(key)) {
      return std::nullopt;
    }
    const Json& value = root_.at(key);
    if (value.is_number_integer() && !value.is_number_unsigned()) {
      return value.get<int64_t>();
    }
    if (value.is_number_unsigned() &&
        value.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return static_cast<int64_t>(value.get<uint64_t>());
    }
    if (value.is_number_float()) {
      const double real = value.get<double>();
      if (std::isfinite(real) && real == std::floor(real) && std::fabs(real) < 9.0e15) {
        return static_cast<int64_t>(real);
      }
    }
    fail(key, value, "must be an integer", maps_to);
  }

  int64_t required_integer(const char* key, const char* maps_to, const char* model_type) {
    const std::optional<int64_t> value = integer(key, maps_to);
    if (!value) {
      throw ConfigError(source_ + ": missing " + key + " (maps to " + maps_to + "); a \"" +
                        model_type + "\" config.json has it");
    }
    return *value;
  }

  std::optional<double> number(const char* key, const char* maps_to) {
    return typed<double>(key, maps_to, &Json::is_number, "must be a number");
  }

  std::optional<bool> boolean(const char* key, const char* maps_to) {
    return typed<bool>(key, maps_to, &Json::is_boolean, "must be true or false");
  }

  std::optional<std::string> text(const char* key, const char* maps_to) {
    return typed<std::string>(key, maps_to, &Json::is_string, "must be a string");
  }

  std::vector<int64_t> integer_list(const char* key, const char* maps_to) {
    read(key);
    std::vector<int64_t> out;
    if (!present(key)) {
      return out;
    }
    const Json& value = root_.at(key);
    if (!value.is_array()) {
      fail(key, value, "must be a list of layer indices", maps_to);
    }
    for (const Json& item : value) {
      if (!item.is_number_integer()) {
        fail(key, value, "must be a list of layer indices", maps_to);
      }
      out.push_back(item.get<int64_t>());
    }
    return out;
  }

  // Top-level fields never read, less the bookkeeping ones, sorted.
  std::vector<std::string> unread() const {
    std::vector<std::string> out;
    for (auto it = root_.begin(); it != root_.end(); ++it) {
      if (read_.count(it.key()) == 0 && bookkeeping_fields().count(it.key()) == 0) {
        out.push_back(shown_value(it.key()));
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  // A present field of JSON type `is_type` as a T; nullopt when absent or null.
  template <class T>
  std::optional<T> typed(const char* key, const char* maps_to,
                         bool (Json::*is_type)() const noexcept, const char* allowed) {
    read(key);
    if (!present(key)) {
      return std::nullopt;
    }
    const Json& value = root_.at(key);
    if (!(value.*is_type)()) {
      fail(key, value, allowed, maps_to);
    }
    return value.get<T>();
  }

  [[noreturn]] void fail(const char* key, const Json& value, const std::string& allowed,
                         const char* maps_to) const {
    throw ConfigError(source_ + ": " + key + " = " + shown_json(value) + ": " + allowed +
                      " (maps to " + maps_to + ")");
  }

 private:
  const Json& root_;
  std::string source_;
  std::set<std::string> read_;
};

// ---- the supported model types ----------------------------------------------

enum class KeyStyle { llama, gpt2 };            // hidden_size ... | n_embd ...
enum class MlpStyle { gated, plain };           // gate/up/down | up/down
enum class QkvBias { attention_bias, always };  // the attention_bias field | Qwen2's fixed biases
enum class ExpertStyle { none, mixtral, olmoe, qwen2_moe, qwen3_moe, deepseek };

struct ModelTypeSpec {
  const char* model_type;
  KeyStyle keys;
  MlpStyle mlp;
  bool tie_default;  // tie_word_embeddings when absent (the family's config class default)
  QkvBias qkv_bias;
  QkNorm qk_norm;
  ExpertStyle experts;
};

constexpr ModelTypeSpec kModelTypes[] = {
    {"llama", KeyStyle::llama, MlpStyle::gated, false, QkvBias::attention_bias, QkNorm::none,
     ExpertStyle::none},
    {"mistral", KeyStyle::llama, MlpStyle::gated, false, QkvBias::attention_bias, QkNorm::none,
     ExpertStyle::none},
    {"qwen2", KeyStyle::llama, MlpStyle::gated, false, QkvBias::always, QkNorm::none,
     ExpertStyle::none},
    {"qwen3", KeyStyle::llama, MlpStyle::gated, false, QkvBias::attention_bias, QkNorm::head,
     ExpertStyle::none},
    {"gemma", KeyStyle::llama, MlpStyle::gated, true, QkvBias::attention_bias, QkNorm::none,
     ExpertStyle::none},
    {"gemma2", KeyStyle::llama, MlpStyle::gated, true, QkvBias::attention_bias, QkNorm::none,
     ExpertStyle::none},
    {"gpt_neox", KeyStyle::llama, MlpStyle::plain, false, QkvBias::attention_bias, QkNorm::none,
     ExpertStyle::none},
    {"gpt2", KeyStyle::gpt2, MlpStyle::plain, true, QkvBias::attention_bias, QkNorm::none,
     ExpertStyle::none},
    {"mixtral", KeyStyle::llama, MlpStyle::gated, false, QkvBias::attention_bias, QkNorm::none,
     ExpertStyle::mixtral},
    {"qwen2_moe", KeyStyle::llama, MlpStyle::gated, false, QkvBias::always, QkNorm::none,
     ExpertStyle::qwen2_moe},
    {"qwen3_moe", KeyStyle::llama, MlpStyle::gated, false, QkvBias::attention_bias, QkNorm::head,
     ExpertStyle::qwen3_moe},
    {"deepseek", KeyStyle::llama, MlpStyle::gated, false, QkvBias::attention_bias, QkNorm::none,
     ExpertStyle::deepseek},
    {"olmoe", KeyStyle::llama, MlpStyle::gated, false, QkvBias::attention_bias, QkNorm::projection,
     ExpertStyle::olmoe},
};

const ModelTypeSpec* find_model_type(const std::string& model_type) {
  for (const ModelTypeSpec& spec : kModelTypes) {
    if (model_type == spec.model_type) {
      return &spec;
    }
  }
  return nullptr;
}

std::string supported_list() {
  std::string out;
  for (const std::string& name : hf_model_types()) {
    out += (out.empty() ? "" : ", ") + name;
  }
  return out;
}

[[noreturn]] void unsupported(const std::string& source, const std::string& model_type) {
  std::string why;
  if (model_type == "deepseek_v2" || model_type == "deepseek_v3" || model_type == "kimi_k2") {
    why = " (multi-head latent attention, kv_lora_rank, is not modelled)";
  }
  throw ConfigError(source + ": model_type = \"" + shown_value(model_type) +
                    "\": not a supported architecture" + why + "; supported: " + supported_list() +
                    " (docs/hf_import.md)");
}

// ---- the readers ---------------------------------------------------------------

struct Reader {
  HfFields& fields;
  const ModelTypeSpec& spec;
  HfImport& out;

  void note(const std::string& key, const std::string& text) { out.notes.push_back({key, text}); }

  void shape();
  void activation();
  void sequence_length();
  void attention_extras();
  void plain_model_extras();
  void family_notes();
  void experts();
  void qwen_layer_pattern();
  void deepseek_layer_pattern();
};

void Reader::shape() {
  ModelConfig& m = out.config.model;
  const bool gpt2 = spec.keys == KeyStyle::gpt2;
  const char* type = spec.model_type;
  m.d_model = fields.required_integer(gpt2 ? "n_embd" : "hidden_size", "model.d_model", type);
  m.n_layers =
      fields.required_integer(gpt2 ? "n_layer" : "num_hidden_layers", "model.n_layers", type);
  m.n_heads =
      fields.required_integer(gpt2 ? "n_head" : "num_attention_heads", "model.n_heads", type);
  m.vocab_size = fields.required_integer("vocab_size", "model.vocab_size", type);
  if (!gpt2) {
    m.n_kv_heads = fields.integer("num_key_value_heads", "model.n_kv_heads").value_or(0);
    m.d_head = fields.integer("head_dim", "model.d_head").value_or(0);
  }
  // The dense FFN width (GPT-2's n_inner null: 4 d, modar's GELU default).
  m.d_ff = fields.integer(gpt2 ? "n_inner" : "intermediate_size", "model.d_ff").value_or(0);
  const char* eps_key = gpt2 ? "layer_norm_epsilon"
                             : (spec.mlp == MlpStyle::plain ? "layer_norm_eps" : "rms_norm_eps");
  if (const std::optional<double> eps = fields.number(eps_key, "model.norm_eps")) {
    m.norm_eps = *eps;
  }
  m.tie_embeddings =
      fields.boolean("tie_word_embeddings", "model.tie_embeddings").value_or(spec.tie_default);
}

void Reader::activation() {
  ModelConfig& m = out.config.model;
  // Gemma's newer configs name the MLP's activation hidden_activation.
  const char* key = spec.keys == KeyStyle::gpt2           ? "activation_function"
                    : fields.present("hidden_activation") ? "hidden_activation"
                                                          : "hidden_act";
  fields.read("hidden_act");  // the one not used is no field of its own
  fields.read("hidden_activation");
  const std::optional<std::string> act = fields.text(key, "model.mlp");
  const std::string name = act.value_or(spec.mlp == MlpStyle::gated ? "silu" : "gelu");
  const bool silu = name == "silu" || name == "swish";
  const bool gelu = name.rfind("gelu", 0) == 0 || name == "quick_gelu";
  if (spec.mlp == MlpStyle::gated && (silu || gelu)) {
    m.mlp = silu ? MlpKind::swiglu : MlpKind::geglu;
    return;
  }
  if (spec.mlp == MlpStyle::plain && gelu) {
    m.mlp = MlpKind::gelu;
    return;
  }
  throw ConfigError(fields.source() + ": " + key + " = \"" + shown_value(name) +
                    "\": unsupported activation for model_type \"" + spec.model_type +
                    "\" (maps to model.mlp); allowed: " +
                    (spec.mlp == MlpStyle::gated ? "silu, swish (swiglu) or gelu* (geglu)"
                                                 : "gelu, gelu_new, gelu_fast, "
                                                   "gelu_pytorch_tanh, quick_gelu"));
}

void Reader::sequence_length() {
  const char* key = spec.keys == KeyStyle::gpt2 ? "n_positions" : "max_position_embeddings";
  if (spec.keys == KeyStyle::gpt2) {
    fields.read("n_ctx");
  }
  const std::optional<int64_t> longest = fields.integer(key, "model.seq_len (an upper bound)");
  int64_t seq_len = kHfDefaultSeqLen;
  std::string why = "the default (config.json holds no training length";
  if (longest && *longest > 0 && *longest < seq_len) {
    seq_len = *longest;
    why = "the default " + std::to_string(kHfDefaultSeqLen) + " capped at " + key + " = " +
          std::to_string(*longest) + " (config.json holds no training length";
  } else if (longest) {
    why += "; " + std::string(key) + " = " + std::to_string(*longest) +
           " is the longest context, not the one you train with";
  }
  out.config.model.seq_len = seq_len;
  note("model.seq_len", "model.seq_len = " + std::to_string(seq_len) + ": " + why +
                            "; set yours with --set model.seq_len=N, Python seq_len=N)");
}

void Reader::attention_extras() {
  ModelConfig& m = out.config.model;
  m.qk_norm = spec.qk_norm;
  if (spec.qk_norm == QkNorm::projection) {
    note("model.qk_norm", "model.qk_norm = \"projection\": " + std::string(spec.model_type) +
                              " normalises the whole Q and K projections");
  }
  if (spec.qkv_bias == QkvBias::always) {
    m.qkv_bias = true;  // Qwen2's attention has Q/K/V biases and no key for them
    return;
  }
  if (spec.keys == KeyStyle::gpt2 || spec.mlp == MlpStyle::plain) {
    return;  // GPT-2 / GPT-NeoX: every linear has a bias (plain_model_extras)
  }
  if (fields.boolean("attention_bias", "model.qkv_bias").value_or(false)) {
    m.qkv_bias = true;
    note("model.qkv_bias",
         "attention_bias = true: the Q/K/V biases are counted, the output "
         "projection's (d_model per layer) is not");
  }
  if (fields.boolean("mlp_bias", "(not modelled)").value_or(false)) {
    note("", "mlp_bias = true: the MLP biases are not counted");
  }
}

// GPT-2 / GPT-NeoX: LayerNorm with shifts, biases on every linear layer and
// (GPT-2) a learned position table; modar's model has RMSNorm, no biases
// and RoPE.  Say how many parameters that leaves out.
void Reader::plain_model_extras() {
  if (spec.mlp != MlpStyle::plain) {
    return;
  }
  const ModelConfig& m = out.config.model;
  const double d = static_cast<double>(m.d_model);
  const double layers = static_cast<double>(m.n_layers);
  const double d_ff = static_cast<double>(m.d_ff > 0 ? m.d_ff : 4 * m.d_model);
  double missing = layers * (3.0 * d + d + d_ff + d) + (2.0 * layers + 1.0) * d;
  std::string what = "linear biases and LayerNorm shifts";
  if (spec.keys == KeyStyle::gpt2) {
    const std::optional<int64_t> positions = fields.integer("n_positions", "model.seq_len");
    missing += positions ? static_cast<double>(*positions) * d : 0.0;
    what += " and the learned position table";
  } else if (fields.boolean("use_parallel_residual", "(not modelled)").value_or(false)) {
    note("",
         "use_parallel_residual = true: attention and MLP modelled in sequence (same "
         "FLOPs and parameters)");
  }
  note("", std::string(spec.model_type) + ": " + what + " are not modelled (modar's model has " +
               "RMSNorm, RoPE and no biases): " + format_number(missing) +
               " parameters fewer than the checkpoint");
}

// What a family has beyond modar's model that changes nothing planned, or
// little: said once.
void Reader::family_notes() {
  if (out.model_type == "gemma2") {
    note("",
         "gemma2: the post-attention and post-MLP norms (2 d_model per layer) are not "
         "counted; logit soft-capping and sliding-window layers are not modelled");
  }
  if (out.model_type == "gemma" || out.model_type == "gemma2") {
    note("model.mlp", "model.mlp = \"geglu\": Gemma's gated GELU MLP");
  }
}

// Qwen2-MoE / Qwen3-MoE: layer l is MoE iff it is not in mlp_only_layers and
// (l + 1) % decoder_sparse_step == 0; modar's first_dense / interval express
// that when mlp_only_layers is a prefix.
void Reader::qwen_layer_pattern() {
  MoeConfig& e = out.config.moe;
  const int64_t step = fields.integer("decoder_sparse_step", "moe.interval").value_or(1);
  if (step < 1) {
    throw ConfigError(fields.source() + ": decoder_sparse_step = " + std::to_string(step) +
                      ": must be >= 1 (maps to moe.interval)");
  }
  e.interval = step;
  e.first_dense = step - 1;
  const std::vector<int64_t> dense = fields.integer_list("mlp_only_layers", "moe.first_dense");
  for (size_t i = 0; i < dense.size(); ++i) {
    if (dense[i] != static_cast<int64_t>(i) || step != 1) {
      std::string list;
      for (const int64_t l : dense) {
        list += (list.empty() ? "" : ", ") + std::to_string(l);
      }
      throw ConfigError(fields.source() + ": mlp_only_layers = [" + shown_value(list) +
                        "]: modar models the dense layers as a prefix (moe.first_dense) then "
                        "every moe.interval-th layer; allowed: [0, 1, ..., k-1] with "
                        "decoder_sparse_step = 1");
    }
  }
  if (!dense.empty()) {
    e.first_dense = static_cast<int64_t>(dense.size());
  }
}

// DeepSeekMoE: layer l is MoE iff l >= first_k_dense_replace and
// l % moe_layer_freq == 0: the first such layer, then every freq-th.
void Reader::deepseek_layer_pattern() {
  MoeConfig& e = out.config.moe;
  const int64_t first = fields.integer("first_k_dense_replace", "moe.first_dense").value_or(0);
  const int64_t freq = fields.integer("moe_layer_freq", "moe.interval").value_or(1);
  if (first < 0 || freq < 1) {
    throw ConfigError(fields.source() + ": first_k_dense_replace = " + std::to_string(first) +
                      ", moe_layer_freq = " + std::to_string(freq) +
                      ": must be >= 0 and >= 1 (map to moe.first_dense, moe.interval)");
  }
  e.interval = freq;
  e.first_dense = (first + freq - 1) / freq * freq;
}

void Reader::experts() {
  MoeConfig& e = out.config.moe;
  ModelConfig& m = out.config.model;
  const char* type = spec.model_type;
  switch (spec.experts) {
    case ExpertStyle::none:
      return;
    case ExpertStyle::mixtral:
    case ExpertStyle::olmoe: {
      const bool mixtral = spec.experts == ExpertStyle::mixtral;
      e.experts = fields.required_integer(mixtral ? "num_local_experts" : "num_experts",
                                          "moe.experts", type);
      e.top_k = fields.required_integer("num_experts_per_tok", "moe.top_k", type);
      e.expert_ffn = m.d_ff;  // intermediate_size is each expert's width
      if (!mixtral) {
        e.z_loss_coef = fields.number("router_z_loss_coef", "moe.z_loss_coef").value_or(0.0);
      }
      break;
    }
    case ExpertStyle::qwen2_moe:
    case ExpertStyle::qwen3_moe: {
      e.experts = fields.required_integer("num_experts", "moe.experts", type);
      e.top_k = fields.required_integer("num_experts_per_tok", "moe.top_k", type);
      e.expert_ffn = fields.required_integer("moe_intermediate_size", "moe.expert_ffn", type);
      if (spec.experts == ExpertStyle::qwen2_moe) {
        const int64_t shared =
            fields.integer("shared_expert_intermediate_size", "moe.shared_expert_ffn").value_or(0);
        if (shared > 0) {
          e.shared_experts = 1;
          e.shared_expert_ffn = shared;
          e.shared_expert_gate = true;  // Qwen2-MoE gates its shared expert, no key for it
        }
      }
      qwen_layer_pattern();
      break;
    }
    case ExpertStyle::deepseek: {
      e.experts = fields.integer("n_routed_experts", "moe.experts").value_or(0);
      e.top_k = fields.required_integer("num_experts_per_tok", "moe.top_k", type);
      e.expert_ffn = fields.required_integer("moe_intermediate_size", "moe.expert_ffn", type);
      e.shared_experts = fields.integer("n_shared_experts", "moe.shared_experts").value_or(0);
      if (const std::optional<double> alpha =
              fields.number("aux_loss_alpha", "moe.aux_loss_coef")) {
        e.aux_loss_coef = *alpha;
      }
      deepseek_layer_pattern();
      break;
    }
  }
  if (const std::optional<double> coef =
          fields.number("router_aux_loss_coef", "moe.aux_loss_coef")) {
    e.aux_loss_coef = *coef;
  }
  if (e.experts == 0) {
    e = MoeConfig{};  // a dense model of an MoE family
  }
}

}  // namespace

const std::vector<std::string>& hf_model_types() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const ModelTypeSpec& spec : kModelTypes) {
      out.emplace_back(spec.model_type);
    }
    return out;
  }();
  return names;
}

bool looks_like_json(const std::string& text) {
  for (const char ch : text) {
    if (ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r') {
      continue;
    }
    return ch == '{';
  }
  return false;
}

HfImport import_hf_config(const std::string& json_text, const std::string& source_name) {
  const std::string source = shown_value(source_name, 200);
  Json root;
  try {
    root = Json::parse(json_text, [](int depth, Json::parse_event_t, Json&) {
      if (depth > kMaxJsonDepth) {
        throw ConfigError("nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
      }
      return true;
    });
  } catch (const Json::exception& e) {
    // "[json.exception.parse_error.101] parse error at line 1, column 2: ..."
    std::string what = e.what();
    const size_t colon = what.find("] ");
    throw FileError(source + ": not valid JSON: " +
                    shown_value(colon == std::string::npos ? what : what.substr(colon + 2), 200) +
                    "; allowed: a Hugging Face config.json (a JSON object)");
  } catch (const ConfigError& e) {
    throw FileError(source + ": not a Hugging Face config.json: " + e.what());
  }
  if (!root.is_object()) {
    throw FileError(source + ": a Hugging Face config.json is a JSON object; got " +
                    std::string(root.type_name()));
  }
  HfFields fields(root, source);
  const std::optional<std::string> model_type = fields.text("model_type", "the architecture");
  if (!model_type) {
    throw ConfigError(source +
                      ": no model_type: not a Hugging Face config.json (or one "
                      "without its architecture); supported model_type values: " +
                      supported_list());
  }
  const ModelTypeSpec* spec = find_model_type(*model_type);
  if (spec == nullptr) {
    unsupported(source, *model_type);
  }
  HfImport out;
  out.model_type = *model_type;
  Reader reader{fields, *spec, out};
  reader.shape();
  reader.activation();
  reader.sequence_length();
  reader.attention_extras();
  reader.plain_model_extras();
  reader.family_notes();
  reader.experts();
  out.ignored = fields.unread();
  return out;
}

std::string hf_import_summary(const HfImport& import, const std::string& source_name,
                              const std::vector<std::string>& overridden_keys) {
  std::string out = shown_value(source_name, 200);
  out += ": Hugging Face \"";
  out += import.model_type;
  out += "\" read";
  for (const HfImportNote& note : import.notes) {
    if (!note.key.empty() && std::find(overridden_keys.begin(), overridden_keys.end(), note.key) !=
                                 overridden_keys.end()) {
      continue;
    }
    out += "; ";
    out += note.text;
  }
  if (!import.ignored.empty()) {
    out += "; not modelled: ";
    for (size_t i = 0; i < import.ignored.size(); ++i) {
      out += (i == 0 ? "" : ", ") + import.ignored[i];
    }
  }
  return out;
}

}  // namespace modar
