#!/usr/bin/env bash
# scripts/fuzz.sh: run modar's libFuzzer targets and report how deep each went
# (executions, executions per second, coverage, corpus), one line per target.
# FUZZ_JOBS targets run side by side (default: the number of cores, each
# fuzzer is one process on one core), so every target keeps its whole time
# bound and the run takes ceil(targets / FUZZ_JOBS) bounds instead of one
# bound per target.
#
#   scripts/fuzz.sh [--long] [--no-build] [TARGET...]
#
# Default: every target (tests/fuzz/CMakeLists.txt) for FUZZ_SECONDS (60) from
# its committed corpus tests/fuzz/corpus/<t>/, as CI does (scripts/sanitize.sh
# calls this after its build).  --long: the nightly-style run, each target
# until FUZZ_RUNS executions (default 1000000) or FUZZ_LONG_SECONDS (default
# 3600) have passed, whichever comes first; the summary table at the end is
# what docs/hardening.md records.
#
# The fuzzers are the ASan + UBSan build of scripts/sanitize.sh, in
# build-sanitize/ (SAN_BUILD_DIR); without --no-build this configures it when
# needed and builds the fuzz targets alone.  New inputs go to
# <build>/fuzz/work-<t>/ (the committed corpus is only read), a crash to
# <build>/fuzz/crash-<t>/ and fails the run: keep it as
# tests/fuzz/corpus/<t>/regression-<what> with its fix (tests/fuzz/README.md).
set -euo pipefail
{  # one block: bash reads it whole before running, so editing this file mid-run is safe
cd "$(dirname "$0")/.."
source scripts/lib.sh

long=0
build=1
targets=()
for arg in "$@"; do
  case "$arg" in
    --long) long=1 ;;
    --no-build) build=0 ;;
    -*) echo "usage: scripts/fuzz.sh [--long] [--no-build] [TARGET...]" >&2; exit 2 ;;
    *) targets+=("$arg") ;;
  esac
done

SAN_DIR="${SAN_BUILD_DIR:-build-sanitize}"
JOBS="${JOBS:-$(nproc)}"
FUZZ_JOBS="${FUZZ_JOBS:-$JOBS}"
if ! [[ "$FUZZ_JOBS" =~ ^[1-9][0-9]*$ ]]; then
  echo "fuzz.sh: FUZZ_JOBS='$FUZZ_JOBS' must be a whole number of targets run at once, 1 or more" >&2
  exit 2
