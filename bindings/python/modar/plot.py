"""modar.plot: figures from results (matplotlib, Agg backend: no display needed).

    isoflop_curves(sweep)          loss vs parameters per budget, baseline vs MoD
                                   vs DAR, each curve's minimum marked (MoD
                                   paper, figure 4)
    step_time_breakdown(estimates) predicted step time by op kind, stacked bars
    predicted_vs_measured(report)  a validation run: predicted vs measured step time

Each function takes results (never recomputes a number), returns the
matplotlib Figure and, with path=..., writes a PNG atomically.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

import matplotlib

# Agg (files, no display) unless the user chose a backend or runs in Jupyter,
# whose inline backend renders Agg images too.
if "MPLBACKEND" not in os.environ and "ipykernel" not in sys.modules:
    matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ._args import one_line_type_errors  # noqa: E402
from ._results import flatten  # noqa: E402

_ARCH_STYLE = {
    "baseline": dict(linestyle="-", marker="o"),
    "mod": dict(linestyle="--", marker="s"),
    "dar": dict(linestyle=":", marker="^"),
    "mod+dar": dict(linestyle="-.", marker="D"),
}


def _save(fig, path: str | os.PathLike | None, dpi: int) -> None:
    if path is None:
        return
    target = Path(path)
    tmp = target.with_name(f".{target.stem}.tmp{os.getpid()}{target.suffix or '.png'}")
    fig.savefig(tmp, dpi=dpi, bbox_inches="tight")
    os.replace(tmp, target)


def _figure_and_axes(ax, figsize: tuple[float, float]):
    """(figure, axes): a new figure of that size, or the one `ax` is drawn in."""
    if ax is None:
        return plt.subplots(figsize=figsize)
    return ax.figure, ax


def _column(row: Mapping[str, Any], *names: str) -> Any:
    for name in names:
        if name in row:
            return row[name]
    raise KeyError(f"none of {', '.join(names)} in the result (have: {', '.join(sorted(row))})")


@one_line_type_errors
def isoflop_curves(
    sweep: Any,
    *,
    x: str = "params",
    archs: Sequence[str] | None = None,
    ax=None,
    path: str | os.PathLike | None = None,
    dpi: int = 120,
    title: str | None = None,
):
    """Loss vs parameters, one colour per budget, one line style per
    architecture, each curve's recommended row starred: the model
    modar.optimal recommends for that budget and architecture (the lowest
    predicted loss that fits, the deepest of ties).

    sweep: a modar.SweepResult (or its rows).  x: "params" (total parameters,
    as the MoD paper plots), "flop_active" (N_f) or any flattened row key.
    Rows whose loss is unknown (no published prior) are left out.
    """
    rows = sweep.rows if hasattr(sweep, "rows") else list(sweep)
    flat = [flatten(r) for r in rows]
    x_key = {"params": ("params.total", "params_total", "n_params"),
             "flop_active": ("params.flop_active", "params_flop_active", "n_flop_active")}.get(x, (x,))
    curves: dict[tuple[float, str], list[tuple[float, float]]] = {}
    stars: dict[tuple[float, str], tuple[float, float]] = {}
    for row in flat:
        loss = row.get("loss")
        if loss is None:
            continue
        arch = str(_column(row, "arch"))
        if archs is not None and arch not in archs:
            continue
        budget = float(_column(row, "budget_flops", "budget", "train_flops"))
        point = (float(_column(row, *x_key)), float(loss))
        curves.setdefault((budget, arch), []).append(point)
        if row.get("recommended"):
            stars[(budget, arch)] = point
    if not curves:
        raise ValueError("isoflop_curves: no rows with a known loss to plot")

    fig, ax = _figure_and_axes(ax, (7.5, 5.0))
    budgets = sorted({b for b, _ in curves})
    colours = plt.get_cmap("viridis")([i / max(1, len(budgets) - 1) * 0.85 for i in range(len(budgets))])
    for (budget, arch), points in sorted(curves.items()):
        points.sort()
        xs, ys = zip(*points)
        colour = colours[budgets.index(budget)]
        style = _ARCH_STYLE.get(arch, dict(linestyle="-", marker="x"))
        ax.plot(xs, ys, color=colour, linestyle=style["linestyle"], linewidth=1.4)
        # The row optimal recommends (rows of older documents: the minimum).
        best = stars.get((budget, arch)) or min(points, key=lambda p: p[1])
        ax.plot([best[0]], [best[1]], marker="*", markersize=13, color=colour,
                markeredgecolor="black", linestyle="none")
    ax.set_xscale("log")
    ax.set_xlabel("parameters" if x == "params" else x)
    ax.set_ylabel("predicted loss")
    ax.set_title(title or "isoFLOP curves (star: modar optimal's recommendation)")
    ax.grid(True, which="both", alpha=0.3)
    # Two legends in one: colour = budget, line style = architecture.
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=colours[i], linewidth=2.5, label=f"{b:.0e} FLOPs")
               for i, b in enumerate(budgets)]
    handles += [Line2D([], [], color="black", linestyle=_ARCH_STYLE.get(a, {}).get("linestyle", "-"),
                       label=a) for a in sorted({a for _, a in curves})]
    handles.append(Line2D([], [], marker="*", markersize=11, color="white", markeredgecolor="black",
                          linestyle="none", label="recommended"))
    ax.legend(handles=handles, fontsize=8, ncol=2)
    _save(fig, path, dpi)
    return fig


def _by_kind(estimate: Any) -> dict[str, float]:
    doc = estimate.to_dict() if hasattr(estimate, "to_dict") else estimate
    from ._estimate import time_by_kind  # one reader of the estimate document

    return time_by_kind(doc)


@one_line_type_errors
def step_time_breakdown(
    estimates: Any,
    *,
    labels: Sequence[str] | None = None,
    ax=None,
    path: str | os.PathLike | None = None,
    dpi: int = 120,
    title: str | None = None,
):
    """Stacked bars: predicted step time of each op kind, one bar per estimate.

    estimates: one modar.EstimateResult, a list of them, or a dict label ->
    EstimateResult.
    """
    if isinstance(estimates, Mapping):
        labels = list(estimates.keys()) if labels is None else labels
        estimates = list(estimates.values())
    elif not isinstance(estimates, (list, tuple)):
        estimates = [estimates]
    if labels is None:
        labels = [f"config {i + 1}" for i in range(len(estimates))]
    tables = [_by_kind(e) for e in estimates]
    kinds = [k for k in dict.fromkeys(k for t in tables for k in t) if any(t.get(k, 0) > 0 for t in tables)]
    if not kinds:
        raise ValueError("step_time_breakdown: no op kind has a positive time")

    fig, ax = _figure_and_axes(ax, (max(4.5, 1.6 * len(tables) + 3), 5.0))
    colours = plt.get_cmap("tab20")(range(len(kinds)))
    bottoms = [0.0] * len(tables)
    for colour, kind in zip(colours, kinds):
        heights = [t.get(kind, 0.0) * 1e3 for t in tables]
        ax.bar(labels, heights, bottom=bottoms, color=colour, label=kind, edgecolor="white", linewidth=0.5)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    ax.set_ylabel("predicted step time (ms)")
    ax.set_title(title or "step time by op kind")
    ax.legend(fontsize=7, bbox_to_anchor=(1.02, 1), loc="upper left")
    _save(fig, path, dpi)
    return fig


@one_line_type_errors
def predicted_vs_measured(
    report: Any,
    *,
    quantity: str = "step_s",
    ax=None,
    path: str | os.PathLike | None = None,
    dpi: int = 120,
    title: str | None = None,
):
    """Predicted vs measured, one point per held-out configuration of a
    validation run (modar.validate), with the y = x line."""
    from ._runtime import validation_points  # one reader of the validation document

    points = validation_points(report, quantity)
    if not points:
        raise ValueError("predicted_vs_measured: the report holds no measured configuration")
    fig, ax = _figure_and_axes(ax, (5.5, 5.0))
    measured = [p[1] for p in points]
    predicted = [p[2] for p in points]
    ax.scatter(measured, predicted, s=36, color="tab:blue", edgecolor="black", zorder=3)
    for label, m, p in points:
        ax.annotate(label, (m, p), fontsize=6, xytext=(3, 3), textcoords="offset points")
    lo = min(measured + predicted) * 0.8
    hi = max(measured + predicted) * 1.25
    ax.plot([lo, hi], [lo, hi], color="gray", linestyle="--", linewidth=1, label="y = x")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel(f"measured {quantity}")
    ax.set_ylabel(f"predicted {quantity}")
    ax.set_title(title or "predicted vs measured")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path, dpi)
    return fig
