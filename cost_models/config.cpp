// Model configuration: TOML reading, --set overrides, validation, TOML output.
//
// Every key is one row of kKeys below: its dotted name (the TOML section and
// key), its type, and how it is read from / written to the Config.  Parsing
// (TOML or --set text) only checks the *type* of a value; validate() checks
// ranges and cross-field rules in one place, so a config built in code, read
// from TOML or edited with --set is held to the same rules.  Every error is a
// one-line modar::ConfigError / modar::FileError that names the key, the value
// and what is allowed.
#include "modar/config.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include "cost_model_internal.hpp"
#include "modar/base/enum_names.hpp"
#include "modar/base/errors.hpp"
#include "modar/base/files.hpp"
#include "modar/base/text.hpp"
#include "modar/hf_config.hpp"
#include "toml_text.hpp"

namespace modar {

int64_t ModConfig::routed_tokens_per_sequence(int64_t seq_len) const {
  const int64_t rounded = std::llround(capacity * static_cast<double>(seq_len));
  return std::clamp<int64_t>(rounded, 1, std::max<int64_t>(seq_len, 1));
}

int64_t MoeConfig::expert_capacity(int64_t tokens) const {
  if (dropless() || choices() <= 0) {
    return tokens;
  }
  const double slots = std::ceil(capacity_factor * static_cast<double>(tokens) *
                                 static_cast<double>(top_k) / static_cast<double>(choices()));
  return std::clamp<int64_t>(static_cast<int64_t>(slots), 0, tokens);
}

// ---- enum names -----------------------------------------------------------
// One list per enum, in enum order: to_string() reads it, and the config
// keys (key_specs) take their allowed values from it.

namespace {

constexpr const char* kMlpKindNames[] = {"gelu", "swiglu", "geglu"};
constexpr const char* kQkNormNames[] = {"none", "head", "projection"};
constexpr const char* kRouterScaleNames[] = {"linear", "sigmoid"};
constexpr const char* kCausalRouterNames[] = {"none", "aux_loss", "predictor"};
constexpr const char* kDarVariantNames[] = {"none",   "attnres", "dar",
                                            "selfkv", "fixedkv", "crossv"};
constexpr const char* kDarKernelNames[] = {"fused", "prefix"};
constexpr const char* kDarPacksNames[] = {"paper", "kept", "rebuilt"};
constexpr const char* kMoeModeNames[] = {"none", "staged", "integrated"};
// fp64 is the runtime's reference dtype, not a train.dtype choice.
constexpr const char* kDTypeNames[] = {"fp32", "bf16", "fp16", "fp64"};
constexpr size_t kConfigDTypes = 3;
constexpr const char* kOptimizerNames[] = {"adamw"};
// Recompute and Megatron's RecomputeGranularity name their values alike.
constexpr const char* kRecomputeNames[] = {"none", "selective", "full"};
constexpr const char* kAttentionKernelNames[] = {"flash",  "unfused", "flash1",
                                                 "flash2", "flash3",  "triton"};
constexpr const char* kGradAccumulationNames[] = {"fused", "unfused"};
constexpr const char* kGradReduceInFp32Names[] = {"auto", "true", "false"};
constexpr const char* kTpCommOverlapNames[] = {"none", "backward", "full"};
constexpr const char* kRouterWeightsNames[] = {"activation", "output", "input"};
constexpr const char* kTokenDispatcherNames[] = {"alltoall", "allgather"};
constexpr const char* kPipelineScheduleNames[] = {"1f1b", "interleaved"};
constexpr const char* kAttentionFlopsNames[] = {"causal", "full", "flash"};

}  // namespace

const char* to_string(MlpKind v) {
  return name_of(kMlpKindNames, v);
}
const char* to_string(QkNorm v) {
  return name_of(kQkNormNames, v);
}
const char* to_string(RouterScale v) {
  return name_of(kRouterScaleNames, v);
}
const char* to_string(CausalRouter v) {
  return name_of(kCausalRouterNames, v);
}
const char* to_string(DarVariant v) {
  return name_of(kDarVariantNames, v);
}
const char* to_string(DarKernel v) {
  return name_of(kDarKernelNames, v);
}
const char* to_string(DarPacks v) {
  return name_of(kDarPacksNames, v);
}
const char* to_string(MoeMode v) {
  return name_of(kMoeModeNames, v);
}
const char* to_string(DType v) {
  return name_of(kDTypeNames, v);
}
const char* to_string(Optimizer v) {
  return name_of(kOptimizerNames, v);
}
const char* to_string(Recompute v) {
  return name_of(kRecomputeNames, v);
}
const char* to_string(RecomputeGranularity v) {
  return name_of(kRecomputeNames, v);
}
std::string recompute_text(const TrainConfig& train) {
  switch (train.recompute_granularity) {
    case RecomputeGranularity::none:
      return to_string(train.recompute);
    case RecomputeGranularity::selective:
      return "megatron selective (" + train.recompute_modules + ")";
    case RecomputeGranularity::full:
      return "megatron full";
  }
  return "unknown";
}
const char* to_string(AttentionKernel v) {
  return name_of(kAttentionKernelNames, v);
}
const char* to_string(GradAccumulation v) {
  return name_of(kGradAccumulationNames, v);
}
const char* to_string(GradReduceInFp32 v) {
  return name_of(kGradReduceInFp32Names, v, "auto");
}
const char* to_string(TpCommOverlap v) {
  return name_of(kTpCommOverlapNames, v, "backward");
}
const char* to_string(RouterWeights v) {
  return name_of(kRouterWeightsNames, v);
}
const char* to_string(TokenDispatcher v) {
  return name_of(kTokenDispatcherNames, v);
}
const char* to_string(PipelineSchedule v) {
  return name_of(kPipelineScheduleNames, v);
}
const char* to_string(AttentionFlops v) {
  return name_of(kAttentionFlopsNames, v);
}
int64_t dtype_bytes(DType v) {
  switch (v) {
    case DType::fp32:
      return 4;
    case DType::bf16:
      return 2;
    case DType::fp16:
      return 2;
    case DType::fp64:
      return 8;
  }
  return 4;
}

namespace {

[[noreturn]] void fail(const std::string& key, const std::string& value_text,
                       const std::string& allowed) {
  throw ConfigError(key + " = " + shown_value(value_text) + ": " + allowed);
}

std::string join_names(std::span<const char* const> names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    out += (i == 0 ? "" : (i + 1 == names.size() ? " or " : ", "));
    out += '"';
    out += names[i];
    out += '"';
  }
  return out;
}

// One scalar value from TOML or from --set text, already type-checked.
struct Value {
  int64_t integer = 0;
  double real = 0.0;
  bool boolean = false;
  std::string text;
};

// The key table's value types are the public ones (ConfigKey::type()).
using KeyType = ConfigValueType;

struct KeySpec {
  const char* key;  // dotted: section.name
  KeyType type;
  std::vector<const char*> choices;  // KeyType::choice: allowed names, in enum order
  void (*set)(Config&, const Value&);
  std::string (*get)(const Config&);  // TOML literal
};

std::string quoted(const char* text) {
  return std::string("\"") + text + "\"";
}
// A text value as a TOML basic string (escapes valid in JSON too).
std::string string_literal(const std::string& text) {
  std::string out = "\"";
  for (char ch : text) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      static const char* const kHex = "0123456789abcdef";
      out += "\\u00";
      out += kHex[(ch >> 4) & 0xF];
      out += kHex[ch & 0xF];
    } else {
      out += ch;
    }
  }
  return out + "\"";
}
std::string integer_literal(int64_t v) {
  return std::to_string(v);
}

