#!/usr/bin/env bash
# Lists the functions over 80 lines and the classes over 400 lines outside tests and benchmarks
# (issue 15's targets), longest first, as "lines path:line name". Exits 1 when it lists any.
#   scripts/long_functions.sh [function-limit [class-limit]]
# Needs Universal Ctags (scripts/setup.sh --test installs it). Flat switch tables that read top to
# bottom are allowed over the limit; this lists them too, for a reader to judge.
set -euo pipefail
cd "$(dirname "$0")/.."
fn_limit=${1:-80}
class_limit=${2:-400}
command -v ctags >/dev/null || { echo "long_functions.sh: ctags not found; run scripts/setup.sh --test" >&2; exit 2; }
ctags --languages=C++ --kinds-C++=fcs --fields=+neK -o - -R common rendezvous launcher kernels worker \
  | awk -F'\t' -v fl="$fn_limit" -v cl="$class_limit" '
      {
        line = 0; end = 0; kind = ""
        for (i = 4; i <= NF; i++) {
          if ($i ~ /^line:/) line = substr($i, 6)
          else if ($i ~ /^end:/) end = substr($i, 5)
          else if ($i ~ /^(function|class|struct)$/) kind = $i
        }
        if (!end) next
        n = end - line + 1
        limit = kind == "function" ? fl : cl
        if (n > limit) printf "%5d %s:%d %s %s\n", n, $2, line, kind, $1
      }' \
  | sort -rn | tee /dev/stderr | { ! grep -q .; }
