"""modar.profile and modar.validate: the reference runtime (runtime/) measures
this machine's op times into a device profile, then checks the cost model's
predictions on held-out configurations.  Same work and documents as
`modar profile` and `modar validate --json`."""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable, Sequence

from . import _core
from ._args import one_line_type_errors
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


def _said(**values: Any) -> dict:
    """Only what the caller gave (None = the library's default, applied in C++
    by the same code as the CLI: runtime::resolve_profile_options /
    resolve_validation_options)."""
    return {key: value for key, value in values.items() if value is not None}


def _typed(name: str, value: Any, kind: type | tuple[type, ...]) -> Any:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, kind):
        raise TypeError(f"{name} = {value!r}: must be {getattr(kind, '__name__', 'a number')}")
    return value


@one_line_type_errors
def profile(
    out: str | os.PathLike,
    *,
    backend: str = "cpu",
    quick: bool = False,
    dtype: str | None = None,
    threads: int | None = None,
    clock: str | None = None,
    budget_s: float | None = None,
    rotate_bytes: int | None = None,
    resume: bool = False,
    kinds: Sequence[str] | None = None,
    max_dim: int | None = None,
    measure_ceilings: bool = True,
    rounds: int | None = None,
    drift_tolerance: float | None = None,
    max_seconds: float | None = None,
    dry_run: bool = False,
    progress: bool | Callable[[str], None] = True,
    device: str | None = None,
    comm_max_bytes: int | None = None,
) -> Profile | dict:
    """Time the runtime's ops on this machine and write a profile to `out`
    (atomically; a killed run continues with resume=True), as `modar profile`.
    backend="torch": time them with PyTorch's kernels on PyTorch's current
    device (or device="cpu" / "cuda") instead, as `python -m modar profile
    --backend torch` (PyTorch installed by you; no resume; under torchrun,
    comm_max_bytes caps the collectives' largest message as --comm-max-bytes).

    Unset arguments take the library's defaults, the same as the CLI's: on the
    CPU one thread timed by the process CPU clock, fp32, 0.08 s per shape on
    the quick grid (0.25 s full).  quick: the quick grid (minutes on 2 CPU
    cores).  kinds: only these op kinds (e.g. ["gemm", "attention"]); max_dim:
    only grid points whose every dimension is <= max_dim.  measure_ceilings=False
    keeps placeholder ceilings (about 20 s saved on a CPU, as `--no-ceilings`).
    rounds: interleaved rounds per point (default 3); drift_tolerance: how far
    the drift sentinel may move before a batch is measured again (default 0.10;
    0 = none); max_seconds: bound on the whole run (the most expensive points
    that do not fit are left out and reported).  dry_run: return the resolved
    settings (a dict, as `modar profile --dry-run`, with the estimated
    duration) without measuring.
    Releases the GIL; progress lines go to stderr (progress=True) or to a
    callable.  Ctrl-C stops the run between grid points and raises
    KeyboardInterrupt; OUT.partial keeps what was measured (resume=True)."""
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else list(kinds)
    if backend == "torch":
        for name, value in (("rounds", rounds), ("drift_tolerance", drift_tolerance),
                            ("max_seconds", max_seconds)):
            if value is not None:
                raise ConfigError(f"{name} = {value!r}: not used with backend=\"torch\" (the "
                                  "noise loop is the runtime profiler's)")
        return _profile_torch(out, device=device, quick=quick, dtype=dtype, threads=threads, clock=clock,
                              budget_s=budget_s, rotate_bytes=rotate_bytes, kinds=kinds,
                              max_dim=max_dim, comm_max_bytes=comm_max_bytes,
                              dry_run=dry_run, progress=progress)
    if device is not None:
        raise ConfigError(f"device = {device!r}: only backend=\"torch\" takes a device (the "
                          "cpu and cuda backends are their device)")
    if comm_max_bytes is not None:
        raise ConfigError(f"comm_max_bytes = {comm_max_bytes!r}: only backend=\"torch\" takes "
                          "it (the cpu and cuda backends measure collectives with "
                          "`mpirun modar profile --comm`)")
    said = _said(backend=backend, out=os.fspath(out), quick=bool(quick), resume=bool(resume),
                 dtype=dtype, threads=_typed("threads", threads, int), clock=clock,
                 budget_s=_typed("budget_s", budget_s, (int, float)),
                 rotate_bytes=_typed("rotate_bytes", rotate_bytes, int), kinds=kinds,
                 max_dim=_typed("max_dim", max_dim, int), rounds=_typed("rounds", rounds, int),
                 drift_tolerance=_typed("drift_tolerance", drift_tolerance, (int, float)),
                 max_seconds=_typed("max_seconds", max_seconds, (int, float)),
                 measure_ceilings=bool(measure_ceilings))
    if dry_run:
        return json.loads(_core.profile_settings(said))
    cpp = _core.run_profile(said, _progress_lines(progress))
    return Profile(cpp, os.fspath(out))


def _profile_torch(out, *, progress, **options) -> Profile | dict:
    """modar.profile(backend="torch"): PyTorch's kernels on its current device
    (_torch_profile.py); bad input raises ValueError, Ctrl-C KeyboardInterrupt
    with nothing written."""
    from . import _torch_profile

    for name in ("threads", "rotate_bytes", "max_dim", "comm_max_bytes"):
        _typed(name, options.get(name), int)
    _typed("budget_s", options.get("budget_s"), (int, float))
    result = _torch_profile.run(os.fspath(out), progress=_progress_lines(progress), **options)
    if options.get("dry_run"):
        return result
    return Profile(result, os.fspath(out))


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


@one_line_type_errors
def validate(
    profile: Any,
    *,
    backend: str = "cpu",
    quick: bool = False,
    rounds: int | None = None,
    repeats: int | None = None,
    refuse_under_load: bool = False,
    warmup_steps: int | None = None,
    threads: int | None = None,
    clock: str | None = None,
    dry_run: bool = False,
    progress: bool | Callable[[str], None] = True,
) -> ValidationResult | dict:
    """Run held-out configurations on the runtime and compare the measured
    step time and peak memory with the cost model's prediction from
    `profile` (a path written by modar.profile / `modar profile`, or the
    returned modar.Profile), as `modar validate --json`.

    Unset arguments take the library's defaults, the same as the CLI's: the
    profile's recorded clock and (CPU) threads, 3 repeats of 5 interleaved
    rounds, 2 warm-up steps.  Each case reports its run-to-run spread and the
    error's noise floor; the host check (drift sentinel vs the profile,
    other work on the CPUs) flags the result (doc["host"]["flags"]), or with
    refuse_under_load=True raises RuntimeError instead.  dry_run: return the
    resolved settings (a dict, as `modar validate --dry-run`).  Releases the
    GIL; Ctrl-C stops between cases / rounds."""
    if isinstance(profile, Profile):
        cpp = profile._cpp
    elif isinstance(profile, (str, os.PathLike)):
        cpp = _core.load_measured_profile(os.fspath(profile), backend)
    else:
        raise TypeError(f"profile = {profile!r}: must be a profile path or a modar.Profile")
    said = _said(backend=backend, quick=bool(quick), rounds=_typed("rounds", rounds, int),
                 repeats=_typed("repeats", repeats, int), refuse_under_load=bool(refuse_under_load),
                 warmup_steps=_typed("warmup_steps", warmup_steps, int),
                 threads=_typed("threads", threads, int), clock=clock)
    if dry_run:
        return json.loads(_core.validation_settings(cpp, said))
    document, text = _core.run_validation(cpp, said, _progress_lines(progress))
    return ValidationResult(document, text)
