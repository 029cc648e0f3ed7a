#!/usr/bin/env bash
# Install what modar needs, idempotently: Debian packages (C++ libraries and
# tools) and pinned Python packages for the default python3, then configure
# and build.  Safe to run again; only missing pieces are installed.
#
#   scripts/setup.sh [--no-build]
set -euo pipefail
cd "$(dirname "$0")/.."

DEBIAN_PACKAGES=(build-essential cmake pkg-config git libeigen3-dev libtomlplusplus-dev
                 libgtest-dev python3-dev)

missing=()
for pkg in "${DEBIAN_PACKAGES[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ -f scripts/python-requirements.txt ]; then
  PYTHON="${PYTHON:-python3}"
  if ! "$PYTHON" -m pip install -q --disable-pip-version-check -r scripts/python-requirements.txt \
       --dry-run 2>/dev/null | grep -q "Would install"; then
    :  # everything pinned is already there
  else
    echo "setup: installing pinned Python packages" >&2
    "$PYTHON" -m pip install -q --disable-pip-version-check -r scripts/python-requirements.txt
  fi
fi

# The Python package `modar` (pyproject.toml: the extension modar._core, the
# pure-Python layer and the `modar` CLI in the environment's scripts dir).
# Incremental: no build isolation and a kept build dir (build/python), and no
# reinstall at all when no input is newer than the last install's stamp.
install_python_package() {
  local python="${PYTHON:-python3}"
  local py_build_dir="${PY_BUILD_DIR:-build/python}"
  local stamp="$py_build_dir/.modar-installed"
  local inputs=(pyproject.toml CMakeLists.txt include cost_models planner runtime bindings profiles)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$(command -v "$python")" ] &&
     [ -z "$(find "${inputs[@]}" -newer "$stamp" -type f -not -name '*.pyc' -print -quit 2>/dev/null)" ] &&
     (cd / && "$python" -c "import modar._core" 2>/dev/null); then
    return 0
  fi
  echo "setup: building and installing the modar Python package ($py_build_dir)" >&2
  mkdir -p "$py_build_dir"
  PIP_ROOT_USER_ACTION=ignore nice "$python" -m pip install -q --disable-pip-version-check \
    --no-build-isolation --no-deps --config-settings=build-dir="$py_build_dir" .
  # pyenv exposes new console scripts (`modar`) only after a rehash.
  if command -v pyenv >/dev/null 2>&1; then pyenv rehash || true; fi
  command -v "$python" > "$stamp"
}

if [ "${1:-}" != "--no-build" ]; then
  scripts/build.sh
  if [ -f scripts/python-requirements.txt ] && [ -f pyproject.toml ]; then
    install_python_package
  fi
fi
