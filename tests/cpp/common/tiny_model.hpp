// The tiny model the runtime's whole-model tests and the parallel-equals-
// serial tests share (d 16, 2 heads over 1 KV head, d_ff 24, V 13, s 6; the
// layer count is the caller's), and named edits of a test's base Config for
// parameterised tests over model families: each sets one whole table, [mod]
// or [dar]; the fields the designated initializer does not name keep their
// defaults, as in a config file that names only those keys.
#pragma once

#include <cstdint>
#include <functional>

#include "modar/config.hpp"

namespace modar {

constexpr int64_t kTinyVocab = 13, kTinySeq = 6;

inline Config tiny_model(int64_t n_layers) {
  Config config;
  config.model = {.d_model = 16,
                  .n_layers = n_layers,
                  .n_heads = 2,
                  .n_kv_heads = 1,
                  .d_ff = 24,
                  .vocab_size = kTinyVocab,
                  .seq_len = kTinySeq};
  return config;
}

inline std::function<void(Config&)> set_mod(ModConfig mod) {
  return [mod](Config& c) { c.mod = mod; };
}

inline std::function<void(Config&)> set_dar(DarConfig dar) {
  return [dar](Config& c) { c.dar = dar; };
}

// [mod] and [dar] together (MoD inside DAR).
inline std::function<void(Config&)> set_mod_dar(ModConfig mod, DarConfig dar) {
  return [mod, dar](Config& c) {
    c.mod = mod;
    c.dar = dar;
  };
}

}  // namespace modar
