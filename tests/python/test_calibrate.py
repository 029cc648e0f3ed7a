"""modar.calibrate: the same fit as `modar calibrate --json` for the same
runs (a CSV path or a list of dicts), its profile accepted by estimate,
optimal and sweep, bad input as one-line ValueErrors, inputs never
overwritten."""

from __future__ import annotations

import json
import subprocess

import pytest

import modar

RUNS = [
    {"name": "one", "config": "model.toml", "overrides": "train.micro_batch=1", "step_s": 0.02},
    {"name": "two", "config": "model.toml", "overrides": ["train.micro_batch=4"], "step_s": 0.07},
    {"name": "three", "config": "model.toml", "overrides": {"model.n_layers": 4},
     "step_s": 0.05},
]
FIT = ["kernel.gemm_efficiency", "kernel.memory_efficiency"]


@pytest.fixture
def folder(tmp_path, monkeypatch):
    (tmp_path / "model.toml").write_text(
        "[model]\nd_model = 1024\nn_layers = 2\nn_heads = 8\nseq_len = 1024\n")
    (tmp_path / "runs.csv").write_text(
        "name,config,overrides,step_s\none,model.toml,train.micro_batch=1,0.02\n"
        "two,model.toml,train.micro_batch=4,0.07\nthree,model.toml,model.n_layers=4,0.05\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_python_equals_the_cli(folder, cli):
    result = modar.calibrate(folder / "runs.csv", profile="a100-80gb-dgx", parameters=FIT,
                             out=folder / "py.toml")
    cli_doc = json.loads(subprocess.run(
        [cli, "calibrate", "runs.csv", "--profile", "a100-80gb-dgx", "--out", "cli.toml",
         "--fit", ",".join(FIT), "--json", "--quiet"],
        capture_output=True, text=True, check=True, cwd=folder).stdout)
    doc = result.to_dict()
    assert doc["parameters"] == cli_doc["parameters"]
    assert doc["runs"] == cli_doc["runs"]
    # A list of dicts (overrides as text, list or dict) is the same runs file.
    from_rows = modar.calibrate(RUNS, profile="a100-80gb-dgx", parameters=FIT)
    assert from_rows.parameters == result.parameters
    assert list(result.to_pandas()["name"]) == ["one", "two", "three"]
    assert set(result.parameters) == set(FIT)


def test_the_calibrated_profile_is_accepted_everywhere(folder):
    result = modar.calibrate(folder / "runs.csv", profile="a100-80gb-dgx", parameters=FIT,
                             out=folder / "cal.toml")
    loaded = modar.load_profile(folder / "cal.toml")
    assert loaded.name == "a100-80gb-dgx-calibrated"
    assert "calibration_run.0003" in loaded.to_dict()["provenance"]
    cfg = modar.Config.from_toml(folder / "model.toml")
    for profile in (folder / "cal.toml", result.profile):
        estimate = modar.estimate(cfg, profile=profile)
        assert estimate.to_dict()["time"]["step_s"] > 0
    # Run "one" is timed as the fit predicted it.
    one = modar.estimate(cfg, profile=str(folder / "cal.toml"), train={"micro_batch": 1})
    assert one.to_dict()["time"]["step_s"] == pytest.approx(result.runs[0]["predicted_s"],
                                                            rel=1e-9)
    plan = modar.optimal(flops=1e19, arch=["baseline"], profile=str(folder / "cal.toml"))
    assert len(plan.to_pandas()) >= 1
    rows = modar.sweep([6e18], arch=["baseline"], profile=str(folder / "cal.toml"))
    assert len(rows.to_pandas()) > 0


def test_bad_input_names_row_column_and_value(folder):
    bad = [dict(RUNS[0]), dict(RUNS[1], step_s="slow")]
    with pytest.raises(ValueError, match=r"row 'two', column 'step_s' = 'slow'"):
        modar.calibrate(bad, profile="a100-80gb-dgx", parameters=FIT)
    with pytest.raises(ValueError, match=r"runs\[0\]: unknown key 'stepz'"):
        modar.calibrate([{"name": "a", "config": "", "overrides": "", "stepz": 1}],
                        profile="a100-80gb-dgx")
    with pytest.raises(ValueError, match="no such profile parameter"):
        modar.calibrate(RUNS, profile="a100-80gb-dgx", parameters=["nope"])
    with pytest.raises(ValueError, match="2 runs for 3 free parameters"):
        modar.calibrate(RUNS[:2], profile="a100-80gb-dgx",
                        parameters=FIT + ["ceilings.launch_overhead_s"])
    before = (folder / "runs.csv").read_text()
    for out in ("runs.csv", "model.toml"):
        with pytest.raises(ValueError, match="is the input"):
            modar.calibrate(folder / "runs.csv", profile="a100-80gb-dgx", parameters=FIT,
                            out=folder / out)
    with pytest.raises(ValueError, match="is a directory"):
        modar.calibrate(RUNS, profile="a100-80gb-dgx", parameters=FIT, out=folder)
    assert (folder / "runs.csv").read_text() == before
    with pytest.raises(TypeError, match="max_iterations"):
        modar.calibrate(RUNS, profile="a100-80gb-dgx", max_iterations=2.5)
