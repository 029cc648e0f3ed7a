"""modar.plot: each figure renders to a PNG file that exists and is not blank."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.image as mpimg  # noqa: E402
import pytest  # noqa: E402

import modar  # noqa: E402
import modar.plot  # noqa: E402


def assert_not_blank(path):
    assert path.exists() and path.stat().st_size > 5000
    pixels = mpimg.imread(path)[..., :3]
    assert pixels.shape[0] > 200 and pixels.shape[1] > 200
    # a blank (or single-colour) canvas has no variance; drawn lines and bars do
    assert pixels.std() > 0.05
    # and a good share of the pixels are not background white
    assert (pixels.min(axis=-1) < 0.9).mean() > 0.02


def test_isoflop_curves_png(tmp_path):
    curves = modar.sweep([6e18, 2e19], arch=["baseline", "mod", "dar"], with_time=False, progress=False)
    path = tmp_path / "isoflop.png"
    fig = modar.plot.isoflop_curves(curves, path=path)
    assert_not_blank(path)
    ax = fig.axes[0]
    # one line per (budget, arch) curve plus one star per curve
    assert len(ax.lines) == 2 * 2 * 3
    assert ax.get_xscale() == "log"


def test_step_time_breakdown_png(tmp_path):
    base = modar.Config(d_model=1024, n_layers=16, n_heads=16, seq_len=1024)
    estimates = {
        "baseline": modar.estimate(base),
        "MoD 12.5%": modar.estimate(base.replace(mod={"capacity": 0.125, "every": 2})),
        "DAR": modar.estimate(base.replace(dar={"variant": "dar"})),
    }
    path = tmp_path / "breakdown.png"
    fig = modar.plot.step_time_breakdown(estimates, path=path)
    assert_not_blank(path)
    # the stacked bars add up to each estimate's time summed over op kinds
    ax = fig.axes[0]
    tops = {}
    for patch in ax.patches:
        x = round(patch.get_x() + patch.get_width() / 2, 6)
        tops[x] = max(tops.get(x, 0.0), patch.get_y() + patch.get_height())
    sums = [sum(r["time_s"] for r in e.to_dict()["time"]["by_kind"]) * 1e3 for e in estimates.values()]
    assert sorted(tops.values()) == pytest.approx(sorted(sums), rel=1e-9)


def test_bad_plot_input_is_value_error():
    with pytest.raises(ValueError):
        modar.plot.isoflop_curves([])


def test_predicted_vs_measured_png(tmp_path):
    # A validation document (as modar.validate returns it) with known points.
    cases = [
        {"name": f"case-{i}", "step_time": {"measured_s": m, "predicted_s": p},
         "memory": {"measured_peak_bytes": 1e6 * (i + 1), "predicted_peak_bytes": 1.1e6 * (i + 1)}}
        for i, (m, p) in enumerate([(0.01, 0.012), (0.05, 0.04), (0.2, 0.21), (1.0, 0.8)])
    ]
    report = {"cases": cases}
    path = tmp_path / "validation.png"
    fig = modar.plot.predicted_vs_measured(report, path=path)
    assert_not_blank(path)
    offsets = fig.axes[0].collections[0].get_offsets()
    assert [tuple(o) for o in offsets] == [(0.01, 0.012), (0.05, 0.04), (0.2, 0.21), (1.0, 0.8)]
    fig = modar.plot.predicted_vs_measured(report, quantity="peak_bytes", path=tmp_path / "mem.png")
    assert_not_blank(tmp_path / "mem.png")
    with pytest.raises(ValueError, match="quantity"):
        modar.plot.predicted_vs_measured(report, quantity="flops")
