"""modar.Config: one model / training / device configuration.

Every construction path (dict, TOML file, keyword arguments, Hugging Face
config.json) sets the C++ structs through the core's typed keys (no TOML text
is written) and ends in the validator the CLI uses, so the rules and the
error messages are the CLI's own; a bad value raises ValueError
(modar.ConfigError) naming the field, the value and what is allowed.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any, Mapping

from . import _core
from ._args import one_line_type_errors

ConfigError = _core.ConfigError
_SECTIONS = ("model", "mod", "dar", "moe", "train", "device", "parallel", "cluster")


_KEYS: dict[str, str] | None = None  # dotted key -> its type ("integer", "real", ...)
_BARE: dict[str, str] | None = None  # bare name -> dotted key, for names in one section only


def _keys() -> dict[str, str]:
    global _KEYS, _BARE
    if _KEYS is None:
        _KEYS = dict(_core.config_key_types())
        seen: dict[str, list[str]] = {}
        for dotted in _KEYS:
            seen.setdefault(dotted.rsplit(".", 1)[-1], []).append(dotted)
        _BARE = {name: keys[0] for name, keys in seen.items() if len(keys) == 1}
    return _KEYS


def _unknown_key(key: str, value: Any) -> ConfigError:
    bare = _BARE or {}
    names = sorted(set(bare) | set(_keys()))
    close = difflib.get_close_matches(key, names + list(_SECTIONS), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(
        f"unknown configuration key {key!r}{hint}; allowed: a section "
        f"({', '.join(_SECTIONS)}) given as a dict, a dotted key such as 'mod.capacity', "
        "or a key name found in one section only such as 'd_model' (see docs/config.md)"
    )


def _flatten(entries: Mapping[str, Any], prefix: str = ""):
    for key, value in entries.items():
        if not isinstance(key, str):
            raise ConfigError(f"{prefix or 'config.'}{key!r}: configuration keys must be strings")
        if isinstance(value, Mapping):
            if prefix:  # sections hold values, not tables
                raise ConfigError(f"{prefix}{key} = {value!r}: a value cannot be a table; "
                                  "allowed: int, float, bool, str")
            yield from _flatten(value, f"{key}.")
        else:
            yield f"{prefix}{key}", value


def _assignments(entries: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """{"mod": {...}}, {"mod.capacity": x} and bare {"capacity": x} -> [(dotted key, value)].

    Every key must be a key of the configuration (docs/config.md) or a bare
    name found in one section only; nothing is ever parsed out of a key, so a
    key cannot carry a second assignment."""
    keys = _keys()
    out = []
    for key, value in _flatten(entries):
        dotted = key if key in keys else (_BARE or {}).get(key)
        if dotted is None:
            raise _unknown_key(key, value)
        out.append((dotted, value))
    return out


class MegatronArgsWarning(UserWarning):
    """What reading Megatron-LM arguments assumed and did not model, once."""


class Config:
    """A validated configuration (the same structs the CLI reads).

    >>> Config(d_model=1024, n_layers=16, mod={"capacity": 0.125, "every": 2})
    >>> Config("model.toml", seq_len=4096)          # a TOML file plus overrides
    >>> Config({"model": {"d_model": 512}})          # a dict (nested or dotted keys)
    >>> Config.from_hf("config.json")                # a Hugging Face config

    Built through the C++ API (one typed value per key, never TOML text), then
    checked by the CLI's validator.
    """

    __slots__ = ("_cpp",)

    @one_line_type_errors
    def __init__(self, source: Any = None, /, **overrides: Any) -> None:
        if isinstance(source, Config):
            cpp = source._cpp.copy()
        elif source is None:
            cpp = _core.Config()
        elif isinstance(source, Mapping):
            cpp = _core.Config()
            cpp.update(_assignments(source))
        elif isinstance(source, (str, os.PathLike)):
            cpp = _core.load_config_file(os.fspath(source))
        else:
            raise TypeError(
                f"config: cannot build a Config from {type(source).__name__}; "
                "allowed: a dict, a TOML path, a Config, or keyword arguments"
            )
        if overrides:
            cpp.update(_assignments(overrides))
        elif isinstance(source, Config):
            self._cpp = cpp  # already validated
            return
        cpp.validate()
        self._cpp = cpp

    @classmethod
    def _wrap(cls, cpp: "_core.Config") -> "Config":
        config = cls.__new__(cls)
        config._cpp = cpp
        return config

    # ---- other constructors -------------------------------------------------
    @classmethod
    def from_dict(cls, document: Mapping[str, Any]) -> "Config":
        return cls(document)

    @classmethod
    @one_line_type_errors
    def from_toml(cls, path: str | os.PathLike, **overrides: Any) -> "Config":
        return cls(os.fspath(path), **overrides)

    @classmethod
    @one_line_type_errors
    def from_toml_string(cls, text: str, **overrides: Any) -> "Config":
        if not isinstance(text, str):
            raise TypeError(f"text: expected str (a TOML document), got {type(text).__name__}")
        config = cls._wrap(_core.parse_config_toml(text, "<string>"))
        config._cpp.validate()
        return cls(config, **overrides) if overrides else config

    @classmethod
    @one_line_type_errors
    def from_hf(cls, path_or_dict: str | os.PathLike | Mapping[str, Any], **overrides: Any) -> "Config":
        """From a Hugging Face config.json (path or dict): docs/hf_import.md.

        The C++ importer the CLI uses.  seq_len is yours (seq_len=8192), 4096
        when not given; the defaults taken and the fields not modelled come
        as one modar.HfImportWarning.  Keyword arguments override the result.
        """
        from ._hf import import_hf

        assignments = _assignments(overrides)
        cpp = import_hf(path_or_dict, [dotted for dotted, _ in assignments])
        if assignments:
            cpp.update(assignments)
        cpp.validate()
        return cls._wrap(cpp)

    @classmethod
    def from_megatron_args(cls, text: str, **overrides: Any) -> "Config":
        """From Megatron-LM arguments (a command line or `modar export`'s text): docs/export.md.

        What was assumed (the world size: set device.count=N; Megatron-LM
        defaults modar's model differs from) and the arguments not modelled
        come as one modar.MegatronArgsWarning.
        """
        import warnings

        if not isinstance(text, str):
            raise TypeError(f"text: expected str (Megatron-LM arguments), got {type(text).__name__}")
        cpp, notes = _core.config_from_megatron_args(text)
        assignments = _assignments(overrides)
        if assignments:
            cpp.update(assignments)
        cpp.validate()
        if notes:
            warnings.warn(notes, MegatronArgsWarning, stacklevel=2)
        return cls._wrap(cpp)

    def to_megatron_args(self) -> str:
        """The Megatron-LM launch arguments of this configuration (`modar export`'s text)."""
        return _core.megatron_arguments(self._cpp)

    # ---- views ----------------------------------------------------------------
    def to_toml(self) -> str:
        return self._cpp.to_toml()

    def to_dict(self) -> dict:
        """{section: {key: value}}: what tomllib reads from to_toml()."""
        return self._cpp.to_dict()

    @one_line_type_errors
    def replace(self, **overrides: Any) -> "Config":
        """A new Config with some fields changed (same keys as the constructor)."""
        return Config(self, **overrides)

    @one_line_type_errors
    def save(self, path: str | os.PathLike) -> Path:
        """Write the TOML file atomically (temporary file + rename)."""
        target = Path(path)
        tmp = target.with_name(f".{target.name}.tmp{os.getpid()}")
        tmp.write_text(self.to_toml(), encoding="utf-8")
        os.replace(tmp, target)
        return target

    def __getitem__(self, dotted: str) -> Any:
        if not isinstance(dotted, str):
            raise KeyError(dotted)
        if dotted in _keys():
            return self._cpp.get(dotted)
        document = self.to_dict()
        if dotted in document:
            return document[dotted]
        raise KeyError(dotted)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Config) and self.to_toml() == other.to_toml()

    def __hash__(self) -> int:
        return hash(self.to_toml())

    def __reduce__(self):
        return (Config.from_toml_string, (self.to_toml(),))

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
