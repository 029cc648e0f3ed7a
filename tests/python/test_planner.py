"""modar.optimal / sweep / fit: the same documents as the CLI's --json for the
same inputs, tables as DataFrames, and bad arguments as ValueError naming the
argument."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import modar
from conftest import run_cli, run_cli_json

# Epoch AI's fit (Besiroglu et al. 2024), docs/planner.md, typed in from the paper.
EPOCH = dict(E=1.8172, A=482.01, B=2085.43, alpha=0.3478, beta=0.3658)


def test_optimal_equals_cli_json():
    cli = run_cli_json("optimal", "--flops", "1e20", "--json")
    py = modar.optimal(flops=1e20)
    assert py.to_dict() == cli


def test_optimal_with_options_equals_cli_json():
    cli = run_cli_json("optimal", "--flops", "6e18", "--arch", "baseline,mod", "--seq-len", "1024",
                       "--capacity", "0.125", "--every", "2", "--gpus", "4", "--json")
    py = modar.optimal(flops=6e18, arch=["baseline", "mod"], seq_len=1024, capacity=0.125,
                       every=2, gpus=4)
    assert py.to_dict() == cli


def test_optimal_wall_clock_budget_equals_cli_json():
    cli = run_cli_json("optimal", "--gpu-hours", "2000", "--gpus", "8", "--profile", "h200",
                       "--arch", "baseline,dar", "--json")
    py = modar.optimal(gpu_hours=2000, gpus=8, profile="h200", arch="baseline,dar".split(","))
    assert py.to_dict() == cli


def test_optimal_result_views():
    plan = modar.optimal(flops=1e20, arch=["baseline", "mod"])
    table = plan.to_pandas()
    assert len(table) == len(plan.recommendations) >= 2
    assert {"arch", "role", "shape.n_layers", "shape.d_model", "params.total", "loss"} <= set(table.columns)
    baseline = plan.best("baseline")
    assert baseline["arch"] == "baseline"
    text = repr(plan)
    assert "OptimalResult" in text and "baseline" in text and "mod" in text
    assert "baseline" in str(plan)  # the CLI's table


def test_closed_form_matches_the_formula_and_spec_fixture():
    for flops, n_spec, d_spec in [(6e18, 2.02e8, 4.96e9), (1e20, 8.53e8, 1.95e10)]:
        a, b = EPOCH["alpha"], EPOCH["beta"]
        g = (a * EPOCH["A"] / (b * EPOCH["B"])) ** (1 / (a + b))
        n_star = g * (flops / 6) ** (b / (a + b))
        d_star = (flops / 6) ** (a / (a + b)) / g
        got = modar.closed_form_optimum(flops)
        assert got["n_opt"] == pytest.approx(n_star, rel=1e-9)
        assert got["tokens_opt"] == pytest.approx(d_star, rel=1e-9)
        assert got["n_opt"] == pytest.approx(n_spec, rel=0.005)
        assert got["tokens_opt"] == pytest.approx(d_spec, rel=0.005)
        loss = EPOCH["E"] + EPOCH["A"] / n_star**a + EPOCH["B"] / d_star**b
        assert got["loss"] == pytest.approx(loss, rel=1e-9)


def test_sweep_equals_cli_json_lines():
    out = run_cli("sweep", "--flops", "6e18,2e19", "--arch", "baseline,mod", "--no-time", "--jsonl")
    cli_rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    py = modar.sweep([6e18, 2e19], arch=["baseline", "mod"], with_time=False, progress=False)
    assert py.rows == cli_rows
    assert len(py) == len(cli_rows) > 10
    frame = py.to_pandas()
    assert len(frame) == len(cli_rows)
    assert set(frame["arch"]) == {"baseline", "mod"}


def test_sweep_with_time_equals_cli_and_reports_progress():
    calls = []
    out = run_cli("sweep", "--flops", "1e19", "--arch", "baseline,dar", "--jsonl")
    cli_rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    py = modar.sweep(1e19, arch=["baseline", "dar"],
                     progress=lambda done, total: calls.append((done, total)))
    assert py.rows == cli_rows
    assert calls and calls[-1] == (2, 2)  # curves: the final report always comes, done = total


def test_sweep_row_on_a_cluster_has_optimals_parallel_block():
    """docs/cluster.md "modar sweep --gpus N": a --jsonl row's `parallel` is the
    same object as an `optimal --json` recommendation's.  The sweep's
    recommended row is optimal's answer (one search, one layout search), so
    the two objects must be equal key for key: the context and expert sizes
    and the global batch included (the sweep's own block lacked them)."""
    args = ("--flops", "1e20", "--arch", "moe", "--gpus", "8")
    rows = [json.loads(line) for line in run_cli("sweep", *args, "--jsonl").splitlines()
            if line.strip()]
    plan = run_cli_json("optimal", *args, "--json")
    rec = next(r for r in plan["recommendations"] if r["role"] == "isoflop_optimal")
    [best] = [r for r in rows if r["recommended"]]
    assert (best["n_layers"], best["d_model"]) == (rec["shape"]["n_layers"], rec["shape"]["d_model"])
    assert best["layout"] == rec["layout"]
    assert best["parallel"] == rec["parallel"]
    par = best["parallel"]
    assert {"context", "expert", "expert_tensor", "expert_data", "global_batch"} <= par.keys()
    assert par["tensor"] * par["context"] * par["pipeline"] * par["data"] == 8
    assert par["global_batch"] == plan["shape_search"]["global_batch"]


def _synthetic_runs(law: dict) -> pd.DataFrame:
    """Losses exactly on a known law (no noise), over a 5 x 5 (N, D) grid."""
    rows = []
    for n in np.geomspace(2e7, 2e9, 5):
        for d in np.geomspace(4e8, 4e10, 5):
            loss = law["E"] + law["A"] / n ** law["alpha"] + law["B"] / d ** law["beta"]
            rows.append({"N": n, "D": d, "loss": loss})
    return pd.DataFrame(rows)


def test_fit_recovers_a_known_law_and_equals_cli(tmp_path):
    law = dict(E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28)  # Hoffmann approach 3
    frame = _synthetic_runs(law)
    path = tmp_path / "runs.csv"
    frame.to_csv(path, index=False, float_format="%.17g")

    cli = run_cli_json("fit", str(path), "--bootstrap", "20", "--json", "--output",
                       str(tmp_path / "cli.fit.toml"))
    from_path = modar.fit(path, bootstrap_samples=20)
    assert from_path.to_dict() == cli

    from_frame = modar.fit(frame, bootstrap_samples=20)
    got = from_frame.params
    assert got["alpha"] == pytest.approx(law["alpha"], abs=0.01)
    assert got["beta"] == pytest.approx(law["beta"], abs=0.01)
    assert got["E"] == pytest.approx(law["E"], rel=0.02)
    # the same numbers whichever way the runs arrive
    assert from_frame.params == pytest.approx(from_path.params, rel=1e-12)
    table = from_frame.to_pandas()
    assert set(table.index) == {"E", "A", "B", "alpha", "beta"}
    assert "FitResult" in repr(from_frame)

    # the fit is usable by the planner, from Python and as a file
    saved = from_frame.save(tmp_path / "mine.fit.toml")
    plan = modar.optimal(flops=1e20, arch=["baseline"], fit=from_frame)
    assert plan.to_dict()["fit"]["alpha"] == pytest.approx(got["alpha"], rel=1e-9)
    cli_plan = run_cli_json("optimal", "--flops", "1e20", "--arch", "baseline", "--fit", str(saved), "--json")
    assert cli_plan["fit"]["alpha"] == pytest.approx(got["alpha"], rel=1e-9)


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda: modar.optimal(flops=-1.0), "flops"),
        (lambda: modar.optimal(flops=float("nan")), "flops"),
        (lambda: modar.optimal(), "budget"),
        (lambda: modar.optimal(flops=1e20, gpus=0), "gpus"),
        (lambda: modar.optimal(flops=1e20, arch=["baseline", "mixtral"]), "mixtral"),
        (lambda: modar.optimal(flops=1e20, capacity=0), "capacity"),
        (lambda: modar.optimal(flops=1e20, arch=["baseline", "dar"], capacity=0.5), "capacity"),
        (lambda: modar.optimal(days="2 fortnights", gpus=8), "days"),
        (lambda: modar.optimal(gpu_hours="2w"), "gpu_hours"),
        (lambda: modar.optimal(gpu_hours="2w"), "give days = 2w with gpus = N"),
        (lambda: modar.optimal(gpu_hours=100, days=1, gpus=4), "days"),
        (lambda: modar.optimal(flops=1e20, eps={"mod": 1e-300}), "eps[mod]"),
        (lambda: modar.optimal(flops=1e20, fit="chinchilla"), "chinchilla"),
        (lambda: modar.optimal(flops=1e20, eps={"mod": -2}), "mod"),
        (lambda: modar.optimal(flops=1e20, seq_len=0), "model.seq_len"),
        (lambda: modar.optimal(flops=1e20, profile="no-such-gpu"), "no-such-gpu"),
        (lambda: modar.sweep([1e19, -1.0], progress=False), "flops"),
        (lambda: modar.sweep(1e19, every=[2, 0], progress=False), "every"),
        (lambda: modar.fit("/nonexistent/runs.csv"), "runs.csv"),
        (lambda: modar.fit(pd.DataFrame({"N": [1e8], "loss": [3.0]})), "tokens"),
        (lambda: modar.fit(pd.DataFrame({"N": [1e8], "D": [1e9], "loss": [3.0]}), bootstrap_samples=-1),
         "bootstrap_samples"),
    ],
)
def test_bad_arguments_raise_value_error_naming_the_field(call, field):
    with pytest.raises(ValueError) as info:
        call()
    assert field.lower() in str(info.value).lower()


