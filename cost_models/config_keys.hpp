// cost_models/config_keys.hpp (internal): what the config's reader, writer,
// typed keys and validation share: each config enum's names (written once,
// in enum order), the key table (one row per dotted key: its type and how it
// is read from / written to a Config) and the one-line value error.
//
//   config_enums.cpp    to_string / dtype_bytes / parse_attention_flops
//   config_keys.cpp     the key table, key lookup, ConfigKey, config_keys()
//   config_toml.cpp     TOML and --set text in, TOML out
//   config_validate.cpp validate(): ranges and cross-field rules
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "modar/config.hpp"

namespace modar::detail {

// ---- enum names ---------------------------------------------------------------
// (the enums: modar/config_enums.hpp)
// EnumNames<E>::names: the names of E's values in enum order, as TOML, the
// CLI and JSON spell them.  to_string reads them, and so do the key table's
// choice keys and their "must be ..." messages.
template <typename Enum>
struct EnumNames;

template <>
struct EnumNames<MlpKind> {
  static constexpr std::array<const char*, 3> names{"gelu", "swiglu", "geglu"};
};
template <>
struct EnumNames<QkNorm> {
  static constexpr std::array<const char*, 3> names{"none", "head", "projection"};
};
template <>
struct EnumNames<RouterScale> {
  static constexpr std::array<const char*, 2> names{"linear", "sigmoid"};
};
template <>
struct EnumNames<CausalRouter> {
  static constexpr std::array<const char*, 3> names{"none", "aux_loss", "predictor"};
};
template <>
struct EnumNames<DarVariant> {
  static constexpr std::array<const char*, 6> names{"none",   "attnres", "dar",
                                                    "selfkv", "fixedkv", "crossv"};
};
template <>
struct EnumNames<MoeMode> {
  static constexpr std::array<const char*, 3> names{"none", "staged", "integrated"};
};
template <>
struct EnumNames<DType> {
  static constexpr std::array<const char*, 4> names{"fp32", "bf16", "fp16", "fp64"};
};
template <>
struct EnumNames<Optimizer> {
  static constexpr std::array<const char*, 1> names{"adamw"};
};
template <>
struct EnumNames<Recompute> {
  static constexpr std::array<const char*, 3> names{"none", "selective", "full"};
};
template <>
struct EnumNames<AttentionFlops> {
  static constexpr std::array<const char*, 3> names{"causal", "full", "flash"};
};
template <>
struct EnumNames<AttentionKernel> {
  static constexpr std::array<const char*, 2> names{"flash", "unfused"};
};
template <>
struct EnumNames<GradAccumulation> {
  static constexpr std::array<const char*, 2> names{"fused", "unfused"};
};
template <>
struct EnumNames<PipelineSchedule> {
  static constexpr std::array<const char*, 2> names{"1f1b", "interleaved"};
};

// The name of `value`; "unknown" for a value outside the enum.
template <typename Enum>
const char* enum_name(Enum value) {
  const auto& names = EnumNames<Enum>::names;
  const auto index = static_cast<size_t>(value);
  return index < names.size() ? names[index] : "unknown";
}

// The first `count` names of Enum (all of them by default), for a choice key.
template <typename Enum>
std::vector<const char*> enum_names(size_t count = EnumNames<Enum>::names.size()) {
  const auto& names = EnumNames<Enum>::names;
  return {names.begin(), names.begin() + static_cast<std::ptrdiff_t>(count)};
}

// ---- the key table --------------------------------------------------------------

// One scalar value from TOML or from --set text, already type-checked.
struct Value {
  int64_t integer = 0;
  double real = 0.0;
  bool boolean = false;
  std::string text;
};

enum class KeyType { integer, real, boolean, choice, text };

struct KeySpec {
  const char* key;  // dotted: section.name
  KeyType type;
  std::vector<const char*> choices;  // KeyType::choice: allowed names, in enum order
  void (*set)(Config&, const Value&);
  std::string (*get)(const Config&);  // TOML literal
};

// Every key, in the order of docs/config.md and of to_toml's output.
const std::vector<KeySpec>& key_specs();
// The row of `dotted_key`, or nullptr.
const KeySpec* find_spec(const std::string& dotted_key);

// ---- errors ---------------------------------------------------------------------

// ConfigError "<key> = <value>: <allowed>" (the value escaped and cut).
[[noreturn]] void fail(const std::string& key, const std::string& value_text,
                       const std::string& allowed);
// "\"a\", \"b\" or \"c\"".
std::string join_names(const std::vector<const char*>& names);
// ConfigError for a key that is not in the table, with a "did you mean" or the
// list of sections; `where` follows the key (" in <file>", " in --set").
[[noreturn]] void fail_unknown_key(const std::string& dotted_key, const std::string& where);
// The enum index of `text` among spec.choices; otherwise fail() showing `shown`.
int64_t choice_index(const KeySpec& spec, const std::string& text, const std::string& shown);

}  // namespace modar::detail
