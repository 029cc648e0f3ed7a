#!/usr/bin/env bash
# scripts/long_functions.sh: every function of our C++ / CUDA sources longer
# than N lines (house rule: none over 200), longest first, as
#
#   <lines>  <file>:<first line>  <scope::name>
#
# Usage: scripts/long_functions.sh [--max N] [PATH ...]
#   --max N   report functions of more than N lines (default 200)
#   PATH      files or folders to read (default: every *.cpp *.hpp *.h *.cu
#             *.cuh file git tracks, plus untracked ones it does not ignore)
#
# A function's length runs from the line its definition starts on to its
# closing brace, as Universal Ctags reports them (fields line: and end:); a
# lambda counts toward the function around it.  CUDA launch qualifiers
# (__global__, __launch_bounds__(...)) are defined away so that kernels are
# named as written.
#
# Exit status: 0 when no function is over N, 1 when some are (usable as a
# check), 2 on a usage error or when Universal Ctags is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

max_lines=200
paths=()
while (($#)); do
  case "$1" in
    --max)
      [[ $# -ge 2 && "$2" =~ ^[0-9]+$ ]] || { echo "long_functions: --max takes a whole number of lines" >&2; exit 2; }
      max_lines=$2
      shift 2
      ;;
    --max=*)
      [[ "${1#--max=}" =~ ^[0-9]+$ ]] || { echo "long_functions: --max takes a whole number of lines" >&2; exit 2; }
      max_lines=${1#--max=}
      shift
      ;;
    -h | --help)
      usage
      exit 0
      ;;
    -*)
      echo "long_functions: unknown option '$1' (allowed: --max N, --help)" >&2
      exit 2
      ;;
    *)
      paths+=("$1")
      shift
      ;;
  esac
done

if ! command -v ctags >/dev/null 2>&1 || ! ctags --version 2>/dev/null | grep -q 'Universal Ctags'; then
  echo "long_functions: needs Universal Ctags (the 'ctags' on PATH is missing or not Universal Ctags);" \
    "install it with: apt-get install universal-ctags (Debian/Ubuntu), brew install universal-ctags (macOS)" >&2
  exit 2
fi

files=()
if ((${#paths[@]})); then
  for path in "${paths[@]}"; do
    if [ -d "$path" ]; then
      mapfile -t -O "${#files[@]}" files < <(find "$path" -type f \( -name '*.cpp' -o -name '*.hpp' \
        -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) | sort)
    elif [ -f "$path" ]; then
      files+=("$path")
    else
      echo "long_functions: '$path': no such file or folder" >&2
      exit 2
    fi
  done
else
  mapfile -t files < <(git ls-files --cached --others --exclude-standard -- \
    '*.cpp' '*.hpp' '*.h' '*.cu' '*.cuh' | sort)
fi
((${#files[@]})) || { echo "long_functions: no C++ or CUDA files to read" >&2; exit 2; }

report=$(
  printf '%s\n' "${files[@]}" |
    ctags -L - -o - --languages=C++ --langmap=C++:+.cu.cuh --kinds-C++=f --fields=+ne --extras=-F \
      -D'__launch_bounds__(x)=' -D'__launch_bounds__(x,y)=' -D'__global__=' -D'__device__=' \
      -D'__host__=' -D'__forceinline__=' 2>/dev/null |
    awk -F'\t' -v max="$max_lines" '
      {
        line = 0; end = 0; scope = ""
        for (i = 4; i <= NF; ++i) {
          if ($i ~ /^line:/) line = substr($i, 6)
          else if ($i ~ /^end:/) end = substr($i, 5)
          else if ($i ~ /^(namespace|class|struct):/) { scope = $i; sub(/^[a-z]+:/, "", scope) }
        }
        if (line == 0 || end == 0) next
        length_lines = end - line + 1
        gsub(/::__anon[0-9a-f]+/, "", scope)
        name = (scope == "" ? $1 : scope "::" $1)
        if (length_lines > max) printf "%5d  %s:%d  %s\n", length_lines, $2, line, name
      }' |
    sort -k1,1nr -k2,2
)

if [ -z "$report" ]; then
  echo "long_functions: no function over $max_lines lines in ${#files[@]} files"
  exit 0
fi
echo "$report"
echo "long_functions: $(printf '%s\n' "$report" | wc -l) functions over $max_lines lines in ${#files[@]} files"
exit 1