def test_optimal_on_a_cluster_reports_each_layout():
    # docs/cluster.md: with gpus > 1 every recommendation carries the fastest
    # layout that fits, the same as `modar optimal --gpus ... --json`.
    plan = modar.optimal(flops=1e21, gpus=64, gpus_per_node=8, arch=["baseline"],
                         profile="a100-80gb-dgx")
    rec = plan.best("baseline")
    par = rec["parallel"]
    assert par["tensor"] * par["pipeline"] * par["data"] == 64
    assert rec["layout"].startswith(f"TP {par['tensor']}")
    assert rec["memory"]["fits"]
    cli = run_cli_json("optimal", "--flops", "1e21", "--gpus", "64", "--gpus-per-node", "8",
                       "--arch", "baseline", "--profile", "a100-80gb-dgx", "--json")
    assert cli["recommendations"][0]["layout"] == rec["layout"]
    with pytest.raises(ValueError, match="gpus_per_node"):
        modar.optimal(flops=1e21, gpus=64, gpus_per_node=0)


def test_one_search_sweep_recommended_row_is_optimal():
    """`modar sweep --flops 1e20 --arch X`'s best row (lowest loss that fits,
    the deepest of ties: optimal's rule) is the row it marks recommended and
    is `modar optimal --flops 1e20 --arch X`'s answer: same shape and loss."""
    for arch in ["baseline", "mod", "dar", "moe"]:
        rows = [json.loads(line) for line in
                run_cli("sweep", "--flops", "1e20", "--arch", arch, "--no-time", "--jsonl").splitlines()]
        plan = run_cli_json("optimal", "--flops", "1e20", "--arch", arch, "--json")
        rec = next(r for r in plan["recommendations"]
                   if r["arch"] == arch and r["role"] == "isoflop_optimal")
        fitting = [r for r in rows if r["fits"] and r["loss"] is not None]
        low = min(r["loss"] for r in fitting)
        ties = [r for r in fitting if r["loss"] <= low * (1 + 1e-4)]
        best = max(ties, key=lambda r: (r["n_layers"], -r["loss"]))
        assert [r for r in rows if r["recommended"]] == [best], arch
        assert (best["n_layers"], best["d_model"]) == (rec["shape"]["n_layers"], rec["shape"]["d_model"])
        assert best["loss"] == rec["loss"]


