// Hugging Face config.json import (modar/hf_config.hpp, docs/hf_import.md):
// the four MoE models' parameter counts against the published ones, what
// each field maps to, the notes and the "not modelled" list, and one-line
// errors for what cannot be read.  Expected counts come from the checkpoints
// (exact totals) and the authors' published figures, or are written by hand
// from the config fields; never from modar's output.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include "../common/config_cases.hpp"
#include "../common/hf_configs.hpp"
#include "modar/base/errors.hpp"
#include "modar/base/text.hpp"
#include "modar/config.hpp"
#include "modar/cost_model.hpp"
#include "modar/hf_config.hpp"

namespace modar {
namespace {

Config imported(const std::string& json) {
  Config c = import_hf_config(json, "config.json").config;
  validate(c);
  return c;
}

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

// The error a config.json gets: its type and one-line message.
template <class Error>
std::string error_of(const std::string& json) {
  try {
    imported(json);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error for " << json;
  return "";
}

TEST(HfImport, PublishedMoeCounts) {
  for (const modar_test::PublishedMoe& model : modar_test::kPublishedMoe) {
    SCOPED_TRACE(model.name);
    const ParamCounts params = count_params(imported(model.config_json));
    // Total: within 0.5% of the checkpoint's exact count; in fact equal.
    EXPECT_LE(std::fabs(params.total / model.total - 1.0), 0.005);
    EXPECT_NEAR(params.total, model.total, 0.5) << params.total;
    // Active: the total less the experts a token is not routed to (hand count).
    EXPECT_NEAR(params.active, model.total - model.inactive_experts, 0.5);
    // ... which is the published figure at the precision it is published to.
    EXPECT_LE(std::fabs(params.active - model.active), model.active_precision / 2.0)
        << params.active;
  }
}

TEST(HfImport, MixtralFields) {
  const HfImport in = import_hf_config(modar_test::kMixtralConfig, "mixtral.json");
  const Config& c = in.config;
  EXPECT_EQ(in.model_type, "mixtral");
  // Every key of the hand-written Mixtral (tests/data/models/mixtral_8x7b.toml:
  // d 4096, 32 layers, 32 heads over 8 KV heads (GQA), SwiGLU 14336,
  // vocabulary 32000, RMSNorm eps 1e-5; 8 experts, top-2, aux loss 0.02).
  for (const auto& row : modar_test::keys_as_stated("models/mixtral_8x7b.toml", c))
    EXPECT_EQ(row.actual, row.expected) << row.where;
  EXPECT_FALSE(c.model.tie_embeddings);
  EXPECT_EQ(c.moe.expert_ffn, 14336);  // the file's 0 = d_ff; the import names it
  EXPECT_EQ(c.moe.first_dense, 0);
  EXPECT_EQ(c.moe.interval, 1);
  // seq_len: the stated default, never max_position_embeddings (32768).
  EXPECT_EQ(c.model.seq_len, kHfDefaultSeqLen);
  // Not modelled, listed once: rope_theta, sliding_window, attention_dropout;
  // bookkeeping (token ids, dtype, versions) is not listed.
  EXPECT_EQ(in.ignored,
            (std::vector<std::string>{"attention_dropout", "rope_theta", "sliding_window"}));
  const std::string summary = hf_import_summary(in, "mixtral.json", {});
  EXPECT_TRUE(contains(summary, "model.seq_len = 4096")) << summary;
  EXPECT_TRUE(contains(summary, "max_position_embeddings = 32768")) << summary;
  EXPECT_TRUE(contains(summary, "not modelled: attention_dropout, rope_theta, sliding_window"));
  EXPECT_EQ(summary.find('\n'), std::string::npos);
  // A --set of model.seq_len silences its note.
  EXPECT_FALSE(contains(hf_import_summary(in, "mixtral.json", {"model.seq_len"}), "seq_len"));
}

TEST(HfImport, SharedExpertsGateAndLayerPatterns) {
  const Config qwen = imported(modar_test::kQwenMoeConfig);
  EXPECT_EQ(qwen.moe.experts, 60);
  EXPECT_EQ(qwen.moe.expert_ffn, 1408);
  EXPECT_EQ(qwen.moe.shared_experts, 1);
  EXPECT_EQ(qwen.moe.shared_expert_ffn, 5632);
  EXPECT_TRUE(qwen.moe.shared_expert_gate);
  EXPECT_TRUE(qwen.model.qkv_bias);
  EXPECT_EQ(qwen.model.d_ff, 5632);
  const Config deepseek = imported(modar_test::kDeepseekMoeConfig);
  EXPECT_EQ(deepseek.moe.shared_experts, 2);
  EXPECT_EQ(deepseek.moe.shared_expert_ffn, 0);  // = the routed width, 1408
  EXPECT_FALSE(deepseek.moe.shared_expert_gate);
  EXPECT_EQ(deepseek.moe.first_dense, 1);
  EXPECT_EQ(deepseek.model.d_ff, 10944);  // layer 0's dense FFN
  EXPECT_EQ(imported(modar_test::kOlmoeConfig).model.qk_norm, QkNorm::projection);

  // Qwen: MoE iff (l + 1) % decoder_sparse_step == 0: step 2 -> layers 1, 3, 5, ...
  std::string step2 = modar_test::kQwenMoeConfig;
  step2.replace(step2.find("\"decoder_sparse_step\": 1"), 24, "\"decoder_sparse_step\": 2");
  const Config q2 = imported(step2);
  EXPECT_EQ(q2.moe.first_dense, 1);
  EXPECT_EQ(q2.moe.interval, 2);
  EXPECT_EQ(q2.moe.moe_layers(24), 12);
  // DeepSeek: MoE iff l >= first_k_dense_replace and l % moe_layer_freq == 0:
  // k = 3, freq = 2 -> layers 4, 6, 8, ...
  std::string freq2 = modar_test::kDeepseekMoeConfig;
  freq2.replace(freq2.find("\"moe_layer_freq\": 1"), 19, "\"moe_layer_freq\": 2");
  freq2.replace(freq2.find("\"first_k_dense_replace\": 1"), 26, "\"first_k_dense_replace\": 3");
  const Config d2 = imported(freq2);
  EXPECT_EQ(d2.moe.first_dense, 4);
  EXPECT_EQ(d2.moe.interval, 2);
  EXPECT_FALSE(d2.moe.is_moe_layer(3));
  EXPECT_TRUE(d2.moe.is_moe_layer(4));
  EXPECT_FALSE(d2.moe.is_moe_layer(5));
}

// Llama-2-7B's checkpoint has 6,738,415,616 parameters = 2 V d + L (4 d^2 +
// 3 d d_ff + 2 d) + d with V 32000, d 4096, L 32, d_ff 11008.
TEST(HfImport, DenseLlamaAndGemmaAndQwen3) {
  const std::string llama = R"({"model_type": "llama", "hidden_size": 4096,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
    "intermediate_size": 11008, "vocab_size": 32000, "hidden_act": "silu",
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "tie_word_embeddings": false})";
  const Config l = imported(llama);
  EXPECT_DOUBLE_EQ(count_params(l).total, 6738415616.0);
  EXPECT_EQ(l.model.seq_len, 4096);
  // Gemma: gated GELU (geglu), head_dim 256 apart from d / H, tied by default.
  const Config gemma = imported(R"({"model_type": "gemma", "hidden_size": 3072,
    "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 16,
    "head_dim": 256, "intermediate_size": 24576, "vocab_size": 256000,
    "hidden_act": "gelu_pytorch_tanh", "max_position_embeddings": 8192})");
  EXPECT_EQ(gemma.model.mlp, MlpKind::geglu);
  EXPECT_EQ(gemma.model.d_head, 256);
  EXPECT_TRUE(gemma.model.tie_embeddings);
  // Qwen3: QK-norm per head, no QKV bias.
  const Config qwen3 = imported(R"({"model_type": "qwen3", "hidden_size": 1024,
    "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
    "head_dim": 128, "intermediate_size": 3072, "vocab_size": 151936, "hidden_act": "silu",
    "max_position_embeddings": 40960, "tie_word_embeddings": true})");
  EXPECT_EQ(qwen3.model.qk_norm, QkNorm::head);
  EXPECT_FALSE(qwen3.model.qkv_bias);
}

