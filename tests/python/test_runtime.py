"""modar.profile / modar.validate: a reduced profiling run, then validation
from Python and from the CLI on the same profile.  Measured times differ run
to run; the predictions (the cost model on that profile) must not."""

from __future__ import annotations

import json
import sys

import pytest

import modar
from conftest import run_cli

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@pytest.fixture(scope="module")
def tiny_profile(tmp_path_factory):
    path = tmp_path_factory.mktemp("profile") / "cpu-tiny.toml"
    lines: list[str] = []
    prof = modar.profile(path, backend="cpu", quick=True, max_dim=128, budget_s=0.02,
                         kinds=["gemm", "rmsnorm", "elementwise", "cross_entropy"], progress=lines.append)
    return path, prof, lines


def test_profile_writes_a_measured_profile(tiny_profile):
    path, prof, lines = tiny_profile
    assert path.exists() and not path.with_name(path.name + ".partial").exists()
    assert prof.measured and prof.backend == "cpu"
    on_disk = modar.load_profile(path)
    assert on_disk.to_dict() == prof.to_dict()
    table = prof.to_pandas()
    assert set(table["kind"]) <= {"gemm", "rmsnorm", "elementwise", "cross_entropy"}
    assert "gemm" in set(table["kind"])
    assert (table["median_s"] > 0).all()
    # every dim of every measured point is within max_dim
    assert all(max(dims) <= 128 for dims in table["dims"])
    # progress lines reached Python while the core ran
    assert any("gemm" in line for line in lines)


def test_larger_gemms_take_longer(tiny_profile):
    # Independent of the code: 2 m n k FLOPs; a 64x larger GEMM is slower.
    table = tiny_profile[1].to_pandas()
    gemm = table[(table["kind"] == "gemm") & (table["pass"] == "forward")]
    by_dims = {tuple(d[:3]): t for d, t in zip(gemm["dims"], gemm["median_s"])}
    small = min(by_dims, key=lambda d: d[0] * d[1] * d[2])
    large = max(by_dims, key=lambda d: d[0] * d[1] * d[2])
    assert large[0] * large[1] * large[2] >= 64 * small[0] * small[1] * small[2]
    assert by_dims[large] > by_dims[small]


def test_validate_python_and_cli_agree_on_predictions(tiny_profile):
    path, prof, _ = tiny_profile
    lines: list[str] = []
    py = modar.validate(path, quick=True, rounds=1, warmup_steps=1, progress=lines.append)
    cli = json.loads(run_cli("validate", "--profile", str(path), "--quick", "--rounds", "1",
                             "--json", "--quiet"))
    doc = py.to_dict()
    assert set(doc) == set(cli)
    assert [c["name"] for c in doc["cases"]] == [c["name"] for c in cli["cases"]]
    for a, b in zip(doc["cases"], cli["cases"]):
        assert a["config"] == b["config"]
        assert a["step_time"]["predicted_s"] == b["step_time"]["predicted_s"]
        assert a["memory"]["predicted_peak_bytes"] == b["memory"]["predicted_peak_bytes"]
        assert a["step_time"]["measured_s"] > 0
    frame = py.to_pandas()
    assert len(frame) == len(doc["cases"])
    assert {"name", "step_time.measured_s", "step_time.predicted_s", "memory.error"} <= set(frame.columns)
    assert "ValidationResult" in repr(py)
    assert lines  # progress lines reached Python


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda p: modar.profile(p / "x.toml", backend="tpu"), "backend"),
        (lambda p: modar.profile(p / "x.toml", kinds=["matmul"]), "matmul"),
        (lambda p: modar.profile(p / "x.toml", budget_s=-1), "budget_s"),
        (lambda p: modar.profile(p / "x.toml", threads=-1), "threads"),
        (lambda p: modar.profile(p / "x.toml", threads=100000), "threads = 100000"),
        (lambda p: modar.profile(p, quick=True), "is a directory"),
        (lambda p: modar.profile(p / "no" / "x.toml", quick=True), "does not exist"),
        (lambda p: modar.validate(p / "missing.toml"), "missing.toml"),
        (lambda p: modar.validate("h200"), "h200"),
        (lambda p: modar.validate(modar.load_profile("h200")), "h200"),
    ],
)
def test_bad_input_raises_value_error_naming_the_field(tmp_path, call, field):
    with pytest.raises(ValueError, match=field):
        call(tmp_path)


