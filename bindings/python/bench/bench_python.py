#!/usr/bin/env python3
"""How many configurations per second Python gets from modar, beside the C++.

    python3 bindings/python/bench/bench_python.py [--seconds S] [--rows N] [--profile NAME]

One table, every row measured in this run on the same configurations and
profile, one thread (the batched rows run with threads=1):

  C++ estimate_into      the core's hot path in a C++ loop (what
                         cost_models/bench/bench_cost_model measures), via
                         modar._core.time_estimate_into
  _core.estimate         the binding called directly from Python (one call each)
  modar.estimate(cfg)    the public single call on a prebuilt Config
  modar.estimate(base, n_layers=L)   the same with one keyword override
                         (copy, typed set, validate)
  modar.estimate_batch(list)         a list of Config -> DataFrame
  C++ estimate_into (the columns' rows)  the hot path over the first 18,000
                         rows of the columns batch (its reference: other
                         configurations than the grid's)
  modar.estimate_batch(columns)      a base Config + columns of overrides
                         (N rows) -> DataFrame, GIL released

"vs C++" is the rate over the C++ loop's on the same configurations.

Rates are per second of this thread's CPU time (the figure for "one core"),
with wall-clock rates beside them (lower when the machine is shared).
Targets (issue 9): single >= 50,000/s, batched >= 1,000,000/s per core.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time

import numpy as np

import modar
from modar import _core


FAMILIES = ("dense", "MoD + DAR")


def grid(profile: str, family: str) -> list[modar.Config]:
    """180 configurations, like cost_models/bench's "dense" / "MoD + DAR" families."""
    configs = []
    for d_model, layers, capacity, block in itertools.product(
        (512, 1024, 2048, 4096), (8, 16, 24, 32, 48), (0.125, 0.25, 0.5), (1, 2, 4)
    ):
        extra = {}
        if family != "dense":
            extra = dict(mod={"every": 2, "capacity": capacity}, dar={"variant": "dar", "block_layers": block})
        configs.append(modar.Config(
            d_model=d_model, n_layers=layers, n_heads=d_model // 128, seq_len=2048,
            train={"micro_batch": 8, "global_batch": 256}, device={"count": 8, "profile": profile},
            **extra,
        ))
    return configs


def timed(body, seconds: float) -> tuple[float, float]:
    """(items per CPU second, items per wall second) of body() -> items, repeated."""
    items = 0
    cpu0, wall0 = time.thread_time(), time.perf_counter()
    while True:
        items += body()
        cpu = time.thread_time() - cpu0
        if cpu >= seconds:
            break
    return items / cpu, items / (time.perf_counter() - wall0)


LIST_ROWS = 18_000


def measure(family: str, args) -> list[tuple]:
    configs = grid(args.profile, family)
    cpp_configs = [c._cpp for c in configs]
    handle = _core.cached_profile(args.profile)
    base = configs[0]
    layers = [8, 16, 24, 32, 48]
    out = []

    count, cpu, wall, _ = _core.time_estimate_into(cpp_configs, handle, "train", args.seconds)
    cpp_rate = count / cpu
    out.append((family, "C++ estimate_into (hot path, C++ loop)", count / cpu, count / wall, cpp_rate, None))

    def binding() -> int:
        for c in cpp_configs:
            _core.estimate(c, "train", None)
        return len(cpp_configs)

    out.append((family, "_core.estimate (binding, one call each)", *timed(binding, args.seconds), cpp_rate, None))

    def single() -> int:
        for c in configs:
            modar.estimate(c).step_s
        return len(configs)

    out.append((family, "modar.estimate(cfg).step_s", *timed(single, args.seconds), cpp_rate, 50_000))

    def single_override() -> int:
        for n in layers:
            modar.estimate(base, n_layers=n).step_s
        return len(layers)

    out.append((family, "modar.estimate(base, n_layers=L).step_s", *timed(single_override, args.seconds),
                cpp_rate, None))

    many = configs * (LIST_ROWS // len(configs))

    def batch_list() -> int:
        return len(modar.estimate_batch(many))

    out.append((family, "modar.estimate_batch(list of Config)", *timed(batch_list, args.seconds), cpp_rate, None))

    rng = np.random.default_rng(0)
    d_model = rng.choice([512, 1024, 2048, 4096], size=args.rows).astype(np.int64)
    table = {
        "model.d_model": d_model,
        "model.n_heads": d_model // 128,
        "model.n_layers": rng.choice(layers, size=args.rows).astype(np.int64),
        "mod.capacity": rng.choice([0.125, 0.25, 0.5], size=args.rows),
        "dar.block_layers": rng.choice([1, 2, 4], size=args.rows).astype(np.int64),
    }

    # The columns' rows are other configurations than the grid's (MoD is on
    # wherever capacity < 1), so their C++ reference is the hot path over the
    # same rows: the first LIST_ROWS of them, built as Configs.
    same = min(args.rows, LIST_ROWS)
    row_configs = [
        modar.Config(base, model={"d_model": int(table["model.d_model"][r]),
                                  "n_heads": int(table["model.n_heads"][r]),
                                  "n_layers": int(table["model.n_layers"][r])},
                     mod={"capacity": float(table["mod.capacity"][r])},
                     dar={"block_layers": int(table["dar.block_layers"][r])})._cpp
        for r in range(same)
    ]
    count, cpu, wall, _ = _core.time_estimate_into(row_configs, handle, "train", args.seconds)
    rows_rate = count / cpu
    out.append((family, "C++ estimate_into (the columns' rows)", count / cpu, count / wall, rows_rate, None))

    def batch_columns() -> int:
        return len(modar.estimate_batch(table, base=base))

    out.append((family, "modar.estimate_batch(columns)", *timed(batch_columns, args.seconds), rows_rate,
                1_000_000))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="CPU seconds per row (default 1)")
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of the columns batch (default 1e6)")
    parser.add_argument("--profile", default="h200", help="profile name or path (default h200)")
    args = parser.parse_args()
    if not 0 < args.seconds <= 600 or not 1 <= args.rows <= 100_000_000:
        parser.error("--seconds in (0, 600], --rows in [1, 1e8]")

    rows = []
    for family in FAMILIES:
        rows += measure(family, args)

    print("modar from Python: configurations evaluated per second, one thread")
    print(f"settings: profile {args.profile!r}, step train, threads 1, {args.seconds:g} CPU-s per row; "
          "configs: 180 per family (d_model 512-4096, n_layers 8-48, heads d/128; MoD + DAR: "
          "capacity 0.125/0.25/0.5 every 2, DAR n=2 K=1/2/4), seq_len 2048, micro_batch 8, "
          f"global_batch 256, 8 devices; list batch {LIST_ROWS:,} configs; columns batch "
          f"{args.rows:,} rows x 5 columns")
    print(f"python {sys.version.split()[0]}, modar {modar.__version__}\n")
    header = (f"{'family':<10} {'path':<46} {'configs/cpu-s':>14} {'configs/wall-s':>15} "
              f"{'vs C++':>7} {'target':>16}")
    print(header)
    print("-" * len(header))
    for family, name, per_cpu, per_wall, cpp_rate, target in rows:
        verdict = "" if target is None else (f">= {target:,}" + (" ok" if per_cpu >= target else " MISS"))
        print(f"{family:<10} {name:<46} {per_cpu:>14,.0f} {per_wall:>15,.0f} "
              f"{per_cpu / cpp_rate:>7.2f} {verdict:>16}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
