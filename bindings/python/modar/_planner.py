"""modar.optimal, modar.sweep, modar.fit: the planner (planner/*.cpp) called
through modar._core.  Every number comes from the C++ core; the results hold
the JSON the CLI prints with --json."""

from __future__ import annotations

import io
import json
import numbers
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from . import _core
from ._args import one_line_type_errors
from ._config import Config, _assignments
from ._results import Result, _fmt, flatten

ConfigError = _core.ConfigError


# ---- argument plumbing: types only --------------------------------------------
#
# Python converts each argument to the type of its request field and passes
# only what the caller gave (None = the library's default).  Every default and
# every range check belongs to the C++ library (resolve_optimal, resolve_sweep,
# resolve_fit_options), as for the CLI, so the two cannot drift apart; its
# errors name these same arguments.

_INT64 = (-(2**63), 2**63 - 1)


def _number(name: str, value: Any) -> float:
    """A real number (Python, numpy) -> float; TypeError otherwise."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} = {value!r:.60}: expected a number, got {type(value).__name__}")
    return float(value)


def _integer(name: str, value: Any) -> int:
    """An integer (or an integral float: 8.0) -> int; TypeError otherwise."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} = {value!r:.60}: expected an integer, got {type(value).__name__}")
    if not _INT64[0] <= int(value) <= _INT64[1]:
        raise ValueError(f"{name} = {value}: does not fit a 64-bit integer")
    return int(value)


def _text(name: str, value: Any) -> str:
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} = {value!r:.60}: expected a string, got {type(value).__name__}")
    return os.fspath(value)


def _items(name: str, value: Any, convert: Callable[[str, Any], Any]) -> list:
    """One value or an iterable of them -> a list of converted values."""
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        values = [value]
    else:
        values = list(value)
    return [convert(name, v) for v in values]


def _each(convert: Callable[[str, Any], Any]) -> Callable[[str, Any], list]:
    """The converter of one value or an iterable of them (a list each)."""
    return lambda name, value: _items(name, value, convert)


def _budget(parse: Callable[[str], float]) -> Callable[[str, Any], float]:
    """The converter of a number, or of text with its unit ("2w", "200k") read
    by the core."""
    return lambda name, value: parse(value) if isinstance(value, str) else _number(name, value)


def _set_given(target: Any, **fields: tuple[Any, Callable[[str, Any], Any]]) -> None:
    """target.NAME = convert("NAME", value) for each NAME=(value, convert) the
    caller gave (value not None); the others keep the library's defaults."""
    for name, (value, convert) in fields.items():
        if value is not None:
            setattr(target, name, convert(name, value))


def _eps(eps: Mapping[str, float] | str | None) -> dict:
    """eps as a dict {arch: value} or the CLI's text "mod=0.94,dar=0.97"."""
    if eps is None:
        return {}
    if isinstance(eps, str):
        return dict(_core.parse_eps_overrides(eps))
    if not isinstance(eps, Mapping):
        raise TypeError(f"eps = {eps!r:.60}: expected a dict {{architecture: eps}} or a string "
                        f"like 'mod=0.94,dar=0.97', got {type(eps).__name__}")
    return {_text("eps key", key): _number(f"eps[{key!r:.40}]", value) for key, value in eps.items()}


def _profile_ref(profile: Any) -> str:
    """A profile name, a TOML path, or a modar.Profile -> what the core loads."""
    from ._profile import Profile

    if isinstance(profile, Profile):
        return profile.path_for_core()
    if profile is None:
        return _core.default_profile_name()
    return _text("profile", profile)


def _fit_ref(fit: Any) -> str:
    if isinstance(fit, FitResult):
        return fit.path_for_core()
    return _text("fit", fit)


