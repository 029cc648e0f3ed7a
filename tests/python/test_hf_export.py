"""Hugging Face config.json import (Config.from_hf, the C++ importer the CLI
uses) and Megatron-LM arguments (Config.to_megatron_args / from_megatron_args):
counts against the published ones, the one-time notes, one-line errors.
Details and sources: docs/hf_import.md, docs/export.md."""

from __future__ import annotations

import warnings

import pytest

import modar

# Qwen/Qwen1.5-MoE-A2.7B's config.json (the hub's field names and values).
QWEN_MOE = {
    "architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "decoder_sparse_step": 1, "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 2048,
    "initializer_range": 0.02, "intermediate_size": 5632, "max_position_embeddings": 8192,
    "max_window_layers": 21, "model_type": "qwen2_moe", "moe_intermediate_size": 1408,
    "norm_topk_prob": False, "num_attention_heads": 16, "num_experts": 60,
    "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 16,
    "output_router_logits": False, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 5632,
    "sliding_window": 32768, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.39.0.dev0", "use_cache": True, "use_sliding_window": False,
    "vocab_size": 151936,
}


def test_qwen_moe_counts_match_the_checkpoint():
    with pytest.warns(modar.HfImportWarning) as caught:
        config = modar.Config.from_hf(QWEN_MOE)
    assert len(caught) == 1
    note = str(caught[0].message)
    assert "model.seq_len = 4096" in note and "\n" not in note
    assert "not modelled:" in note and "rope_theta" in note and "bos_token_id" not in note
    params = modar.estimate(config).to_dict()["params"]
    # The checkpoint's exact count (hub safetensors metadata): 14,315,784,192.
    assert params["total"] == pytest.approx(14_315_784_192, rel=1e-12)
    # Active: total less (60 - 4) experts x 24 layers x 3 x 2048 x 1408 = 2.689B (published 2.7B).
    assert params["active"] == pytest.approx(14_315_784_192 - 56 * 24 * 3 * 2048 * 1408, rel=1e-12)
    assert abs(params["active"] / 2.7e9 - 1) < 0.005
    model, moe = config.to_dict()["model"], config.to_dict()["moe"]
    assert (moe["experts"], moe["top_k"], moe["expert_ffn"]) == (60, 4, 1408)
    assert (moe["shared_experts"], moe["shared_expert_ffn"], moe["shared_expert_gate"]) == (1, 5632, True)
    assert model["qkv_bias"] is True and model["seq_len"] == 4096


def test_seq_len_is_the_users_and_silences_its_note():
    with pytest.warns(modar.HfImportWarning) as caught:
        config = modar.Config.from_hf(QWEN_MOE, seq_len=8192)
    assert config.to_dict()["model"]["seq_len"] == 8192
    assert "seq_len" not in str(caught[0].message)


def test_hf_file_and_errors(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "mamba", "hidden_size": 768}')
    with pytest.raises(ValueError, match='model_type = "mamba": not a supported architecture'):
        modar.Config.from_hf(path)
    bad = dict(QWEN_MOE, num_experts_per_tok="4")
    with pytest.raises(ValueError, match="num_experts_per_tok = \"4\": must be an integer"):
        modar.Config.from_hf(bad)
    with pytest.raises(TypeError, match="config"):
        modar.Config.from_hf({"model_type": object()})


def test_megatron_arguments_round_trip():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", modar.HfImportWarning)
        config = modar.Config.from_hf(QWEN_MOE, count=8, parallel={"tensor": 2, "zero": 1},
                                      train={"micro_batch": 1, "global_batch": 64})
    text = config.to_megatron_args()
    assert "    --num-experts 60\n" in text
    assert "    --moe-shared-expert-intermediate-size 5632\n" in text
    assert "    --add-qkv-bias\n" in text
    assert "#   moe.shared_expert_gate = true" in text  # no Megatron-LM argument for it
    with pytest.warns(modar.MegatronArgsWarning, match="device.count = 2"):
        back = modar.Config.from_megatron_args(text, count=8)
    got, want = back.to_dict(), config.to_dict()
    for section, key in [("model", "d_model"), ("model", "n_layers"), ("model", "qkv_bias"),
                         ("moe", "experts"), ("moe", "top_k"), ("moe", "expert_ffn"),
                         ("parallel", "tensor"), ("parallel", "zero"), ("train", "global_batch")]:
        assert got[section][key] == want[section][key], (section, key)
    # The shared expert's gate has no Megatron-LM argument: lost on the way back.
    assert got["moe"]["shared_expert_gate"] is False
    with pytest.raises(ValueError, match="--num-layers = x: must be an integer"):
        modar.Config.from_megatron_args("--num-layers x")
