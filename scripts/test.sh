#!/usr/bin/env bash
# README command 2: set up and build if needed (scripts/setup.sh), then run
# every test: C++ (ctest in build/) and Python (pytest with .venv's python).
# ctest includes the multi-process tests, which it starts under mpirun
# (comm.mpi_np2, comm.mpi_np4: cmake/modar_mpi_test.cmake, --allow-run-as-root
# --oversubscribe, 120 s each at most; "skipped" when the build has no MPI).
#
#   scripts/test.sh [--sanitize | --no-sanitize]
#
# With CI=true (or SANITIZE=1, or --sanitize) it also runs the CI jobs of
# scripts/sanitize.sh: the AddressSanitizer + UBSan build of the C++ tests and
# the libFuzzer targets, each for FUZZ_SECONDS (60).  SANITIZE=0 or
# --no-sanitize skips them.  Every job prints its run time ("time: ...").
set -euo pipefail
{  # one block: bash reads it whole before running, so editing this file mid-run is safe
cd "$(dirname "$0")/.."
source scripts/lib.sh

sanitize="${SANITIZE:-}"
if [ -z "$sanitize" ]; then
  [ "${CI:-}" = true ] && sanitize=1 || sanitize=0
fi
for arg in "$@"; do
  case "$arg" in
    --sanitize) sanitize=1 ;;
    --no-sanitize) sanitize=0 ;;
    *) echo "usage: scripts/test.sh [--sanitize | --no-sanitize]" >&2; exit 2 ;;
  esac
done

# CI proves that the CUDA code builds (there is no GPU to run it): one
# architecture, sm_90 (the H200 the GPU checks run on), instead of the default
# 80 and 90 halves nvcc's share of the clean build.  Users' builds keep both.
if [ "${CI:-}" = true ]; then
  export CUDAARCHS="${CUDAARCHS:-90}"
fi
BUILD_DIR="${BUILD_DIR:-build}"
VENV="${VENV:-.venv}"
start_all=$EPOCHREALTIME
# The Debian packages and .venv first; then the PyTorch of the PyTorch
# profile's test (scripts/torch_for_tests.sh: gigabytes, once per machine)
# downloads in the background while the C++ compiles, and is joined before
# pytest.  Ctrl-C or an early exit stops it (its install is all-or-nothing).
modar_timed "setup" scripts/setup.sh --no-build
torch_log=$(mktemp "${TMPDIR:-/tmp}/modar-torch-install.XXXXXX")
setsid scripts/torch_for_tests.sh install >"$torch_log" 2>&1 &  # its own process group
torch_pid=$!
trap 'kill -- -"$torch_pid" 2>/dev/null || true; rm -f "$torch_log"' EXIT
modar_timed "build" scripts/setup.sh

status=0
modar_timed "ctest" bash -c "cd '$BUILD_DIR' && ctest --output-on-failure -j '$(nproc)' --timeout 900" ||
  status=1
modar_timed "torch (joined)" wait "$torch_pid" || cat "$torch_log" >&2
VENV="$VENV" scripts/torch_for_tests.sh link
if [ -d tests/python ] && ls tests/python/test_*.py >/dev/null 2>&1; then
  modar_timed "pytest" "$VENV/bin/python" -m pytest -q tests/python tests/setup || status=1
fi
if [ "$sanitize" = 1 ]; then
  scripts/sanitize.sh || status=1
fi
awk -v a="$start_all" -v b="$EPOCHREALTIME" -v rc="$status" \
  'BEGIN { printf "time: %-24s %7.1f s (exit %d)\n", "test.sh total", b - a, rc }' >&2
exit $status
exit
}
