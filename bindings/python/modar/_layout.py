"""modar.layout: every parallel layout of one model and one global batch on N
GPUs, ranked by step time (planner/layout_search.cpp rank_layouts), as
`modar layout CONFIG --gpus N --json`."""

from __future__ import annotations

from typing import Any, Callable

from . import _core
from ._args import one_line_type_errors
from ._config import Config, as_config
from ._planner import _integer, _profile_ref, _set_given
from ._results import Result, flatten

ConfigError = _core.ConfigError


class LayoutResult(Result):
    """The ranked layouts: ["fitting"] fastest first, ["not_fitting"] least
    memory first (each with its "binding" constraint), the global batch and
    what was skipped.  str() is the CLI's table."""

    _title = "layout"

    @property
    def best(self) -> dict | None:
        """The fastest layout that fits (None when none does)."""
        return self._doc["fitting"][0] if self._doc["fitting"] else None

    def to_pandas(self):
        """One row per layout (fitting ones first, in rank order), the JSON
        fields flattened ("parallel.tensor", "memory.peak_bytes", ...)."""
        import pandas as pd

        rows = [flatten(row) for row in self._doc["fitting"] + self._doc["not_fitting"]]
        return pd.DataFrame(rows)

    def _summary(self) -> list[str]:
        d = self._doc
        lines = [
            f"  {d['gpus']} GPUs, global batch {d['global_batch']} sequences "
            f"({d['global_batch_source']}), {len(d['fitting'])} layouts fit"
        ]
        if d["fitting"]:
            best = d["fitting"][0]
            lines.append(f"  best: {best['layout']}: step {best['step_s']:.4g} s, "
                         f"MFU {best['mfu']:.1%}, {best['memory']['peak_bytes'] / 2**30:.1f} GiB")
        return lines


@one_line_type_errors
def layout(
    config: Any,
    *,
    gpus: int,
    gpus_per_node: int | None = None,
    global_batch: int | None = None,
    profile: Any = None,
    top: int | None = None,
    progress: bool | Callable[[int, int], None] = True,
    **overrides: Any,
) -> LayoutResult:
    """Rank every layout of `config`'s model (a Config, dict or TOML path,
    plus keyword overrides) on `gpus` devices: TP with and without SP, CP, PP
    (1F1B, interleaved), EP and expert TP, ZeRO 0-3, micro-batch and
    recompute, at one global batch (`global_batch` sequences; default the
    configuration's train.global_batch, else ~4M tokens).  profile: a name,
    a TOML path or a modar.Profile (default: the configuration's).  The
    library applies the defaults and checks every argument (ValueError
    naming it).  Releases the GIL; progress=True prints a line with an ETA
    on stderr when the ranking takes over a second, a callable gets
    (layouts done, layouts in all), False is quiet; Ctrl-C raises
    KeyboardInterrupt between layouts."""
    cfg: Config = as_config(config)
    if profile is not None:
        overrides = {**overrides, "device": {"profile": _profile_ref(profile)}}
    if overrides:
        cfg = cfg.replace(**overrides)
    request = _core.LayoutRequest()
    request.gpus = _integer("gpus", gpus)
    _set_given(request, gpus_per_node=(gpus_per_node, _integer),
               global_batch=(global_batch, _integer), top=(top, _integer))
    document, text = _core.layout(cfg._cpp, request, progress)
    return LayoutResult(document, text)
