"""The fast Python path: single estimates without a TOML round trip, profiles
cached by name / path + modification time, and modar.estimate_batch (many
configurations in C++ with the GIL released) -- checked against the CLI's
--json documents (another process, no cache) and hand formulas."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pandas as pd
import pytest

import modar
from conftest import run_cli_json


def flatten(document: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in document.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


CONFIGS = [
    dict(d_model=512, n_layers=6, n_heads=8, seq_len=512, train={"micro_batch": 2}),
    dict(d_model=1024, n_layers=12, n_heads=16, seq_len=1024, mlp="swiglu",
         mod={"capacity": 0.25, "every": 2}),
    dict(d_model=768, n_layers=8, n_heads=12, seq_len=2048, dar={"variant": "dar", "block_layers": 2},
         train={"micro_batch": 4, "global_batch": 32, "recompute": "full"}, device={"count": 2}),
    dict(d_model=512, n_layers=4, n_heads=8, seq_len=512,
         moe={"experts": 8, "top_k": 2, "shared_experts": 1}),
]


def test_batch_rows_equal_cli_documents(tmp_path):
    configs = [modar.Config(profile="cpu-generic", **c) for c in CONFIGS]
    frame = modar.estimate_batch(configs)
    assert list(frame.columns) == list(modar._core.batch_columns())
    assert len(frame) == len(configs)
    for i, config in enumerate(configs):
        path = config.save(tmp_path / f"c{i}.toml")
        cli = flatten(run_cli_json("estimate", str(path), "--json"))
        for column in frame.columns:
            assert frame[column][i] == cli[column], (i, column)


def test_batch_columns_match_the_narayanan_formula():
    # docs/cost_model.md counting: training FLOPs per token 72 L d^2 (1 + s/(6d) + V/(12 L d)),
    # full attention convention, GELU 4d, untied head, no recompute.
    base = modar.Config(d_model=1024, n_heads=16, seq_len=2048, vocab_size=50304,
                        mlp="gelu", tie_embeddings=False, attention_flops="full")
    layers = np.arange(2, 65, dtype=np.int64)  # (dar.block_layers = 2 needs 2 layers on this branch)
    seq = np.where(layers % 2 == 0, 1024, 2048).astype(np.int64)
    frame = modar.estimate_batch({"n_layers": layers, "model.seq_len": seq}, base=base)
    assert list(frame.columns[:2]) == ["n_layers", "model.seq_len"]
    assert (frame["n_layers"] == layers).all()
    d, vocab = 1024, 50304
    expected = 72 * layers * d**2 * (1 + seq / (6 * d) + vocab / (12 * layers * d))
    np.testing.assert_allclose(frame["flops.train_per_token"], expected, rtol=1e-12)


def test_batch_from_a_dataframe_equals_single_estimates():
    table = pd.DataFrame({
        "model.n_layers": [4, 8, 12, 16],
        "mod.capacity": [0.125, 0.25, 0.5, 1.0],
        "mod.every": [2, 2, 4, 4],
        "dar.variant": ["none", "dar", "attnres", "dar"],
        "train.recompute": ["none", "selective", "full", "none"],
    })
    base = modar.Config(d_model=512, n_heads=8, seq_len=512)
    frame = modar.estimate_batch(table, base=base, profile="cpu-generic", step="decode")
    for i, row in table.iterrows():
        single = modar.estimate(base, profile="cpu-generic", step="decode",
                                n_layers=int(row["model.n_layers"]), capacity=float(row["mod.capacity"]),
                                every=int(row["mod.every"]), variant=row["dar.variant"],
                                recompute=row["train.recompute"])
        doc = flatten(single.to_dict())
        for column in modar._core.batch_columns():
            assert frame[column][i] == doc[column], (i, column)
        assert single.step_s == doc["time.step_s"] and single.fits == doc["memory.fits"]


def test_batch_threads_equal_serial():
    rng = np.random.default_rng(1)
    rows = 20_000
    table = {"n_layers": rng.integers(2, 48, rows), "capacity": rng.uniform(0.05, 1.0, rows),
             "every": rng.integers(2, 5, rows)}
    serial = modar.estimate_batch(table, threads=1)
    parallel = modar.estimate_batch(table, threads=3)
    pd.testing.assert_frame_equal(serial, parallel)


def test_batch_errors_raise_or_mark():
    table = {"n_heads": [8, 7, 16, 0]}  # 7 does not divide 1024, 0 is not positive
    base = modar.Config(d_model=1024)
    with pytest.raises(ValueError, match=r"^row 1: model\.n_heads = 7: must divide"):
        modar.estimate_batch(table, base=base)
    marked = modar.estimate_batch(table, base=base, errors="mark")
    assert pd.isna(marked["error"][0]) and pd.isna(marked["error"][2])
    assert "model.n_heads = 7" in marked["error"][1] and "model.n_heads = 0" in marked["error"][3]
    assert np.isnan(marked["time.step_s"][1]) and not marked["memory.fits"][1]
    good = modar.estimate(base, n_heads=16)
    assert marked["time.step_s"][2] == good.step_s


@pytest.mark.parametrize(
    "table, kwargs, error, text",
    [
        ({"d_modle": [512]}, {}, ValueError, "d_modle"),
        ({"model.d_model = 64\nmodel.n_layers": [512]}, {}, ValueError, "model.d_model = 64"),
        ({"n_layers": [1.5, 2.0]}, {}, ValueError, "model.n_layers"),
        ({"n_layers": ["4"]}, {}, ValueError, "model.n_layers"),
        ({"mlp": [3]}, {}, ValueError, "model.mlp"),
        ({"n_layers": [4, 8], "d_model": [512]}, {}, ValueError, "d_model"),
        ({"n_layers": 4}, {}, TypeError, "n_layers"),
        ("n_layers", {}, TypeError, "table"),
        ({"n_layers": [4]}, {"errors": "ignore"}, ValueError, "errors"),
        ({"n_layers": [4]}, {"threads": 0}, ValueError, "threads"),
        ({"n_layers": [4]}, {"threads": "2"}, TypeError, "threads"),
        ({"n_layers": [4]}, {"step": 1}, TypeError, "step"),
        ({"capacity": [float("nan")]}, {}, ValueError, "mod.capacity"),
    ],
)
def test_batch_bad_input_names_the_field(table, kwargs, error, text):
    with pytest.raises(error) as info:
        modar.estimate_batch(table, **kwargs)
    assert text in str(info.value)
    assert "\n" not in str(info.value)


def test_batch_releases_the_gil():
    rows = 300_000
    table = {"n_layers": np.tile(np.arange(2, 50, dtype=np.int64), rows // 48 + 1)[:rows]}
    result = {}

    def work():
        result["frame"] = modar.estimate_batch(table)

    worker = threading.Thread(target=work)
    ticks = 0
    start = time.monotonic()
    worker.start()
    while worker.is_alive():
        ticks += 1
        time.sleep(0.001)
    worker.join()
    elapsed = time.monotonic() - start
    assert len(result["frame"]) == rows
    # ~1 tick per millisecond while the GIL is free; a held GIL would allow a
    # handful over the whole call
    assert elapsed < 0.05 or ticks > 0.2 * elapsed * 1000 / 2


def _interrupt_after(seconds: float) -> threading.Timer:
    timer = threading.Timer(seconds, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    return timer


def test_batch_honours_ctrl_c_promptly():
    rows = 4_000_000  # seconds of work: the interrupt must cut it short
    table = {"n_layers": np.full(rows, 24, dtype=np.int64)}
    timer = _interrupt_after(0.5)
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        modar.estimate_batch(table)
    timer.join()
    assert time.monotonic() - start < 0.5 + 3.0


def test_sweep_honours_ctrl_c_promptly():
    timer = _interrupt_after(0.5)
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        modar.sweep(np.geomspace(1e18, 1e24, 40), arch=["baseline", "mod", "dar", "mod+dar"],
                    capacity=[0.125, 0.25, 0.5], every=[2, 3, 4], block_layers=[1, 2, 4],
                    streams=[2, 3, 4], progress=False)
    timer.join()
    assert time.monotonic() - start < 0.5 + 3.0


def _profile_file(path, peak_flops_bf16: float):
    text = modar.load_profile("h200").to_toml()
    lines = [f"peak_flops_bf16 = {peak_flops_bf16!r}" if line.startswith("peak_flops_bf16") else line
             for line in text.splitlines()]
    assert any(line.startswith("peak_flops_bf16") for line in text.splitlines())
    path.write_text("\n".join(lines) + "\n")
    return path


def test_profile_file_is_read_again_when_it_changes(tmp_path):
    path = _profile_file(tmp_path / "dev.toml", 989e12)
    config = modar.Config(d_model=1024, n_heads=16, seq_len=1024)
    first = modar.estimate(config, profile=str(path))
    assert first.to_dict() == run_cli_json("estimate", config.save(tmp_path / "c.toml"), "--profile",
                                           str(path), "--json")
    again = modar.estimate(config, profile=str(path))
    assert again.to_dict() == first.to_dict()
    # rewrite the file: another size and modification time -> read again
    _profile_file(path, 494.5e12)
    changed = modar.estimate(config, profile=str(path))
    cli = run_cli_json("estimate", tmp_path / "c.toml", "--profile", str(path), "--json")
    assert changed.to_dict() == cli
    assert changed.mfu == pytest.approx(cli["time"]["mfu"]) and changed.mfu != first.mfu


def test_single_estimate_reads_the_structs_lazily():
    result = modar.estimate(modar.Config(d_model=512, n_heads=8))
    assert "_document" not in result.__dict__  # nothing built yet
    step = result.step_s
    assert "_document" not in result.__dict__
    assert result.to_dict()["time"]["step_s"] == step
    assert result["params"]["total"] == result.params_total


def test_batch_moe_columns_follow_the_spec_definition():
    # docs/model.md experts: a token touches top_k of the E routed experts, so the active
    # parameters are the total less (1 - top_k / E) of the routed experts'.
    # Routed expert parameters by hand: GELU expert 2 d d_e weights per expert
    # (expert_ffn defaults to d_ff = 4 d), E experts in every MoE layer.
    d, layers, experts, top_k = 512, 4, 8, 2
    config = modar.Config(profile="cpu-generic", d_model=d, n_layers=layers, n_heads=8, seq_len=512,
                          mlp="gelu", moe={"experts": experts, "top_k": top_k})
    row = modar.estimate_batch([config]).iloc[0]
    moe_layers = row["params.experts"] / (experts * 2 * d * 4 * d)
    assert moe_layers == pytest.approx(round(moe_layers)) and 1 <= round(moe_layers) <= layers
    assert row["params.active"] == pytest.approx(
        row["params.total"] - row["params.experts"] * (1 - top_k / experts), rel=1e-12)
    dense = modar.estimate_batch([modar.Config(profile="cpu-generic", d_model=d, n_layers=layers,
                                               n_heads=8, seq_len=512, mlp="gelu")]).iloc[0]
    assert dense["params.experts"] == 0 and dense["params.active"] == dense["params.total"]