def _run_request(request: Any, *, profile: Any, gpus: Any, gpus_per_node: Any, fit: Any, eps: Any,
                 base: Any, aspect: Any, aspect_min: Any, aspect_max: Any, gqa_group: Any,
                 overrides: Mapping[str, Any]) -> None:
    """The arguments optimal and sweep share -> the request's PlannerRunRequest fields."""
    _set_given(request, profile=(profile, lambda _, value: _profile_ref(value)),
               gpus=(gpus, _integer), gpus_per_node=(gpus_per_node, _integer),
               fit=(fit, lambda _, value: _fit_ref(value)))
    request.eps = _eps(eps)
    shapes = _core.ShapeSearchOptions()
    if aspect is not None:
        if isinstance(aspect, (str, bytes)) or not hasattr(aspect, "__len__") or len(aspect) != 2:
            raise TypeError(f"aspect = {aspect!r:.60}: expected (aspect_min, aspect_max)")
        aspect_min, aspect_max = aspect
    _set_given(shapes, aspect_min=(aspect_min, _number), aspect_max=(aspect_max, _number),
               gqa_group=(gqa_group, _integer))
    request.shapes = shapes
    # The base configuration: a Config / dict / TOML path plus keyword
    # overrides (seq_len=4096, micro_batch=4, ...), set through the config
    # library; the keys named count as set (on a cluster a given micro-batch
    # or recompute is kept fixed).
    if base is not None or overrides:
        request.base = Config(base, **overrides)._cpp if base is not None else Config(**overrides)._cpp
        request.base_keys = [key for key, _ in _assignments(overrides)]
        if isinstance(base, Mapping):
            request.base_keys += [key for key, _ in _assignments(base)]


# ---- optimal -------------------------------------------------------------------

class OptimalResult(Result):
    """Recommendations for one budget (`modar optimal --json`)."""

    @property
    def recommendations(self) -> list[dict]:
        return self._doc.get("recommendations", [])

    def best(self, arch: str = "baseline", role: str = "isoflop_optimal") -> dict:
        for rec in self.recommendations:
            if rec.get("arch") == arch and rec.get("role") == role:
                return rec
        raise KeyError(f"no {role} recommendation for arch {arch!r}")

    def to_pandas(self):
        """One row per recommendation, nested fields flattened ('shape.d_model')."""
        import pandas as pd

        return pd.DataFrame([flatten(r) for r in self.recommendations])

    def __repr__(self) -> str:
        lines = ["<modar.OptimalResult>"]
        budget = self._doc.get("budget") or self._doc.get("request", {})
        if isinstance(budget, dict):
            lines.append("  budget: " + ", ".join(f"{k}={_fmt(v)}" for k, v in budget.items()
                                                  if not isinstance(v, (dict, list))))
        for rec in self.recommendations:
            shape = rec.get("shape", {})
            params = rec.get("params", {})
            loss = rec.get("loss")
            lines.append(
                f"  {rec.get('arch', '?'):9s} {rec.get('role', ''):16s} "
                f"L={shape.get('n_layers', '?')} d={shape.get('d_model', '?')} "
                f"N={_fmt(params.get('total', float('nan')))} "
                f"D={_fmt(rec.get('tokens', float('nan')))} "
                f"loss={_fmt(loss) if loss is not None else 'unknown'}"
            )
        return "\n".join(lines)


@one_line_type_errors
def optimal(
    flops: float | None = None,
    gpu_hours: float | str | None = None,
    days: float | str | None = None,
    *,
    profile: Any = None,
    gpus: int | None = None,
    gpus_per_node: int | None = None,
    arch: Sequence[str] | str | None = None,
    fit: Any = None,
    eps: Mapping[str, float] | str | None = None,
    base: Any = None,
    capacity: float | None = None,
    every: int | None = None,
    block_layers: int | None = None,
    streams: int | None = None,
    aspect: Sequence[float] | None = None,
    aspect_min: float | None = None,
    aspect_max: float | None = None,
    gqa_group: int | None = None,
    progress: bool | Callable[[int, int], None] = True,
    dar_block_layers: int | None = None,
    dar_streams: int | None = None,
    **config_overrides: Any,
) -> OptimalResult:
    """The isoFLOP- (flops=) or wall-clock-optimal (gpu_hours= or days=) model
    for a budget: the same inputs and output as `modar optimal ... --json`.

    gpu_hours: device-hours on `profile`, all GPUs together (a number, or text
    such as "200k"); days: wall-clock days on `gpus` GPUs (a number, or "14d",
    "2w", "336h").  Further keyword arguments set keys of the base
    configuration (seq_len=4096, micro_batch=4, mlp="swiglu", ...), like the
    CLI's --seq-len / --set.  With gpus > 1 every candidate gets its fastest
    memory-feasible parallel layout (docs/cluster.md).  Unset arguments take
    the library's defaults, the CLI's (`modar optimal --help` shows them).
    Runs with the GIL released; progress=True prints a line with an ETA on
    stderr for calls over a second, a callable gets (done, total) steps;
    Ctrl-C raises KeyboardInterrupt.
    """
    if dar_block_layers is not None or dar_streams is not None:
        warnings.warn("modar.optimal: dar_block_layers / dar_streams are now block_layers / "
                      "streams (as in modar.sweep)", DeprecationWarning, stacklevel=3)
        block_layers = dar_block_layers if block_layers is None else block_layers
        streams = dar_streams if streams is None else streams
    request = _core.OptimalRequest()
    _set_given(request, flops=(flops, _number),
               gpu_hours=(gpu_hours, _budget(_core.parse_gpu_hours)),
               days=(days, _budget(_core.parse_days)), arch=(arch, _each(_text)),
               capacity=(capacity, _number), every=(every, _integer),
               block_layers=(block_layers, _integer), streams=(streams, _integer))
    _run_request(request, profile=profile, gpus=gpus, gpus_per_node=gpus_per_node, fit=fit,
                 eps=eps, base=base, aspect=aspect, aspect_min=aspect_min, aspect_max=aspect_max,
                 gqa_group=gqa_group, overrides=config_overrides)
    document, table = _core.optimal(request, progress)
    return OptimalResult(document, table)


