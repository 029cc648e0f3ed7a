#!/usr/bin/env bash
# scripts/gpu-check.sh: the one prepared check for the GPU device machine
# (one NVIDIA H200, CUDA runtime + PyTorch with its nvidia wheels, CMake,
# ninja; no Eigen / toml++ / GoogleTest, no network).  It runs the binaries
# that scripts/gpu-build.sh built HERE and staged in build-gpu-carry/.
#
#   scripts/gpu-build.sh                       # here, no GPU needed (once per change)
#   (device tool) run: scripts/gpu-check.sh    carry: ["build-gpu-carry"], timeout_s 540
#   scripts/gpu-check.sh --dry-run             # rehearsal here: no GPU, nothing fails hard
#
# Results: at most 8 files in $OUT (default ./gpu-check-out/):
#   summary.txt          stage table, the tables of every stage, failed tests
#   h200-measured.toml   the bounded GPU profile (profile name "h200-measured"),
#                        or h200-measured.toml.partial when its stage ran out of time
#   side_by_side.tsv     ours vs PyTorch, same shapes, same GPU
#   tests.xml            GoogleTest XML of the CUDA tests
#   logs.tar.gz          every stage's full log
# Stages (each under its own limit, capped by the total BUDGET_S, default 470 s;
# a stage that fails is recorded and the next one runs):
#   deps      (seconds) the carried binaries, the GPU, and the libraries they need
#             (libcudart.so.13, libcublasLt.so.13, libcublas.so.13, libcudnn.so.9, found in
#             the PyTorch environment's nvidia wheels): anything missing ends the run
#             with ONE line naming it, before any time is spent
#   env       nvidia-smi, versions
#   tests     modar_test_cuda with MODAR_REQUIRE_CUDNN=1 (the cuDNN attention path must run)
#   sanitize  compute-sanitizer memcheck / racecheck on a bounded subset of the tests
#   peaks     modar_cuda_peaks: ceilings, our kernels vs them, and the side-by-side cases
#   torch     scripts/gpu_torch_compare.py: the same cases in PyTorch
#   bench     modar_bench_layers: MoD layer vs dense at d=2048 s=2048 b=8; DAR / AttnRes /
#             MoD model step vs the plain residual at d=2048 L=16
#   profile   modar profile --quick bounded to 1 GiB per shape (--max-point-bytes), --budget
#             0.03 s per shape; resumes from build-gpu-carry/h200-measured.toml.partial if
#             a previous run left one there (copy it from $OUT)
#   validate  modar validate --backend cuda --quick against the new profile (or its
#             partial checkpoint when the profile stage ran out of time)
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
DRY=0
if [ "${1:-}" = "--dry-run" ]; then
  DRY=1
elif [ -n "${1:-}" ]; then
  echo "usage: scripts/gpu-check.sh [--dry-run]" >&2
  exit 2
fi
CARRY=${CARRY_DIR:-build-gpu-carry}
BIN="$ROOT/$CARRY/bin"
PACK=${OUT:-$ROOT/gpu-check-out}
WORK=$(mktemp -d /tmp/gpu-check.XXXXXX)
SUMMARY="$WORK/summary.txt"
BUDGET_S=${BUDGET_S:-470}
START_ALL=$(date +%s)
: > "$SUMMARY"
mkdir -p "$PACK"

note() { echo "$*" | tee -a "$SUMMARY" >&2; }

# ---- packing (always, also after a failed dependency check) ----------------------
pack() {
  {
    echo
    echo "---- peaks"; tail -n 30 "$WORK/peaks.log" 2>/dev/null
    echo "---- side by side (ours vs PyTorch)"; grep -v '^==' "$WORK/torch.log" 2>/dev/null | tail -n 40
    echo "---- bench"; grep -v '^==' "$WORK/bench.log" 2>/dev/null | tail -n 30
    echo "---- validate"; tail -n 30 "$WORK/validate.log" 2>/dev/null
    echo "---- profile"; tail -n 5 "$WORK/profile.log" 2>/dev/null
    echo "---- failed tests"
    grep -E "^\[  FAILED|Failure|gpu error" "$WORK/tests.log" 2>/dev/null | head -n 60
    echo "---- sanitizer"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|Race" \
      "$WORK"/sanitize*.log 2>/dev/null | head -n 20
  } >> "$SUMMARY"
  cp "$SUMMARY" "$PACK/summary.txt"
  for f in h200-measured.toml h200-measured.toml.partial side_by_side.tsv tests.xml; do
    [ -f "$WORK/$f" ] && cp "$WORK/$f" "$PACK/$f"
  done
  tar -czf "$PACK/logs.tar.gz" -C "$WORK" . 2>/dev/null
  local count
  count=$(find "$PACK" -maxdepth 1 -type f | wc -l)
  echo "packed $count files into $PACK (at most 8 come back):" >&2
  ls -l "$PACK" >&2
  if [ "$count" -gt 8 ]; then
    echo "gpu-check: $count files in $PACK; only 8 come back" >&2
  fi
}

