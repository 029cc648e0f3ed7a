#!/usr/bin/env bash
# examples/calibration_loop.sh: does the CPU calibration loop give the same
# answer twice?  Runs N times (default 3), back to back:
#
#   modar profile --backend cpu --quick --out DIR/pK.toml
#   modar validate --profile DIR/pK.toml --backend cpu --json > DIR/vK.json
#
# and prints, per run, the load average before and after, the profile's noise
# (round spread, sentinel drift, re-measured batches), validate's median
# step-time |error| with its noise floor and per-repeat medians, and the host
# check's flags; then whether every pair of runs agrees within their reported
# spread: |median_i - median_j| <= spread_i + spread_j, where a run's spread is
# the larger of its median noise floor and half the range of its per-repeat
# medians.  Exit status 0 when they agree and every run's host check passed,
# 1 when they disagree, 3 when they agree but a host check failed (the
# comparison was taken under a load that invalidates it).  docs/profiler.md
# ("Noise") has a run of it.
#
#   examples/calibration_loop.sh [N] [DIR]     (MODAR=path/to/modar; default build/bin/modar)
#
# MAX_SECONDS=S bounds each profile (`--max-seconds S`: the most expensive
# points left out by the estimate, measuring stops when S is spent), so that N
# runs fit a known time on a busy machine; validate then predicts the left-out
# points from each kind's fitted efficiency.  REFUSE_UNDER_LOAD=1 passes
# `--refuse-under-load` to validate: a run whose host check fails then stops
# the loop with validate's exit status 3 instead of reporting a comparison.
# REPORT_ONLY=1 prints the report of the runs already in DIR (measures nothing).
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-3}"
dir="${2:-$(mktemp -d /tmp/modar-calibration-loop.XXXXXX)}"
modar="${MODAR:-build/bin/modar}"
python="${PYTHON:-python3}"
max_seconds="${MAX_SECONDS:-}"
profile_bound=()
[ -n "$max_seconds" ] && profile_bound=(--max-seconds "$max_seconds")
validate_refuse=()
[ "${REFUSE_UNDER_LOAD:-0}" = 1 ] && validate_refuse=(--refuse-under-load)
mkdir -p "$dir"
echo "calibration loop: $runs runs into $dir ($(nproc) CPUs, $(date -u '+%Y-%m-%d %H:%M UTC')," \
  "profile bound: ${max_seconds:+$max_seconds s}${max_seconds:-none})"
[ "${REPORT_ONLY:-0}" = 1 ] && skip_runs=1 || skip_runs=0
for k in $(seq 1 "$runs"); do
  [ "$skip_runs" = 1 ] && break
  load_before=$(cut -d' ' -f1-3 /proc/loadavg)
  start=$(date +%s)
  "$modar" profile --backend cpu --quick --quiet "${profile_bound[@]}" --out "$dir/p$k.toml" \
    >"$dir/profile$k.txt"
  profiled=$(date +%s)
  "$modar" validate --profile "$dir/p$k.toml" --backend cpu --json --quiet "${validate_refuse[@]}" \
    >"$dir/v$k.json"
  echo "run $k: profile $(( profiled - start )) s + validate $(( $(date +%s) - profiled )) s," \
    "load average $load_before -> $(cut -d' ' -f1-3 /proc/loadavg)"
done
"$python" - "$dir" "$runs" <<'PY'
import json, re, sys
from pathlib import Path

folder, runs = Path(sys.argv[1]), int(sys.argv[2])
rows = []
for k in range(1, runs + 1):
    provenance = dict(re.findall(r'^"?(\w+)"? = "?([^"\n]*)"?$',
                                 (folder / f"p{k}.toml").read_text().split("[ceilings]")[0], re.M))
    doc = json.loads((folder / f"v{k}.json").read_text())
    st, host = doc["step_time"], doc["host"]
    by_repeat = st["median_abs_error_by_repeat"]
    spread = max(st["median_noise_floor"], (max(by_repeat) - min(by_repeat)) / 2)
    rows.append((k, st["median_abs_error"], spread, by_repeat, provenance, host))
    print(f"run {k}: step |error| median {st['median_abs_error']:.1%} +- {spread:.1%} "
          f"(raw {st['median_abs_error_raw']:.1%}, noise floor {st['median_noise_floor']:.1%}, "
          f"per repeat {' / '.join(f'{e:.1%}' for e in by_repeat)}); "
          f"profile: {provenance.get('measurement_count', '-')} points measured, "
          f"{provenance.get('unmeasured_count', '0')} left out, round spread median {provenance.get('round_spread_median', '-')}, "
          f"drift {provenance.get('drift', '-')}, re-measured batches "
          f"{provenance.get('drift_remeasured_batches', '-')}, marked points "
          f"{provenance.get('drift_marked_points', '-')}, load {provenance.get('load_average_at_start', '-')}"
          f" -> {provenance.get('load_average_at_end', '-')}; host: sentinel "
          f"{host['sentinel_s'] * 1e3:.3g} ms (profiled {host['sentinel_profile_s'] * 1e3:.3g} ms), "
          f"other CPUs busy {host['other_busy_cpus_during']:.2f}, flags: {len(host['flags'])}")
    for flag in host["flags"]:
        print(f"    flag: {flag}")
agree = all(abs(a[1] - b[1]) <= a[2] + b[2] for i, a in enumerate(rows) for b in rows[i + 1:])
flagged = [k for k, *_, host in rows if not host["valid"]]
print("agree within their reported spread:", "yes" if agree else "NO")
if flagged:
    print(f"host check failed in run(s) {', '.join(map(str, flagged))} of {runs}: those errors "
          "measure the machine's changes as much as the profile; re-run on a quiet machine")
# 0: the runs agree and every host check passed; 1: they disagree; 3: they
# agree but some run's host check failed (validate's --refuse-under-load status).
sys.exit(1 if not agree else (3 if flagged else 0))
PY
