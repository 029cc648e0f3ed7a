"""modar.Config: dict / TOML / keyword round trips, Hugging Face configs, and
bad input raising ValueError that names the field (the CLI's own messages)."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

import modar
from conftest import CliError, run_cli

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def make_config() -> modar.Config:
    return modar.Config(
        d_model=1024, n_layers=16, n_heads=8, seq_len=1024, mlp="swiglu",
        mod={"capacity": 0.125, "every": 2},
        dar={"variant": "dar", "block_layers": 4},
        train={"micro_batch": 4},
    )


def test_keyword_arguments_land_in_their_sections():
    config = make_config()
    d = config.to_dict()
    assert d["model"]["d_model"] == 1024
    assert d["model"]["n_layers"] == 16
    assert d["model"]["mlp"] == "swiglu"
    assert d["mod"]["capacity"] == 0.125 and d["mod"]["every"] == 2
    assert d["dar"]["variant"] == "dar" and d["dar"]["block_layers"] == 4
    assert d["train"]["micro_batch"] == 4


def test_bare_dotted_and_nested_keys_agree():
    nested = modar.Config({"model": {"d_model": 512, "n_heads": 8}, "mod": {"every": 2}})
    dotted = modar.Config({"model.d_model": 512, "model.n_heads": 8, "mod.every": 2})
    bare = modar.Config(d_model=512, n_heads=8, every=2)
    assert nested == dotted == bare


def test_round_trip_dict_toml_python(tmp_path):
    config = make_config()
    # dict -> Config
    assert modar.Config(config.to_dict()) == config
    # TOML text -> Config, and the text is stable under a second round trip
    assert modar.Config.from_toml_string(config.to_toml()) == config
    assert modar.Config.from_toml_string(config.to_toml()).to_toml() == config.to_toml()
    # TOML file -> Config
    path = config.save(tmp_path / "model.toml")
    assert modar.Config(path) == config
    assert modar.Config.from_toml(str(path)) == config
    # the TOML the core writes is what tomllib reads as to_dict()
    assert tomllib.loads(path.read_text()) == config.to_dict()


def test_hand_written_toml_file(tmp_path):
    path = tmp_path / "hand.toml"
    path.write_text(
        "[model]\nd_model = 768\nn_layers = 12\nn_heads = 12\nseq_len = 1024\n\n"
        "[mod]\ncapacity = 0.25\nevery = 2\n"
    )
    config = modar.Config(path)
    assert config["model.d_model"] == 768
    assert config["mod.capacity"] == 0.25
    # a file plus keyword overrides
    bigger = modar.Config(path, n_layers=24, mod={"capacity": 0.5})
    assert bigger["model.n_layers"] == 24 and bigger["mod.capacity"] == 0.5
    assert bigger["model.d_model"] == 768 and bigger["mod.every"] == 2


def test_replace_and_numpy_scalars():
    config = make_config()
    other = config.replace(d_model=np.int64(2048), capacity=np.float64(0.25))
    assert other["model.d_model"] == 2048 and other["mod.capacity"] == 0.25
    assert config["model.d_model"] == 1024  # unchanged


def test_repr_is_readable():
    text = repr(make_config())
    assert text.startswith("modar.Config(") and "d_model=1024" in text and "capacity" in text


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"mod": {"capacity": 1.5, "every": 2}}, "mod.capacity"),
        ({"mod": {"capacity": 0.0, "every": 2}}, "mod.capacity"),
        ({"d_model": 512.5}, "model.d_model"),
        ({"d_model": "wide"}, "model.d_model"),
        ({"mlp": "relu"}, "model.mlp"),
        ({"n_layers": -3}, "model.n_layers"),
        ({"dar": {"variant": "dual"}}, "dar.variant"),
        ({"train": {"dtype": "int8"}}, "train.dtype"),
        ({"mod": {"capacity": float("nan"), "every": 2}}, "mod.capacity"),
    ],
)
def test_bad_values_raise_value_error_naming_the_field(kwargs, field):
    with pytest.raises(ValueError) as info:
        modar.Config(**kwargs)
    assert field in str(info.value)
    assert isinstance(info.value, modar.ConfigError)


def test_unknown_key_suggests_the_right_one():
    with pytest.raises(ValueError, match="d_model"):
        modar.Config(d_modle=512)
    with pytest.raises(ValueError, match="mod.capacity"):
        modar.Config({"mod": {"capacty": 0.5}})


def test_python_and_cli_give_the_same_message(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[mod]\ncapacity = 1.5\nevery = 2\n")
    with pytest.raises(ValueError) as info:
        modar.Config(path)
    message = str(info.value)
    assert "mod.capacity" in message and "1.5" in message
    with pytest.raises(CliError) as cli_info:
        run_cli("estimate", str(path))
    assert cli_info.value.returncode == 2
    assert message in cli_info.value.stderr


def test_missing_file_is_a_value_error_naming_the_path(tmp_path):
    missing = tmp_path / "nope.toml"
    with pytest.raises(ValueError, match="nope.toml"):
        modar.Config(missing)


def test_hf_llama(data_dir):
    config = modar.Config.from_hf(data_dir / "llama2_7b_config.json")
    model = config.to_dict()["model"]
    assert (model["d_model"], model["n_layers"], model["n_heads"]) == (4096, 32, 32)
    assert model["n_kv_heads"] in (0, 32)  # 32 KV heads == MHA
    assert model["d_ff"] == 11008 and model["mlp"] == "swiglu"
    assert model["vocab_size"] == 32000 and model["seq_len"] == 4096
    assert model["tie_embeddings"] is False
    assert model["norm_eps"] == pytest.approx(1e-5)


def test_hf_gpt2_and_overrides(data_dir):
    config = modar.Config.from_hf(data_dir / "gpt2_config.json", seq_len=512)
    model = config.to_dict()["model"]
    assert (model["d_model"], model["n_layers"], model["n_heads"]) == (768, 12, 12)
    assert model["mlp"] == "gelu" and model["vocab_size"] == 50257
    assert model["d_ff"] == 0  # n_inner null: the GELU default, 4 d
    assert model["tie_embeddings"] is True  # absent: Hugging Face's default
    assert model["seq_len"] == 512


def test_hf_gpt_neox(data_dir):
    model = modar.Config.from_hf(data_dir / "pythia_160m_config.json").to_dict()["model"]
    assert (model["d_model"], model["n_layers"], model["n_heads"], model["d_ff"]) == (768, 12, 12, 3072)
    assert model["mlp"] == "gelu" and model["seq_len"] == 2048 and model["tie_embeddings"] is False


def test_hf_bad_inputs(tmp_path, data_dir):
    hf = json.loads((data_dir / "llama2_7b_config.json").read_text())
    del hf["hidden_size"]
    with pytest.raises(ValueError, match="hidden_size"):
        modar.Config.from_hf(hf)
    hf = json.loads((data_dir / "llama2_7b_config.json").read_text())
    hf["hidden_act"] = "relu"
    with pytest.raises(ValueError, match="hidden_act"):
        modar.Config.from_hf(hf)
    hf = json.loads((data_dir / "llama2_7b_config.json").read_text())
    hf["num_attention_heads"] = 30  # does not divide 4096: the core's validator says so
    with pytest.raises(ValueError, match="n_heads"):
        modar.Config.from_hf(hf)
    broken = tmp_path / "config.json"
    broken.write_text("{not json")
    with pytest.raises(ValueError, match="config.json"):
        modar.Config.from_hf(broken)