template <typename Enum>
Enum enum_at(const Value& v) {
  return static_cast<Enum>(v.integer);
}

// The table row for a plain field of a section, (Config::*Section).*Field: its
// key type follows the field's C++ type (bool, floating point, integer); the
// setter stores the typed value, the getter writes its TOML literal.
template <auto Section, auto Field>
KeySpec plain_key(const char* key) {
  using Field_t = std::remove_cvref_t<decltype(std::declval<Config&>().*Section.*Field)>;
  if constexpr (std::is_same_v<Field_t, bool>) {
    return {key,
            KeyType::boolean,
            {},
            [](Config& c, const Value& v) { (c.*Section).*Field = v.boolean; },
            [](const Config& c) { return std::string((c.*Section).*Field ? "true" : "false"); }};
  } else if constexpr (std::is_floating_point_v<Field_t>) {
    return {key,
            KeyType::real,
            {},
            [](Config& c, const Value& v) { (c.*Section).*Field = v.real; },
            [](const Config& c) { return toml_float_literal((c.*Section).*Field); }};
  } else {
    static_assert(std::is_integral_v<Field_t>, "plain_key: a bool, floating or integer field");
    return {key,
            KeyType::integer,
            {},
            [](Config& c, const Value& v) { (c.*Section).*Field = v.integer; },
            [](const Config& c) { return integer_literal((c.*Section).*Field); }};
  }
}
// `choices`: the enum's names in enum order (its k...Names list).
template <auto Section, auto Field>
KeySpec choice_key(const char* key, std::span<const char* const> choices) {
  return {key,
          KeyType::choice,
          {choices.begin(), choices.end()},
          [](Config& c, const Value& v) {
            using Enum = std::remove_reference_t<decltype((c.*Section).*Field)>;
            (c.*Section).*Field = enum_at<Enum>(v);
          },
          [](const Config& c) { return quoted(to_string((c.*Section).*Field)); }};
}

