// The config's derived quantities that live on its structs (MoD's routed
// tokens, an expert's capacity).  The rest of the config is one file per
// job: config_keys.hpp / config_keys.cpp (the key table and enum names),
// config_enums.cpp (enum <-> text), config_toml.cpp (TOML, config.json and
// --set in, TOML out), config_validate.cpp (validate()).
#include "modar/config.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>

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

}  // namespace modar
