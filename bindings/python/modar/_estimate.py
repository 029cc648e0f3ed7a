"""modar.estimate: FLOPs, parameters, memory and step time of one
configuration (cost_models/), as `modar estimate CONFIG --json`; and
modar.estimate_batch: many configurations in one call, as a pandas DataFrame.

A single estimate costs what the C++ costs: the configuration is a C++
struct (no TOML round trip), the profile is loaded and pre-indexed once per
process (cached by name, or by path + modification time + size), and the
result keeps the C++ structs: the `--json` document is built only when a view
needs it (to_dict, [key], repr)."""

from __future__ import annotations

import json
import numbers
import weakref
from typing import Any, Iterable, Mapping

from . import _core
from ._args import expect_type, one_line_type_errors
from ._config import Config, _assignments, as_config
from ._planner import _profile_ref
from ._profile import Profile
from ._results import Result, _fmt

ConfigError = _core.ConfigError
_STEPS = ("train", "decode")


def time_by_kind(document: dict) -> dict[str, float]:
    """{op kind: predicted seconds per step} from an estimate document."""
    return {row["kind"]: float(row["time_s"]) for row in document["time"]["by_kind"]}


def _handle_or_document(name: str, section: str, key: str, doc: str | None = None) -> property:
    """A read-only number of an EstimateResult: the C++ struct's `name`, or for
    a result made from a document (older callers) document[section][key]."""

    def read(self: "EstimateResult") -> Any:
        return getattr(self._handle, name) if self._handle is not None else self._doc[section][key]

    return property(read, doc=doc)


class EstimateResult(Result):
    """One configuration's counts and predicted time (`modar estimate --json`).

    The numbers are the C++ structs; .to_dict() (and [key], repr) build the
    CLI's JSON document on first use."""

    def __init__(self, handle: "_core.EstimateHandle | dict | str") -> None:
        if isinstance(handle, (dict, str)):  # a document (older callers)
            super().__init__(handle)
            self._handle = None
        else:
            self._handle = handle
            self._text = None

    @property
    def _doc(self) -> dict:  # type: ignore[override]
        doc = self.__dict__.get("_document")
        if doc is None:
            doc = self.__dict__["_document"] = json.loads(self._handle.to_json())
        return doc

    @_doc.setter
    def _doc(self, value: dict) -> None:
        self.__dict__["_document"] = value

    # Read straight from the C++ structs (no document needed).
    step_s = _handle_or_document("step_s", "time", "step_s", "Seconds per optimizer step.")
    tokens_per_s = _handle_or_document("tokens_per_s", "time", "tokens_per_s")
    mfu = _handle_or_document("mfu", "time", "mfu")
    peak_bytes = _handle_or_document("peak_bytes", "memory", "peak_bytes")
    fits = _handle_or_document("fits", "memory", "fits")
    params_total = _handle_or_document("params_total", "params", "total")

    def to_pandas(self):
        """The step time by op kind: count, FLOPs, bytes, seconds, share."""
        import pandas as pd

        return pd.DataFrame(self._doc["time"]["by_kind"])

    def __repr__(self) -> str:
        d = self._doc
        model = d.get("config", {}).get("model", {})
        params, flops, memory, time = d["params"], d["flops"], d["memory"], d["time"]
        lines = [
            f"<modar.EstimateResult: {d.get('step', 'train')} step, "
            f"L={model.get('n_layers', '?')} d={model.get('d_model', '?')} on "
            f"{d.get('conventions', {}).get('profile', '?')}>",
            f"  params       total {_fmt(params['total'])}, FLOP-active {_fmt(params['flop_active'])}",
            f"  FLOPs/token  forward {_fmt(flops['forward_per_token'])}, train {_fmt(flops['train_per_token'])}",
            f"  memory       peak {memory['peak_bytes'] / 2**30:.2f} GiB "
            f"({'fits' if memory['fits'] else 'does NOT fit'})",
            f"  time         step {_fmt(time['step_s'])} s, {_fmt(time['tokens_per_s'])} tokens/s, "
            f"MFU {time['mfu']:.1%}",
        ]
        return "\n".join(lines)


# ---- profiles ------------------------------------------------------------------