const std::vector<KeySpec>& key_specs() {
  static const std::vector<KeySpec> specs = {
      // [model]
      plain_key<&Config::model, &ModelConfig::d_model>("model.d_model"),
      plain_key<&Config::model, &ModelConfig::n_layers>("model.n_layers"),
      plain_key<&Config::model, &ModelConfig::n_heads>("model.n_heads"),
      plain_key<&Config::model, &ModelConfig::n_kv_heads>("model.n_kv_heads"),
      plain_key<&Config::model, &ModelConfig::d_head>("model.d_head"),
      plain_key<&Config::model, &ModelConfig::d_ff>("model.d_ff"),
      choice_key<&Config::model, &ModelConfig::mlp>("model.mlp", kMlpKindNames),
      plain_key<&Config::model, &ModelConfig::vocab_size>("model.vocab_size"),
      plain_key<&Config::model, &ModelConfig::make_vocab_size_divisible_by>(
          "model.make_vocab_size_divisible_by"),
      plain_key<&Config::model, &ModelConfig::tie_embeddings>("model.tie_embeddings"),
      plain_key<&Config::model, &ModelConfig::seq_len>("model.seq_len"),
      plain_key<&Config::model, &ModelConfig::norm_eps>("model.norm_eps"),
      plain_key<&Config::model, &ModelConfig::qkv_bias>("model.qkv_bias"),
      choice_key<&Config::model, &ModelConfig::qk_norm>("model.qk_norm", kQkNormNames),
      // [mod]
      plain_key<&Config::mod, &ModConfig::capacity>("mod.capacity"),
      plain_key<&Config::mod, &ModConfig::every>("mod.every"),
      plain_key<&Config::mod, &ModConfig::offset>("mod.offset"),
      choice_key<&Config::mod, &ModConfig::router_scale>("mod.router_scale", kRouterScaleNames),
      choice_key<&Config::mod, &ModConfig::causal_router>("mod.causal_router", kCausalRouterNames),
      plain_key<&Config::mod, &ModConfig::predictor_hidden>("mod.predictor_hidden"),
      // [dar]
      choice_key<&Config::dar, &DarConfig::variant>("dar.variant", kDarVariantNames),
      plain_key<&Config::dar, &DarConfig::block_layers>("dar.block_layers"),
      plain_key<&Config::dar, &DarConfig::streams>("dar.streams"),
      choice_key<&Config::dar, &DarConfig::kernel>("dar.kernel", kDarKernelNames),
      choice_key<&Config::dar, &DarConfig::packs>("dar.packs", kDarPacksNames),
      // [moe]: experts and MoDE (docs/model.md experts, docs/moe.md).
      plain_key<&Config::moe, &MoeConfig::experts>("moe.experts"),
      plain_key<&Config::moe, &MoeConfig::top_k>("moe.top_k"),
      plain_key<&Config::moe, &MoeConfig::expert_ffn>("moe.expert_ffn"),
      plain_key<&Config::moe, &MoeConfig::shared_experts>("moe.shared_experts"),
      plain_key<&Config::moe, &MoeConfig::shared_expert_ffn>("moe.shared_expert_ffn"),
      plain_key<&Config::moe, &MoeConfig::shared_expert_gate>("moe.shared_expert_gate"),
      plain_key<&Config::moe, &MoeConfig::interval>("moe.interval"),
      plain_key<&Config::moe, &MoeConfig::first_dense>("moe.first_dense"),
      plain_key<&Config::moe, &MoeConfig::capacity_factor>("moe.capacity_factor"),
      plain_key<&Config::moe, &MoeConfig::aux_loss_coef>("moe.aux_loss_coef"),
      plain_key<&Config::moe, &MoeConfig::z_loss_coef>("moe.z_loss_coef"),
      plain_key<&Config::moe, &MoeConfig::load_imbalance>("moe.load_imbalance"),
      choice_key<&Config::moe, &MoeConfig::mode>("moe.mode", kMoeModeNames),
      plain_key<&Config::moe, &MoeConfig::null_experts>("moe.null_experts"),
      choice_key<&Config::moe, &MoeConfig::router_weights>("moe.router_weights",
                                                           kRouterWeightsNames),
      choice_key<&Config::moe, &MoeConfig::token_dispatcher>("moe.token_dispatcher",
                                                             kTokenDispatcherNames),
      // [train]
      plain_key<&Config::train, &TrainConfig::micro_batch>("train.micro_batch"),
      plain_key<&Config::train, &TrainConfig::global_batch>("train.global_batch"),
      // The config's dtypes: kDTypeNames without fp64.
      choice_key<&Config::train, &TrainConfig::dtype>(
          "train.dtype", std::span(kDTypeNames).first<kConfigDTypes>()),
      choice_key<&Config::train, &TrainConfig::optimizer>("train.optimizer", kOptimizerNames),
      choice_key<&Config::train, &TrainConfig::recompute>("train.recompute", kRecomputeNames),
      // Megatron-LM's recompute flags (docs/cluster.md "Recompute").
      choice_key<&Config::train, &TrainConfig::recompute_granularity>("train.recompute_granularity",
                                                                      kRecomputeNames),
      {"train.recompute_modules",
       KeyType::text,
       {},
       [](Config& c, const Value& v) { c.train.recompute_modules = v.text; },
       [](const Config& c) { return string_literal(c.train.recompute_modules); }},
      // train.attention_kernel (docs/cluster.md): executed kernel, time and memory.
      choice_key<&Config::train, &TrainConfig::attention_kernel>("train.attention_kernel",
                                                                 kAttentionKernelNames),
      // train.grad_accumulation (docs/cluster.md): a memory-bound pass per micro-batch.
      choice_key<&Config::train, &TrainConfig::grad_accumulation>("train.grad_accumulation",
                                                                  kGradAccumulationNames),
      // train.grad_reduce_in_fp32 (docs/cluster.md "Main gradients"): a choice
      // that also takes a TOML / Python boolean (choice_from_boolean).
      choice_key<&Config::train, &TrainConfig::grad_reduce_in_fp32>("train.grad_reduce_in_fp32",
                                                                    kGradReduceInFp32Names),
      // train.hidden_dropout / attention_dropout (docs/cluster.md "Dropout").
      plain_key<&Config::train, &TrainConfig::hidden_dropout>("train.hidden_dropout"),
      plain_key<&Config::train, &TrainConfig::attention_dropout>("train.attention_dropout"),
      // [device]
      {"device.profile",
       KeyType::text,
       {},
       [](Config& c, const Value& v) { c.device.profile = v.text; },
       [](const Config& c) { return string_literal(c.device.profile); }},
      plain_key<&Config::device, &DeviceConfig::count>("device.count"),
      // [parallel] and [cluster]: cluster-scale planning (docs/cluster.md).
      plain_key<&Config::parallel, &ParallelConfig::tensor>("parallel.tensor"),
      plain_key<&Config::parallel, &ParallelConfig::sequence_parallel>(
          "parallel.sequence_parallel"),
      plain_key<&Config::parallel, &ParallelConfig::context>("parallel.context"),
      plain_key<&Config::parallel, &ParallelConfig::pipeline>("parallel.pipeline"),
      choice_key<&Config::parallel, &ParallelConfig::schedule>("parallel.schedule",
                                                               kPipelineScheduleNames),
      plain_key<&Config::parallel, &ParallelConfig::virtual_stages>("parallel.virtual_stages"),
      plain_key<&Config::parallel, &ParallelConfig::zero>("parallel.zero"),
      plain_key<&Config::parallel, &ParallelConfig::overlap_grad_reduce>(
          "parallel.overlap_grad_reduce"),
      plain_key<&Config::parallel, &ParallelConfig::overlap_param_gather>(
          "parallel.overlap_param_gather"),
      choice_key<&Config::parallel, &ParallelConfig::tp_comm_overlap>("parallel.tp_comm_overlap",
                                                                      kTpCommOverlapNames),
      plain_key<&Config::parallel, &ParallelConfig::expert>("parallel.expert"),
      plain_key<&Config::parallel, &ParallelConfig::expert_tensor>("parallel.expert_tensor"),
      plain_key<&Config::parallel, &ParallelConfig::balance_stages>("parallel.balance_stages"),
      plain_key<&Config::parallel, &ParallelConfig::dar_bank_cache>("parallel.dar_bank_cache"),
      plain_key<&Config::cluster, &ClusterConfig::gpus_per_node>("cluster.gpus_per_node"),
      plain_key<&Config::cluster, &ClusterConfig::nodes>("cluster.nodes"),
      // [counting]: conventions only (docs/cost_model.md counting), no effect on the model.
      {"counting.attention_flops",
       KeyType::choice,
       {std::begin(kAttentionFlopsNames), std::end(kAttentionFlopsNames)},
       [](Config& c, const Value& v) { c.attention_flops = enum_at<AttentionFlops>(v); },
       [](const Config& c) { return quoted(to_string(c.attention_flops)); }},
  };
  return specs;
}

