// tests/cpp/common/moe_families.hpp: published MoE models' shapes as configs,
// read from their Hugging Face configs (common/hf_configs.hpp holds the
// JSON), for the tests that count a model's tensors or write its launch
// arguments by hand: one definition per model (tests/data/models/, with
// the published numbers and where they come from), so the tests agree on it.
#pragma once

#include "model_files.hpp"

namespace modar_test {

// mistralai/Mixtral-8x7B-v0.1: d 4096, 32 layers, 32 heads of 128 with 8 KV
// heads, SwiGLU 14336, vocabulary 32000 untied; 8 experts, top-2.
inline modar::Config mixtral_8x7b() {
  return model_file("mixtral_8x7b");
}

// allenai/OLMoE-1B-7B-0924: d 2048, 16 layers, 16 heads of 128 (MHA), SwiGLU
// 1024, vocabulary 50304 untied; 64 experts, top-8.
inline modar::Config olmoe_1b_7b() {
  return model_file("olmoe_1b_7b");
}

}  // namespace modar_test
