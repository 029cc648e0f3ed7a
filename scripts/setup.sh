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

if [ "${1:-}" != "--no-build" ]; then
  scripts/build.sh
fi