const KeySpec* find_spec(const std::string& dotted_key) {
  for (const KeySpec& spec : key_specs()) {
    if (dotted_key == spec.key) {
      return &spec;
    }
  }
  return nullptr;
}

std::vector<std::string> section_names() {
  std::vector<std::string> sections;
  for (const std::string& key : config_keys()) {
    std::string section = key.substr(0, key.find('.'));
    if (std::find(sections.begin(), sections.end(), section) == sections.end()) {
      sections.push_back(section);
    }
  }
  return sections;
}

[[noreturn]] void fail_unknown_key(const std::string& dotted_key, const std::string& where) {
  const std::string suggestion = nearest_name(dotted_key, config_keys());
  std::string message = "unknown key '" + shown_value(dotted_key) + "'" + where;
  if (!suggestion.empty()) {
    message += "; did you mean '" + suggestion + "'?";
  } else {
    message += "; valid keys are section.key with sections ";
    const std::vector<std::string> sections = section_names();
    for (size_t i = 0; i < sections.size(); ++i) {
      message += (i ? ", " : "") + sections[i];
    }
    message += " (see docs/config.md)";
  }
  throw ConfigError(message);
}

int64_t choice_index(const KeySpec& spec, const std::string& text, const std::string& shown) {
  for (size_t i = 0; i < spec.choices.size(); ++i) {
    if (text == spec.choices[i]) {
      return static_cast<int64_t>(i);
    }
  }
  fail(spec.key, shown, "must be " + join_names(spec.choices));
}

