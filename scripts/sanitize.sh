#!/usr/bin/env bash
# scripts/sanitize.sh: the CI jobs that keep the C++ honest (scripts/test.sh
# runs this when CI=true or SANITIZE=1).
#
#   scripts/sanitize.sh [--no-tests] [--no-fuzz]
#
# One Clang build in build-sanitize/ (SAN_BUILD_DIR) with AddressSanitizer +
# UndefinedBehaviorSanitizer on all C++ (CUDA off, no benchmarks, no Python)
# and the libFuzzer targets (cmake -DMODAR_FUZZ=ON; tests/fuzz/README.md):
#   asan-ubsan   every C++ test (ctest; the CLI tests run the sanitized `modar`,
#                and fuzz_replay.* replays every committed fuzz corpus);
#   fuzz-<t>     each libFuzzer target for FUZZ_SECONDS (default 60) from its
#                committed corpus tests/fuzz/corpus/<t>/ (seeds and regression
#                inputs).  New inputs go to build-sanitize/fuzz/work-<t>/, a
#                crash to build-sanitize/fuzz/crash-<t>/ and fails the job: keep
#                it as tests/fuzz/corpus/<t>/regression-<what> with the fix.
# Each job prints its run time ("time: ...").
set -euo pipefail
{  # one block: bash reads it whole before running, so editing this file mid-run is safe
cd "$(dirname "$0")/.."
source scripts/lib.sh

run_tests=1
run_fuzz=1
for arg in "$@"; do
  case "$arg" in
    --no-tests) run_tests=0 ;;
    --no-fuzz) run_fuzz=0 ;;
    *) echo "usage: scripts/sanitize.sh [--no-tests] [--no-fuzz]" >&2; exit 2 ;;
  esac
done

SAN_DIR="${SAN_BUILD_DIR:-build-sanitize}"
JOBS="${JOBS:-$(nproc)}"
FUZZ_SECONDS="${FUZZ_SECONDS:-60}"
FUZZ_TARGETS=(${FUZZ_TARGETS:-config fit_csv profile calibrate_csv hf_config})

modar_ensure_debian_packages "${MODAR_DEBIAN_PACKAGES[@]}" clang libclang-rt-dev llvm

configure_and_build() {
  if [ ! -f "$SAN_DIR/CMakeCache.txt" ]; then
    local launcher=()
    if command -v ccache >/dev/null 2>&1; then
      launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
    fi
    cmake -S . -B "$SAN_DIR" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=clang++ \
      -DMODAR_CUDA=OFF -DMODAR_BENCHMARKS=OFF -DMODAR_PYTHON=OFF -DMODAR_FUZZ=ON \
      "${launcher[@]}" >/dev/null
  fi
  cmake --build "$SAN_DIR" -j "$JOBS"
}

# Any report fails: ASan aborts, UBSan halts (-fno-sanitize-recover=all), leaks count.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:check_initialization_order=1:strict_init_order=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

sanitized_tests() {
  (cd "$SAN_DIR" && ctest --output-on-failure -j "$JOBS" --timeout 900)
}

fuzz_one() {
  local target=$1
  local exe="$SAN_DIR/fuzz/modar_fuzz_$target"
  local work="$SAN_DIR/fuzz/work-$target" crash="$SAN_DIR/fuzz/crash-$target"
  local log="$SAN_DIR/fuzz/$target.log"
  rm -rf "$work" "$crash"
  mkdir -p "$work" "$crash"
  # The first folder receives new inputs; the committed corpus is only read.
  if "$exe" -max_total_time="$FUZZ_SECONDS" -timeout=25 -rss_limit_mb=2048 \
       -dict="tests/fuzz/$target.dict" -artifact_prefix="$crash/" -print_final_stats=1 \
       "$work" "tests/fuzz/corpus/$target" >"$log" 2>&1; then
    echo "fuzz-$target: $(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}') inputs" \
      "in ${FUZZ_SECONDS} s, no crash; corpus $(ls "tests/fuzz/corpus/$target" | wc -l) committed +" \
      "$(ls "$work" | wc -l) new; $(grep -Eo 'cov: [0-9]+' "$log" | tail -1)" >&2
    return 0
  fi
  tail -n 60 "$log" >&2
  echo "fuzz-$target: FAILED; the input is in $crash/ (log $log)." >&2
  echo "  Keep it: cp $crash/<file> tests/fuzz/corpus/$target/regression-<what>, then fix the bug." >&2
  return 1
}

status=0
modar_timed "sanitize-build" configure_and_build
if [ "$run_tests" = 1 ]; then
  modar_timed "asan-ubsan-tests" sanitized_tests || status=1
fi
if [ "$run_fuzz" = 1 ]; then
  for target in "${FUZZ_TARGETS[@]}"; do
    modar_timed "fuzz-$target" fuzz_one "$target" || status=1
  done
fi
exit $status
exit
}