# ---- sweep ---------------------------------------------------------------------

class SweepResult(Result):
    """Every evaluated candidate (`modar sweep --json`: one JSON object a line)."""

    def __init__(self, rows: list[dict]) -> None:
        super().__init__({"rows": rows})

    @property
    def rows(self) -> list[dict]:
        return self._doc["rows"]

    def to_json_lines(self) -> str:
        return "".join(json.dumps(r) + "\n" for r in self.rows)

    def to_pandas(self):
        import pandas as pd

        return pd.DataFrame([flatten(r) for r in self.rows])

    def __len__(self) -> int:
        return len(self.rows)

    def __repr__(self) -> str:
        budgets = sorted({r.get("budget_flops") for r in self.rows if "budget_flops" in r})
        archs = sorted({str(r.get("arch")) for r in self.rows})
        return (f"<modar.SweepResult: {len(self.rows)} candidates, budgets "
                f"{', '.join(_fmt(b) for b in budgets)}; archs {', '.join(archs)}>")


@one_line_type_errors
def sweep(
    flops: float | Iterable[float] | None = None,
    *,
    arch: Sequence[str] | str | None = None,
    capacity: float | Iterable[float] | None = None,
    every: int | Iterable[int] | None = None,
    block_layers: int | Iterable[int] | None = None,
    streams: int | Iterable[int] | None = None,
    fit: Any = None,
    eps: Mapping[str, float] | str | None = None,
    profile: Any = None,
    gpus: int | None = None,
    gpus_per_node: int | None = None,
    with_time: bool | None = None,
    base: Any = None,
    grid_step: float | None = None,
    grid_half_width: float | None = None,
    aspect: Sequence[float] | None = None,
    aspect_min: float | None = None,
    aspect_max: float | None = None,
    gqa_group: int | None = None,
    progress: bool | Callable[[int, int], None] = True,
    budgets: float | Iterable[float] | None = None,
    **config_overrides: Any,
) -> SweepResult:
    """The isoFLOP curves behind modar.optimal (budget x arch x capacity x
    every x K x n; one row per N_f bin, the row `recommended` = optimal's
    answer), as `modar sweep --jsonl`.  The same arguments as modar.optimal
    where they mean the same; a list gives one curve per value.  Runs with the
    GIL released; progress=True prints a line with an ETA on stderr for
    sweeps over a second, a callable gets (done, total) curves; Ctrl-C raises
    KeyboardInterrupt.  Curves without rows (a budget outside the shape
    search) are warned about."""
    if budgets is not None:
        if flops is not None:
            raise TypeError("modar.sweep: give flops (budgets is its old name), not both")
        flops = budgets
    if flops is None:
        raise TypeError("modar.sweep: flops (the training-FLOP budgets) is required")
    request = _core.SweepRequest()
    _set_given(request, flops=(flops, _each(_number)), arch=(arch, _each(_text)),
               capacity=(capacity, _each(_number)), every=(every, _each(_integer)),
               block_layers=(block_layers, _each(_integer)), streams=(streams, _each(_integer)),
               with_time=(with_time, lambda _, value: bool(value)),
               grid_step=(grid_step, _number), grid_half_width=(grid_half_width, _number))
    _run_request(request, profile=profile, gpus=gpus, gpus_per_node=gpus_per_node, fit=fit,
                 eps=eps, base=base, aspect=aspect, aspect_min=aspect_min, aspect_max=aspect_max,
                 gqa_group=gqa_group, overrides=config_overrides)
    lines, notes = _core.sweep(request, progress)
    for note in notes:
        warnings.warn(f"modar.sweep: {note}", stacklevel=3)
    return SweepResult([json.loads(line) for line in lines])