// A boolean given to a choice key whose names include "true" and "false"
// (train.grad_reduce_in_fp32 = true): that name's index; other choice keys
// refuse it with their names.
int64_t choice_from_boolean(const KeySpec& spec, bool value, const std::string& shown) {
  return choice_index(spec, value ? "true" : "false", shown);
}

Value value_from_text(const KeySpec& spec, const std::string& text) {
  Value value;
  switch (spec.type) {
    case KeyType::integer:
      if (!parse_integer_text(text, &value.integer)) {
        fail(spec.key, text, "must be an integer");
      }
      break;
    case KeyType::real:
      if (!parse_finite_number_text(text, &value.real)) {
        fail(spec.key, text, "must be a finite number");
      }
      break;
    case KeyType::boolean:
      if (text == "true") {
        value.boolean = true;
      } else if (text == "false") {
        value.boolean = false;
      } else {
        fail(spec.key, text, "must be true or false");
      }
      break;
    case KeyType::choice: {
      std::string bare = text;
      if (bare.size() >= 2 && bare.front() == '"' && bare.back() == '"') {
        bare = bare.substr(1, bare.size() - 2);
      }
      value.integer = choice_index(spec, bare, text);
      break;
    }
    case KeyType::text:
      // A --set value does not go through the TOML reader, which refuses
      // such text in a file: refuse it here too, so to_toml() reads back.
      if (!is_valid_utf8(text)) {
        fail(spec.key, text, "must be valid UTF-8 text");
      }
      value.text = text;
      if (value.text.size() >= 2 && value.text.front() == '"' && value.text.back() == '"') {
        value.text = value.text.substr(1, value.text.size() - 2);
      }
      break;
  }
  return value;
}

std::string describe_node(const toml::node& node) {
  return detail::toml_node_text(node);
}

Value value_from_node(const KeySpec& spec, const toml::node& node) {
  Value value;
  const std::string shown = describe_node(node);
  switch (spec.type) {
    case KeyType::integer:
      if (!node.is_integer()) {
        fail(spec.key, shown, "must be an integer");
      }
      value.integer = node.as_integer()->get();
      break;
    case KeyType::real: {
      const std::optional<double> number = detail::toml_number(node);
      if (!number) {
        fail(spec.key, shown, "must be a number");
      }
      if (!std::isfinite(*number)) {
        fail(spec.key, shown, "must be a finite number");
      }
      value.real = *number;
      break;
    }
    case KeyType::boolean:
      if (!node.is_boolean()) {
        fail(spec.key, shown, "must be true or false");
      }
      value.boolean = node.as_boolean()->get();
      break;
    case KeyType::choice:
      if (node.is_boolean()) {
        value.integer = choice_from_boolean(spec, node.as_boolean()->get(), shown);
        break;
      }
      if (!node.is_string()) {
        fail(spec.key, shown, "must be " + join_names(spec.choices));
      }
      value.integer = choice_index(spec, node.as_string()->get(), shown);
      break;
    case KeyType::text:
      if (!node.is_string()) {
        fail(spec.key, shown, "must be a string");
      }
      value.text = node.as_string()->get();
      break;
  }
  return value;
}

// A config is a few hundred bytes; 16 MiB leaves room for comments and
// refuses /dev/zero-like inputs long before memory runs out.
constexpr uint64_t kMaxConfigBytes = uint64_t{16} << 20;

std::string read_whole_file(const std::string& path, const char* what) {
  return read_input_file(path, what, kMaxConfigBytes);
}

}  // namespace

