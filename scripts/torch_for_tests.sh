#!/usr/bin/env bash
# scripts/torch_for_tests.sh: a real PyTorch for the PyTorch profile's test
# (tests/python/test_torch_profile.py).  PyTorch is no dependency of modar:
# `python -m modar profile --backend torch` uses the user's own.  Only the
# test suite needs one, so only scripts/test.sh calls this (never
# scripts/quickstart.sh: the main job must not download gigabytes).
#
#   scripts/torch_for_tests.sh install   # the download + install; slow, run in the background
#   scripts/torch_for_tests.sh link      # make .venv see it; record what happened
#
# Both need .venv (scripts/setup.sh --no-build makes it).  The decisions
# check the real state:
#   * .venv's python already imports torch with scaled_dot_product_attention
#     (installed by you, or linked before): nothing to do;
#   * else $MODAR_TORCH_PIN (torch==2.15.0) is installed ONCE per machine into
#     $MODAR_TORCH_HOME/<pin>-<python tag> (default ~/.cache/modar-torch), under
#     a lock, into a temporary folder renamed when complete (an interrupted
#     install leaves nothing half-written), and .venv sees it through a .pth
#     file (a fresh clone's .venv links it in milliseconds).  PyPI's Linux
#     wheel brings its CUDA runtime wheels: about 2.9 GB to download and
#     5.2 GB installed, even for the CPU (docs/profiler.md), which is why
#     scripts/test.sh starts `install` before the C++ build and joins it
#     before pytest: the download overlaps the compile.
#     MODAR_TORCH_INDEX_URL=<PyTorch's CPU wheel index> takes the ~200 MB CPU
#     build where that index is reachable;
#   * MODAR_TORCH=0 skips it.
# `link` records the outcome in $VENV/.modar-torch-status, which the test
# prints when it skips; a failed install is a warning, not an error.
# Environment: VENV (.venv), MODAR_TORCH, MODAR_TORCH_PIN, MODAR_TORCH_HOME,
# MODAR_TORCH_INDEX_URL.
set -euo pipefail
{  # one block: bash reads it whole before running, so editing this file mid-run is safe
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV="${VENV:-.venv}"
case "$VENV" in /*) ;; *) VENV="$ROOT/$VENV" ;; esac
VENV_PY="$VENV/bin/python"
MODAR_TORCH_PIN="${MODAR_TORCH_PIN:-torch==2.15.0}"
torch_status="$VENV/.modar-torch-status"

mode="${1:-}"
case "$mode" in
  install | link) ;;
  *) echo "usage: scripts/torch_for_tests.sh install|link" >&2; exit 2 ;;
esac
if [ ! -x "$VENV_PY" ]; then
  echo "torch_for_tests: $VENV_PY does not exist: run scripts/setup.sh --no-build first" >&2
  exit 1
fi

# The import takes seconds (PyTorch loads its CUDA libraries), so a passed
# check is cached under a key of this python, torch's version and the
# modification times of its package and library folders (cheap to read).
torch_key() {
  (cd / && "$VENV_PY" -c '
import importlib.metadata as m, os, sys
try:
    d = m.distribution("torch")
    p = os.path.dirname(str(d.locate_file("torch/__init__.py")))
    print(sys.executable, d.version, p, os.stat(p).st_mtime_ns,
          os.stat(os.path.join(p, "lib")).st_mtime_ns)
except Exception:
    print("none")' 2>/dev/null || echo none)
}
torch_imports() {
  local key
  key=$(torch_key)
  [ "$key" != none ] || return 1
  [ -f "$VENV/.modar-torch-ok" ] && [ "$(cat "$VENV/.modar-torch-ok")" = "$key" ] && return 0
  (cd / && "$VENV_PY" -c '
import torch, torch.nn.functional as F
assert hasattr(F, "scaled_dot_product_attention")' >/dev/null 2>&1) || return 1
  echo "$key" >"$VENV/.modar-torch-ok"
}
torch_prefix() {
  local tag
  tag=$("$VENV_PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
  echo "${MODAR_TORCH_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/modar-torch}/${MODAR_TORCH_PIN//[^A-Za-z0-9.]/-}-$tag"
}
install_torch_prefix() {  # $1 = the prefix; returns pip's status
  local prefix=$1 index=()
  [ -n "${MODAR_TORCH_INDEX_URL:-}" ] && index=(--index-url "$MODAR_TORCH_INDEX_URL")
  mkdir -p "$(dirname "$prefix")"
  (
    flock 9
    [ -f "$prefix/.modar-complete" ] && exit 0
    rm -rf "$prefix.partial"
    echo "torch_for_tests: installing $MODAR_TORCH_PIN into $prefix (once per machine;" \
      "PyPI's wheel brings its CUDA runtime: ~2.9 GB)" >&2
    "$VENV_PY" -m pip install -q --disable-pip-version-check --no-cache-dir --no-compile \
      "${index[@]}" --target "$prefix.partial" "$MODAR_TORCH_PIN" &&
      touch "$prefix.partial/.modar-complete" &&
      rm -rf "$prefix" && mv "$prefix.partial" "$prefix"
  ) 9>"$prefix.lock"
}

if [ "$mode" = install ]; then
  if [ "${MODAR_TORCH:-auto}" = 0 ] || torch_imports; then
    exit 0
  fi
  install_torch_prefix "$(torch_prefix)"
  exit
fi

# link
if torch_imports; then
  [ -f "$torch_status" ] && [ "$(head -c 3 "$torch_status")" = "ok:" ] ||
    echo "ok: torch $(torch_key | cut -d' ' -f2-3)" >"$torch_status"
  exit 0
fi
if [ "${MODAR_TORCH:-auto}" = 0 ]; then
  echo "not installed: MODAR_TORCH=0 (scripts/torch_for_tests.sh skipped PyTorch)" >"$torch_status"
  exit 0
fi
prefix=$(torch_prefix)
site=$("$VENV_PY" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
if [ ! -f "$prefix/.modar-complete" ]; then
  echo "not installed: $MODAR_TORCH_PIN is not in $prefix (the install failed or did not run:" \
    "no network, or no wheel for this Python; see scripts/test.sh's output)" >"$torch_status"
  echo "torch_for_tests: warning: $(cat "$torch_status")" >&2
  exit 0
fi
echo "$prefix" >"$site/modar-torch.pth"
if torch_imports; then
  echo "ok: $MODAR_TORCH_PIN from $prefix (linked by $site/modar-torch.pth)" >"$torch_status"
else
  echo "not installed: $prefix is linked but 'import torch' fails in $VENV_PY" >"$torch_status"
  echo "torch_for_tests: warning: $(cat "$torch_status")" >&2
fi
exit 0
}
