#!/usr/bin/env python3
"""Predict Megatron-LM's weak-scaling throughput (Narayanan et al. 2021, Table 1).

For every row of examples/cluster/megatron_table1.csv, runs
`modar estimate examples/cluster/megatron_base.toml --set ... --json` with the
row's model and layout on the embedded A100 profile (a100-80gb-dgx: the
datasheet profile a100-80gb-dgx-datasheet calibrated on the rows of
megatron_table1_fit.csv, the HELD_OUT rows below left out) and prints predicted vs published TFLOP/s per GPU, counted by
the paper's equation 3:  F = 96 B s l h^2 (1 + s / (6 h) + V / (16 l h)).

Usage: examples/cluster/megatron_table1.py [path/to/modar] [--breakdown]
       examples/cluster/megatron_table1.py --write-runs RUNS.csv

       examples/cluster/megatron_table1.py --write-fit RUNS.csv

--write-fit writes the rows the embedded a100-80gb-dgx profile is calibrated
on: all but the HELD_OUT rows below (examples/cluster/megatron_table1_fit.csv
is this file; docs/validation.md).

--write-runs writes the table as a runs file of `modar calibrate`
(name,config,overrides,step_s): each row's published TFLOP/s per GPU turned
back into seconds per iteration by equation 3 (step = F / (TFLOP/s x GPUs)),
its config megatron_base.toml with the row's model and layout as overrides
(examples/cluster/megatron_table1_runs.csv is this file).

--breakdown also prints, per row, what each 2021 setting of the base config
costs: the predicted TFLOP/s with that one setting switched to what modern
stacks do (FlashAttention, wgrad-fused gradient accumulation, gradient
reduce overlapped with the backward, the input-gradient all-reduce beside the
weight-gradient GEMM), everything else as published.
"""
import csv
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
VOCAB, SEQ = 51200, 2048


def rows():
    with open(os.path.join(HERE, "megatron_table1.csv")) as f:
        lines = [line for line in f if not line.startswith("#")]
    return list(csv.DictReader(lines))


def equation3_flops(batch, layers, hidden, seq=SEQ, vocab=VOCAB):
    return 96.0 * batch * seq * layers * hidden**2 * (
        1.0 + seq / (6.0 * hidden) + vocab / (16.0 * layers * hidden))


def layout_sets(row):
    tp, pp, gpus, layers = int(row["tp"]), int(row["pp"]), int(row["gpus"]), int(row["layers"])
    sets = [
        f"model.d_model={row['hidden']}", f"model.n_layers={layers}",
        f"model.n_heads={row['heads']}", f"parallel.tensor={tp}", f"parallel.pipeline={pp}",
        f"device.count={gpus}", f"train.global_batch={row['batch']}",
    ]
    if pp > 1 and layers % (2 * pp) == 0:
        sets += ["parallel.schedule=interleaved", "parallel.virtual_stages=2"]
    return sets


# The 2021 settings of megatron_base.toml and their modern counterparts.
MODERN = [
    ("attention", "train.attention_kernel=flash"),
    ("grad acc", "train.grad_accumulation=fused"),
    ("DP overlap", "parallel.overlap_grad_reduce=true"),
    ("TP overlap", "parallel.tp_comm_overlap=backward"),
]


def run(modar, base, sets):
    cmd = [modar, "estimate", base, "--json"]
    for s in sets:
        cmd += ["--set", s]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def breakdown(modar, base):
    print()
    print("what each 2021 setting costs: predicted TFLOP/s per GPU with that one setting "
          "modern (the rest as published)")
    print(f"{'params':>8} {'2021':>7} " + " ".join(f"{name:>11}" for name, _ in MODERN) +
          f" {'all modern':>11} {'paper':>6}")
    for row in rows():
        flops = equation3_flops(int(row["batch"]), int(row["layers"]), int(row["hidden"]))
        gpus = int(row["gpus"])
        rate = lambda doc: flops / doc["time"]["step_s"] / gpus / 1e12
        sets = layout_sets(row)
        cells = [rate(run(modar, base, sets + [modern])) for _, modern in MODERN]
        everything = rate(run(modar, base, sets + [m for _, m in MODERN]))
        print(f"{row['params_b']:>7}B {rate(run(modar, base, sets)):7.1f} " +
              " ".join(f"{c:11.1f}" for c in cells) +
              f" {everything:11.1f} {float(row['tflops_per_gpu']):6.0f}")