const std::vector<std::string>& config_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> out;
    for (const KeySpec& spec : key_specs()) {
      out.emplace_back(spec.key);
    }
    return out;
  }();
  return keys;
}

std::vector<std::pair<std::string, std::string>> config_values(const Config& config) {
  std::vector<std::pair<std::string, std::string>> values;
  for (const KeySpec& spec : key_specs()) {
    values.emplace_back(spec.key, spec.get(config));
  }
  return values;
}

// ---- typed keys (ConfigKey) --------------------------------------------------
// The messages are those of a TOML value of the wrong type (value_from_node).

namespace {

const KeySpec& spec_at(const void* spec) {
  return *static_cast<const KeySpec*>(spec);
}

[[noreturn]] void fail_type(const KeySpec& spec, const std::string& shown) {
  switch (spec.type) {
    case KeyType::integer:
      fail(spec.key, shown, "must be an integer");
    case KeyType::real:
      fail(spec.key, shown, "must be a number");
    case KeyType::boolean:
      fail(spec.key, shown, "must be true or false");
    case KeyType::choice:
      fail(spec.key, shown, "must be " + join_names(spec.choices));
    case KeyType::text:
      break;
  }
  fail(spec.key, shown, "must be a string");
}

}  // namespace

ConfigKey::ConfigKey(const std::string& dotted_key) : spec_(find_spec(dotted_key)) {
  if (spec_ == nullptr) {
    fail_unknown_key(dotted_key, "");
  }
}

const char* ConfigKey::name() const {
  return spec_at(spec_).key;
}

ConfigValueType ConfigKey::type() const {
  return spec_at(spec_).type;
}

void ConfigKey::set_integer(Config& config, int64_t value) const {
  const KeySpec& spec = spec_at(spec_);
  Value typed;
  if (spec.type == KeyType::integer) {
    typed.integer = value;
  } else if (spec.type == KeyType::real) {
    typed.real = static_cast<double>(value);
  } else {
    fail_type(spec, std::to_string(value));
  }
  spec.set(config, typed);
}

void ConfigKey::set_real(Config& config, double value) const {
  const KeySpec& spec = spec_at(spec_);
  if (spec.type != KeyType::real) {
    fail_type(spec, toml_float_literal(value));
  }
  if (!std::isfinite(value)) {
    fail(spec.key, format_number(value), "must be a finite number");
  }
  Value typed;
  typed.real = value;
  spec.set(config, typed);
}

void ConfigKey::set_boolean(Config& config, bool value) const {
  const KeySpec& spec = spec_at(spec_);
  Value typed;
  if (spec.type == KeyType::choice) {
    typed.integer = choice_from_boolean(spec, value, value ? "true" : "false");
  } else if (spec.type != KeyType::boolean) {
    fail_type(spec, value ? "true" : "false");
  }
  typed.boolean = value;
  spec.set(config, typed);
}

void ConfigKey::set_text(Config& config, const std::string& value) const {
  const KeySpec& spec = spec_at(spec_);
  const std::string shown = "\"" + value + "\"";
  Value typed;
  if (spec.type == KeyType::choice) {
    typed.integer = choice_index(spec, value, shown);
  } else if (spec.type == KeyType::text) {
    typed.text = value;
  } else {
    fail_type(spec, shown);
  }
  spec.set(config, typed);
}

std::string ConfigKey::literal(const Config& config) const {
  return spec_at(spec_).get(config);
}

AttentionFlops parse_attention_flops(const std::string& text, const std::string& field) {
  if (const auto flops = enum_named<AttentionFlops>(kAttentionFlopsNames, text)) {
    return *flops;
  }
  throw ConfigError(field + " = " + text + ": must be " + join_names(kAttentionFlopsNames));
}

namespace {

Config parse_config_toml_unvalidated(const std::string& toml_text, const std::string& source_name) {
  const toml::table root = detail::parse_toml_text(toml_text, source_name);
  Config config;
  const std::string where = " in " + shown_value(source_name, 200);
  for (const auto& [section_key, section_node] : root) {
    const std::string section(section_key.str());
    if (!section_node.is_table()) {
      // A top-level key: either a misplaced key (e.g. "capacity = 0.5") or garbage.
      fail_unknown_key(section, where + " (keys belong in a [section])");
    }
    for (const auto& [name_key, node] : *section_node.as_table()) {
      const std::string dotted = section + "." + std::string(name_key.str());
      const KeySpec* spec = find_spec(dotted);
      if (spec == nullptr) {
        fail_unknown_key(dotted, where);
      }
      spec->set(config, value_from_node(*spec, node));
    }
  }
  return config;
}

}  // namespace

Config parse_config_toml(const std::string& toml_text, const std::string& source_name) {
  Config config = parse_config_toml_unvalidated(toml_text, source_name);
  validate(config);
  return config;
}

