// tests/cpp/common/moe_families.hpp: published MoE models' shapes as configs,
// read from their Hugging Face configs (common/hf_configs.hpp holds the
// JSON), for the tests that count a model's tensors or write its launch
// arguments by hand: one definition per model, so the tests agree on it.
#pragma once

#include "modar/config.hpp"

namespace modar_test {

// mistralai/Mixtral-8x7B-v0.1: d 4096, 32 layers, 32 heads of 128 with 8 KV
// heads, SwiGLU 14336, vocabulary 32000 untied, RMSNorm eps 1e-5; 8 experts
// of the model's FFN width (moe.expert_ffn 0 = d_ff), top-2, router aux loss
// 0.02; sequences of 4096.
inline modar::Config mixtral_8x7b() {
  modar::Config c;
  c.model = {.d_model = 4096,
             .n_layers = 32,
             .n_heads = 32,
             .n_kv_heads = 8,
             .d_ff = 14336,
             .mlp = modar::MlpKind::swiglu,
             .vocab_size = 32000,
             .seq_len = 4096,
             .norm_eps = 1e-5};
  c.moe = {.experts = 8, .top_k = 2, .aux_loss_coef = 0.02};
  return c;
}

// allenai/OLMoE-1B-7B-0924: d 2048, 16 layers, 16 heads of 128 (MHA), SwiGLU
// 1024, vocabulary 50304 untied, RMSNorm eps 1e-5; 64 experts of the
// model's FFN width, top-8, router aux loss 0.01; sequences of 4096.
inline modar::Config olmoe_1b_7b() {
  modar::Config c;
  c.model = {.d_model = 2048,
             .n_layers = 16,
             .n_heads = 16,
             .d_ff = 1024,
             .mlp = modar::MlpKind::swiglu,
             .vocab_size = 50304,
             .seq_len = 4096,
             .norm_eps = 1e-5};
  c.moe = {.experts = 64, .top_k = 8, .aux_loss_coef = 0.01};
  return c;
}

}  // namespace modar_test
