"""modar.calibrate: fit a device profile's time-model parameters to measured
step times (`modar calibrate RUNS.csv --profile BASE --out P.toml`,
docs/calibrate.md).  The fit runs in C++ (planner/calibrate.cpp); this layer
only turns Python inputs into the runs CSV and wraps the result."""

from __future__ import annotations

import csv
import io
import os
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from . import _core
from ._args import one_line_type_errors
from ._profile import Profile
from ._results import Result, _fmt

ConfigError = _core.ConfigError
COLUMNS = ("name", "config", "overrides", "step_s", "peak_memory_gib")


class CalibrationResult(Result):
    """The calibrated profile, each fitted parameter with its standard error,
    and each run's measured vs predicted step time with its leave-one-out
    error (`modar calibrate --json`)."""

    def __init__(self, document: str, text: str, profile: Profile) -> None:
        super().__init__(document, text)
        self.profile = profile

    @property
    def parameters(self) -> dict[str, float]:
        """{name: fitted value} (the base value where the runs did not determine it)."""
        return {p["name"]: p["value"] for p in self._doc["parameters"]}

    @property
    def runs(self) -> list[dict]:
        return self._doc["runs"]

    def to_pandas(self):
        """One row per run: measured and predicted seconds, errors, leave-one-out."""
        import pandas as pd

        return pd.DataFrame(self.runs)

    def save(self, path: str | os.PathLike) -> Path:
        """Write the calibrated profile atomically (usable as profile=path, --profile)."""
        return self.profile.save(path)

    def __repr__(self) -> str:
        s = self._doc["summary"]
        lines = [f"<modar.CalibrationResult: {s['runs']} runs, profile "
                 f"{self._doc['profile']!r} from {self._doc['base_profile']!r}>",
                 f"  |error| median {s['median_abs_error']:.1%}, max {s['max_abs_error']:.1%}"]
        if s.get("loo_median_abs_error") is not None:
            lines.append(f"  leave-one-out |error| median {s['loo_median_abs_error']:.1%}, "
                         f"max {s['loo_max_abs_error']:.1%}")
        for p in self._doc["parameters"]:
            se = p["standard_error"]
            lines.append(f"  {p['name']:36s} {_fmt(p['value'])}"
                         + (f" +- {_fmt(se)}" if se is not None else "") + f" {p['unit']}")
        return "\n".join(lines)