Config load_config_file(const std::string& path) {
  return load_config_document(path, {}).config;
}

Config load_config_file(const std::string& path, const std::vector<std::string>& overrides) {
  return load_config_document(path, overrides).config;
}

ConfigDocument load_config_document(const std::string& path,
                                    const std::vector<std::string>& overrides) {
  const std::string text = read_whole_file(path, "config file");
  ConfigDocument document;
  std::optional<HfImport> imported;
  if (looks_like_json(text)) {
    imported = import_hf_config(text, path);
    document.config = imported->config;
  } else {
    document.config = parse_config_toml_unvalidated(text, path);
  }
  std::vector<std::string> overridden;
  for (const std::string& assignment : overrides) {
    apply_override(document.config, assignment);
    std::string key = assignment.substr(0, assignment.find('='));
    key.erase(0, key.find_first_not_of(" \t"));
    key.erase(key.find_last_not_of(" \t") + 1);
    overridden.push_back(key);
  }
  validate(document.config);
  if (imported) {
    document.notes = hf_import_summary(*imported, path, overridden);
  }
  return document;
}

void apply_override(Config& config, const std::string& dotted_key, const std::string& value) {
  const KeySpec* spec = find_spec(dotted_key);
  if (spec == nullptr) {
    fail_unknown_key(dotted_key, " in an override");
  }
  spec->set(config, value_from_text(*spec, value));
}

void apply_override(Config& config, const std::string& assignment) {
  const size_t equals = assignment.find('=');
  if (equals == std::string::npos || equals == 0) {
    throw ConfigError("override " + shown_value(assignment) +
                      ": must be section.key=value, e.g. mod.capacity=0.125");
  }
  std::string key = assignment.substr(0, equals);
  std::string value = assignment.substr(equals + 1);
  auto trim = [](std::string& s) {
    const size_t first = s.find_first_not_of(" \t");
    const size_t last = s.find_last_not_of(" \t");
    s = first == std::string::npos ? std::string() : s.substr(first, last - first + 1);
  };
  trim(key);
  trim(value);
  apply_override(config, key, value);
}

