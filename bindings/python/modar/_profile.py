"""modar.load_profile and modar.Profile: device profiles (profiles/*.toml,
embedded in the core, or written by `modar profile` / modar.profile())."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from . import _core
from ._args import one_line_type_errors


class Profile:
    """A device profile: ceilings, provenance and (when measured) op timings."""

    def __init__(self, cpp_profile: "_core.DeviceProfile", source: str | None = None) -> None:
        self._cpp = cpp_profile
        self._source = source  # name or path it was loaded from, when known
        self._toml: str | None = None

    @property
    def name(self) -> str:
        return self._cpp.name

    @property
    def backend(self) -> str:
        return self._cpp.backend

    @property
    def measured(self) -> bool:
        return self._cpp.measured

    def to_toml(self) -> str:
        if self._toml is None:
            self._toml = _core.profile_to_toml(self._cpp)
        return self._toml

    def to_dict(self) -> dict:
        return tomllib.loads(self.to_toml())

    def to_pandas(self):
        """The measured op table, one row per (op kind, pass, shape)."""
        import pandas as pd

        doc = self.to_dict()
        rows = doc.get("measurements") or doc.get("op") or doc.get("ops") or []
        if isinstance(rows, dict):
            rows = [dict(kind=k, **v) if isinstance(v, dict) else {"kind": k, "value": v}
                    for k, v in rows.items()]
        return pd.DataFrame(rows)

    @one_line_type_errors
    def save(self, path: str | os.PathLike) -> Path:
        _core.save_profile(self._cpp, os.fspath(path))
        self._source = os.fspath(path)
        return Path(path)

    def path_for_core(self) -> str:
        """A name or path the core can load (saved to a temporary file if needed)."""
        if self._source is not None and (
            self._source in _core.embedded_profile_names() or Path(self._source).exists()
        ):
            return self._source
        handle, name = tempfile.mkstemp(prefix=f"modar-profile-{self.name}-", suffix=".toml")
        os.close(handle)
        return os.fspath(self.save(name))

    def __repr__(self) -> str:
        doc = self.to_dict()
        ceilings = doc.get("ceilings", {})
        parts = [f"name={self.name!r}", f"backend={self.backend!r}", f"measured={self.measured}"]
        for key in ("peak_flops_bf16", "memory_bandwidth"):
            if key in ceilings:
                parts.append(f"{key}={ceilings[key]:.4g}")
        return f"modar.Profile({', '.join(parts)})"


@one_line_type_errors
def load_profile(name_or_path: str | os.PathLike) -> Profile:
    """An embedded profile by name (modar.profile_names()) or a profile TOML path."""
    ref = os.fspath(name_or_path)
    return Profile(_core.load_profile(ref), ref)


def profile_names() -> list[str]:
    return list(_core.embedded_profile_names())
