# scripts/lib.sh: helpers shared by the set-up and test scripts (sourced).
#
# The Debian packages modar needs: C++ libraries and tools (toml++ for the
# config files, nlohmann-json for Hugging Face config.json), the Python
# environment's (python3-dev for the extension, python3-venv), and Open MPI
# for the multi-process runtime.  scripts/sanitize.sh adds Clang's.
# ccache: the Python package's build (build/python) compiles most of what
# build/ compiled, with the same flags; ccache turns that into cache hits.
MODAR_DEBIAN_PACKAGES=(build-essential cmake pkg-config git ccache libeigen3-dev
                       libtomlplusplus-dev nlohmann-json3-dev libgtest-dev python3-dev
                       python3-venv libopenmpi-dev
                       openmpi-bin)

# Every decision checks the real state: a Debian package counts as present
# only when dpkg's database says "installed" (not "config-files", not
# "half-installed"); nothing reads the text of a tool's quiet mode.

# The Debian packages among "$@" that are not installed, one per line.
modar_missing_debian_packages() {
  local pkg status
  for pkg in "$@"; do
    status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
    [ "$status" = installed ] || echo "$pkg"
  done
}

# Install the Debian packages among "$@" that are missing (apt-get, as root or
# through sudo), then check again: a package still missing is an error.
modar_ensure_debian_packages() {
  local missing
  mapfile -t missing < <(modar_missing_debian_packages "$@")
  ((${#missing[@]})) || return 0
  echo "setup: installing Debian packages: ${missing[*]}" >&2
  local sudo=""
  if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
      sudo="sudo"
    else
      echo "setup: missing Debian packages (${missing[*]}) and not root: run as root or install them" >&2
      return 1
    fi
  fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  mapfile -t missing < <(modar_missing_debian_packages "${missing[@]}")
  if ((${#missing[@]})); then
    echo "setup: apt-get did not install: ${missing[*]}" >&2
    return 1
  fi
}

# modar_timed NAME COMMAND...: run COMMAND, then print "time: NAME <s> s (exit <rc>)"
# on stderr; returns COMMAND's exit status.
modar_timed() {
  local name=$1 start rc
  shift
  start=$EPOCHREALTIME
  "$@" && rc=0 || rc=$?
  awk -v n="$name" -v a="$start" -v b="$EPOCHREALTIME" -v rc="$rc" \
    'BEGIN { printf "time: %-24s %7.1f s (exit %d)\n", n, b - a, rc }' >&2
  return "$rc"
}

# modar_configure_sanitize_build DIR: configure (once) the Clang build with
# ASan + UBSan and the libFuzzer targets (CUDA, benchmarks and Python off) that
# scripts/sanitize.sh and scripts/fuzz.sh build into DIR.
modar_configure_sanitize_build() {
  local dir=$1 launcher=()
  [ -f "$dir/CMakeCache.txt" ] && return 0
  if command -v ccache >/dev/null 2>&1; then
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  fi
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=clang++ \
    -DMODAR_CUDA=OFF -DMODAR_BENCHMARKS=OFF -DMODAR_PYTHON=OFF -DMODAR_FUZZ=ON \
    "${launcher[@]}" >/dev/null
}
