"""modar.layout (docs/cluster.md "modar layout"): the same document as
`modar layout CONFIG --gpus N --json`, its views, and one-line errors naming
the argument."""

from __future__ import annotations

import pytest

import modar
from conftest import REPO, run_cli, run_cli_json

LLAMA = REPO / "examples" / "configs" / "llama2_7b.toml"


def test_layout_equals_cli_json():
    result = modar.layout(LLAMA, gpus=8)
    assert result.to_dict() == run_cli_json("layout", LLAMA, "--gpus", "8", "--json")
    assert result["global_batch"] == 1024
    assert result.best["fits"] and result.best["step_s"] > 0


def test_layout_arguments_reach_the_search():
    result = modar.layout(LLAMA, gpus=8, global_batch=256, gpus_per_node=4, top=3,
                          micro_batch=2, profile="a100-80gb-dgx")
    cli = run_cli_json("layout", LLAMA, "--gpus", "8", "--global-batch", "256",
                       "--gpus-per-node", "4", "--set", "train.micro_batch=2",
                       "--profile", "a100-80gb-dgx", "--json")
    assert result.to_dict() == cli
    assert result["gpus_per_node"] == 4 and result["profile"] == "a100-80gb-dgx"
    # The text is the CLI's table (3 rows each).
    text = run_cli("layout", LLAMA, "--gpus", "8", "--global-batch", "256", "--gpus-per-node",
                   "4", "--profile", "a100-80gb-dgx", "--top", "3")
    assert str(result).strip() in text


def test_layout_to_pandas_has_every_layout():
    result = modar.layout(LLAMA, gpus=8)
    frame = result.to_pandas()
    assert len(frame) == len(result["fitting"]) + len(result["not_fitting"])
    fitting = frame[frame["fits"]]
    assert list(fitting["step_s"]) == sorted(fitting["step_s"])
    assert {"parallel.tensor", "parallel.pipeline", "parallel.zero", "memory.peak_bytes",
            "mfu"} <= set(frame.columns)


@pytest.mark.parametrize(
    "kwargs, error, field",
    [({"gpus": 0}, ValueError, "gpus = 0"), ({"gpus": 2**25}, ValueError, "gpus = 33554432"),
     ({"gpus": 8, "global_batch": -1}, ValueError, "global_batch = -1"),
     ({"gpus": 8, "gpus_per_node": 2000}, ValueError, "gpus_per_node = 2000"),
     ({"gpus": 8, "top": 0}, ValueError, "top = 0"), ({"gpus": 8, "n_heads": 33}, ValueError, "n_heads"),
     ({"gpus": "8"}, TypeError, "gpus")],
)
def test_bad_arguments_name_the_field(kwargs, error, field):
    # Values: the library's check (resolve_layout), naming the argument;
    # types: Python's conversion (TypeError), as for every modar call.
    with pytest.raises(error) as raised:
        modar.layout(LLAMA, **kwargs)
    assert field in str(raised.value)
    assert "\n" not in str(raised.value)


def test_layout_progress_counts_every_layout():
    # The callable gets (layouts done, layouts in all); the last report is the
    # final one: every layout the document says was considered.
    seen = []
    result = modar.layout(LLAMA, gpus=8, progress=lambda done, total: seen.append((done, total)))
    assert seen and seen[-1] == (result["considered"], result["considered"])
    assert all(total == result["considered"] for _, total in seen)


def test_layout_progress_callback_error_reaches_the_caller():
    def refuse(done, total):
        raise RuntimeError(f"stop at {done} of {total}")

    with pytest.raises(RuntimeError, match="stop at"):
        modar.layout(LLAMA, gpus=8, progress=refuse)