# Rows kept out of the A100 calibration, one per regime of the table, each
# between two fitted rows (so the check is interpolation in model size, not
# extrapolation), chosen before any fit was run: 3.6B (tensor parallelism
# only), 76.1B (a 4-stage 1F1B pipeline), 529.6B (the 35-stage 1F1B
# pipeline).  The ends (1.7B, 1008B) stay fitted to anchor the range.
HELD_OUT = ("3.6", "76.1", "529.6")


def published_step_s(row):
    """Seconds per iteration implied by the published TFLOP/s per GPU."""
    flops = equation3_flops(int(row["batch"]), int(row["layers"]), int(row["hidden"]))
    return flops / (float(row["tflops_per_gpu"]) * 1e12 * int(row["gpus"]))


def write_runs(path, only_fitted=False):
    """The table as a `modar calibrate` runs file (config paths relative to it)."""
    base = os.path.relpath(os.path.join(HERE, "megatron_base.toml"),
                           os.path.dirname(os.path.abspath(path)))
    with open(path, "w", newline="") as f:
        what = ("without the held-out rows " + ", ".join(h + "B" for h in HELD_OUT) +
                " (--write-fit)") if only_fitted else "all rows (--write-runs)"
        f.write("# Narayanan et al. 2021, Table 1 as measured runs: step_s = equation 3 FLOPs /\n"
                "# (published TFLOP/s per GPU x GPUs); " + what + ", written by\n"
                "# examples/cluster/megatron_table1.py.\n")
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["name", "config", "overrides", "step_s"])
        for row in rows():
            if only_fitted and row["params_b"] in HELD_OUT:
                continue
            writer.writerow([f"gpt-{row['params_b']}b", base, " ".join(layout_sets(row)),
                             f"{published_step_s(row):.6g}"])


def main():
    for flag in ("--write-runs", "--write-fit"):
        if flag in sys.argv[1:]:
            index = sys.argv.index(flag)
            if index + 1 >= len(sys.argv):
                sys.exit(f"{flag}: needs the path of the runs CSV to write")
            write_runs(sys.argv[index + 1], only_fitted=flag == "--write-fit")
            return
    args = [a for a in sys.argv[1:] if a != "--breakdown"]
    modar = args[0] if args else os.environ.get(
        "MODAR", os.path.join(ROOT, "build", "bin", "modar"))
    if not os.access(modar, os.X_OK):
        sys.exit(f"modar binary not found at {modar} (build first, or pass its path)")
    base = os.path.join(HERE, "megatron_base.toml")
    print(f"{'params':>8} {'TP':>3} {'PP':>3} {'v':>2} {'GPUs':>5} {'batch':>5} "
          f"{'step s':>8} {'bubble':>7} {'comm':>6} {'mem GiB':>8} "
          f"{'pred':>6} {'paper':>6} {'error':>7}")
    errors = []
    for row in rows():
        doc = run(modar, base, layout_sets(row))
        par = doc["parallel"]
        step = doc["time"]["step_s"]
        gpus = int(row["gpus"])
        flops = equation3_flops(int(row["batch"]), int(row["layers"]), int(row["hidden"]))
        predicted = flops / step / gpus / 1e12
        published = float(row["tflops_per_gpu"])
        error = predicted / published - 1.0
        errors.append(abs(error))
        print(f"{row['params_b']:>7}B {row['tp']:>3} {row['pp']:>3} "
              f"{par['layout']['virtual_stages']:>2} {gpus:>5} {row['batch']:>5} "
              f"{step:8.2f} {par['time']['bubble_s'] / step:7.1%} "
              f"{par['time']['exposed_comm_s'] / step:6.1%} "
              f"{doc['memory']['peak_bytes'] / 2**30:8.1f} "
              f"{predicted:6.1f} {published:6.0f} {error:+7.1%}")
    print(f"median |error| {statistics.median(errors):.1%}, max |error| {max(errors):.1%} "
          f"(profile a100-80gb-dgx, micro-batch 1, full recompute; held out of its "
          f"calibration: {', '.join(h + 'B' for h in HELD_OUT)})")
    if "--breakdown" in sys.argv[1:]:
        breakdown(modar, base)


if __name__ == "__main__":
    main()