def test_days_is_a_wall_clock_budget_on_the_gpus():
    """--days D on N GPUs is D x 24 x N GPU-hours, and text units are read."""
    by_days = modar.optimal(days="2w", gpus=8, arch=["baseline"], progress=False)
    by_hours = modar.optimal(gpu_hours=14 * 24 * 8, gpus=8, arch=["baseline"], progress=False)
    assert by_days.to_dict()["budget"]["days"] == 14
    assert by_days.to_dict()["budget"]["gpu_hours"] == 14 * 24 * 8
    assert by_days.best("baseline")["shape"] == by_hours.best("baseline")["shape"]
    cli = run_cli_json("optimal", "--days", "14", "--gpus", "8", "--arch", "baseline", "--json")
    assert cli == by_days.to_dict()
    rec = by_days.best("baseline")
    assert rec["time"]["days"] == pytest.approx(rec["time"]["train_hours"] / 24)
    assert rec["time"]["gpu_hours"] == pytest.approx(rec["time"]["train_hours"] * 8)


def test_optimal_reports_progress_and_names_match_sweep():
    calls = []
    plan = modar.optimal(flops=1e20, arch=["baseline", "dar"], block_layers=1, streams=2,
                         progress=lambda done, total: calls.append((done, total)))
    assert calls and calls[-1][0] == calls[-1][1] > 0
    assert plan.best("dar")["dar"]["block_layers"] == 1
    with pytest.warns(DeprecationWarning):
        old = modar.optimal(flops=1e20, arch=["baseline", "dar"], dar_block_layers=1, progress=False)
    assert old.to_dict() == plan.to_dict()