# A modar.Profile -> its pre-indexed C++ copy, for as long as the Profile lives.
_HANDLES: "weakref.WeakKeyDictionary[Any, _core.ProfileHandle]" = weakref.WeakKeyDictionary()


def _profile_handle(profile: Any, by_name: bool = False) -> "_core.ProfileHandle | None":
    """None (the configuration's device.profile, cached in the core), the
    pre-indexed copy of a modar.Profile, or (by_name) the cached profile of a
    name or path."""
    if profile is None:
        return None
    if not isinstance(profile, Profile):
        if not by_name:
            return None
        return _core.cached_profile(_profile_ref(profile))
    handle = _HANDLES.get(profile)
    if handle is None:
        handle = _HANDLES[profile] = _core.ProfileHandle(profile._cpp)
    return handle


def _step(step: Any) -> str:
    expect_type("step", step, str, '"train" or "decode"')
    if step not in _STEPS:
        raise ConfigError(f'step = "{step}": allowed: "train", "decode"')
    return step


def _with_profile(cfg: Config, profile: Any, overrides: Mapping[str, Any]) -> Config:
    """cfg with keyword overrides and, like the CLI's --profile, the profile
    as device.profile."""
    if profile is not None:
        overrides = {**overrides, "device": {"profile": _profile_ref(profile)}}
    return cfg.replace(**overrides) if overrides else cfg


@one_line_type_errors
def estimate(config: Any = None, *, profile: Any = None, step: str = "train", **overrides: Any) -> EstimateResult:
    """Estimate one configuration: a Config, dict or TOML path, plus keyword
    overrides.  profile: a name, a TOML path or a modar.Profile (default: the
    configuration's device.profile).  step: "train" or "decode"."""
    step = _step(step)
    if config is None:
        cfg = Config(**overrides) if overrides else _default_config()
        overrides = {}
    else:
        cfg = as_config(config)
    if profile is not None or overrides:
        cfg = _with_profile(cfg, profile, overrides)
    return EstimateResult(_core.estimate(cfg._cpp, step, _profile_handle(profile)))


_DEFAULT: Config | None = None


def _default_config() -> Config:
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = Config()
    return _DEFAULT


# ---- many configurations ---------------------------------------------------------

def _column_array(key: str, kind: str, values: Any, rows: int | None):
    """One column of overrides -> what the core takes: an int64, float64 or
    bool array, or a list of str (choices and paths)."""
    import numpy as np

    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable) and not hasattr(values, "__array__"):
        raise TypeError(f"{key}: expected a sequence of values (a list, a numpy array "
                        f"or a pandas Series), got {type(values).__name__}")
    array = np.asarray(values)
    if array.ndim != 1:
        raise ConfigError(f"{key}: {array.ndim}-dimensional values; allowed: one value per row")
    if kind in ("choice", "text"):
        items = array.tolist()
        for item in items:
            if not isinstance(item, str):
                raise ConfigError(f"{key} = {item!r}: must be a string")
        return items
    if array.dtype.kind == "b":
        return np.ascontiguousarray(array, dtype=np.bool_)
    if array.dtype.kind in "iu":
        if array.dtype.kind == "u" and array.size and array.max() > np.iinfo(np.int64).max:
            raise ConfigError(f"{key}: values beyond 2^63 - 1; allowed: 64-bit integers")
        return np.ascontiguousarray(array, dtype=np.int64)
    if array.dtype.kind == "f":
        return np.ascontiguousarray(array, dtype=np.float64)
    if array.dtype.kind == "O":  # mixed Python objects: one type per column
        kinds = {type(v) for v in array.tolist()}
        if kinds <= {int}:
            return np.asarray(array.tolist(), dtype=np.int64)
        if kinds <= {int, float}:
            return np.asarray(array.tolist(), dtype=np.float64)
    allowed = {"integer": "integers", "real": "numbers", "boolean": "booleans"}.get(kind, "strings")
    raise ConfigError(f"{key}: values of dtype {array.dtype}; allowed: {allowed}")