fi
FUZZ_SECONDS="${FUZZ_SECONDS:-60}"
FUZZ_RUNS="${FUZZ_RUNS:-1000000}"
FUZZ_LONG_SECONDS="${FUZZ_LONG_SECONDS:-3600}"
# The targets tests/fuzz/CMakeLists.txt defines (MODAR_FUZZ_TARGETS).
all_targets=($(sed -n 's/^set(MODAR_FUZZ_TARGETS \(.*\))$/\1/p' tests/fuzz/CMakeLists.txt))
if ((${#targets[@]} == 0)); then
  targets=(${FUZZ_TARGETS:-${all_targets[@]}})
fi
for target in "${targets[@]}"; do
  if [[ " ${all_targets[*]} " != *" $target "* ]]; then
    echo "fuzz.sh: unknown target '$target'; allowed: ${all_targets[*]}" >&2
    exit 2
  fi
done

if [ "$build" = 1 ]; then
  modar_ensure_debian_packages "${MODAR_DEBIAN_PACKAGES[@]}" clang libclang-rt-dev llvm
  modar_configure_sanitize_build "$SAN_DIR"
  cmake --build "$SAN_DIR" -j "$JOBS" --target "${targets[@]/#/modar_fuzz_}"
fi

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:check_initialization_order=1:strict_init_order=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

summary=()
# fuzz_one TARGET: run it, print one line of figures; non-zero on a crash.
fuzz_one() {
  local target=$1
  local exe="$SAN_DIR/fuzz/modar_fuzz_$target"
  local work="$SAN_DIR/fuzz/work-$target" crash="$SAN_DIR/fuzz/crash-$target"
  local log="$SAN_DIR/fuzz/$target.log"
  local bound
  if [ "$long" = 1 ]; then
    bound=(-runs="$FUZZ_RUNS" -max_total_time="$FUZZ_LONG_SECONDS")
  else
    bound=(-max_total_time="$FUZZ_SECONDS")
  fi
  if [ ! -x "$exe" ]; then
    echo "fuzz-$target: $exe is missing (build it: scripts/fuzz.sh without --no-build)" >&2
    return 1
  fi
  rm -rf "$work" "$crash"
  mkdir -p "$work" "$crash"
  local start=$EPOCHREALTIME rc=0
  # The first folder receives new inputs; the committed corpus is only read.
  "$exe" "${bound[@]}" -timeout=25 -rss_limit_mb=2048 -dict="tests/fuzz/$target.dict" \
    -artifact_prefix="$crash/" -print_final_stats=1 "$work" "tests/fuzz/corpus/$target" \
    >"$log" 2>&1 || rc=$?
  local seconds
  seconds=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", b - a }')
  if [ "$rc" != 0 ]; then
    tail -n 60 "$log" >&2
    echo "fuzz-$target: FAILED; the input is in $crash/ (log $log)." >&2
    echo "  Keep it: cp $crash/<file> tests/fuzz/corpus/$target/regression-<what>, then fix the bug." >&2
    return 1
  fi
  # libFuzzer's final statistics (-print_final_stats=1).
  local runs per_second coverage
  runs=$(awk '/^stat::number_of_executed_units:/ { print $2 }' "$log")
  per_second=$(awk '/^stat::average_exec_per_sec:/ { print $2 }' "$log")
  coverage=$(grep -Eo 'cov: [0-9]+' "$log" | tail -1 | awk '{ print $2 }')
  local line
  line=$(printf '%-14s %12s executions %8s exec/s %6s s  cov %6s  corpus %d committed + %d new' \
    "$target" "${runs:-?}" "${per_second:-?}" "$seconds" "${coverage:-?}" \
    "$(ls "tests/fuzz/corpus/$target" | wc -l)" "$(ls "$work" | wc -l)")
  echo "fuzz-$line, no crash" >&2
  echo "$line" >"$SAN_DIR/fuzz/$target.line"
  if [ "$long" = 1 ] && [ "${runs:-0}" -lt "$FUZZ_RUNS" ]; then
    echo "fuzz-$target: stopped by the time bound (${FUZZ_LONG_SECONDS} s) before $FUZZ_RUNS executions" >&2
  fi
}

# Up to FUZZ_JOBS targets at once.  Each job's messages go to its own file,
# printed whole when it ends, so that two jobs' lines never interleave.
# Ctrl-C (or SIGTERM) stops the running fuzzers and exits 130 at once, instead
# of each interrupted fuzzer being reported as a crash and the next started.
status=0
declare -A job_target=()
finish_one() {  # wait for any one job, print its messages, record its line
  local pid rc=0 target
  wait -n -p pid "${!job_target[@]}" || rc=$?
  target=${job_target[$pid]}
  unset "job_target[$pid]"
  cat "$SAN_DIR/fuzz/$target.out" >&2
  [ "$rc" = 0 ] || status=1
}
stop_jobs() {  # each job's fuzzer first, then the job's shell
  local pid
  for pid in "${!job_target[@]}"; do
    pkill -TERM -P "$pid" 2>/dev/null || true
    kill -TERM "$pid" 2>/dev/null || true
  done
  wait || true
  echo "fuzz.sh: interrupted; no summary" >&2
  exit 130
}
trap stop_jobs INT TERM
mkdir -p "$SAN_DIR/fuzz"
for target in "${targets[@]}"; do
  while ((${#job_target[@]} >= FUZZ_JOBS)); do finish_one; done
  rm -f "$SAN_DIR/fuzz/$target.line"
  modar_timed "fuzz-$target" fuzz_one "$target" >"$SAN_DIR/fuzz/$target.out" 2>&1 &
  job_target[$!]=$target
done
while ((${#job_target[@]})); do finish_one; done
trap - INT TERM
for target in "${targets[@]}"; do  # the summary in the targets' order
  if [ -s "$SAN_DIR/fuzz/$target.line" ]; then
    summary+=("$(cat "$SAN_DIR/fuzz/$target.line")")
  fi
done
if ((${#summary[@]})); then
  mode="FUZZ_SECONDS=$FUZZ_SECONDS"
  [ "$long" = 1 ] && mode="--long: FUZZ_RUNS=$FUZZ_RUNS, FUZZ_LONG_SECONDS=$FUZZ_LONG_SECONDS"
  echo "fuzz summary ($mode; $(date -u '+%Y-%m-%d %H:%M UTC'); load average $(cut -d' ' -f1-3 /proc/loadavg)):" >&2
  printf '  %s\n' "${summary[@]}" >&2
fi
exit $status
exit
}
