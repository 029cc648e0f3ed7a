"""modar.Config: one model / training / device configuration.

Every construction path (dict, TOML file, keyword arguments, Hugging Face
config.json) ends in the C++ parser and validator the CLI uses, so the rules
and the error messages are the CLI's own; a bad value raises ValueError
(modar.ConfigError) naming the field, the value and what is allowed.
"""

from __future__ import annotations

import copy
import difflib
import json
import math
import numbers
import os
import sys
from pathlib import Path
from typing import Any, Mapping

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from . import _core

ConfigError = _core.ConfigError
_SECTIONS = ("model", "mod", "dar", "train", "device")


def _toml_value(field: str, value: Any) -> str:
    """One TOML literal; refuses what TOML cannot say, naming the field."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()  # numpy scalar -> Python scalar
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        value = float(value)
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, (str, os.PathLike)):
        return json.dumps(os.fspath(value))  # a JSON string is a TOML basic string
    raise ConfigError(
        f"{field} = {value!r}: unsupported value type {type(value).__name__}; "
        "allowed: int, float, bool, str"
    )


def _dict_to_toml(document: Mapping[str, Mapping[str, Any] | Any]) -> str:
    top = [f"{k} = {_toml_value(k, v)}" for k, v in document.items() if not isinstance(v, Mapping)]
    lines = top + ([""] if top else [])
    for section, body in document.items():
        if not isinstance(body, Mapping):
            continue
        lines.append(f"[{section}]")
        for key, value in body.items():
            lines.append(f"{key} = {_toml_value(f'{section}.{key}', value)}")
        lines.append("")
    return "\n".join(lines)


def _bare_key_index() -> dict[str, str]:
    """Bare name -> dotted key, for names that occur in exactly one section."""
    seen: dict[str, list[str]] = {}
    for dotted in _core.config_keys():
        seen.setdefault(dotted.rsplit(".", 1)[-1], []).append(dotted)
    return {name: keys[0] for name, keys in seen.items() if len(keys) == 1}


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[parts[-1]] = value


def _flatten(entries: Mapping[str, Any], prefix: str = ""):
    for key, value in entries.items():
        if not isinstance(key, str):
            raise ConfigError(f"{prefix or 'config.'}{key!r}: configuration keys must be strings")
        if isinstance(value, Mapping):
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _normalise(entries: Mapping[str, Any]) -> dict:
    """Accept {"mod": {...}}, {"mod.capacity": x} and bare {"capacity": x}."""
    tree: dict = {}
    bare = None
    for key, value in _flatten(entries):
        if "." in key:
            _set_dotted(tree, key, value)
            continue
        if bare is None:
            bare = _bare_key_index()
            top_level = {k for k in _core.config_keys() if "." not in k}
        dotted = key if key in top_level else bare.get(key)
        if dotted is None:
            names = sorted(set(bare) | top_level)
            close = difflib.get_close_matches(key, names + list(_SECTIONS), n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise ConfigError(
                f"{key} = {value!r}: unknown configuration key; {hint}"
                f"allowed: a section ({', '.join(_SECTIONS)}) given as a dict, "
                f"or one of {', '.join(names)}"
            )
        _set_dotted(tree, dotted, value)
    return tree


def _deep_merge(base: dict, extra: Mapping) -> dict:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


class Config:
    """A validated configuration (the same structs the CLI reads).

    >>> Config(d_model=1024, n_layers=16, mod={"capacity": 0.125, "every": 2})
    >>> Config("model.toml", seq_len=4096)          # a TOML file plus overrides
    >>> Config({"model": {"d_model": 512}})          # a dict (nested or dotted keys)
    >>> Config.from_hf("config.json")                # a Hugging Face config
    """

    __slots__ = ("_cpp",)

    def __init__(self, source: Any = None, /, **overrides: Any) -> None:
        if isinstance(source, Config):
            base_cpp = source._cpp
            base_doc = source.to_dict() if overrides else None
        elif source is None:
            base_cpp, base_doc = None, {}
        elif isinstance(source, Mapping):
            base_cpp, base_doc = None, _normalise(source)
        elif isinstance(source, (str, os.PathLike)):
            base_cpp = _core.load_config_file(os.fspath(source))
            base_doc = None
            if overrides:
                base_doc = tomllib.loads(_core.config_to_toml(base_cpp))
        else:
            raise ConfigError(
                f"config: cannot build a Config from {type(source).__name__}; "
                "allowed: a dict, a TOML path, a Config, or keyword arguments"
            )
        if base_cpp is not None and not overrides:
            _core.validate_config(base_cpp)
            self._cpp = base_cpp
            return
        document = _deep_merge(base_doc or {}, _normalise(overrides))
        self._cpp = _core.parse_config_toml(_dict_to_toml(document), "<python>")
        _core.validate_config(self._cpp)

    # ---- other constructors -------------------------------------------------
    @classmethod
    def from_dict(cls, document: Mapping[str, Any]) -> "Config":
        return cls(document)

    @classmethod
    def from_toml(cls, path: str | os.PathLike, **overrides: Any) -> "Config":
        return cls(os.fspath(path), **overrides)

    @classmethod
    def from_toml_string(cls, text: str, **overrides: Any) -> "Config":
        config = cls.__new__(cls)
        config._cpp = _core.parse_config_toml(text, "<string>")
        _core.validate_config(config._cpp)
        return cls(config, **overrides) if overrides else config

    @classmethod
    def from_hf(cls, path_or_dict: str | os.PathLike | Mapping[str, Any], **overrides: Any) -> "Config":
        """From a Hugging Face config.json (LLaMA / GPT-NeoX / GPT-2 keys).

        Keyword arguments override the result (for example seq_len=4096 when
        max_position_embeddings is longer than the context you train with).
        """
        from ._hf import hf_to_dict

        return cls(_deep_merge(hf_to_dict(path_or_dict), _normalise(overrides)))

    # ---- views ----------------------------------------------------------------
    def to_toml(self) -> str:
        return _core.config_to_toml(self._cpp)

    def to_dict(self) -> dict:
        return tomllib.loads(self.to_toml())

    def replace(self, **overrides: Any) -> "Config":
        """A new Config with some fields changed (same keys as the constructor)."""
        return Config(self, **overrides)

    def save(self, path: str | os.PathLike) -> Path:
        """Write the TOML file atomically (temporary file + rename)."""
        target = Path(path)
        tmp = target.with_name(f".{target.name}.tmp{os.getpid()}")
        tmp.write_text(self.to_toml())
        os.replace(tmp, target)
        return target

    def __getitem__(self, dotted: str) -> Any:
        node: Any = self.to_dict()
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                raise KeyError(dotted)
            node = node[part]
        return node

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Config) and self.to_toml() == other.to_toml()

    def __hash__(self) -> int:
        return hash(self.to_toml())

    def __repr__(self) -> str:
        d = self.to_dict()
        model, mod, dar = d.get("model", {}), d.get("mod", {}), d.get("dar", {})
        parts = [f"{k}={model[k]!r}" for k in ("d_model", "n_layers", "n_heads", "seq_len", "mlp") if k in model]
        if mod.get("every", 0):
            parts.append(f"mod={{'capacity': {mod.get('capacity')!r}, 'every': {mod.get('every')!r}}}")
        if dar.get("variant", "none") != "none":
            parts.append(f"dar={{'variant': {dar.get('variant')!r}, 'block_layers': {dar.get('block_layers')!r}}}")
        profile = d.get("device", {}).get("profile")
        if profile is not None:
            parts.append(f"profile={profile!r}")
        return f"modar.Config({', '.join(parts)})"


def as_config(value: Any) -> Config:
    """Config, dict, TOML path -> Config (the argument every API call accepts)."""
    return value if isinstance(value, Config) else Config(value)
