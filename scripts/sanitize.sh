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
#                inputs), run by scripts/fuzz.sh, which prints each target's
#                executions, executions per second and coverage.  New inputs go
#                to build-sanitize/fuzz/work-<t>/, a crash to
#                build-sanitize/fuzz/crash-<t>/ and fails the job: keep it as
#                tests/fuzz/corpus/<t>/regression-<what> with the fix.
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
FUZZ_TARGETS=(${FUZZ_TARGETS:-$(sed -n 's/^set(MODAR_FUZZ_TARGETS \(.*\))$/\1/p' tests/fuzz/CMakeLists.txt)})

modar_ensure_debian_packages "${MODAR_DEBIAN_PACKAGES[@]}" clang libclang-rt-dev llvm

configure_and_build() {
  modar_configure_sanitize_build "$SAN_DIR"
  cmake --build "$SAN_DIR" -j "$JOBS"
}

# Any report fails: ASan aborts, UBSan halts (-fno-sanitize-recover=all), leaks count.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:check_initialization_order=1:strict_init_order=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

sanitized_tests() {
  (cd "$SAN_DIR" && ctest --output-on-failure -j "$JOBS" --timeout 900)
}

status=0
modar_timed "sanitize-build" configure_and_build
if [ "$run_tests" = 1 ]; then
  modar_timed "asan-ubsan-tests" sanitized_tests || status=1
fi
if [ "$run_fuzz" = 1 ]; then
  SAN_BUILD_DIR="$SAN_DIR" FUZZ_SECONDS="$FUZZ_SECONDS" scripts/fuzz.sh --no-build \
    "${FUZZ_TARGETS[@]}" || status=1
fi
exit $status
exit
}
