#!/usr/bin/env bash
# scripts/gpu-check.sh: the one prepared check for a machine WITH a GPU.
#
#   scripts/gpu-check.sh                 # logs and tables into $OUT, else gpu-check-<date>/
#   BUILD_DIR=build-gpu scripts/gpu-check.sh
#   SKIP_BUILD=1 BUILD_DIR=build-e scripts/gpu-check.sh   # use a carried, already built tree
#
# Stages (each runs under its own time limit, continues when an earlier one
# failed, and records its exit code):
#   env       nvidia-smi (name, driver, clocks seen), nvcc version
#   build     configure (sm_90 only when configuring here) and build the CUDA
#             tests, the CLI and the benchmarks
#   tests     modar_test_cuda: every op vs the CPU backend (FlashAttention rule)
#   peaks     modar_cuda_peaks: bf16 / fp32 GEMM and copy ceilings, our kernels vs them
#   profile   modar profile --backend cuda --quick --out $OUT/profile-cuda.toml
#   validate  modar validate --backend cuda --profile $OUT/profile-cuda.toml
#   bench     modar_bench_layers --backend cuda (layer / model-step table)
#   sanitize  compute-sanitizer memcheck + racecheck on the kernel tests (small cases)
# Sized for < 8 minutes in total on one H100 / H200: a total budget
# (BUDGET_S, default 470 s) caps every stage's limit by the time left, and a
# stage with under 5 s left is recorded as skipped.
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT_DIR="${OUT:-$ROOT/gpu-check-$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$OUT_DIR"
BUILD_DIR="${BUILD_DIR:-build-gpu}"
JOBS="${JOBS:-$(nproc)}"
SUMMARY="$OUT_DIR/summary.txt"
: > "$SUMMARY"
START_ALL=$(date +%s)
BUDGET_S="${BUDGET_S:-470}"

# run_stage NAME LIMIT_S COMMAND...: stdout+stderr to $OUT_DIR/NAME.log
run_stage() {
  local name=$1 limit=$2
  shift 2
  local start end rc left
  start=$(date +%s)
  left=$((BUDGET_S - (start - START_ALL)))
  if [ "$left" -lt 5 ]; then
    printf '%-10s rc=%-4s %5ss  %s\n' "$name" "skip" 0 "(total budget spent) $*" | tee -a "$SUMMARY" >&2
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name (limit ${limit}s): $*" | tee -a "$OUT_DIR/$name.log" >&2
  timeout --kill-after=10 "$limit" "$@" >> "$OUT_DIR/$name.log" 2>&1
  rc=$?
  end=$(date +%s)
  printf '%-10s rc=%-4s %5ss  %s\n' "$name" "$rc" "$((end - start))" "$*" | tee -a "$SUMMARY" >&2
  return 0
}

env_info() {
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw,power.limit --format=csv || true
  nvidia-smi -q -d CLOCK,PERFORMANCE || true
  nvcc --version || true
  cmake --version | head -1 || true
  git -C "$ROOT" log --oneline -1 || true
}

build() {
  if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
    cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DMODAR_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 || return 1
  fi
  cmake --build "$BUILD_DIR" -j "$JOBS" --target modar_test_cuda modar_cli modar_cuda_peaks \
    modar_bench_layers
}

# Shell functions run under `timeout` through bash -c.
export -f env_info build
export ROOT BUILD_DIR JOBS
run_stage env 15 bash -c env_info
if [ "${SKIP_BUILD:-0}" != "1" ]; then
  run_stage build 240 bash -c build
fi
# Clock state seen just before the timed stages (the profile records its own).
nvidia-smi --query-gpu=clocks.sm,clocks.mem --format=csv >> "$OUT_DIR/env.log" 2>&1 || true

TEST_BIN="$BUILD_DIR/tests/modar_test_cuda"
CLI="$BUILD_DIR/bin/modar"
PEAKS="$BUILD_DIR/bin/modar_cuda_peaks"
BENCH=$(ls "$BUILD_DIR"/runtime/bench/modar_bench_layers "$BUILD_DIR"/bin/modar_bench_layers 2>/dev/null | head -1)

run_stage tests 100 "$TEST_BIN" --gtest_output="xml:$OUT_DIR/tests.xml"
run_stage peaks 45 "$PEAKS" --reps 20
run_stage profile 120 "$CLI" profile --backend cuda --quick --out "$OUT_DIR/profile-cuda.toml"
run_stage validate 50 "$CLI" validate --backend cuda --profile "$OUT_DIR/profile-cuda.toml"
if [ -n "$BENCH" ]; then
  run_stage bench 45 "$BENCH" --backend cuda --dtype bf16 --reps 5
else
  echo "bench      rc=-    not built" | tee -a "$SUMMARY" >&2
fi
if command -v compute-sanitizer >/dev/null 2>&1; then
  FILTER='CudaTopk.*:CudaGatherScatter.*:CudaRmsNorm.*:CudaDar.*:CudaLoss.*'
  run_stage sanitize 60 compute-sanitizer --tool memcheck --error-exitcode 99 "$TEST_BIN" \
    --gtest_filter="$FILTER"
  run_stage racecheck 40 compute-sanitizer --tool racecheck --error-exitcode 99 "$TEST_BIN" \
    --gtest_filter='CudaTopk.RaggedCountsOfPredictorMode:CudaDepthRead.MergeForwardBackwardMatchCpu'
fi

END_ALL=$(date +%s)
echo "total $((END_ALL - START_ALL))s; logs and tables in $OUT_DIR" | tee -a "$SUMMARY" >&2
# The tables last, so that the tail of the output carries them.
echo "---- summary" && cat "$SUMMARY"
echo "---- peaks" && tail -n 12 "$OUT_DIR/peaks.log" 2>/dev/null
echo "---- failed tests" && grep -E "^\[  FAILED|Failure|gpu error" "$OUT_DIR/tests.log" 2>/dev/null | head -n 40
exit 0
