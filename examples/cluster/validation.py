#!/usr/bin/env python3
"""Write docs/validation.md: modar's predictions against published training
runs, with the embedded GPU profiles as built (no per-row settings).

    python3 examples/cluster/validation.py [path/to/modar] [--out docs/validation.md]

Without --out it prints the document.  What it contains:

- how each embedded GPU profile was made (its provenance: datasheet + GPU
  kernel model, or `modar calibrate` on named runs, with the command);
- Narayanan et al. 2021 Table 1 (examples/cluster/megatron_table1.csv) on the
  embedded a100-80gb-dgx profile, each row marked `fitted` when the profile's
  provenance lists it among the runs it was calibrated on, else `held out`;
- `modar calibrate`'s own cross-validation on the whole table
  (examples/cluster/megatron_table1_runs.csv) from the uncalibrated base
  profile: each run's leave-one-out error;
- every run of examples/cluster/published_runs.csv, which no calibration
  reads: held out;
- MosaicML's llm-foundry MPT benchmarks (examples/cluster/mpt_llm_foundry.csv,
  examples/cluster/mpt_llm_foundry.py): held out, with the error by regime.

Each prediction is `modar estimate --json` on the row's model and layout.
"""
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import tomllib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import megatron_table1 as table1  # noqa: E402
import hopper_runs as hopper  # noqa: E402
import mpt_llm_foundry as mpt  # noqa: E402

A100 = "a100-80gb-dgx"
A100_BASE = "a100-80gb-dgx-datasheet"  # what a100-80gb-dgx is calibrated from
H100_BASE = "h100-80gb-dgx-datasheet"  # what h100-80gb-dgx is calibrated from
GPU_PROFILES = (A100, A100_BASE, "h100-80gb-dgx", H100_BASE, "h200", "h800-80gb-hgx")

# The base configuration of each `settings` value: "2021" = the 2021
# Megatron-LM settings, the same file Table 1 runs on (megatron_base.toml:
# unfused attention and gradient accumulation, synchronous TP all-reduces, no
# gradient-reduce overlap, dropout 0.1, tied embeddings); "modern" = today's
# defaults (dense.toml, untied head).  The row sets its model, layout and dtype.
BASES = {"2021": os.path.join(HERE, "megatron_base.toml"),
         "modern": os.path.join(ROOT, "examples", "configs", "dense.toml")}
MODERN = ["model.tie_embeddings=false"]
# BLOOM's Jean Zay nodes: 4 x 100 Gb/s Omni-Path per 8 GPUs.  The per-GPU
# figure the planner reads is one link's bandwidth shared by 2 GPUs, at the
# same achieved / line-rate fraction (0.86) as the A100 profile's HDR figure
# (21.5 of 25 GB/s).
NETWORKS = {"omnipath4x100": ("inter_node", 12.5e9 * 0.86 / 2,
                              "4 x 100 Gb/s Omni-Path per 8 GPUs: 12.5 GB/s x 0.86 / 2")}


class Failure(Exception):
    pass


def rows(path):
    with open(path) as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def profile_file(name):
    return os.path.join(ROOT, "profiles", name + ".toml")


def profile_toml(name):
    path = profile_file(name)
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        return tomllib.load(f)


def calibrated_on(name):
    """The run names the profile's provenance says it was calibrated on, in its order."""
    doc = profile_toml(name) or {}
    provenance = doc.get("provenance", {})
    return [provenance[key].split(":", 1)[0] for key in sorted(provenance)
            if key.startswith("calibration_run.")]


def modar_json(modar, arguments):
    result = subprocess.run([modar] + arguments, capture_output=True, text=True)
    if result.returncode != 0:
        raise Failure(f"modar {' '.join(arguments[:2])} failed: {result.stderr.strip()}")
    return json.loads(result.stdout)


def estimate(modar, base, sets, profile=None):
    arguments = ["estimate", base, "--json"] + [a for s in sets for a in ("--set", s)]
    if profile:
        arguments += ["--profile", profile]
    return modar_json(modar, arguments)


def layout_text(tp, pp, vp, dp, extra=""):
    text = f"TP {tp} x PP {pp}" + (f" (v {vp})" if int(vp) > 1 else "") + f" x DP {dp}"
    return text + (f", {extra}" if extra else "")


