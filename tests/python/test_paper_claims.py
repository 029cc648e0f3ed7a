"""examples/paper_claims.py: every claim of the two papers that modar meets
today keeps being met.  Each bound below is the paper's own statement (the
criterion the script prints), not modar's current value."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO, _cli

# The claims that hold at the defaults (examples/paper_claims.py prints all of
# them, including the ones that do not hold and the ones not modelled).
HOLDS_TODAY = {
    # The isoFLOP-curve minima (the paper's comparison) at every budget; the
    # recommended shapes where the grid allows.
    "mod.optimum_forward_flops.6e18": (0.93, 1.07),
    "mod.optimum_forward_flops.2e19": (0.93, 1.07),
    "mod.optimum_forward_flops.1e20": (0.93, 1.07),
    "mod.optimum_forward_flops_shapes.6e18": (0.93, 1.07),
    "mod.optimum_forward_flops_shapes.1e20": (0.93, 1.07),
    "mod.optimum_params.6e18": (1.0, None),
    "mod.optimum_params.2e19": (1.0, None),
    "mod.optimum_params.1e20": (1.0, None),
    "mod.optimum_loss_gain.6e18": (0.0, 1.55),
    "mod.optimum_loss_gain.2e19": (0.0, 1.55),
    "mod.optimum_loss_gain.1e20": (0.0, 1.55),
    "mod.parity_forward_flops.6e18": (None, 0.5),
    "mod.parity_forward_flops.2e19": (None, 0.5),
    "mod.parity_forward_flops.1e20": (None, 0.5),
    "mod.same_size_wallclock.6e18": (0.9, 1.1),
    "mod.same_size_wallclock.2e19": (0.9, 1.1),
    "mod.same_size_wallclock.1e20": (0.9, 1.1),
    "mod.baseline_size.6e18": (176e6, 264e6),
    # Sampling, batch 1 (the bound on "upwards of 50 %").
    "mod.sampling_same_size.batch1_issue_bound": (1.3, None),
    "mod.sampling_kv_cache": (None, 1.0),
    # Causal routing (MoD 3.5): the aux-loss router's 0.2-0.3 % and the
    # predictor's none, in the planner's loss.
    "mod.aux_loss_penalty": (0.2, 0.3),
    "mod.predictor_loss_penalty": (-0.05, 0.05),
    # ... and the predictor's training-step cost at the paper's batch (128
    # sequences; micro-batch 16): "not significant", read as under 2 %.
    "mod.predictor_step_cost": (None, 2.0),
    # Figure 7 (MoD 4.3): MoDE < MoE < baseline; the experts' gain grows with
    # the FLOPs per token and the MoE optimum is not below the baseline's.
    "mode.figure7.order": (None, None),
    "mode.figure7.moe_optimum_flops": (0.93, None),
    "mode.figure7.moe.gain_grows": (0.0, None),
    "mode.figure7.mode-integrated.gain_grows": (0.0, None),
    "mode.figure7.mode-staged.gain_grows": (0.0, None),
    # ... and where the curves' gap matches the figure within its readings
    # (the paper's gain 100 (1 - arch / baseline) as read, +-0.6 points): the
    # MoE about zero at 0.25x (1.037 vs 1.035: -0.19 %) and 2.2 % at 1.0x.
    "mode.figure7.moe.gain_0.25x": (-0.19 - 0.6, -0.19 + 0.6),
    "mode.figure7.moe.gain_1x": (2.2 - 0.6, 2.2 + 0.6),
    "mode.figure7.mode-integrated.gain_0.35x": (2.3 - 0.6, 2.3 + 0.6),
    "mode.figure7.mode-integrated.gain_1x": (4.3 - 0.6, 4.3 + 0.6),
    # Staged MoDE (MoD's figure-4 prior x MoE's figure-7 prior, not fitted to
    # the MoDE curve) against the figure's one MoDE curve.
    "mode.figure7.mode-staged.gain_0.35x": (2.3 - 0.6, 2.3 + 0.6),
    "mode.figure7.mode-staged.gain_1x": (4.3 - 0.6, 4.3 + 0.6),
    # DAR Table 5 with the paper's implementation (dar.kernel = prefix,
    # dar.packs = paper, its Triton kernels at dar.prefix_memory_efficiency
    # 0.62 of the HBM peak: Liger-Kernel's published H100 rate, docs/moe.md)
    # at micro-batch 4: -9.16 / -17.54 % within 3 points, +7.7 / +10.7 GiB
    # within 2, DAR over AttnRes +3.1 GiB within 1.5 and -9.23 % within 3
    # points, the single-stream sentence; with modar's fused kernels DAR over
    # AttnRes +3.1 GiB within 1.5.
    "dar.table5.paper_implementation.attnres.throughput": (-12.16, -6.16),
    "dar.table5.paper_implementation.dar.throughput": (-20.54, -14.54),
    "dar.table5.paper_implementation.attnres.memory": (5.7, 9.7),
    "dar.table5.paper_implementation.dar.memory": (8.7, 12.7),
    "dar.table5.paper_implementation.dar_over_attnres.memory": (1.6, 4.6),
    "dar.table5.paper_implementation.dar_over_attnres.throughput": (-12.23, -6.23),
    "dar.table5.paper_implementation.single_stream_most": (0.5, None),
    "dar.table5.fused.dar_over_attnres.memory": (1.6, 4.6),
}


@pytest.fixture(scope="module")
def claims() -> dict:
    script = REPO / "examples" / "paper_claims.py"
    out = subprocess.run([sys.executable, str(script), "--modar", _cli(), "--json"],
                         capture_output=True, text=True, check=True, timeout=600).stdout
    return {row["id"]: row for row in json.loads(out)["claims"]}


def test_every_claim_that_holds_today_still_holds(claims):
    for key, (low, high) in HOLDS_TODAY.items():
        row = claims[key]
        assert row["holds"] is True, (key, row)
        if low is not None:
            assert row["modar"] > low, (key, row["modar"])
        if high is not None:
            assert row["modar"] <= high, (key, row["modar"])


def test_same_size_loss_and_every_claim_is_reported(claims):
    for budget in ("6e18", "2e19", "1e20"):
        assert claims[f"mod.same_size_loss.{budget}"]["holds"] is True
    for row in claims.values():
        assert row["holds"] in (True, False, None)
        assert row["criterion"] and row["paper"]


def test_decode_accounting_adds_up():
    """The batch-1 decode accounting's parts add up to each step (modar's own
    step time, from `modar estimate --step decode`), the LM head is the same
    GEMV in both, and the step ratio is the sampling claim's."""
    script = REPO / "examples" / "paper_claims.py"
    out = json.loads(subprocess.run([sys.executable, str(script), "--modar", _cli(), "--json"],
                                    capture_output=True, text=True, check=True,
                                    timeout=600).stdout)
    parts = out["decode_accounting"]
    for name in ("baseline", "mod"):
        part = parts[name]
        total = sum(v for k, v in part.items() if k != "step")
        assert abs(total - part["step"]) <= 1e-9 * part["step"], name
        assert abs(part["other (overheads)"]) <= 0.01 * part["step"], name
    assert parts["baseline"]["LM head GEMM"] == parts["mod"]["LM head GEMM"]
    claims = {row["id"]: row for row in out["claims"]}
    speed = parts["baseline"]["step"] / parts["mod"]["step"]
    assert abs(speed - claims["mod.sampling_same_size.batch1"]["modar"]) < 1e-9
