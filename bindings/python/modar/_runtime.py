"""modar.profile and modar.validate: the reference runtime (runtime/) measures
this machine's op times into a device profile, then checks the cost model's
predictions on held-out configurations.  Same work and documents as
`modar profile` and `modar validate --json`."""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Sequence

from . import _core
from ._profile import Profile
from ._results import Result, _fmt, flatten

ConfigError = _core.ConfigError


def _progress_lines(progress: bool | Callable[[str], None] | None):
    """True: each progress line of the core on stderr (a notebook shows it);
    a callable gets each line; False / None: quiet."""
    if progress is True:
        def show(line: str) -> None:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
        return show
    if callable(progress):
        return progress
    return None


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name} = {value!r}: must be a positive integer")
    return value


def profile(
    out: str | os.PathLike,
    *,
    backend: str = "cpu",
    quick: bool = False,
    dtype: str | None = None,
    threads: int | None = None,
    budget_s: float | None = None,
    rotate_bytes: int | None = None,
    resume: bool = False,
    kinds: Sequence[str] | None = None,
    max_dim: int | None = None,
    progress: bool | Callable[[str], None] = True,
) -> Profile:
    """Time the runtime's ops on this machine and write a profile to `out`
    (atomically; a killed run continues with resume=True), as `modar profile`.

    quick: the quick grid (minutes on 2 CPU cores).  kinds: only these op
    kinds (e.g. ["gemm", "attention"]); max_dim: only grid points whose every
    dimension is <= max_dim.  Both give a reduced grid for a fast look (the
    kinds left out fall back to the roofline, larger shapes extrapolate).
    Releases the GIL; progress lines go to stderr (progress=True) or to a
    callable.  Ctrl-C is honoured when the run returns (the checkpoint in
    OUT.partial keeps what was measured)."""
    options = _core.ProfileOptions()
    if backend not in ("cpu", "cuda"):
        raise ConfigError(f"backend = {backend!r}: allowed: cpu, cuda")
    options.backend_name = backend
    options.out_path = os.fspath(out)
    options.quick = bool(quick)
    options.resume = bool(resume)
    options.dtype = dtype if dtype is not None else ("fp32" if backend == "cpu" else "bf16")
    if threads is not None:
        options.threads = _positive_int("threads", threads)
    # the CLI's defaults: 0.08 s per shape on the quick grid, 0.25 s on the full one
    options.budget_s = 0.08 if quick else 0.25
    if budget_s is not None:
        if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or not budget_s > 0:
            raise ConfigError(f"budget_s = {budget_s!r}: must be a positive number of seconds")
        options.budget_s = float(budget_s)
    if rotate_bytes is not None:
        options.rotation_bytes = _positive_int("rotate_bytes", rotate_bytes)
    wanted: list[str] = []
    if kinds is not None:
        wanted = [kinds] if isinstance(kinds, str) else list(kinds)
        known = set(_core.profile_grid_kinds(backend, bool(quick), options.dtype))
        for kind in wanted:
            if kind not in known:
                raise ConfigError(f"kinds: {kind!r} is not an op kind of the grid; "
                                  f"allowed: {', '.join(sorted(known))}")
    limit = _positive_int("max_dim", max_dim) if max_dim is not None else 0
    cpp = _core.run_profile(options, wanted, limit, _progress_lines(progress))
    return Profile(cpp, os.fspath(out))


class ValidationResult(Result):
    """Measured vs predicted step time and peak memory per held-out
    configuration (`modar validate --json`)."""

    @property
    def cases(self) -> list[dict]:
        return self._doc["cases"]

    def to_pandas(self):
        """One row per case: name, scope, measured / predicted step time and
        peak memory, errors (fractions), plus the flattened configuration."""
        import pandas as pd

        rows = []
        for case in self.cases:
            flat = flatten({k: v for k, v in case.items() if k not in ("ops",)})
            rows.append(flat)
        return pd.DataFrame(rows)

    def __repr__(self) -> str:
        d = self._doc
        lines = [f"<modar.ValidationResult: {len(self.cases)} cases on {d.get('backend')} "
                 f"with profile {d.get('profile')}>",
                 f"  step time |error| median {d['step_time']['median_abs_error']:.1%}, "
                 f"max {d['step_time']['max_abs_error']:.1%}",
                 f"  memory    |error| median {d['memory']['median_abs_error']:.1%}, "
                 f"max {d['memory']['max_abs_error']:.1%}"]
        for case in self.cases[:12]:
            st = case["step_time"]
            lines.append(f"  {case['name']:28s} measured {_fmt(st['measured_s'])} s, "
                         f"predicted {_fmt(st['predicted_s'])} s ({st['error']:+.1%})")
        return "\n".join(lines)


def validation_points(report: Any, quantity: str = "step_s") -> list[tuple[str, float, float]]:
    """(case name, measured, predicted) per case, for modar.plot."""
    doc = report.to_dict() if hasattr(report, "to_dict") else report
    keys = {"step_s": ("step_time", "measured_s", "predicted_s"),
            "peak_bytes": ("memory", "measured_peak_bytes", "predicted_peak_bytes")}
    if quantity not in keys:
        raise ValueError(f"quantity = {quantity!r}: allowed: {', '.join(keys)}")
    section, measured, predicted = keys[quantity]
    return [(c["name"], float(c[section][measured]), float(c[section][predicted]))
            for c in doc["cases"] if c[section][measured] > 0]


def validate(
    profile: Any,
    *,
    backend: str = "cpu",
    quick: bool = False,
    rounds: int = 7,
    warmup_steps: int = 2,
    threads: int | None = None,
    progress: bool | Callable[[str], None] = True,
) -> ValidationResult:
    """Run held-out configurations on the runtime and compare the measured
    step time and peak memory with the cost model's prediction from
    `profile` (a path written by modar.profile / `modar profile`, or the
    returned modar.Profile), as `modar validate --json`.  Releases the GIL."""
    if backend not in ("cpu", "cuda"):
        raise ConfigError(f"backend = {backend!r}: allowed: cpu, cuda")
    if isinstance(profile, Profile):
        cpp = profile._cpp
    elif isinstance(profile, (str, os.PathLike)):
        cpp = _core.load_measured_profile(os.fspath(profile), backend)
    else:
        raise ConfigError(f"profile = {profile!r}: must be a profile path or a modar.Profile")
    document, text = _core.run_validation(
        cpp, backend, bool(quick), _positive_int("rounds", rounds),
        _positive_int("warmup_steps", warmup_steps) if warmup_steps != 0 else 0,
        _positive_int("threads", threads) if threads is not None else 0,
        _progress_lines(progress))
    return ValidationResult(document, text)
