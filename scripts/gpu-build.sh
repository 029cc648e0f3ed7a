#!/usr/bin/env bash
# scripts/gpu-build.sh: build, on a machine WITHOUT a GPU, the binaries that
# scripts/gpu-check.sh runs on the GPU device machine, and stage them in a
# small folder that travels with the working tree.
#
#   scripts/gpu-build.sh          # build-gpu/ (the tree), build-gpu-carry/ (what travels)
#   JOBS=2 scripts/gpu-build.sh
#
# The device machine has the NVIDIA driver, the CUDA runtime, cuBLAS and cuDNN
# (PyTorch's nvidia wheels), CMake and ninja, but no Eigen, toml++ or
# GoogleTest and no network.  So the binaries are built here for sm_90 with
# MODAR_SELF_CONTAINED=ON (static libstdc++ / libgcc / libgomp, header-only
# toml++, GoogleTest static, Eigen header-only); they need only
# libcudart.so.13, libcublasLt.so.13 / libcublas.so.13 and glibc, and dlopen
# libcudnn.so.9 at the first attention call.  build-gpu-carry/ holds the
# stripped binaries and MANIFEST.txt (commit, sizes, NEEDED libraries); it
# must stay under 60 MiB (the device tool carries at most 64 MiB in all).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD_DIR:-build-gpu}
CARRY=${CARRY_DIR:-build-gpu-carry}
JOBS=${JOBS:-2}
scripts/fetch-cudnn-frontend.sh
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMODAR_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DMODAR_SELF_CONTAINED=ON -DMODAR_PYTHON=OFF \
    -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache
fi
cmake --build "$BUILD" -j "$JOBS" --target modar_test_cuda modar_cli modar_cuda_peaks \
  modar_bench_layers
rm -rf "$CARRY"
mkdir -p "$CARRY/bin"
for f in "$BUILD/tests/modar_test_cuda" "$BUILD/bin/modar" "$BUILD/bin/modar_cuda_peaks" \
    "$(ls "$BUILD"/runtime/bench/modar_bench_layers "$BUILD"/bin/modar_bench_layers 2>/dev/null | head -1)"; do
  [ -x "$f" ] || { echo "gpu-build: $f was not built" >&2; exit 1; }
  cp "$f" "$CARRY/bin/"
  strip --strip-unneeded "$CARRY/bin/$(basename "$f")"
done
{
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) from $(git rev-parse --short HEAD)$(git diff --quiet || echo ' +uncommitted changes')"
  echo "cmake: sm_90, MODAR_SELF_CONTAINED=ON, $(nvcc --version | tail -1)"
  for b in "$CARRY"/bin/*; do
    echo "$(basename "$b"): $(stat -c %s "$b") bytes; NEEDED: $(readelf -d "$b" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p' | tr '\n' ' ')"
  done
} > "$CARRY/MANIFEST.txt"
cat "$CARRY/MANIFEST.txt"
size_kib=$(du -sk "$CARRY" | cut -f1)
echo "$CARRY: $((size_kib / 1024)) MiB"
if [ "$size_kib" -gt $((60 * 1024)) ]; then
  echo "gpu-build: $CARRY is $((size_kib / 1024)) MiB; the device tool carries at most 64 MiB in all" >&2
  exit 1
fi