def _rows_to_csv(rows: Sequence[dict]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    present = [c for c in COLUMNS if c != "peak_memory_gib" or
               any(r.get("peak_memory_gib") is not None for r in rows)]
    writer.writerow(present)
    for i, row in enumerate(rows):
        unknown = set(row) - set(COLUMNS)
        if unknown:
            raise ConfigError(f"runs[{i}]: unknown key {sorted(unknown)[0]!r}; allowed: "
                              + ", ".join(COLUMNS))
        overrides = row.get("overrides") or ""
        if isinstance(overrides, dict):
            overrides = " ".join(f"{k}={v}" for k, v in overrides.items())
        elif not isinstance(overrides, str):
            overrides = " ".join(map(str, overrides))
        cells = {"name": row.get("name", ""), "config": os.fspath(row.get("config") or ""),
                 "overrides": overrides, "step_s": repr(row.get("step_s", "")),
                 "peak_memory_gib": "" if row.get("peak_memory_gib") is None
                 else repr(row["peak_memory_gib"])}
        if isinstance(row.get("step_s"), str):
            cells["step_s"] = row["step_s"]
        writer.writerow([cells[c] for c in present])
    return buffer.getvalue()


@one_line_type_errors
def calibrate(
    runs: Any,
    *,
    profile: str | os.PathLike | Profile,
    out: str | os.PathLike | None = None,
    parameters: Sequence[str] | None = None,
    name: str | None = None,
    leave_one_out: bool | None = None,
    max_iterations: int | None = None,
    progress: bool | Callable[[str], None] = False,
) -> CalibrationResult:
    """Fit `profile`'s named time-model parameters to measured step times,
    as `modar calibrate RUNS.csv --profile P --out OUT`.

    runs: a runs CSV path (columns name, config, overrides, step_s and
    optionally peak_memory_gib; config paths relative to the CSV), or a list
    of dicts / a pandas DataFrame with those columns (config paths relative to
    the current folder; overrides a string, a list or a dict).
    parameters: the names to fit (modar.calibration_parameters(); default:
    the documented set).  out: also write the calibrated profile there
    (atomically; never one of the inputs).  Bad input raises ValueError
    naming the row, the column, the value and what is allowed; Ctrl-C raises
    KeyboardInterrupt with nothing written."""
    if isinstance(profile, Profile):
        profile_ref = profile.path_for_core()
    else:
        profile_ref = os.fspath(profile)
    if isinstance(parameters, str):
        parameters = [parameters]
    said = {k: v for k, v in (("parameters", None if parameters is None else list(parameters)),
                              ("name", name), ("leave_one_out", leave_one_out),
                              ("max_iterations", max_iterations)) if v is not None}
    for key, kind in (("leave_one_out", bool), ("max_iterations", int), ("name", str)):
        if key in said and (not isinstance(said[key], kind) or
                            (kind is int and isinstance(said[key], bool))):
            raise TypeError(f"{key} = {said[key]!r}: must be {kind.__name__}")
    inputs: list[str] = [profile_ref]
    if isinstance(runs, (str, os.PathLike)):
        path, text, source, base_dir = os.fspath(runs), "", os.fspath(runs), ""
        inputs += [path, *_config_paths(path)]
    else:
        if hasattr(runs, "to_dict"):
            runs = runs.to_dict(orient="records")
        if not isinstance(runs, (list, tuple)) or not all(isinstance(r, dict) for r in runs):
            raise ConfigError(f"runs = {type(runs).__name__}: must be a CSV path, a pandas "
                              "DataFrame or a list of dicts")
        path, text, source, base_dir = "", _rows_to_csv(runs), "<runs>", os.getcwd()
        inputs += [os.fspath(r["config"]) for r in runs if r.get("config")]
    if out is not None:
        _check_output(os.fspath(out), inputs)
    if progress is True:
        def show(line: str) -> None:
            sys.stderr.write(f"modar.calibrate: {line}\n")
            sys.stderr.flush()
        callback = show
    else:
        callback = progress if callable(progress) else None
    document, report, cpp_profile = _core.calibrate(path, text, source, base_dir, profile_ref,
                                                    said, callback)
    result = CalibrationResult(document, report, Profile(cpp_profile))
    if out is not None:
        _check_output(os.fspath(out), inputs)
        result.save(out)
    return result


def _config_paths(csv_path: str) -> list[str]:
    """The config files a runs CSV names (relative to its folder), for the
    output check; the C++ reader reports anything malformed."""
    folder = os.path.dirname(csv_path)
    try:
        with open(csv_path, newline="", encoding="utf-8-sig") as f:
            lines = [line for line in f if line.strip() and not line.lstrip().startswith("#")]
        reader = csv.DictReader(lines)
        key = next((k for k in reader.fieldnames or [] if k.strip().lower() == "config"), None)
        return [os.path.join(folder, row[key].strip()) for row in reader
                if key and row.get(key) and row[key].strip()]
    except (OSError, UnicodeDecodeError, csv.Error):
        return []


def _check_output(out: str, inputs: Sequence[str]) -> None:
    """The calibrated profile never replaces an input (same file, also through
    a link) nor lands on a folder."""
    if os.path.isdir(out):
        raise ConfigError(f"out = {out!r}: is a directory; allowed: a file path")
    for item in inputs:
        try:
            if os.path.exists(item) and os.path.exists(out) and os.path.samefile(out, item):
                raise ConfigError(f"out = {out!r}: is the input {item!r} (same file); allowed: "
                                  "a different path (an input is never overwritten)")
        except OSError:
            continue


def calibration_parameters() -> list[dict]:
    """The parameters calibrate can fit: name, unit, min, max, meaning."""
    return list(_core.calibration_parameters())
