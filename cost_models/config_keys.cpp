// The config's key table: one row per dotted key (its type, its enum names,
// how it is stored into and written from a Config), the lookup of a key with
// its "did you mean" error, config_keys() / config_values(), and ConfigKey,
// the typed access the Python bindings use.  Reading text into the table is
// config_toml.cpp's job, range checks are config_validate.cpp's.
#include "config_keys.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "modar/base/errors.hpp"
#include "modar/base/text.hpp"
#include "modar/config.hpp"

namespace modar {
namespace detail {

[[noreturn]] void fail(const std::string& key, const std::string& value_text,
                       const std::string& allowed) {
  throw ConfigError(key + " = " + shown_value(value_text) + ": " + allowed);
}

std::string join_names(const std::vector<const char*>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    out += (i == 0 ? "" : (i + 1 == names.size() ? " or " : ", "));
    out += '"';
    out += names[i];
    out += '"';
  }
  return out;
}

namespace {

std::string quoted(const char* text) {
  return std::string("\"") + text + "\"";
}
std::string integer_literal(int64_t v) {
  return std::to_string(v);
}

template <typename Enum>
Enum enum_at(const Value& v) {
  return static_cast<Enum>(v.integer);
}

// Table rows for a plain field of a section (Config::*Section).*Field: the
// setter stores the typed value, the getter writes its TOML literal.
template <auto Section, auto Field>
KeySpec integer_key(const char* key) {
  return {key,
          KeyType::integer,
          {},
          [](Config& c, const Value& v) { (c.*Section).*Field = v.integer; },
          [](const Config& c) { return integer_literal((c.*Section).*Field); }};
}
template <auto Section, auto Field>
KeySpec real_key(const char* key) {
  return {key,
          KeyType::real,
          {},
          [](Config& c, const Value& v) { (c.*Section).*Field = v.real; },
          [](const Config& c) { return toml_float_literal((c.*Section).*Field); }};
}
template <auto Section, auto Field>
KeySpec boolean_key(const char* key) {
  return {key,
          KeyType::boolean,
          {},
          [](Config& c, const Value& v) { (c.*Section).*Field = v.boolean; },
          [](const Config& c) { return std::string((c.*Section).*Field ? "true" : "false"); }};
}
// A config enum: the names are EnumNames' (config_keys.hpp); `allowed`, when
// given, keeps only the first names (train.dtype: fp64 is the runtime's
// reference dtype, not a training dtype).
template <auto Section, auto Field>
KeySpec choice_key(const char* key, size_t allowed = 0) {
  using Enum = std::remove_cvref_t<decltype(std::declval<Config&>().*Section.*Field)>;
  return {key, KeyType::choice, allowed == 0 ? enum_names<Enum>() : enum_names<Enum>(allowed),
          [](Config& c, const Value& v) { (c.*Section).*Field = enum_at<Enum>(v); },
          [](const Config& c) { return quoted(to_string((c.*Section).*Field)); }};
}

}  // namespace

const std::vector<KeySpec>& key_specs() {
  static const std::vector<KeySpec> specs = {
      // [model]
      integer_key<&Config::model, &ModelConfig::d_model>("model.d_model"),
      integer_key<&Config::model, &ModelConfig::n_layers>("model.n_layers"),
      integer_key<&Config::model, &ModelConfig::n_heads>("model.n_heads"),
      integer_key<&Config::model, &ModelConfig::n_kv_heads>("model.n_kv_heads"),
      integer_key<&Config::model, &ModelConfig::d_head>("model.d_head"),
      integer_key<&Config::model, &ModelConfig::d_ff>("model.d_ff"),
      choice_key<&Config::model, &ModelConfig::mlp>("model.mlp"),
      integer_key<&Config::model, &ModelConfig::vocab_size>("model.vocab_size"),
      boolean_key<&Config::model, &ModelConfig::tie_embeddings>("model.tie_embeddings"),
      integer_key<&Config::model, &ModelConfig::seq_len>("model.seq_len"),
      real_key<&Config::model, &ModelConfig::norm_eps>("model.norm_eps"),
      boolean_key<&Config::model, &ModelConfig::qkv_bias>("model.qkv_bias"),
      choice_key<&Config::model, &ModelConfig::qk_norm>("model.qk_norm"),
      // [mod]
      real_key<&Config::mod, &ModConfig::capacity>("mod.capacity"),
      integer_key<&Config::mod, &ModConfig::every>("mod.every"),
      integer_key<&Config::mod, &ModConfig::offset>("mod.offset"),
      choice_key<&Config::mod, &ModConfig::router_scale>("mod.router_scale"),
      choice_key<&Config::mod, &ModConfig::causal_router>("mod.causal_router"),
      integer_key<&Config::mod, &ModConfig::predictor_hidden>("mod.predictor_hidden"),
      // [dar]
      choice_key<&Config::dar, &DarConfig::variant>("dar.variant"),
      integer_key<&Config::dar, &DarConfig::block_layers>("dar.block_layers"),
      integer_key<&Config::dar, &DarConfig::streams>("dar.streams"),
      // [moe]: experts and MoDE (docs/model.md experts, docs/moe.md).
      integer_key<&Config::moe, &MoeConfig::experts>("moe.experts"),
      integer_key<&Config::moe, &MoeConfig::top_k>("moe.top_k"),
      integer_key<&Config::moe, &MoeConfig::expert_ffn>("moe.expert_ffn"),
      integer_key<&Config::moe, &MoeConfig::shared_experts>("moe.shared_experts"),
      integer_key<&Config::moe, &MoeConfig::shared_expert_ffn>("moe.shared_expert_ffn"),
      boolean_key<&Config::moe, &MoeConfig::shared_expert_gate>("moe.shared_expert_gate"),
      integer_key<&Config::moe, &MoeConfig::interval>("moe.interval"),
      integer_key<&Config::moe, &MoeConfig::first_dense>("moe.first_dense"),
      real_key<&Config::moe, &MoeConfig::capacity_factor>("moe.capacity_factor"),
      real_key<&Config::moe, &MoeConfig::aux_loss_coef>("moe.aux_loss_coef"),
      real_key<&Config::moe, &MoeConfig::z_loss_coef>("moe.z_loss_coef"),
      real_key<&Config::moe, &MoeConfig::load_imbalance>("moe.load_imbalance"),
      choice_key<&Config::moe, &MoeConfig::mode>("moe.mode"),
      integer_key<&Config::moe, &MoeConfig::null_experts>("moe.null_experts"),
      // [train]
      integer_key<&Config::train, &TrainConfig::micro_batch>("train.micro_batch"),
      integer_key<&Config::train, &TrainConfig::global_batch>("train.global_batch"),
      choice_key<&Config::train, &TrainConfig::dtype>("train.dtype", 3),  // fp32, bf16, fp16
      choice_key<&Config::train, &TrainConfig::optimizer>("train.optimizer"),
      choice_key<&Config::train, &TrainConfig::recompute>("train.recompute"),
      // train.attention_kernel (docs/cluster.md): executed kernel, time and memory.
      choice_key<&Config::train, &TrainConfig::attention_kernel>("train.attention_kernel"),
      // train.grad_accumulation (docs/cluster.md): a memory-bound pass per micro-batch.
      choice_key<&Config::train, &TrainConfig::grad_accumulation>("train.grad_accumulation"),
      // [device]
      {"device.profile",
       KeyType::text,
       {},
       [](Config& c, const Value& v) { c.device.profile = v.text; },
       [](const Config& c) { return toml_quote(c.device.profile); }},
      integer_key<&Config::device, &DeviceConfig::count>("device.count"),
      // [parallel] and [cluster]: cluster-scale planning (docs/cluster.md).
      integer_key<&Config::parallel, &ParallelConfig::tensor>("parallel.tensor"),
      boolean_key<&Config::parallel, &ParallelConfig::sequence_parallel>(
          "parallel.sequence_parallel"),
      integer_key<&Config::parallel, &ParallelConfig::pipeline>("parallel.pipeline"),
      choice_key<&Config::parallel, &ParallelConfig::schedule>("parallel.schedule"),
      integer_key<&Config::parallel, &ParallelConfig::virtual_stages>("parallel.virtual_stages"),
      integer_key<&Config::parallel, &ParallelConfig::zero>("parallel.zero"),
      boolean_key<&Config::parallel, &ParallelConfig::overlap_grad_reduce>(
          "parallel.overlap_grad_reduce"),
      boolean_key<&Config::parallel, &ParallelConfig::overlap_param_gather>(
          "parallel.overlap_param_gather"),
      integer_key<&Config::parallel, &ParallelConfig::expert>("parallel.expert"),
      boolean_key<&Config::parallel, &ParallelConfig::balance_stages>("parallel.balance_stages"),
      boolean_key<&Config::parallel, &ParallelConfig::dar_bank_cache>("parallel.dar_bank_cache"),
      integer_key<&Config::cluster, &ClusterConfig::gpus_per_node>("cluster.gpus_per_node"),
      integer_key<&Config::cluster, &ClusterConfig::nodes>("cluster.nodes"),
      // [counting]: conventions only (docs/cost_model.md counting), no effect on the model.
      {"counting.attention_flops", KeyType::choice, enum_names<AttentionFlops>(),
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

namespace {

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

}  // namespace

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

}  // namespace detail

namespace {
using namespace detail;  // the key table and its errors (config_keys.hpp)
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
  switch (spec_at(spec_).type) {
    case KeyType::integer:
      return ConfigValueType::integer;
    case KeyType::real:
      return ConfigValueType::real;
    case KeyType::boolean:
      return ConfigValueType::boolean;
    case KeyType::choice:
      return ConfigValueType::choice;
    case KeyType::text:
      break;
  }
  return ConfigValueType::text;
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
  if (spec.type != KeyType::boolean) {
    fail_type(spec, value ? "true" : "false");
  }
  Value typed;
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

}  // namespace modar
