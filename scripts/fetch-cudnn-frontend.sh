#!/usr/bin/env bash
# scripts/fetch-cudnn-frontend.sh: the cuDNN frontend's C++ headers (header-only)
# for the CUDA build's fused attention (runtime/cuda/cudnn_attention.cpp), from
# the pinned PyPI wheel nvidia-cudnn-frontend, into build-deps/cudnn-frontend/
# (git-ignored; CMake's MODAR_CUDNN_FRONTEND_INCLUDE_DIR points there).  Needs
# pip and the network once; the headers are the same for every Python version.
#
#   scripts/fetch-cudnn-frontend.sh            # -> build-deps/cudnn-frontend/include
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=1.32.0  # frontend 1.32 needs cuDNN >= 9.0 at run time (checked when loaded)
DEST=build-deps/cudnn-frontend
if [ -f "$DEST/include/cudnn_frontend.h" ] && grep -q "FRONTEND_MINOR_VERSION 32" \
    "$DEST/include/cudnn_frontend_version.h" 2>/dev/null; then
  echo "cuDNN frontend $VERSION headers already in $DEST/include"
  exit 0
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
  --platform manylinux_2_28_x86_64 -d "$TMP" "nvidia-cudnn-frontend==$VERSION" || {
  echo "fetch-cudnn-frontend: pip download of nvidia-cudnn-frontend==$VERSION failed" >&2
  exit 1
}
mkdir -p "$TMP/x"
python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
  "$(ls "$TMP"/*.whl | head -1)" "$TMP/x"
rm -rf "$DEST"
mkdir -p "$DEST"
cp -r "$TMP/x/include" "$DEST/include"
echo "cuDNN frontend $VERSION headers in $DEST/include"
