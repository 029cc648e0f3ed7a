// modar/hf_config.hpp: a Hugging Face config.json read as a modar Config.
//
// Every command that takes a config file reads a config.json too (the
// document is JSON when its first non-blank character is '{'), and Python's
// Config.from_hf calls the same code.  Supported model_type values, the keys
// each maps and what is left out: docs/hf_import.md.  model.seq_len is never
// taken from max_position_embeddings: it is the user's (--set model.seq_len,
// Python seq_len=), kHfDefaultSeqLen when not given.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "modar/config.hpp"

namespace modar {

// The training length an imported config gets when the user gives none
// (capped at max_position_embeddings when that is shorter).
constexpr int64_t kHfDefaultSeqLen = 4096;

// One thing the import decided that the user should know once: a default it
// took, an approximation it made.  `key` is the modar key it is about (so a
// --set of that key silences it), or "" for the model as a whole.
struct HfImportNote {
  std::string key;
  std::string text;
};

struct HfImport {
  Config config;           // not validated: overrides come first, then validate()
  std::string model_type;  // "mixtral"
  std::vector<HfImportNote> notes;
  std::vector<std::string> ignored;  // config.json fields modar does not model, sorted
};

// True when the first non-blank character of `text` is '{' (a JSON object).
bool looks_like_json(const std::string& text);

// Read a config.json (text) into a Config.  Throws modar::FileError when the
// text is not a JSON object, modar::ConfigError naming the config.json field
// (and the modar key it maps to) for an unsupported model_type, a missing or
// mistyped field, or a layout modar cannot express.
HfImport import_hf_config(const std::string& json_text, const std::string& source_name);

// One line for the user: what was read, the notes whose key is not among
// `overridden_keys`, and the ignored fields, e.g.
//   config.json: Hugging Face "mixtral" (MixtralForCausalLM): model.seq_len = 4096 (...);
//   not modelled: rope_theta, sliding_window
std::string hf_import_summary(const HfImport& import, const std::string& source_name,
                              const std::vector<std::string>& overridden_keys);

// The model_type values import_hf_config reads, in documentation order.
const std::vector<std::string>& hf_model_types();

}  // namespace modar