fail_deps() {
  note "gpu-check: $*"
  pack
  exit 3
}

# ---- deps: seconds, before anything is timed --------------------------------------
# Library folders of the PyTorch environment's nvidia wheels (nvidia/*/lib,
# nvidia/cu13/lib) and torch/lib, without importing torch (seconds).
NV_DIRS=$(python3 - <<'PY' 2>/dev/null
import glob, importlib.util, os
dirs = []
try:
    import nvidia
    for base in list(nvidia.__path__):
        dirs += sorted(glob.glob(os.path.join(base, "*", "lib")))
        dirs += sorted(glob.glob(os.path.join(base, "*", "*", "lib")))
except Exception:
    pass
spec = importlib.util.find_spec("torch")
if spec and spec.origin:
    dirs.append(os.path.join(os.path.dirname(spec.origin), "lib"))
print(":".join(d for d in dirs if os.path.isdir(d)))
PY
)
export LD_LIBRARY_PATH="${NV_DIRS:+$NV_DIRS:}/usr/local/cuda/lib64:/usr/local/cuda/lib:/usr/local/nvidia/lib64:/usr/local/nvidia/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
find_lib() {  # the path the dynamic loader resolves soname $1 to (as our binaries will), or nothing
  python3 - "$1" <<'PY' 2>/dev/null
import ctypes, sys
try:
    ctypes.CDLL(sys.argv[1])
except OSError:
    sys.exit(0)
with open("/proc/self/maps") as maps:
    for line in maps:
        if sys.argv[1].split(".so")[0] + ".so" in line:
            print(line.split()[-1])
            break
    else:
        print(sys.argv[1] + " (loaded)")
PY
}
note "gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ) $([ $DRY = 1 ] && echo '(dry run: no GPU needed)') commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)"
[ -f "$ROOT/$CARRY/MANIFEST.txt" ] && note "carried build: $(head -1 "$ROOT/$CARRY/MANIFEST.txt")"
for b in modar_test_cuda modar modar_cuda_peaks modar_bench_layers; do
  [ -x "$BIN/$b" ] || fail_deps "missing $CARRY/bin/$b: run scripts/gpu-build.sh here first and carry $CARRY"
done
missing=""
for lib in libcuda.so.1 libcudart.so.13 libcublasLt.so.13 libcublas.so.13 libcudnn.so.9; do
  path=$(find_lib "$lib")
  if [ -z "$path" ]; then
    missing="$missing $lib"
  else
    note "deps: $lib -> $path"
  fi
