"""modar.optimal, modar.sweep, modar.fit: the planner (planner/*.cpp) called
through modar._core.  Every number comes from the C++ core; the results hold
the JSON the CLI prints with --json."""

from __future__ import annotations

import io
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from . import _core
from ._args import one_line_type_errors
from ._config import Config
from ._progress import resolve as _resolve_progress
from ._results import Result, _fmt, flatten

ConfigError = _core.ConfigError
_DEFAULT_ARCHS = ("baseline", "mod", "dar", "mod+dar")
_MAX_DEVICES = 16777216  # device.count's bound (cost_models/config.cpp)


# ---- argument plumbing ---------------------------------------------------------

_INT64_MAX = 2**63 - 1


def _positive(name: str, value: Any, kind: type, most: float | None = None) -> Any:
    """The CLI's flag checks (positive, finite, integral, at most `most`) for a
    Python argument."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{name} = {value!r:.60}: must be a positive {'integer' if kind is int else 'number'}")
    if kind is int and (isinstance(value, float) and not value.is_integer()):
        raise ConfigError(f"{name} = {value!r}: must be a positive integer")
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name} = {value!r}: must be a positive finite number")
    limit = most if most is not None else (_INT64_MAX if kind is int else None)
    if limit is not None and value > limit:
        raise ConfigError(f"{name} = {value!r}: must be <= {limit:.17g}")
    return kind(value)


def _as_list(name: str, value: Any, kind: type) -> list:
    values = list(value) if isinstance(value, (list, tuple, set, frozenset)) or (
        hasattr(value, "__iter__") and not isinstance(value, (str, bytes, Mapping))
    ) else [value]
    out = []
    for v in values:
        if kind is str:
            if not isinstance(v, str):
                raise ConfigError(f"{name} = {v!r}: must be a string")
            out.append(v)
        else:
            out.append(_positive(name, v, kind))
    if not out:
        raise ConfigError(f"{name}: empty; give at least one value")
    return out


_EPS_ALLOWED: str | None = None


def _eps_allowed() -> str:
    """The architecture names --eps accepts, as the core lists them."""
    global _EPS_ALLOWED
    if _EPS_ALLOWED is None:
        try:
            _core.parse_eps_overrides("?=1")
            _EPS_ALLOWED = "an architecture name"
        except ValueError as error:
            text = str(error)
            _EPS_ALLOWED = text.split("allowed: ", 1)[1] if "allowed: " in text else "an architecture name"
    return _EPS_ALLOWED


def _eps_error(error: ValueError) -> ConfigError:
    text = str(error)
    return ConfigError("eps: " + text[len("--eps "):] if text.startswith("--eps ") else text)


def _eps_overrides(eps: Mapping[str, float] | str | None) -> dict:
    """eps as a dict {arch: value} or the CLI's text "mod=0.94,dar=0.97".

    A dict is checked entry by entry through the core's --eps parser; its keys
    are names, never text to split, so {"mod=0.5,dar": 0.9} is refused."""
    if eps is None:
        return {}
    if isinstance(eps, str):
        try:
            return dict(_core.parse_eps_overrides(eps))
        except ValueError as error:
            raise _eps_error(error) from None
    if not isinstance(eps, Mapping):
        raise TypeError(f"eps = {eps!r:.60}: expected a dict {{architecture: eps}} or a string "
                        f"like 'mod=0.94,dar=0.97', got {type(eps).__name__}")
    out: dict[str, float] = {}
    for key, value in eps.items():
        if not isinstance(key, str):
            raise TypeError(f"eps key {key!r:.60}: expected str (an architecture name), got {type(key).__name__}")
        if hasattr(value, "item") and not isinstance(value, (str, bytes)):
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"eps[{key!r:.60}] = {value!r:.60}: expected a number, got {type(value).__name__}")
        if key != key.strip() or not key or any(c in key for c in ",=") or not key.isprintable():
            raise ConfigError(f"eps key {key!r:.60}: unknown architecture; allowed: {_eps_allowed()}")
        try:
            parsed = dict(_core.parse_eps_overrides(f"{key}={float(value)!r}"))
        except ValueError as error:
            raise _eps_error(error) from None
        if list(parsed) != [key]:  # cannot happen for a key without ',' or '='
            raise ConfigError(f"eps key {key!r:.60}: unknown architecture; allowed: {_eps_allowed()}")
        out[key] = parsed[key]
    return out


def _profile_ref(profile: Any) -> str:
    """A profile name, a TOML path, or a modar.Profile -> what the core loads."""
    from ._profile import Profile

    if isinstance(profile, Profile):
        return profile.path_for_core()
    if profile is None:
        return _core.default_profile_name()
    if isinstance(profile, (str, os.PathLike)):
        return os.fspath(profile)
    raise ConfigError(
        f"profile = {profile!r}: must be a profile name, a TOML path or a modar.Profile"
    )


def _fit_ref(fit: Any) -> str:
    if isinstance(fit, FitResult):
        return fit.path_for_core()
    if isinstance(fit, (str, os.PathLike)):
        return os.fspath(fit)
    raise ConfigError(f"fit = {fit!r}: must be a fit name ({', '.join(_core.builtin_fit_names())}), "
                      "a fit TOML path or a modar.FitResult")


def _shapes(aspect: Sequence[float] | None, gqa_group: int | None) -> "_core.ShapeSearchOptions":
    options = _core.ShapeSearchOptions()
    if aspect is not None:
        if isinstance(aspect, (str, bytes)) or not hasattr(aspect, "__len__"):
            raise TypeError(f"aspect = {aspect!r:.60}: expected (aspect_min, aspect_max), "
                            f"got {type(aspect).__name__}")
        if len(aspect) != 2:
            raise ConfigError(f"aspect = {aspect!r}: must be (aspect_min, aspect_max)")
        lo, hi = (_positive("aspect", a, float) for a in aspect)
        if hi < lo:
            raise ConfigError(f"aspect = {aspect!r}: aspect_max must be >= aspect_min")
        options.aspect_min, options.aspect_max = lo, hi
    if gqa_group is not None:
        options.gqa_group = _positive("gqa_group", gqa_group, int)
    return options


def _base(base: Any, overrides: Mapping[str, Any]) -> "_core.Config":
    """The planner's base configuration: a Config / dict / TOML path plus
    keyword overrides (seq_len=4096, micro_batch=4, recompute="full", ...)."""
    if base is None and not overrides:
        return Config()._cpp
    return Config(base, **overrides)._cpp if base is not None else Config(**overrides)._cpp


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
    gpu_hours: float | None = None,
    *,
    profile: Any = None,
    gpus: int = 1,
    gpus_per_node: int | None = None,
    arch: Sequence[str] | str = _DEFAULT_ARCHS,
    fit: Any = "epoch",
    eps: Mapping[str, float] | str | None = None,
    base: Any = None,
    capacity: float = 0.125,
    every: int = 2,
    dar_block_layers: int = 2,
    dar_streams: int = 2,
    aspect: Sequence[float] | None = None,
    gqa_group: int | None = None,
    **config_overrides: Any,
) -> OptimalResult:
    """The isoFLOP- (flops=) or wall-clock-optimal (gpu_hours=) model for a budget.

    Same inputs and output as `modar optimal --flops ... --json`; further
    keyword arguments set keys of the base configuration (seq_len=4096,
    micro_batch=4, mlp="swiglu", ...), like the CLI's --seq-len / --set.
    With gpus > 1 every candidate gets its fastest memory-feasible parallel
    layout (docs/cluster.md); each recommendation reports it.
    """
    request = _core.OptimalRequest()
    if flops is not None:
        request.train_flops = _positive("flops", flops, float)
    if gpu_hours is not None:
        request.gpu_hours = _positive("gpu_hours", gpu_hours, float)
    request.profile = _profile_ref(profile)
    request.gpus = _positive("gpus", gpus, int, _MAX_DEVICES)
    if gpus_per_node is not None:
        request.gpus_per_node = _positive("gpus_per_node", gpus_per_node, int, 1024)
    request.archs = _as_list("arch", arch, str)
    request.fit = _fit_ref(fit)
    request.eps_overrides = _eps_overrides(eps)
    request.base = _base(base, config_overrides)
    request.capacity = _positive("capacity", capacity, float)
    request.every = _positive("every", every, int)
    request.dar_block_layers = _positive("dar_block_layers", dar_block_layers, int)
    request.dar_streams = _positive("dar_streams", dar_streams, int)
    request.shapes = _shapes(aspect, gqa_group)
    document, table = _core.optimal(request)
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
    budgets: float | Iterable[float],
    *,
    arch: Sequence[str] | str = ("baseline", "mod"),
    capacity: float | Iterable[float] = 0.125,
    every: int | Iterable[int] = 2,
    block_layers: int | Iterable[int] = 2,
    streams: int | Iterable[int] = 2,
    fit: Any = "epoch",
    eps: Mapping[str, float] | str | None = None,
    profile: Any = None,
    gpus: int = 1,
    with_time: bool = True,
    base: Any = None,
    grid_step: float | None = None,
    grid_half_width: float | None = None,
    aspect: Sequence[float] | None = None,
    gqa_group: int | None = None,
    progress: Any = True,
    **config_overrides: Any,
) -> SweepResult:
    """Every candidate (budget x arch x capacity x every x K x n x shape), as
    `modar sweep --json`.  Runs with the GIL released; progress=True prints a
    line on stderr for sweeps longer than a second, a callable gets (done, -1)."""
    request = _core.SweepRequest()
    request.budgets_flops = _as_list("budgets", budgets, float)
    request.archs = _as_list("arch", arch, str)
    request.capacities = _as_list("capacity", capacity, float)
    request.everys = _as_list("every", every, int)
    request.block_layers = _as_list("block_layers", block_layers, int)
    request.streams = _as_list("streams", streams, int)
    request.fit = _fit_ref(fit)
    request.eps_overrides = _eps_overrides(eps)
    request.profile = _profile_ref(profile)
    request.gpus = _positive("gpus", gpus, int, _MAX_DEVICES)
    request.with_time = bool(with_time)
    request.base = _base(base, config_overrides)
    if grid_step is not None:
        request.grid_step = _positive("grid_step", grid_step, float)
    if grid_half_width is not None:
        request.grid_half_width = _positive("grid_half_width", grid_half_width, float)
    request.shapes = _shapes(aspect, gqa_group)
    callback, close = _resolve_progress(progress, "modar.sweep", "candidates")
    try:
        lines = _core.sweep(request, callback)
    finally:
        close()
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
) -> FitResult:
    """Fit L(N, D) = E + A/N^alpha + B/D^beta to runs: a CSV path or a pandas
    DataFrame (columns loss, D or tokens, N or n_flop_active / params, or
    config), or a list of dicts with those keys."""
    options = _core.FitOptions()
    if huber_delta is not None:
        options.huber_delta = _positive("huber_delta", huber_delta, float)
    if bootstrap_samples is not None:
        if isinstance(bootstrap_samples, bool) or not isinstance(bootstrap_samples, int) or not (
            0 <= bootstrap_samples <= 100000
        ):
            raise ConfigError(f"bootstrap_samples = {bootstrap_samples!r}: must be in [0, 100000]")
        options.bootstrap_samples = bootstrap_samples
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
            raise ConfigError(f"seed = {seed!r:.60}: must be an integer in [0, 2^64)")
        options.seed = seed
    if isinstance(runs, (str, os.PathLike)):
        document, text, toml_text = _core.fit_csv_file(os.fspath(runs), options)
        return FitResult(document, text, toml_text)
    if isinstance(runs, list):
        import pandas as pd

        runs = pd.DataFrame(runs)
    if hasattr(runs, "to_csv"):
        buffer = io.StringIO()
        runs.to_csv(buffer, index=False, float_format="%.17g")
        document, text, toml_text = _core.fit_csv_text(buffer.getvalue(), "<DataFrame>", os.getcwd(), options)
        return FitResult(document, text, toml_text)
    raise ConfigError(
        f"runs = {type(runs).__name__}: must be a CSV path, a pandas DataFrame or a list of dicts"
    )


@one_line_type_errors
def closed_form_optimum(flops: float, *, fit: Any = "epoch", eps: float = 1.0) -> dict:
    """N*, D*, loss of the dense closed form under C = 6 N D (docs/planner.md).

    flops: the training budget C (positive, finite); eps: the architecture's
    efficiency (positive, finite; 1 = the dense baseline)."""
    flops = _positive("flops", flops, float)
    eps = _positive("eps", eps, float)
    return dict(_core.closed_form_optimum(_fit_ref(fit), flops, eps))
