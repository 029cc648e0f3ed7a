#!/usr/bin/env bash
# README command 2: build if needed and run every test (C++ and Python).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD_DIR="${BUILD_DIR:-build}"
status=0
(cd "$BUILD_DIR" && ctest --output-on-failure -j "$(nproc)" --timeout 900) || status=1
if [ -d tests/python ] && ls tests/python/test_*.py >/dev/null 2>&1; then
  python3 -m pytest -q tests/python || status=1
fi
exit $status