namespace {

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
  if (e.router_weights == RouterWeights::input && e.top_k != 1) {
    fail("moe.router_weights", "\"input\"",
         "needs moe.top_k = 1 (a token's input can carry one weight; Megatron-Core "
         "moe_apply_probs_on_input is top-1 only)");
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
  const int64_t expert_tensor = config.parallel.resolved_expert_tensor();
  if (expert_tensor > 0 && e.resolved_expert_ffn(m) % expert_tensor != 0) {
    const bool own = config.parallel.expert_tensor > 0;
    fail(own ? "parallel.expert_tensor" : "parallel.tensor", std::to_string(expert_tensor),
         "must divide the expert width moe.expert_ffn = " +
             std::to_string(e.resolved_expert_ffn(m)) +
             (own ? "" : " (the experts' tensor size is parallel.tensor unless "
                         "parallel.expert_tensor is set)"));
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
                                                   {"parallel.context", p.context},
                                                   {"parallel.pipeline", p.pipeline},
                                                   {"parallel.virtual_stages", p.virtual_stages}};
  for (const auto& [key, value] : sizes) {
    require_positive(key, value);
    if (value > kMaxParallel) {
      fail(key, std::to_string(value), "must be <= 1048576");
    }
  }
  require_positive("parallel.expert", p.expert);
  require_non_negative("parallel.expert_tensor", p.expert_tensor, "parallel.tensor");
  if (p.expert_tensor > kMaxParallel) {
    fail("parallel.expert_tensor", std::to_string(p.expert_tensor), "must be <= 1048576");
  }
  if (p.expert_tensor > 0 && p.expert_tensor != p.tensor && config.moe.experts == 0) {
    fail("parallel.expert_tensor", std::to_string(p.expert_tensor),
         "must be 0 (= parallel.tensor) without experts (set moe.experts > 0)");
  }
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
  if (p.context > 1) {
    // Megatron-Core's load-balanced split: 2 c chunks per sequence, rank r
    // holding chunks r and 2c - 1 - r (and SP splits a rank's tokens by t).
    const int64_t chunking = 2 * p.context * (p.sequence_parallel ? p.tensor : 1);
    if (m.seq_len % chunking != 0) {
      fail("parallel.context", std::to_string(p.context),
           "model.seq_len = " + std::to_string(m.seq_len) + " must be a multiple of 2 x " +
               "parallel.context" + (p.sequence_parallel ? " x parallel.tensor" : "") + " = " +
               std::to_string(chunking) + " (each rank holds 2 load-balanced chunks)");
    }
    if (!is_fused(config.train.attention_kernel)) {
      fail("parallel.context", std::to_string(p.context),
           "needs a fused train.attention_kernel (\"flash\", \"flash1\", \"flash2\", "
           "\"flash3\" or \"triton\", not \"unfused\": ring attention runs fused kernels on "
           "each KV block)");
    }
  }
  const int64_t model_parallel = p.tensor * p.context * p.pipeline;
  if (config.device.count % model_parallel != 0) {
    fail("device.count", std::to_string(config.device.count),
         "must be a multiple of parallel.tensor * parallel.context * parallel.pipeline = " +
             std::to_string(model_parallel));
  }
  // Megatron-Core (parallel_state.initialize_model_parallel) builds the expert
  // layers' groups over the same ranks as the dense layers': the world size
  // must be divisible by expert_tensor x expert x pipeline, i.e. the tensor x
  // data ranks of a pipeline stage fold into expert_tensor x expert x
  // expert_data (docs/cluster.md "Expert parallelism").
  const int64_t stage_ranks = p.tensor * p.context * p.data(config.device.count);
  const int64_t expert_group = p.resolved_expert_tensor() * p.expert;
  if ((p.expert > 1 || p.expert_tensor > 0) && stage_ranks % expert_group != 0) {
    fail("parallel.expert", std::to_string(p.expert),
         "parallel.expert x parallel.expert_tensor = " + std::to_string(p.expert) + " x " +
             std::to_string(p.resolved_expert_tensor()) +
             " must divide the ranks of a pipeline stage, parallel.tensor x parallel.context x "
             "data-parallel size = device.count / parallel.pipeline = " +
             std::to_string(stage_ranks) +
             " (Megatron-Core folds the expert groups over the tensor, context and data-parallel "
             "ranks)");
  }
  if (config.moe.enabled() && p.resolved_expert_tensor() != p.tensor && p.tensor > 1 &&
      !p.sequence_parallel) {
    fail("parallel.expert_tensor", std::to_string(p.resolved_expert_tensor()),
         "differs from parallel.tensor = " + std::to_string(p.tensor) +
             " and needs parallel.sequence_parallel = true (Megatron-Core runs experts under "
             "tensor parallelism with sequence parallelism)");
  }
  if (p.zero > 0 && p.data(config.device.count) * p.context < 2) {
    // The optimizer shards over the data-parallel ranks with their context
    // ranks (Megatron-Core's data-parallel group with CP).
    fail("parallel.zero", std::to_string(p.zero),
         "needs data-parallel size x parallel.context >= 2 (device.count / (parallel.tensor * "
         "parallel.pipeline))");
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
  require_positive("model.make_vocab_size_divisible_by", m.make_vocab_size_divisible_by);
  if (m.make_vocab_size_divisible_by > 65536) {
    fail("model.make_vocab_size_divisible_by", std::to_string(m.make_vocab_size_divisible_by),
         "must be <= 65536 (Megatron-LM's default is 128)");
  }
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
  detail::parse_recompute_modules(t.recompute_modules);  // the names, whatever the granularity
  if (t.recompute_granularity != RecomputeGranularity::none && t.recompute != Recompute::none) {
    fail("train.recompute_granularity",
         std::string("\"") + to_string(t.recompute_granularity) + "\"",
         std::string("Megatron-LM's recompute needs train.recompute = \"none\" (it is \"") +
             to_string(t.recompute) +
             "\": modar's own, a different set of modules); set one of the two");
  }
  for (const auto& [key, value] : {std::pair<const char*, double>{"train.hidden_dropout",
                                                                  t.hidden_dropout},
                                   {"train.attention_dropout", t.attention_dropout}}) {
    if (!(std::isfinite(value) && value >= 0.0 && value < 1.0)) {
      fail(key, format_number(value), "must be a finite probability in [0, 1)");
    }
  }
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
  if (!is_valid_utf8(config.device.profile)) {
    // A --set override is not read by the TOML parser, which refuses such text
    // in a file: refuse it here too, so that to_toml() always reads back.
    fail("device.profile", config.device.profile,
         "must be valid UTF-8 text (a profile name or a file path)");
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
               "(parallel.tensor * parallel.context * parallel.pipeline)) = " +
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

std::string to_toml(const Config& config) {
  std::string out = "# modar configuration (see docs/config.md)\n";
  std::string current_section;
  for (const KeySpec& spec : key_specs()) {
    const std::string dotted = spec.key;
    const size_t dot = dotted.find('.');
    const std::string section = dotted.substr(0, dot);
    if (section != current_section) {
      out += (current_section.empty() ? "\n[" : "\n[") + section + "]\n";
      current_section = section;
    }
    out += dotted.substr(dot + 1) + " = " + spec.get(config) + "\n";
  }
  return out;
}

}  // namespace modar
