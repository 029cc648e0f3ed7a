"""The PyTorch profile (`python -m modar profile --backend torch`): its
settings are the C++ profiler's, bad input is one line with exit 2, and a
real PyTorch on the CPU writes a profile that `modar estimate --profile` uses,
and two ranks (the torchrun environment, gloo) measure the collectives into
its [network].

PyTorch comes from scripts/torch_for_tests.sh, which scripts/test.sh runs
(docs/profiler.md "The PyTorch profile"); the test that needs it skips only
when that script could not install it, with its recorded reason."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import modar
from conftest import REPO, run_cli_json

STATUS = Path(sys.prefix) / ".modar-torch-status"


def _torch_or_skip() -> None:
    """Skip (with the recorded reason) only where PyTorch could not be installed."""
    if importlib.util.find_spec("torch") is not None:
        return
    status = STATUS.read_text().strip() if STATUS.exists() else ""
    if status.startswith("ok"):
        pytest.fail(f"scripts/torch_for_tests.sh recorded '{status}' "
                    "but torch is not importable")
    pytest.skip("PyTorch is not installed in this Python: "
                + (status or "scripts/torch_for_tests.sh link has not run here "
                   f"(scripts/test.sh runs it; it records why in {STATUS})"))


def _module(*args: str, env: dict | None = None, timeout: float = 300):
    return subprocess.run([sys.executable, "-m", "modar", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=REPO)


def test_dry_run_resolves_the_cpp_profilers_defaults(tmp_path, cli):
    """Same grid and defaults as `modar profile --backend cpu` (no PyTorch needed)."""
    common = ["--quick", "--kinds", "gemm,attention", "--max-dim", "64", "--dry-run",
              "--out", str(tmp_path / "p.toml")]
    torch_run = _module("profile", "--backend", "torch", "--device", "cpu", *common)
    assert torch_run.returncode == 0, torch_run.stderr
    ours = json.loads(torch_run.stdout)
    theirs = json.loads(subprocess.run([cli, "profile", "--backend", "cpu", *common],
                                       capture_output=True, text=True, check=True).stdout)
    for key in ("grid", "dtype", "threads", "clock", "budget_s", "points"):
        assert ours[key] == theirs[key], key
    # By hand: quick CPU grid, dims <= 64: GEMM {16, 64}^3 = 8 shapes; attention
    # H in {1, 4, 16} x s in {16, 64} x d_h in {32, 64}, forward and backward = 24.
    assert ours["points"] == 8 + 24
    assert ours["backend"] == "torch" and ours["device"] == "cpu"
    python = modar.profile(tmp_path / "p.toml", backend="torch", device="cpu", quick=True,
                           kinds=["gemm"], max_dim=64, dry_run=True)
    assert python["points"] == 8 and python["threads"] == theirs["threads"]


@pytest.mark.parametrize("args, expected", [
    (["--device", "tpu"], "argument --device: invalid choice: 'tpu'"),
    (["--device", "cpu", "--budget", "-1"], "budget_s = -1: must be in (0, 3600] seconds per shape"),
    (["--device", "cpu", "--kinds", "gemn"], 'kinds: "gemn" is not an op kind of the grid'),
    (["--device", "cpu", "--threads", "-2"], "threads = -2: must be in [0,"),
    (["--device", "cpu", "--comm-max-bytes", "10"], "comm_max_bytes = 10: must be >= 1024"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, expected):
    result = _module("profile", "--backend", "torch", *args, "--out", str(tmp_path / "p.toml"))
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("modar profile: error: ")
    assert not (tmp_path / "p.toml").exists()


def test_out_must_be_a_file_in_an_existing_folder(tmp_path):
    for out, expected in ((tmp_path, "is a directory"),
                          (tmp_path / "missing" / "p.toml", "does not exist")):
        result = _module("profile", "--backend", "torch", "--device", "cpu", "--out", str(out))
        assert result.returncode == 2 and expected in result.stderr, result.stderr
    with pytest.raises(ValueError, match="is a directory"):
        modar.profile(tmp_path, backend="torch", device="cpu", dry_run=True)


def test_profile_on_cpu_is_used_by_estimate(tmp_path, cli):
    """In this process (modar.profile, what `python -m modar profile` calls):
    importing PyTorch costs about 9 CPU seconds, paid once for this test and
    the two-rank one below."""
    _torch_or_skip()
    out = tmp_path / "torch-cpu.toml"
    modar.profile(out, backend="torch", device="cpu", quick=True,
                  kinds=["gemm", "attention", "rmsnorm"], max_dim=64, budget_s=0.002,
                  progress=False)

    doc = tomllib.loads(out.read_text())
    assert doc["backend"] == "torch" and doc["measured"] is True
    p = doc["provenance"]
    assert p["torch"].split("+")[0] == importlib.metadata.version("torch").split("+")[0]
    assert p["status"] == "complete" and p["clock"] == "cpu" and p["threads"] == "1"
    assert "scaled_dot_product_attention" in p["attention"]
    # By hand (quick CPU grid, dims <= 64): GEMM 8, attention 24, rmsnorm
    # rows {16, 64} x d {64} x {forward, backward} = 4.
    rows = doc["measurements"]
    assert int(p["measurement_count"]) == len(rows) == 8 + 24 + 4 - int(p["skipped_count"])
    assert int(p["skipped_count"]) == 0
    by_key = {(m["kind"], m["pass"], tuple(m["dims"])): m for m in rows}
    for m in rows:
        assert m["median_s"] > 0 and m["repeats"] >= 5 and m["spread"] >= 0
    small = by_key[("gemm", "forward", (16, 16, 16, 1))]["median_s"]
    large = by_key[("gemm", "forward", (64, 64, 64, 1))]["median_s"]
    assert large > small  # 64 x the FLOPs
    # The GEMM ceiling is at least the best grid GEMM's rate (2 m n k / t).
    best = max(2 * m["dims"][0] * m["dims"][1] * m["dims"][2] / m["median_s"]
               for m in rows if m["kind"] == "gemm")
    assert doc["ceilings"]["peak_flops_fp32"] >= best * (1 - 1e-12)
    fwd = by_key[("attention", "forward", (1, 16, 16, 64, 64, 64, 1))]["median_s"]
    bwd = by_key[("attention", "backward", (1, 16, 16, 64, 64, 64, 1))]["median_s"]
    assert bwd > fwd  # the backward does about twice the forward's work

    # The profile in use: estimate (CLI and Python) times the tiny config with it.
    tiny = REPO / "examples" / "configs" / "tiny.toml"
    estimate = run_cli_json("estimate", str(tiny), "--profile", str(out), "--json")
    assert estimate["time"]["calibrated"] is True and estimate["time"]["step_s"] > 0
    python = modar.estimate(modar.Config.from_toml(tiny), profile=str(out))
    assert python.to_dict()["time"]["step_s"] == pytest.approx(estimate["time"]["step_s"])


def _rank(rank: int, port: int, out: str, results) -> None:
    """One rank of a two-rank job, as torchrun would start it (its env)."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        modar.profile(out, backend="torch", device="cpu", quick=True, kinds=["gemm"],
                      max_dim=16, budget_s=0.002, comm_max_bytes=4096, progress=False)
        results.put((rank, "ok"))
    except BaseException as error:  # reported to the test, not swallowed
        results.put((rank, repr(error)))