def test_profiling_releases_the_gil(tmp_path):
    """While the core profiles (no progress callback, so it never takes the
    GIL back), another Python thread keeps running."""
    import threading
    import time

    done = threading.Event()
    result = {}

    def work():
        result["profile"] = modar.profile(tmp_path / "gil.toml", quick=True, max_dim=64, budget_s=0.005,
                                          kinds=["gemm"], progress=False)
        done.set()

    worker = threading.Thread(target=work)
    ticks = 0
    start = time.monotonic()
    worker.start()
    while not done.is_set():
        ticks += 1
        time.sleep(0.001)
    worker.join()
    elapsed = time.monotonic() - start
    assert result["profile"].measured
    # ~1 tick per millisecond when the GIL is free; a held GIL would stall the
    # loop for the whole run (at most a handful of ticks)
    assert elapsed > 0.2 and ticks > 0.2 * elapsed * 1000 / 2


def test_validate_threads_are_bounded(tiny_profile):
    path, _, _ = tiny_profile
    with pytest.raises(ValueError, match="threads = 100000"):
        modar.validate(path, threads=100000, progress=False)


# The defaults belong to the library: the CLI and Python pass only what the
# user said, so the same inputs resolve to the same settings.
@pytest.mark.parametrize(
    "kwargs, flags",
    [
        ({}, []),
        ({"quick": True}, ["--quick"]),
        ({"threads": 2, "clock": "wall"}, ["--threads", "2", "--clock", "wall"]),
        ({"quick": True, "kinds": ["gemm", "rmsnorm"], "max_dim": 64, "budget_s": 0.01},
         ["--quick", "--kinds", "gemm,rmsnorm", "--max-dim", "64", "--budget", "0.01"]),
        ({"dtype": "bf16", "rotate_bytes": 4096}, ["--dtype", "bf16", "--rotate-bytes", "4096"]),
    ],
)
def test_profile_settings_match_the_cli(tmp_path, kwargs, flags):
    out = tmp_path / "p.toml"
    py = modar.profile(out, dry_run=True, **kwargs)
    cli = json.loads(run_cli("profile", "--out", str(out), *flags, "--dry-run"))
    # The estimated duration comes from rates timed on the spot: present and
    # positive in both, not equal to the microsecond.
    assert py.pop("estimated_duration_s") > 0 and cli.pop("estimated_duration_s") > 0
    assert py == cli
    if not kwargs:  # the CPU defaults, in one place
        assert (py["threads"], py["clock"], py["dtype"], py["budget_s"]) == (1, "cpu", "fp32", 0.25)


@pytest.mark.parametrize(
    "kwargs, flags",
    [
        ({}, []),
        ({"quick": True, "rounds": 3}, ["--quick", "--rounds", "3"]),
        ({"threads": 2, "clock": "wall"}, ["--threads", "2", "--clock", "wall"]),
    ],
)
def test_validate_settings_match_the_cli(tiny_profile, kwargs, flags):
    path, prof, _ = tiny_profile
    py = modar.validate(path, dry_run=True, **kwargs)
    cli = json.loads(run_cli("validate", "--profile", str(path), *flags, "--dry-run"))
    assert py == cli
    if not kwargs:  # the profile's recorded clock and threads
        recorded = tomllib.loads(prof.to_toml())["provenance"]
        assert py["clock"] == recorded["clock"] == "cpu"
        assert str(py["threads"]) == recorded["threads"] == "1"


def test_ctrl_c_stops_profiling_and_keeps_the_checkpoint(tmp_path):
    """SIGINT during modar.profile raises KeyboardInterrupt between grid
    points (not after the whole grid) and leaves OUT.partial for resume."""
    import os
    import signal
    import threading
    import time

    out = tmp_path / "interrupted.toml"
    timer = threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT))
    start = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            modar.profile(out, quick=True, kinds=["gemm", "rmsnorm", "elementwise"],
                          budget_s=0.05, progress=False)
    finally:
        timer.cancel()
    elapsed = time.monotonic() - start
    assert not out.exists()
    partial = tmp_path / "interrupted.toml.partial"
    assert partial.exists()
    assert tomllib.loads(partial.read_text())["provenance"]["status"] == "partial"
    assert elapsed < 30  # the full reduced grid takes minutes
