#!/usr/bin/env bash
# scripts/setup.sh: install what modar needs, then build.  Idempotent: every
# step checks the real state first, so a second run installs nothing and
# rebuilds only what changed.
#
#   scripts/setup.sh [--no-build]
#
# 1. Debian packages: C++ libraries and tools, python3-venv, Open MPI (for the
#    multi-process runtime).  Present = dpkg's status "installed"; apt-get
#    runs only for the missing ones.
# 2. The project's Python environment .venv/ (VENV=...), created with
#    `$PYTHON -m venv` (PYTHON, default python3) when .venv/bin/python does not
#    run; then the pins of scripts/python-requirements.txt, each checked by
#    its installed version and an import in .venv's python
#    (scripts/check_python_requirements.py); pip runs only for the missing.
# 3. Unless --no-build: build into build/ (scripts/build.sh) and install the
#    `modar` package (the extension and the `modar` command) into .venv.
#
# Environment: VENV (.venv), PYTHON (python3), BUILD_DIR (build), JOBS (nproc).
set -euo pipefail
{  # one block: bash reads it whole before running, so editing this file mid-run is safe
cd "$(dirname "$0")/.."
ROOT=$(pwd)
source scripts/lib.sh

modar_ensure_debian_packages "${MODAR_DEBIAN_PACKAGES[@]}"  # scripts/lib.sh

# ---- the Python environment -------------------------------------------------
VENV="${VENV:-.venv}"
case "$VENV" in /*) ;; *) VENV="$ROOT/$VENV" ;; esac
VENV_PY="$VENV/bin/python"
PYTHON="${PYTHON:-python3}"

venv_runs() {  # .venv's python starts, is a virtual environment's, and has pip
  [ -x "$VENV_PY" ] &&
    "$VENV_PY" -c 'import sys, pip; sys.exit(sys.prefix == sys.base_prefix)' 2>/dev/null
}
if ! venv_runs; then
  if [ -e "$VENV" ] && [ ! -f "$VENV/pyvenv.cfg" ]; then
    echo "setup: $VENV exists but is not a virtual environment (no pyvenv.cfg); move it away" >&2
    exit 1
  fi
  echo "setup: creating the Python environment $VENV with $("$PYTHON" -c \
    'import sys; print(sys.executable, sys.version.split()[0])')" >&2
  "$PYTHON" -m venv --clear "$VENV"
  if ! venv_runs; then
    echo "setup: $VENV_PY does not run (or has no pip) after '$PYTHON -m venv $VENV'" >&2
    exit 1
  fi
fi

REQUIREMENTS=scripts/python-requirements.txt
check_requirements() {
  "$VENV_PY" scripts/check_python_requirements.py "$REQUIREMENTS" --cache "$VENV/.modar-requirements-ok"
}
# Wheels are kept in a wheelhouse outside the repository (MODAR_WHEELHOUSE), so
# a new clone (every CI run) installs offline from it; pip downloads only what
# the wheelhouse lacks.  Decisions by pip's exit status, never by its text.
# --no-compile: the .pyc files are written on first import instead.
install_pins() {
  local wheels="${MODAR_WHEELHOUSE:-${XDG_CACHE_HOME:-$HOME/.cache}/modar-wheels}"
  local pip=("$VENV_PY" -m pip)
  local install=(install -q --disable-pip-version-check --no-compile)
  mkdir -p "$wheels"
  if "${pip[@]}" "${install[@]}" --no-index --find-links "$wheels" -r "$REQUIREMENTS" \
       >/dev/null 2>&1; then
    return 0
  fi
  echo "setup: downloading the wheels $wheels lacks" >&2
  if "${pip[@]}" download -q --disable-pip-version-check --only-binary=:all: -d "$wheels" \
       -r "$REQUIREMENTS" &&
     "${pip[@]}" "${install[@]}" --no-index --find-links "$wheels" -r "$REQUIREMENTS"; then
    return 0
  fi
  "${pip[@]}" "${install[@]}" -r "$REQUIREMENTS"  # a package without a wheel: pip's own way
}
mapfile -t py_missing < <(check_requirements)
if ((${#py_missing[@]})); then
  echo "setup: installing Python packages into $VENV: ${py_missing[*]}" >&2
  install_pins
  mapfile -t py_missing < <(check_requirements)
  if ((${#py_missing[@]})); then
    echo "setup: still missing or broken in $VENV after pip install: ${py_missing[*]}" >&2
    exit 1
  fi
fi

# ---- PyTorch, for the PyTorch profile's test ---------------------------------------
# `python -m modar profile --backend torch` uses the user's PyTorch; it is no
# dependency of the package.  The test suite runs it on the CPU with a real
# PyTorch (tests/python/test_torch_profile.py), so setup provides one:
#   * .venv's python already imports torch with scaled_dot_product_attention
#     (installed by you, or linked before): nothing to do;
#   * else $MODAR_TORCH_PIN (torch==2.15.0) is installed ONCE per machine into
#     $MODAR_TORCH_HOME/<pin>-<python tag> (default ~/.cache/modar-torch), under
#     a lock, into a temporary folder renamed when complete, and .venv sees it
#     through a .pth file (a fresh clone's .venv links it in milliseconds).
#     PyPI's Linux wheel brings its CUDA runtime wheels: about 2.9 GB to
#     download and 5.2 GB installed, even for the CPU (docs/profiler.md);
#     MODAR_TORCH_INDEX_URL=<PyTorch's CPU wheel index> takes the ~200 MB CPU
#     build where that index is reachable;
#   * MODAR_TORCH=0 skips it.  Whatever happens is recorded in
#     $VENV/.modar-torch-status, which the test prints when it skips; a failed
#     install is a warning here, not an error.
MODAR_TORCH_PIN="${MODAR_TORCH_PIN:-torch==2.15.0}"
torch_status="$VENV/.modar-torch-status"
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
install_torch_prefix() {  # $1 = the prefix; returns pip's status
  local prefix=$1 index=()
  [ -n "${MODAR_TORCH_INDEX_URL:-}" ] && index=(--index-url "$MODAR_TORCH_INDEX_URL")
  mkdir -p "$(dirname "$prefix")"
  (
    flock 9
    [ -f "$prefix/.modar-complete" ] && exit 0
    rm -rf "$prefix.partial"
    echo "setup: installing $MODAR_TORCH_PIN into $prefix (once per machine; PyPI's wheel" \
      "brings its CUDA runtime: ~2.9 GB)" >&2
    "$VENV_PY" -m pip install -q --disable-pip-version-check --no-cache-dir --no-compile \
      "${index[@]}" --target "$prefix.partial" "$MODAR_TORCH_PIN" &&
      touch "$prefix.partial/.modar-complete" &&
      rm -rf "$prefix" && mv "$prefix.partial" "$prefix"
  ) 9>"$prefix.lock"
}
ensure_torch() {
  if torch_imports; then
    [ -f "$torch_status" ] && [ "$(head -c 3 "$torch_status")" = "ok:" ] ||
      echo "ok: torch $(torch_key | cut -d' ' -f2-3)" >"$torch_status"
    return 0
  fi
  if [ "${MODAR_TORCH:-auto}" = 0 ]; then
    echo "not installed: MODAR_TORCH=0 (scripts/setup.sh skipped PyTorch)" >"$torch_status"
    return 0
  fi
  local tag prefix site
  tag=$("$VENV_PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
  prefix="${MODAR_TORCH_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/modar-torch}/${MODAR_TORCH_PIN//[^A-Za-z0-9.]/-}-$tag"
  site=$("$VENV_PY" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  if ! install_torch_prefix "$prefix"; then
    echo "not installed: pip could not install $MODAR_TORCH_PIN into $prefix (no network" \
      "or no wheel for this Python; see setup's output)" >"$torch_status"
    echo "setup: warning: $(cat "$torch_status")" >&2
    return 0
  fi
  echo "$prefix" >"$site/modar-torch.pth"
  if torch_imports; then
    echo "ok: $MODAR_TORCH_PIN from $prefix (linked by $site/modar-torch.pth)" >"$torch_status"
  else
    echo "not installed: $prefix is linked but 'import torch' fails in $VENV_PY" >"$torch_status"
    echo "setup: warning: $(cat "$torch_status")" >&2
  fi
}
ensure_torch

# ---- the modar package ---------------------------------------------------------
# The Python package `modar` (pyproject.toml: the extension modar._core, the
# pure-Python layer and the `modar` CLI in the environment's bin/).
# Incremental: no build isolation and a kept build dir (build/python).  The
# real check: .venv imports modar._core from its own site-packages and has
# the `modar` command; the stamp only caches "no input is newer than the last
# install" on top of that.
modar_package_installed() {
  [ -x "$VENV/bin/modar" ] &&
    (cd / && "$VENV_PY" -c '
import sys, modar, modar._core
sys.exit(not modar.__file__.startswith(sys.prefix))' 2>/dev/null)
}
install_python_package() {
  local py_build_dir="${PY_BUILD_DIR:-build/python}"
  local stamp="$py_build_dir/.modar-installed"
  local inputs=(pyproject.toml CMakeLists.txt include cost_models planner runtime bindings profiles)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$VENV_PY" ] &&
     [ -z "$(find "${inputs[@]}" -newer "$stamp" -type f -not -name '*.pyc' -print -quit 2>/dev/null)" ] &&
     modar_package_installed; then
    return 0
  fi
  echo "setup: building and installing the modar Python package into $VENV ($py_build_dir)" >&2
  mkdir -p "$py_build_dir"
  echo "$VENV_PY" > "$stamp.new"  # its time: inputs edited during the build count as newer
  local settings=(--config-settings=build-dir="$py_build_dir")
  if command -v ccache >/dev/null 2>&1; then
    # The same compiler (by name: ccache hashes it) as build/, so that the
    # sources both compile are cache hits the second time.
    local cxx
    cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "${BUILD_DIR:-build}/CMakeCache.txt" 2>/dev/null ||
          true)
    settings+=(--config-settings=cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache)
    if [ -n "$cxx" ]; then
      # CMake cannot switch the compiler of a configured tree (it drops every
      # -D value): a tree configured with another one starts afresh.
      local cached
      cached=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$py_build_dir/CMakeCache.txt" 2>/dev/null ||
               true)  # no such file yet in a new tree
      if [ -n "$cached" ] && [ "$cached" != "$cxx" ]; then
        rm -f "$py_build_dir/CMakeCache.txt"
      fi
      settings+=(--config-settings=cmake.define.CMAKE_CXX_COMPILER="$cxx")
    fi
  fi
  PIP_ROOT_USER_ACTION=ignore "$VENV_PY" -m pip install -q --disable-pip-version-check \
    --no-build-isolation --no-deps "${settings[@]}" .
  if ! modar_package_installed; then
    echo "setup: modar is not importable from $VENV after pip install" >&2
    exit 1
  fi
  mv "$stamp.new" "$stamp"
}

if [ "${1:-}" != "--no-build" ]; then
  scripts/build.sh
  if [ -f pyproject.toml ]; then
    install_python_package
  fi
fi
exit
}