def test_two_ranks_measure_the_collectives(tmp_path):
    """The torchrun path on two gloo ranks, forked from this process (PyTorch
    already imported: no second import): every collective timed on 2 ranks
    into [network] and no deadlock (each rank once chose its own number of
    timed calls, and one waited forever in a collective the other never
    issued)."""
    _torch_or_skip()
    import multiprocessing
    import socket

    import torch  # noqa: F401  (imported before the fork: the children share it)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "two-ranks.toml"
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    ranks = [context.Process(target=_rank, args=(r, port, str(out), results)) for r in (0, 1)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(120)
    hung = [process for process in ranks if process.is_alive()]
    for process in hung:
        process.kill()
    assert not hung, "a rank still ran after 120 s: the collectives deadlocked"
    assert sorted(results.get(timeout=5) for _ in ranks) == [(0, "ok"), (1, "ok")]
    doc = tomllib.loads(out.read_text())
    assert doc["provenance"]["network_ranks"] == "2"
    intra = doc["network"]["intra_node"]
    timed = {table["kind"]: table for table in intra["collectives"]}
    # gloo has no reduce-scatter of a flat tensor: skipped (and said so) or timed.
    assert {"all_reduce", "all_gather", "all_to_all", "send_recv"} <= set(timed)
    for table in timed.values():
        assert table["ranks"] == 2 and table["sizes_bytes"] == [1024.0, 4096.0]
        assert all(t > 0 for t in table["times_s"])
    assert intra["bus_bandwidth"] > 0 and intra["latency_s"] > 0
    # One node measured: the inter-node level is the intra-node one, named so.
    assert "copied" in doc["network"]["inter_node"]["name"]