def table1_rows(modar, fitted):
    base = os.path.join(HERE, "megatron_base.toml")
    out = []
    for row in table1.rows():
        name = f"gpt-{row['params_b']}b"
        doc = estimate(modar, base, table1.layout_sets(row))
        gpus = int(row["gpus"])
        flops = table1.equation3_flops(int(row["batch"]), int(row["layers"]), int(row["hidden"]))
        tp, pp = int(row["tp"]), int(row["pp"])
        out.append({
            "run": f"GPT {row['params_b']}B", "role": "fitted" if name in fitted else "held out",
            "gpus": gpus,
            "layout": layout_text(tp, pp, doc["parallel"]["layout"]["virtual_stages"],
                                  gpus // (tp * pp)),
            "published": float(row["tflops_per_gpu"]),
            "predicted": flops / doc["time"]["step_s"] / gpus / 1e12})
    return out


def published_row_sets(row):
    sets = [f"model.n_layers={row['layers']}", f"model.d_model={row['hidden']}",
            f"model.n_heads={row['heads']}", f"model.n_kv_heads={row['kv_heads']}",
            f"model.mlp={row['mlp']}", f"model.vocab_size={row['vocab']}",
            f"model.seq_len={row['seq']}", f"train.global_batch={row['batch']}",
            f"train.micro_batch={row['micro_batch']}", f"parallel.tensor={row['tp']}",
            f"parallel.pipeline={row['pp']}", f"parallel.zero={row['zero']}",
            f"device.count={row['gpus']}", f"train.recompute={row['recompute']}",
            f"train.dtype={row['dtype']}"]
    if int(row["ffn"]) > 0:
        sets.append(f"model.d_ff={row['ffn']}")
    if int(row["vp"]) > 1:
        sets += ["parallel.schedule=interleaved", f"parallel.virtual_stages={row['vp']}"]
    if int(row["tp"]) > 1 and row["settings"] == "modern":
        sets.append("parallel.sequence_parallel=true")
    if row["settings"] not in BASES:
        raise Failure(f"published_runs.csv: run '{row['run']}', column 'settings' = "
                      f"'{row['settings']}': must be 2021 or modern")
    return sets + (MODERN if row["settings"] == "modern" else []) + row["overrides"].split()


def network_profile(row, folder):
    """The row's profile with its published network (BLOOM), else None."""
    if not row["network"]:
        return None, ""
    level, busbw, why = NETWORKS[row["network"]]
    with open(profile_file(row["profile"])) as f:
        lines = f.read().splitlines()
    out, section = [], ""
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("["):
            section = stripped
        if section == f"[network.{level}]" and stripped.startswith("bus_bandwidth"):
            line = f"bus_bandwidth = {busbw!r}"
        out.append(line)
    path = os.path.join(folder, row["run"].replace(" ", "_") + ".toml")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
    return path, f"network: {why}"


def predicted_metric(row, doc):
    gpus, step = int(row["gpus"]), doc["time"]["step_s"]
    metric = row["metric"]
    if metric == "step_s":
        return step, "s per iteration"
    if metric == "tflops_eq3":
        flops = table1.equation3_flops(int(row["batch"]), int(row["layers"]), int(row["hidden"]),
                                       seq=int(row["seq"]), vocab=int(row["vocab"]))
        return flops / step / gpus / 1e12, "TFLOP/s per GPU (eq. 3)"
    if metric == "tflops_model":  # model FLOPs: MFU x the profile's bf16 peak
        peak = profile_toml(row["profile"])["ceilings"]["peak_flops_bf16"]
        return doc["time"]["mfu"] * peak / 1e12, "model TFLOP/s per GPU"
    if metric == "gpu_hours":
        return float(row["tokens"]) / doc["time"]["tokens_per_s"] * gpus / 3600.0, "GPU-hours"
    raise Failure(f"published_runs.csv: run '{row['run']}', column 'metric' = '{metric}': "
                  "must be step_s, tflops_eq3, tflops_model or gpu_hours")


def other_rows(modar, folder):
    out = []
    for row in rows(os.path.join(HERE, "published_runs.csv")):
        profile, network_note = network_profile(row, folder)
        sets = published_row_sets(row)
        if not profile:
            sets.append(f"device.profile={row['profile']}")
        doc = estimate(modar, BASES[row["settings"]], sets, profile)
        predicted, label = predicted_metric(row, doc)
        gpus = int(row["gpus"])
        dp = gpus // (int(row["tp"]) * int(row["pp"]))
        out.append({
            "run": row["run"], "role": "held out", "source": row["source"], "gpus": gpus,
            "profile": row["profile"],
            "layout": layout_text(row["tp"], row["pp"], row["vp"], dp,
                                  f"ZeRO {row['zero']}, micro-batch {row['micro_batch']}"),
            "metric": label, "published": float(row["published"]), "predicted": predicted,
            "assumed": "; ".join(x for x in (row["assumed"], network_note) if x),
            "bubble_share": doc.get("parallel", {}).get("time", {}).get("bubble_s", 0.0) /
            doc["time"]["step_s"],
            "deeper_interleaving": deeper_interleaving(modar, row, sets, profile)})
    return out


def deeper_interleaving(modar, row, sets, profile):
    """The row's prediction at v 4 where the source leaves the interleaving open
    (Llama 3 405B: 'the paper tunes its own interleaving'): a sensitivity, not a fit."""
    if not row["run"].startswith("Llama 3 405B"):
        return None
    doc = estimate(modar, BASES[row["settings"]], sets + ["parallel.virtual_stages=4"], profile)
    return predicted_metric(row, doc)[0]


def fit_parameters(name):
    """The --fit list of the profile's calibration command ([] = the defaults)."""
    command = ((profile_toml(name) or {}).get("provenance", {})
               .get("calibration_command", "")).split()
    return command[command.index("--fit") + 1].split(",") if "--fit" in command else []


def loo_rows(modar, base_profile, folder):
    """`modar calibrate` on the whole Table 1 from the uncalibrated profile,
    fitting what the embedded A100 was fitted with."""
    runs = os.path.join(HERE, "megatron_table1_runs.csv")
    fit = fit_parameters(A100)
    doc = modar_json(modar, ["calibrate", runs, "--profile", base_profile, "--out",
                             os.path.join(folder, "all.toml"), "--json", "--quiet"] +
                     (["--fit", ",".join(fit)] if fit else []))
    doc["fit"] = fit
    return doc


def fmt(value):
    if value < 10:
        return f"{value:.2f}"  # seconds per iteration of small runs (1.42 s)
    return f"{value:,.1f}" if value < 1e4 else f"{value:,.0f}"


def pct(value):
    return f"{value:+.1%}"


def summary(errors, what):
    if not errors:
        return ""
    return (f"{what}: |error| median {statistics.median(errors):.1%}, max {max(errors):.1%} "
            f"({len(errors)} runs)")


def profiles_section(lines):
    lines += ["## How the embedded GPU profiles were made", "",
              "| profile | made from | calibrated on |", "|---|---|---|"]
    for name in GPU_PROFILES:
        doc = profile_toml(name)
        if doc is None:
            continue
        provenance = doc.get("provenance", {})
        how = provenance.get("how") or "datasheet ceilings (roofline), not fitted to any run"
        command = provenance.get("calibration_command")
        if command:
            fitted = calibrated_on(name)
            base = provenance.get("calibration", "")
            made = f"`modar calibrate` ({base}); reproduce: `{command}`"
            on = f"{len(fitted)} runs: " + ", ".join(fitted)
        else:
            made, on = how, "nothing (no run's step time was fitted)"
        lines.append(f"| `{name}` | {made} | {on} |")
    lines.append("")


def table1_section(lines, t1, fitted):
    lines += ["## Narayanan et al. 2021, Table 1 (A100, Megatron-LM 2021)", "",
              "Source: Narayanan et al., *Efficient Large-Scale Language Model Training on GPU "
              "Clusters Using Megatron-LM*, SC 2021 (arXiv 2104.04473), Table 1: weak scaling, "
              "TFLOP/s per GPU by their equation 3.  Layouts as published; the 2021 settings of "
              "`examples/cluster/megatron_base.toml` (docs/cluster.md), micro-batch 1, full "
              "recomputation; profile `a100-80gb-dgx`.  The rows the profile was not "
              "calibrated on were chosen before any fit (`HELD_OUT` in "
              "`examples/cluster/megatron_table1.py`: one per regime, each between two fitted "
              "rows).", "",
              "| run | role | GPUs | layout | published | predicted | error |",
              "|---|---|---|---|---|---|---|"]
    for r in t1:
        lines.append(f"| {r['run']} | {r['role']} | {r['gpus']} | {r['layout']} | "
                     f"{fmt(r['published'])} | {fmt(r['predicted'])} | "
                     f"{pct(r['predicted'] / r['published'] - 1.0)} |")
    errors = [abs(r["predicted"] / r["published"] - 1.0) for r in t1]
    held = [e for r, e in zip(t1, errors) if r["role"] == "held out"]
    fit = [e for r, e in zip(t1, errors) if r["role"] == "fitted"]
    lines += ["", summary(errors, "All rows") + ("; " + summary(fit, "fitted") if fit else "") +
              ("; " + summary(held, "held out") if held and fit else ""), ""]
    if not fitted:
        lines += ["The profile was calibrated on none of these rows: every one is held out.", ""]


def loo_section(lines, doc, base_profile):
    lines += ["## `modar calibrate` cross-validated on Table 1", "",
              f"`modar calibrate examples/cluster/megatron_table1_runs.csv --profile "
              f"{base_profile}" + (f" --fit {','.join(doc['fit'])}" if doc["fit"] else "") +
              "` (all ten rows, " + ("the parameters the embedded profile was fitted with"
                                    if doc["fit"] else "the five default parameters") +
              "): each row's "
              "step time predicted by a fit to the other nine (leave-one-out).  Errors are of "
              "the step time (predicted / measured - 1), the published TFLOP/s turned into "
              "seconds per iteration by equation 3.", "",
              "| run | measured s | base profile | calibrated on all ten | leave-one-out |",
              "|---|---|---|---|---|"]
    for r in doc["runs"]:
        base_error = r["base_predicted_s"] / r["measured_s"] - 1.0
        lines.append(f"| {r['name']} | {r['measured_s']:.2f} | {pct(base_error)} | "
                     f"{pct(r['error'])} | {pct(r['loo_error'])} |")
    s = doc["summary"]
    lines += ["", f"Calibrated on all ten: |error| median {s['median_abs_error']:.1%}, max "
              f"{s['max_abs_error']:.1%}; leave-one-out: median "
              f"{s['loo_median_abs_error']:.1%}, max {s['loo_max_abs_error']:.1%}.", "",
              "| parameter | base | fitted | standard error |", "|---|---|---|---|"]
    for p in doc["parameters"]:
        error = p.get("standard_error")
        note = ("not determined" if not p["determined"] else
                f"{error:.3g}" if error is not None else "n/a") + (
                    " (at its bound)" if p.get("at_bound") else "")
        lines.append(f"| `{p['name']}` | {p['base']:.4g} | {p['value']:.4g} | {note} |")
    lines.append("")


def korthikanti_lines(others):
    """What the Korthikanti et al. 2022 rows (Megatron-LM 2022, A100) say."""
    rows = {r["run"]: r for r in others if r["run"].endswith("(2022)")}
    if not rows:
        return []
    errors = [abs(r["predicted"] / r["published"] - 1.0) for r in rows.values()]
    gains = []
    for size in ("22B", "175B", "530B", "1T"):
        full = rows.get(f"GPT {size} full recompute (2022)")
        present = rows.get(f"GPT {size} SP + selective (2022)")
        if full and present:
            gains.append(f"{size} {full['published'] / present['published'] - 1.0:.1%} "
                         f"(modar {full['predicted'] / present['predicted'] - 1.0:.1%})")
    return [
        "Korthikanti et al. 2022 (Megatron-LM of 2022 on the same Selene A100 nodes as Table "
        "1; data-parallel size 1, so no gradient reduction): " + summary(errors, "these rows")
        + ".  The throughput gain of sequence parallelism + selective recomputation over full "
        "recomputation, published and predicted: " + ", ".join(gains) + ".  The 22B rows "
        "are the same regime as Table 1's 18.4B row (hidden 6144, TP 8, no pipeline) and are "
        "predicted too fast where 18.4B is predicted too slow: the TP-heavy Table 1 residuals "
        "are not a tensor-parallel cost modar misses in one direction (docs/calibrate.md, "
        "\"Table 1 leave-one-out\").", ""]


def mtnlg_range(others):
    """'13-17%': how much too fast the MT-NLG rows are predicted."""
    fast = sorted(-(r["predicted"] / r["published"] - 1.0) * 100.0 for r in others
                  if r["run"].startswith("MT-NLG"))
    return f"{fast[0]:.0f}-{fast[-1]:.0f}%" if fast else "n/a"


def llama3_lines(others):
    """Where the Llama 3 405B rows (Dubey et al. 2024, H100) stand and why."""
    rows = [r for r in others if r.get("deeper_interleaving")]
    if not rows:
        return []
    parts = [f"{r['run']} {pct(r['predicted'] / r['published'] - 1.0)} (bubble "
             f"{r['bubble_share']:.0%} of the step; at v 4 "
             f"{pct(r['deeper_interleaving'] / r['published'] - 1.0)})" for r in rows]
    return ["Llama 3 405B (Dubey et al. 2024) on the calibrated `h100-80gb-dgx`: " +
            "; ".join(parts) + ".  Meta publishes TP 8 x PP 16 with 16M tokens per batch "
            "(32 or 16 micro-batches per pipeline per step) but not its interleaving (the paper "
            "tunes its own schedule); at the v 2 assumed here the pipeline bubble is the gap, "
            "and a deeper interleaving closes most of it.  The assumption stays as fixed "
            "before comparing; the v 4 figures are a sensitivity, not a fit.", ""]


def others_section(lines, others):
    lines += ["## Other published runs (held out of every calibration)", "",
              "No calibration reads these rows (`examples/cluster/published_runs.csv`, sources "
              "in the file).  Where a source does not publish a setting, the choice made is in "
              "`assumed`, fixed before comparing.", "",
              "| run | role | source | profile | GPUs | layout | metric | published | predicted "
              "| error | assumed |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in others:
        lines.append("| " + " | ".join([
            r["run"], r["role"], r["source"], f"`{r['profile']}`", str(r["gpus"]), r["layout"],
            r["metric"], fmt(r["published"]), fmt(r["predicted"]),
            pct(r["predicted"] / r["published"] - 1.0), r["assumed"]]) + " |")
    errors = [abs(r["predicted"] / r["published"] - 1.0) for r in others]
    lines += ["", summary(errors, "All rows") + ".", ""] + korthikanti_lines(others) + [
              "MT-NLG 530B: what the rows run is what Smith et al. 2022 publish (section 2.4: "
              "bf16 mixed precision, so fp32 main gradients; TP 8 x PP 35, 1F1B, batch 1920, "
              "seq 2048; full recomputation; the data-parallel gradient all-reduce between "
              "nodes over one 200 Gb/s HDR NIC per GPU, after the backward) with the 2021 "
              "Megatron-LM settings of `megatron_base.toml`; micro-batch 1 is assumed.  They "
              f"are still predicted {mtnlg_range(others)} too fast, and that stays unexplained: "
              "the same model "
              "on Megatron-LM's own run of this shape (Table 1's 529.6B row: TP 8 x PP 35, "
              "micro-batch 1, batch 2520 on 2520 GPUs, 163 TFLOP/s published, MT-NLG 126 at "
              "2240 GPUs) is within a few percent, so the gap is in the DeepSpeed + Megatron "
              "stack of the MT-NLG runs (DeepSpeed's pipeline engine), which modar's Megatron-LM "
              "model does not describe, not in the shapes.  Nothing is fitted to these rows.", "",
              ] + llama3_lines(others) + [
              "Hopper profiles: `h100-80gb-dgx` is calibrated on six of NVIDIA's published "
              "H100 BF16 runs (the section above); `h200` and `h800-80gb-hgx` carry its fitted "
              "GEMM and attention efficiencies over to their own datasheet memory and NVLink "
              "(same SM: an assumption, in each profile's provenance).  The two Llama 3 405B "
              "rows above (H100, Dubey et al. 2024, Table 4) are held out of that calibration.  "
              "No published H200 or H800 training run that modar can represent was found: the "
              "H200 runs published as text (PyTorch torchtitan `benchmarks/`, Llama 3.1 8B on "
              "32 and 64 H200, June 2025) train in Float8; torchtitan's BF16 H100 rows (December "
              "2024) ran on 96 GB HBM2e H100s at a 500 W limit (Grand Teton), not a DGX H100, so "
              "they are not checks of these profiles either.  "
              "DeepSeek-V3 (H800, 2.788M GPU-hours "
              "for 14.8T tokens, DeepSeek-AI 2024) trains in FP8 with multi-head latent "
              "attention and the DualPipe schedule, none of which modar models, so it is not "
              "a check of these profiles.  The Llama-2 GPU-hours (Touvron et al. 2023, Table "
              "2) are whole-job totals on Meta's clusters (restarts, evaluation and idle time "
              "included) at a layout Meta did not publish: a loose bound, not a step-time "
              "check.", ""]


def document(modar):
    fitted = calibrated_on(A100)
    base_profile = (os.path.relpath(profile_file(A100_BASE), ROOT)
                    if os.path.exists(profile_file(A100_BASE)) else A100)
    with tempfile.TemporaryDirectory() as folder:
        t1 = table1_rows(modar, fitted)
        others = other_rows(modar, folder)
        hopper_rows = hopper.read_rows()
        marked = [r["run"] for r in hopper_rows if r["role"] == "calibration"]
        if marked != calibrated_on("h100-80gb-dgx"):
            raise Failure("hopper_runs.csv: the rows marked calibration (" + ", ".join(marked) +
                          ") are not the runs h100-80gb-dgx's provenance lists (" +
                          ", ".join(calibrated_on("h100-80gb-dgx")) + ")")
        hopper_results = hopper.predict(
            lambda base, sets, profile=None: estimate(modar, base, sets, profile), hopper_rows)
        hopper_folds = hopper.cross_validate(
            lambda arguments: modar_json(modar, arguments),
            lambda base, sets, profile=None: estimate(modar, base, sets, profile), hopper_rows,
            folder)
        mpt_results = mpt.predict(
            lambda base, sets, profile=None: estimate(modar, base, sets, profile), mpt.read_rows())
        cwd = os.getcwd()
        os.chdir(ROOT)  # the calibrate command as written in this document
        try:
            loo = loo_rows(modar, base_profile, folder)
        finally:
            os.chdir(cwd)
    lines = ["# Validation against published training runs", "",
             "Generated by `python3 examples/cluster/validation.py build/bin/modar --out "
             "docs/validation.md` (do not edit by hand): the embedded profiles as built, each "
             "row's published model and layout, no per-row settings.  error = predicted / "
             "published - 1.  `fitted`: a run the profile was calibrated on (its provenance "
             "lists it); `held out`: no calibration of any embedded profile read it.", ""]
    profiles_section(lines)
    table1_section(lines, t1, fitted)
    loo_section(lines, loo, base_profile)
    lines += hopper.section(hopper_results, hopper_folds)
    others_section(lines, others)
    lines += mpt.section(mpt_results)
    return "\n".join(lines)


def main():
    args = sys.argv[1:]
    out = mpt.take_option(args, "--out", "validation.py")
    modar = args[0] if args else os.path.join(ROOT, "build", "bin", "modar")
    if not os.access(modar, os.X_OK):
        sys.exit(f"validation.py: modar binary not found at {modar} (build first, or pass its path)")
    modar = os.path.abspath(modar)
    try:
        text = document(modar)
    except (Failure, mpt.RowError, hopper.RowError) as e:
        sys.exit(f"validation.py: {e}")
    if out:
        tmp = out + ".tmp"
        with open(tmp, "w") as f:
            f.write(text + "\n")
        os.replace(tmp, out)
    else:
        print(text)


if __name__ == "__main__":
    main()
