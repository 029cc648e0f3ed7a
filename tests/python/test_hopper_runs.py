"""examples/cluster/hopper_runs.csv, NVIDIA's published H100 BF16 runs: the
transcription checks hold on every row and catch a bad one, the calibration
runs file is what --write-fit writes from the rows marked `calibration`, and
those are exactly the runs h100-80gb-dgx's provenance says it was fitted on."""
from __future__ import annotations

import shutil
import sys
import tomllib

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "examples" / "cluster"))
import hopper_runs  # noqa: E402


def test_every_row_passes_its_transcription_checks():
    rows = hopper_runs.read_rows()
    assert len(rows) == 35  # 5 + 6 + 6 Llama 3.1, 5 GPT-3, 8 + 5 Nemotron-4
    assert [r["run"] for r in rows if r["role"] == "calibration"] == [
        "Llama 3.1 8B 8xH100", "Llama 3.1 8B 128xH100", "Llama 3.1 70B 64xH100",
        "Llama 3.1 70B 1024xH100", "Llama 3.1 405B 32xH100 (7 layers)",
        "Llama 3.1 405B 576xH100"]


def test_a_transcription_error_is_one_line_naming_row_column_and_value(tmp_path):
    text = (REPO / "examples" / "cluster" / "hopper_runs.csv").read_text()
    # GPT-3 175B on 128 GPUs: 2048 x 256 / 8.309 s = 63,099 tokens/s; a digit swapped.
    bad = tmp_path / "runs.csv"
    bad.write_text(text.replace(",8.309,63099,", ",8.309,60399,", 1))
    with pytest.raises(hopper_runs.RowError) as error:
        hopper_runs.read_rows(str(bad))
    message = str(error.value)
    assert "\n" not in message
    assert "GPT-3 175B 128xH100" in message and "'tokens_per_s' = '60399'" in message
    bad.write_text(text.replace("held out,96,12288,96,96", "held out,95,12288,96,96", 1))
    with pytest.raises(hopper_runs.RowError, match="column 'layers' = '95'"):
        hopper_runs.read_rows(str(bad))


def test_the_fit_file_is_what_write_fit_writes(tmp_path):
    out = tmp_path / "fit.csv"
    hopper_runs.write_fit(str(out))
    committed = REPO / "examples" / "cluster" / "hopper_runs_fit.csv"
    assert out.read_text() == committed.read_text()


def test_the_calibration_rows_are_the_profiles_fitted_runs():
    with open(REPO / "profiles" / "h100-80gb-dgx.toml", "rb") as f:
        provenance = tomllib.load(f)["provenance"]
    fitted = [provenance[k].split(":", 1)[0] for k in sorted(provenance)
              if k.startswith("calibration_run.")]
    marked = [r["run"] for r in hopper_runs.read_rows() if r["role"] == "calibration"]
    assert fitted == marked
    assert "hopper_runs_fit.csv" in provenance["calibration_command"]


def test_carry_over_writes_the_h100_values_into_h200_and_h800_and_nothing_else(tmp_path):
    for name in ("h100-80gb-dgx", "h200", "h800-80gb-hgx"):
        shutil.copy(REPO / "profiles" / f"{name}.toml", tmp_path / f"{name}.toml")
    h200 = tmp_path / "h200.toml"
    original = h200.read_text()
    h200.write_text(original.replace("gemm_efficiency = 0.", "gemm_efficiency = 0.1", 1)
                    .replace('gemm_efficiency = "0.', 'gemm_efficiency = "0.1', 1))
    assert h200.read_text() != original
    hopper_runs.carry_over(str(tmp_path))
    assert h200.read_text() == original  # the committed profile already carries them
    with open(tmp_path / "h100-80gb-dgx.toml", "rb") as f:
        h100 = tomllib.load(f)["kernel"]
    for name in ("h200", "h800-80gb-hgx"):
        with open(tmp_path / f"{name}.toml", "rb") as f:
            doc = tomllib.load(f)
        for key in ("gemm_efficiency", "attention_efficiency"):
            assert doc["kernel"][key] == h100[key]
            assert doc["provenance"][key].startswith(repr(h100[key]) + ":")
