#!/usr/bin/env python3
"""The mfu_beyond_published flag at the defaults, on every embedded GPU profile.

    python3 examples/cluster/mfu_flag_check.py [path/to/modar]

runs the documented `modar optimal` calls (README's `--flops 1e20`, the
issue's `--gpu-hours 86016 --gpus 256`, docs/validation.md's `--flops 1e21
--gpus 64`) with `--json` on each embedded GPU profile and prints, per call,
the class's published MFU and every recommendation's MFU as modar counts it
(causal attention) / as the published figure counts it (the whole square),
`*` where flagged.  It exits 1 when a recommendation is flagged without its
MFU being above the published figure, or above it without the flag
(docs/kernel_model.md "Trust").
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROFILES = ["a100-80gb-dgx", "a100-80gb-dgx-datasheet", "h100-80gb-dgx",
            "h100-80gb-dgx-datasheet", "h200", "h800-80gb-hgx"]
CALLS = [["--flops", "1e20"], ["--gpu-hours", "86016", "--gpus", "256"],
         ["--flops", "1e21", "--gpus", "64"]]


def optimal(modar, profile, call):
    done = subprocess.run([modar, "optimal", *call, "--profile", profile, "--json"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"mfu_flag_check.py: modar optimal {' '.join(call)} --profile {profile}: "
                 f"{done.stderr.strip()}")
    return json.loads(done.stdout)["recommendations"]


def main():
    modar = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "bin", "modar")
    print("| profile | call | best published MFU | recommendations: MFU causal / full square "
          "(* flagged) |")
    print("|---|---|---|---|")
    wrong = 0
    for profile in PROFILES:
        for call in CALLS:
            recs = optimal(modar, profile, call)
            cells = []
            for r in recs:
                t = r["time"]
                flagged = any(f["code"] == "mfu_beyond_published" for f in r.get("flags", []))
                wrong += flagged != (t["mfu_as_published"] > t["published_mfu"] > 0)
                cells.append(f"{100 * t['mfu']:.1f} / {100 * t['mfu_full_attention']:.1f}"
                             + ("*" if flagged else ""))
            print(f"| `{profile}` | `{' '.join(call)}` | "
                  f"{100 * recs[0]['time']['published_mfu']:.2f}% | " + ", ".join(cells) + " |")
    print(f"\n{wrong} recommendation(s) where the flag and the MFU disagree")
    sys.exit(1 if wrong else 0)


if __name__ == "__main__":
    main()