# ---- fit -----------------------------------------------------------------------

class FitResult(Result):
    """A loss law fitted to your runs (`modar fit RUNS.csv --json`)."""

    def __init__(self, document: str, text: str, toml_text: str) -> None:
        super().__init__(document, text)
        self._toml = toml_text
        self._path: str | None = None

    @property
    def params(self) -> dict:
        """{'E': ..., 'A': ..., 'B': ..., 'alpha': ..., 'beta': ...} (estimates)."""
        return {k: (v["estimate"] if isinstance(v, dict) else v) for k, v in self._doc["params"].items()}

    def to_toml(self) -> str:
        return self._toml

    def save(self, path: str | os.PathLike) -> Path:
        """Write the fit TOML atomically; usable as fit=path here or --fit in the CLI."""
        target = Path(path)
        tmp = target.with_name(f".{target.name}.tmp{os.getpid()}")
        tmp.write_text(self._toml)
        os.replace(tmp, target)
        self._path = str(target)
        return target

    def path_for_core(self) -> str:
        if self._path is None or not Path(self._path).exists():
            handle, name = tempfile.mkstemp(prefix="modar-fit-", suffix=".toml")
            os.close(handle)
            self.save(name)
        return str(self._path)

    def to_pandas(self):
        """One row per parameter: estimate, standard error, 95% interval."""
        import pandas as pd

        return pd.DataFrame.from_dict(self._doc["params"], orient="index")

    def __repr__(self) -> str:
        p = self.params
        return (f"<modar.FitResult: {self._doc.get('runs')} runs; L = {_fmt(p['E'])} + "
                f"{_fmt(p['A'])}/N^{_fmt(p['alpha'])} + {_fmt(p['B'])}/D^{_fmt(p['beta'])}>")


@one_line_type_errors
def fit(
    runs: Any,
    *,
    huber_delta: float | None = None,
    bootstrap_samples: int | None = None,
    seed: int | None = None,
    progress: bool | Callable[[int, int], None] = True,
) -> FitResult:
    """Fit L(N, D) = E + A/N^alpha + B/D^beta to runs: a CSV path or a pandas
    DataFrame (columns loss, D or tokens, N or n_flop_active / params, or
    config), or a list of dicts with those keys.  Unset arguments take the
    library's defaults (`modar fit --help`).  Releases the GIL; progress=True
    prints a line with an ETA on stderr for fits over a second, a callable
    gets (done, total) BFGS fits; Ctrl-C raises KeyboardInterrupt."""
    request = _core.FitRequest()
    _set_given(request, huber_delta=(huber_delta, _number),
               bootstrap_samples=(bootstrap_samples, _integer), seed=(seed, _integer))
    if isinstance(runs, (str, os.PathLike)):
        document, text, toml_text = _core.fit_csv_file(os.fspath(runs), request, progress)
        return FitResult(document, text, toml_text)
    if isinstance(runs, list):
        import pandas as pd

        runs = pd.DataFrame(runs)
    if hasattr(runs, "to_csv"):
        buffer = io.StringIO()
        runs.to_csv(buffer, index=False, float_format="%.17g")
        document, text, toml_text = _core.fit_csv_text(buffer.getvalue(), "<DataFrame>", os.getcwd(),
                                                       request, progress)
        return FitResult(document, text, toml_text)
    raise TypeError(
        f"runs = {type(runs).__name__}: expected a CSV path, a pandas DataFrame or a list of dicts"
    )


@one_line_type_errors
def closed_form_optimum(flops: float, *, fit: Any = None, eps: float | None = None) -> dict:
    """N*, D*, loss of the dense closed form under C = 6 N D (docs/planner.md).

    flops: the training budget C; eps: the architecture's efficiency (1 = the
    dense baseline, the default).  The library checks both, as for optimal."""
    return dict(_core.closed_form_optimum(_number("flops", flops),
                                          None if fit is None else _fit_ref(fit),
                                          None if eps is None else _number("eps", eps)))