done
unresolved=$(for b in "$BIN"/*; do ldd "$b" 2>&1 | grep "not found" | sed "s|^|$(basename "$b"): |"; done | sort -u | tr '\n' ';')
if [ $DRY = 0 ]; then
  [ -n "$missing" ] && fail_deps "missing libraries:$missing (the dynamic loader found none with LD_LIBRARY_PATH=$LD_LIBRARY_PATH)"
  [ -n "$unresolved" ] && fail_deps "unresolved by ldd: $unresolved"
  nvidia-smi -L > "$WORK/gpus.txt" 2>&1 || fail_deps "no GPU visible: nvidia-smi -L failed ($(head -1 "$WORK/gpus.txt"))"
  note "deps: $(head -1 "$WORK/gpus.txt")"
  export MODAR_REQUIRE_CUDNN=1
else
  note "deps (dry run): missing:${missing:- none}; ldd unresolved: ${unresolved:-none}"
fi

# ---- stages -----------------------------------------------------------------------
# run_stage NAME LIMIT_S COMMAND...: stdout+stderr to $WORK/NAME.log, capped by
# the time left in BUDGET_S; the exit code is recorded, the run goes on.
run_stage() {
  local name=$1 limit=$2
  shift 2
  local start rc left
  start=$(date +%s)
  left=$((BUDGET_S - (start - START_ALL)))
  if [ "$left" -lt 5 ]; then
    note "$(printf '%-9s rc=%-4s %4ss  %s' "$name" skip 0 "(total budget spent) $*")"
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name (limit ${limit}s): $*" >> "$WORK/$name.log"
  timeout --kill-after=5 "$limit" "$@" >> "$WORK/$name.log" 2>&1
  rc=$?
  note "$(printf '%-9s rc=%-4s %4ss  %s' "$name" "$rc" "$(($(date +%s) - start))" "$*")"
  return 0
}

env_info() {
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw,power.limit --format=csv
  nvcc --version 2>/dev/null | tail -1
  compute-sanitizer --version 2>/dev/null | head -2
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())'
  cat "$ROOT/$CARRY/MANIFEST.txt"
}
export -f env_info
export ROOT CARRY
run_stage env 15 bash -c env_info

T="$BIN/modar_test_cuda"
run_stage tests 130 "$T" --gtest_output="xml:$WORK/tests.xml"
if command -v compute-sanitizer >/dev/null 2>&1; then
  # Small cases only (the sanitizers slow kernels 10-100x).
  run_stage sanitize 40 compute-sanitizer --tool memcheck --error-exitcode 99 "$T" \
    --gtest_filter='CudaTopk.*:CudaGatherScatter.*:CudaRmsNorm.*:CudaRope.*:CudaDar.*:CudaLoss.*:CudaAttentionCudnn.ForwardAndBackwardMatchCpu:CudaAllocator.*'
  run_stage sanitize_race 25 compute-sanitizer --tool racecheck --error-exitcode 99 "$T" \
    --gtest_filter='CudaTopk.RaggedCountsOfPredictorMode:CudaDepthRead.MergeForwardBackwardMatchCpu:CudaAttention.ForwardAndBackwardMatchCpu'
else
  note "sanitize  rc=-    compute-sanitizer not on PATH"
fi
run_stage peaks 50 "$BIN/modar_cuda_peaks" --reps 10 --side-by-side "$WORK/ours.tsv"
if [ $DRY = 1 ]; then
  # Rehearse the PyTorch side on a sample of our table (no torch here).
  printf 'kind\tparams\tours_median_s\tours_spread\tours_path\ngemm\tm=4096 n=4096 k=4096\t0.0002\t0.01\tcublaslt\n' > "$WORK/ours.sample.tsv"
  run_stage torch 30 python3 "$ROOT/scripts/gpu_torch_compare.py" --dry-run \
    --ours "$WORK/ours.sample.tsv" --out "$WORK/side_by_side.tsv"
else
  run_stage torch 55 env PYTHONUNBUFFERED=1 python3 "$ROOT/scripts/gpu_torch_compare.py" \
    --ours "$WORK/ours.tsv" --out "$WORK/side_by_side.tsv"
fi
run_stage bench 45 "$BIN/modar_bench_layers" --backend cuda --dtype bf16 --shapes 2048x2048x8 \
  --capacity 0.125 --reps 5 --model-d 2048 --model-layers 16 --model-seq 1024 --model-batch 1 \
  --model-vocab 8192
PROFILE="$WORK/h200-measured.toml"
RESUME=()
if [ -f "$ROOT/$CARRY/h200-measured.toml.partial" ]; then
  cp "$ROOT/$CARRY/h200-measured.toml.partial" "$PROFILE.partial"
  RESUME=(--resume)
fi
left=$((BUDGET_S - ($(date +%s) - START_ALL) - 45))  # keep 45 s for validate
[ "$left" -lt 5 ] && left=5
run_stage profile "$left" "$BIN/modar" profile --backend cuda --dtype bf16 --quick \
  --max-point-bytes 1073741824 --budget 0.03 "${RESUME[@]}" --out "$PROFILE"
# validate needs a measured profile: the new one, else its partial checkpoint
# (the measured shapes so far; the planner extrapolates the rest).
VALIDATE_PROFILE="$PROFILE"
if [ ! -f "$PROFILE" ] && [ -f "$PROFILE.partial" ]; then
  VALIDATE_PROFILE="$WORK/h200-measured-partial.toml"
  cp "$PROFILE.partial" "$VALIDATE_PROFILE"
fi
if [ -f "$VALIDATE_PROFILE" ]; then
  run_stage validate 45 "$BIN/modar" validate --backend cuda --quick --rounds 3 \
    --profile "$VALIDATE_PROFILE"
else
  note "validate  rc=-    no measured profile (the profile stage wrote none)"
fi
note "total $(($(date +%s) - START_ALL))s (budget ${BUDGET_S}s); validate profile: $(basename "$VALIDATE_PROFILE")"
pack
cat "$SUMMARY"
exit 0
