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
