#!/usr/bin/env python3
"""The DAR paper's Table 5 (training efficiency on a sparse MoE), predicted.

Runs `modar estimate` on examples/configs/moe_dar_table5.toml (7.22B-total /
1.40B-active MoE, s = 4096, global batch 128, 8 x H800, EP 8, ZeRO-1; the shape
and layout are ASSUMED, see docs/moe.md) for the plain residual, Block AttnRes
and Block DAR (n = 2 streams) and prints throughput and peak memory per GPU
beside the paper's numbers (DAR paper, Training Efficiency: -9.16% / -17.54%
throughput, +7.7 / +10.7 GiB peak memory, with unoptimised kernels).

usage: examples/dar_table5.py [--modar PATH] [--block-layers K] [--set KEY=VALUE ...]
(default modar: $MODAR_CLI, else build/bin/modar)
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = os.path.join(HERE, "configs", "moe_dar_table5.toml")
PAPER = {"Block AttnRes": (-9.16, 7.7), "Block DAR": (-17.54, 10.7)}


def estimate(modar, sets):
    command = [modar, "estimate", CONFIG, "--json"]
    for assignment in sets:
        command += ["--set", assignment]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        sys.exit("modar estimate failed: " + result.stderr.strip())
    report = json.loads(result.stdout)
    return report["time"]["tokens_per_s"], report["memory"]["peak_bytes"] / 2**30


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = os.environ.get("MODAR_CLI") or os.path.join(HERE, "..", "build", "bin", "modar")
    parser.add_argument("--modar", default=default, help="the modar CLI")
    parser.add_argument("--block-layers", type=int, default=3,
                        help="K layers per block (default 3: 7 blocks over 19 layers)")
    parser.add_argument("--set", action="append", default=[], help="extra config override")
    args = parser.parse_args()
    k = str(args.block_layers)
    variants = [
        ("plain residual", ["dar.variant=none"]),
        ("Block AttnRes", ["dar.variant=attnres", "dar.block_layers=" + k]),
        ("Block DAR", ["dar.variant=dar", "dar.streams=2", "dar.block_layers=" + k]),
    ]
    rows = [(name, *estimate(args.modar, sets + args.set)) for name, sets in variants]
    base_tps, base_mem = rows[0][1], rows[0][2]
    print("DAR paper Table 5 predicted: " + os.path.relpath(CONFIG) +
          " (profile h800-80gb-hgx datasheet roofline, EP 8, ZeRO-1, micro_batch 1, K = " + k + ")")
    print(f"{'variant':<16}{'tokens/s':>12}{'throughput':>12}{'paper':>10}"
          f"{'peak GiB/GPU':>14}{'delta':>9}{'paper':>9}")
    for name, tps, mem in rows:
        paper_tps, paper_mem = PAPER.get(name, (None, None))
        d_tps = 100.0 * (tps / base_tps - 1.0)
        d_mem = mem - base_mem
        print(f"{name:<16}{tps:>12.0f}{d_tps:>+11.2f}%"
              f"{'' if paper_tps is None else f'{paper_tps:+.2f}%':>10}"
              f"{mem:>14.1f}{d_mem:>+9.1f}{'' if paper_mem is None else f'{paper_mem:+.1f}':>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