TEST(HfImport, Gpt2SaysWhatItLeavesOut) {
  const HfImport in = import_hf_config(
      R"({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": null,
          "vocab_size": 50257, "n_positions": 1024, "n_ctx": 1024,
          "activation_function": "gelu_new", "layer_norm_epsilon": 1e-05, "attn_pdrop": 0.1})",
      "gpt2.json");
  EXPECT_EQ(in.config.model.mlp, MlpKind::gelu);
  EXPECT_TRUE(in.config.model.tie_embeddings);
  EXPECT_EQ(in.config.model.d_ff, 0);        // n_inner null: 4 d
  EXPECT_EQ(in.config.model.seq_len, 1024);  // the default capped at n_positions
  // Biases: L (qkv 3d + out d + up 4d + down d) = 12 x 9 x 768; LayerNorm
  // shifts (2 L + 1) d; the position table 1024 d: 82,944 + 19,200 + 786,432 =
  // 888,576, the difference between the checkpoint (124,439,808) and modar.
  const std::string summary = hf_import_summary(in, "gpt2.json", {});
  EXPECT_TRUE(contains(
      summary, format_number(12.0 * 9 * 768 + 25.0 * 768 + 1024.0 * 768) + " parameters fewer"))
      << summary;
  EXPECT_TRUE(contains(summary, "not modelled: attn_pdrop")) << summary;
}