def _columns(table: Any) -> tuple[list[str], list[Any], int]:
    """A dict of columns or a DataFrame -> (dotted keys, arrays, rows)."""
    from ._config import _keys

    if hasattr(table, "columns") and hasattr(table, "__getitem__") and not isinstance(table, Mapping):
        items = [(str(name) if not isinstance(name, str) else name, table[name]) for name in table.columns]
    elif isinstance(table, Mapping):
        items = list(table.items())
    else:
        raise TypeError(f"table: expected a dict of columns or a pandas DataFrame, "
                        f"got {type(table).__name__}")
    keys_types = _keys()
    names, arrays = [], []
    rows = None
    for name, values in items:
        if not isinstance(name, str):
            raise ConfigError(f"column {name!r}: column names must be configuration keys (str)")
        dotted = _assignments({name: 0})[0][0]  # unknown keys: ConfigError naming them
        label = dotted if name == dotted else f"{dotted} (column {name!r})"
        array = _column_array(label, keys_types[dotted], values, rows)
        if rows is None:
            rows = len(array)
        elif len(array) != rows:
            raise ConfigError(f"{label}: {len(array)} values; allowed: as many as the "
                              f"other columns ({rows})")
        names.append(dotted)
        arrays.append(array)
    return names, arrays, rows or 0


@one_line_type_errors
def estimate_batch(
    table: Any,
    *,
    base: Any = None,
    profile: Any = None,
    step: str = "train",
    errors: str = "raise",
    threads: int = 1,
):
    """Many configurations in one call -> a pandas DataFrame, one row each.

    table: a list of configurations (Config, dict or TOML path), or columns
    of overrides applied to `base` (a dict {key: values} or a DataFrame whose
    column names are configuration keys: "model.n_layers", "mod.capacity",
    or bare names found in one section such as "n_layers").

    The rows are computed in C++ with the GIL released (threads > 1 splits
    them over that many threads).  Columns: the override columns (as given),
    then the scalar numbers of `modar estimate --json` flattened
    ("params.total", "flops.train_per_token", "memory.peak_bytes",
    "memory.fits", "time.step_s", "time.mfu", ...; modar._core.batch_columns()).

    errors="raise": the first invalid row raises ValueError naming the row,
    the field, the value and what is allowed; errors="mark": invalid rows get
    NaN (False for flags, 0 for counts) and their message in an "error" column.
    """
    import numpy as np
    import pandas as pd

    step = _step(step)
    expect_type("errors", errors, str, '"raise" or "mark"')
    if errors not in ("raise", "mark"):
        raise ConfigError(f'errors = "{errors}": allowed: "raise", "mark"')
    if isinstance(threads, bool) or not isinstance(threads, numbers.Integral):
        raise TypeError(f"threads = {threads!r}: expected int, got {type(threads).__name__}")
    if not 1 <= int(threads) <= 1024:
        raise ConfigError(f"threads = {threads}: allowed: 1 to 1024")
    handle = _profile_handle(profile, by_name=True)  # one profile for every row
    base_cfg = as_config(base) if base is not None else _default_config()

    keys: list[str] = []
    arrays: list[Any] = []
    echo: dict[str, Any] = {}
    if isinstance(table, (list, tuple)):
        configs = []
        for i, item in enumerate(table):
            try:
                cfg = as_config(item)
            except (ValueError, TypeError) as error:
                raise type(error)(f"table[{i}]: {error}") from None
            configs.append(cfg._cpp)
        rows = len(configs)
    else:
        names, arrays, rows = _columns(table)
        configs = None
        keys = names
        source_names = list(table.columns) if hasattr(table, "columns") and not isinstance(table, Mapping) \
            else list(table.keys())
        for name, array in zip(source_names, arrays):
            echo[str(name)] = array
    reals, ints, bools, failed, messages = _core.estimate_batch(
        base_cfg._cpp, configs, keys, arrays, rows, step, handle, errors == "raise", int(threads))
    columns = _core.batch_columns()
    data: dict[str, Any] = dict(echo)
    n_real, n_int = reals.shape[0], ints.shape[0]
    for c in range(n_real):
        data[columns[c]] = reals[c]
    for c in range(n_int):
        data[columns[n_real + c]] = ints[c]
    for c in range(bools.shape[0]):
        data[columns[n_real + n_int + c]] = bools[c]
    if errors == "mark":
        error_column = np.full(rows, None, dtype=object)
        for row, message in zip(failed, messages):
            error_column[row] = message
        data["error"] = error_column
    return pd.DataFrame(data, copy=False)
