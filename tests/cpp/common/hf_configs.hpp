// tests/cpp/common/hf_configs.hpp: four MoE models' Hugging Face config.json
// files, written with the hub's field names and values (the public
// config.json of each checkpoint), and their published parameter counts.
//
// Published counts (docs/hf_import.md has the sources):
//  * total: the checkpoint's exact parameter count (the Hugging Face hub's
//    safetensors metadata for the repository below);
//  * active: the figure the authors publish, to the precision they give it.
#pragma once

#include <cstdint>

namespace modar_test {

struct PublishedMoe {
  const char* name;
  const char* config_json;
  double total;             // exact, from the checkpoint
  double active;            // as published (rounded to `active_precision`)
  double active_precision;  // the unit of the published active figure
  // Hand count of the active parameters from the fields below: the total
  // less the routed experts a token does not use, (E - top_k) x MoE layers x
  // one expert's matrices (gated MLP: 3 d f).
  double inactive_experts;
};

// mistralai/Mixtral-8x7B-v0.1: 46.7B total, 12.9B active (Mistral AI, "Mixtral
// of experts", 2023).  Inactive: (8 - 2) x 32 x 3 x 4096 x 14336.
inline constexpr const char* kMixtralConfig = R"({
  "architectures": ["MixtralForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mixtral",
  "num_attention_heads": 32,
  "num_experts_per_tok": 2,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "num_local_experts": 8,
  "output_router_logits": false,
  "rms_norm_eps": 1e-05,
  "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.02,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.36.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
})";

// allenai/OLMoE-1B-7B-0924: 6.9B total, 1.3B active (Muennighoff et al. 2024).
// Inactive: (64 - 8) x 16 x 3 x 2048 x 1024.
inline constexpr const char* kOlmoeConfig = R"({
  "architectures": ["OlmoeForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "clip_qkv": null,
  "eos_token_id": 50279,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 1024,
  "max_position_embeddings": 4096,
  "model_type": "olmoe",
  "norm_topk_prob": false,
  "num_attention_heads": 16,
  "num_experts": 64,
  "num_experts_per_tok": 8,
  "num_hidden_layers": 16,
  "num_key_value_heads": 16,
  "output_router_logits": false,
  "pad_token_id": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "rope_theta": 10000.0,
  "router_aux_loss_coef": 0.01,
  "tie_word_embeddings": false,
  "torch_dtype": "float32",
  "transformers_version": "4.43.0.dev0",
  "use_cache": true,
  "vocab_size": 50304
})";

// Qwen/Qwen1.5-MoE-A2.7B: 14.3B total, 2.7B activated (Qwen team, "Qwen1.5-MoE",
// 2024).  Inactive: (60 - 4) x 24 x 3 x 2048 x 1408.
inline constexpr const char* kQwenMoeConfig = R"({
  "architectures": ["Qwen2MoeForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "decoder_sparse_step": 1,
  "eos_token_id": 151643,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 5632,
  "max_position_embeddings": 8192,
  "max_window_layers": 21,
  "model_type": "qwen2_moe",
  "moe_intermediate_size": 1408,
  "norm_topk_prob": false,
  "num_attention_heads": 16,
  "num_experts": 60,
  "num_experts_per_tok": 4,
  "num_hidden_layers": 24,
  "num_key_value_heads": 16,
  "output_router_logits": false,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.001,
  "shared_expert_intermediate_size": 5632,
  "sliding_window": 32768,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.39.0.dev0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// deepseek-ai/deepseek-moe-16b-base: 16.4B total, 2.8B activated (Dai et al.
// 2024).  Inactive: (64 - 6) x 27 x 3 x 2048 x 1408 (layer 0 is dense).
inline constexpr const char* kDeepseekMoeConfig = R"({
  "architectures": ["DeepseekForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "aux_loss_alpha": 0.001,
  "bos_token_id": 100000,
  "eos_token_id": 100001,
  "first_k_dense_replace": 1,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 10944,
  "max_position_embeddings": 4096,
  "model_type": "deepseek",
  "moe_intermediate_size": 1408,
  "moe_layer_freq": 1,
  "n_routed_experts": 64,
  "n_shared_experts": 2,
  "norm_topk_prob": false,
  "num_attention_heads": 16,
  "num_experts_per_tok": 6,
  "num_hidden_layers": 28,
  "num_key_value_heads": 16,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 10000,
  "scoring_func": "softmax",
  "seq_aux": true,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.36.2",
  "use_cache": true,
  "vocab_size": 102400
})";

inline const PublishedMoe kPublishedMoe[] = {
    {"Mixtral-8x7B", kMixtralConfig, 46702792704.0, 12.9e9, 0.1e9, 6.0 * 32 * 3 * 4096.0 * 14336.0},
    {"OLMoE-1B-7B", kOlmoeConfig, 6919161856.0, 1.3e9, 0.1e9, 56.0 * 16 * 3 * 2048.0 * 1024.0},
    {"Qwen1.5-MoE-A2.7B", kQwenMoeConfig, 14315784192.0, 2.7e9, 0.1e9,
     56.0 * 24 * 3 * 2048.0 * 1408.0},
    {"DeepSeekMoE-16B", kDeepseekMoeConfig, 16375728128.0, 2.8e9, 0.1e9,
     58.0 * 27 * 3 * 2048.0 * 1408.0},
};

}  // namespace modar_test