TEST(HfImport, OneLineErrorsNameTheField) {
  const std::string unsupported =
      error_of<ConfigError>(R"({"model_type": "mamba", "hidden_size": 768})");
  EXPECT_TRUE(contains(unsupported, "model_type = \"mamba\": not a supported architecture"))
      << unsupported;
  EXPECT_TRUE(contains(unsupported, "mixtral"));
  EXPECT_TRUE(contains(error_of<ConfigError>(R"({"model_type": "deepseek_v3"})"),
                       "multi-head latent attention"));
  std::string missing = modar_test::kMixtralConfig;
  missing.replace(missing.find("\"num_local_experts\": 8"), 22, "\"num_local_expertz\": 8");
  const std::string no_experts = error_of<ConfigError>(missing);
  EXPECT_TRUE(contains(no_experts, "missing num_local_experts (maps to moe.experts)"))
      << no_experts;
  std::string mistyped = modar_test::kMixtralConfig;
  mistyped.replace(mistyped.find("\"num_experts_per_tok\": 2"), 24,
                   "\"num_experts_per_tok\": \"2\"");
  EXPECT_TRUE(contains(error_of<ConfigError>(mistyped),
                       "num_experts_per_tok = \"2\": must be an integer (maps to moe.top_k)"));
  std::string relu = modar_test::kMixtralConfig;
  relu.replace(relu.find("\"silu\""), 6, "\"relu\"");
  EXPECT_TRUE(contains(error_of<ConfigError>(relu), "hidden_act = \"relu\""));
  std::string scattered = modar_test::kQwenMoeConfig;
  scattered.replace(scattered.find("\"max_window_layers\""), 0, "\"mlp_only_layers\": [3, 7], ");
  EXPECT_TRUE(contains(error_of<ConfigError>(scattered), "mlp_only_layers = [3, 7]"));
  // The cross-field rules are the validator's, named by modar key.
  std::string heads = modar_test::kMixtralConfig;
  heads.replace(heads.find("\"num_attention_heads\": 32"), 25, "\"num_attention_heads\": 30");
  EXPECT_TRUE(contains(error_of<ConfigError>(heads), "model.n_heads = 30"));
  // Not JSON, not an object, too deep, no model_type.
  EXPECT_TRUE(contains(error_of<FileError>("{\"model_type\": "), "not valid JSON"));
  EXPECT_TRUE(contains(error_of<FileError>("[1, 2]"), "JSON object"));
  EXPECT_TRUE(contains(error_of<FileError>("{\"a\": " + std::string(100, '[')), "deeper"));
  EXPECT_TRUE(contains(error_of<ConfigError>("{\"hidden_size\": 8}"), "no model_type"));
  const std::string bad_utf8 = error_of<FileError>("{\"model_type\": \"caf\xe9\"}");
  EXPECT_TRUE(contains(bad_utf8, "UTF-8")) << bad_utf8;
  EXPECT_EQ(bad_utf8.find('\n'), std::string::npos);
}

TEST(HfImport, EveryConfigFileReaderTakesJson) {
  EXPECT_TRUE(looks_like_json("  \n{\"model_type\": 1}"));
  EXPECT_FALSE(looks_like_json("[model]\nd_model = 8\n"));
  const std::string path = testing::TempDir() + "/hf_import_mixtral_config.json";
  {
    std::ofstream out(path);
    out << modar_test::kMixtralConfig;
  }
  const ConfigDocument doc = load_config_document(path, {"model.seq_len=8192", "moe.top_k=1"});
  EXPECT_EQ(doc.config.model.seq_len, 8192);
  EXPECT_EQ(doc.config.moe.top_k, 1);
  EXPECT_TRUE(contains(doc.notes, "Hugging Face \"mixtral\""));
  EXPECT_FALSE(contains(doc.notes, "model.seq_len"));
  EXPECT_EQ(load_config_file(path).moe.experts, 8);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace modar
