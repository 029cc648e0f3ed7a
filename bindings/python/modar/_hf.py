"""Hugging Face config.json -> modar configuration dict.

Key names differ by family; each modar field lists the names it accepts, in
order (LLaMA / Mistral / Qwen, GPT-NeoX, GPT-2):

    model.d_model      hidden_size | n_embd | d_model
    model.n_layers     num_hidden_layers | n_layer
    model.n_heads      num_attention_heads | n_head
    model.n_kv_heads   num_key_value_heads            (absent: MHA)
    model.d_head       head_dim                       (absent: d_model / n_heads)
    model.d_ff         intermediate_size | n_inner    (absent / null: the MLP's default)
    model.vocab_size   vocab_size
    model.seq_len      max_position_embeddings | n_positions | n_ctx
    model.tie_embeddings  tie_word_embeddings         (absent: true, HF's default)
    model.norm_eps     rms_norm_eps | layer_norm_eps | layer_norm_epsilon
    model.mlp          hidden_act | activation_function:
                       silu / swish -> swiglu (gated, LLaMA); gelu* -> gelu

Only values are mapped here; the C++ validator checks them afterwards, so a
config.json with, say, heads that do not divide the width is refused with the
same message as a TOML file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from . import _core

ConfigError = _core.ConfigError

_FIELDS = (
    ("d_model", ("hidden_size", "n_embd", "d_model"), True),
    ("n_layers", ("num_hidden_layers", "n_layer"), True),
    ("n_heads", ("num_attention_heads", "n_head"), True),
    ("n_kv_heads", ("num_key_value_heads",), False),
    ("d_head", ("head_dim",), False),
    ("d_ff", ("intermediate_size", "n_inner"), False),
    ("vocab_size", ("vocab_size",), True),
    ("seq_len", ("max_position_embeddings", "n_positions", "n_ctx"), False),
    ("norm_eps", ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon"), False),
)
_GATED = {"silu", "swish", "swiglu"}
_GELU = {"gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_python", "quick_gelu"}


def _read(source: str | os.PathLike | Mapping[str, Any]) -> tuple[dict, str]:
    if isinstance(source, Mapping):
        return dict(source), "<dict>"
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"config: expected a config.json path or a dict, got {type(source).__name__}")
    path = Path(source)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise _core.FileError(f"{path}: cannot read Hugging Face config: {error.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise _core.FileError(
            f"{path}: not UTF-8 text (byte 0x{data[error.start]:02x} at offset {error.start}); "
            "allowed: a JSON config.json in UTF-8"
        ) from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise _core.FileError(
            f"{path}: not valid JSON at line {error.lineno} column {error.colno}: {error.msg}"
        ) from None
    if not isinstance(document, dict):
        raise _core.FileError(f"{path}: a Hugging Face config.json must hold a JSON object")
    return document, str(path)


def hf_to_dict(source: str | os.PathLike | Mapping[str, Any]) -> dict:
    hf, where = _read(source)
    model: dict[str, Any] = {}
    for field, names, required in _FIELDS:
        present = [n for n in names if hf.get(n) is not None]
        if present:
            value = hf[present[0]]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(
                    f"{where}: {present[0]} = {value!r}: must be a number (maps to model.{field})"
                )
            model[field] = value
        elif required:
            raise ConfigError(
                f"{where}: missing {' / '.join(names)}: needed for model.{field}; "
                "allowed: a LLaMA, GPT-NeoX or GPT-2 style config.json"
            )
    act_key = "hidden_act" if "hidden_act" in hf else "activation_function"
    act = hf.get(act_key, "gelu")
    if not isinstance(act, str) or (act.lower() not in _GATED and act.lower() not in _GELU):
        raise ConfigError(
            f"{where}: {act_key} = {act!r}: unsupported activation; "
            f"allowed: {', '.join(sorted(_GATED | _GELU))}"
        )
    model["mlp"] = "swiglu" if act.lower() in _GATED else "gelu"
    tie = hf.get("tie_word_embeddings", True)
    if not isinstance(tie, bool):
        raise ConfigError(f"{where}: tie_word_embeddings = {tie!r}: must be true or false")
    model["tie_embeddings"] = tie
    if "d_ff" in model and model["d_ff"] == 0:
        del model["d_ff"]
    return {"model": model}
