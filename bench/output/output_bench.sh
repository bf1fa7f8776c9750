#!/usr/bin/env bash
# Worker output through the launcher: the agent's CPU time per line and whether every line
# arrived, dlaunch beside torchrun (Debian's python3-torch 1.13) in the same run.
#
#   bench/output/output_bench.sh [LINES] [RUNS]      (defaults: 1000000 lines, 5 runs)
#
# The worker is `seq LINES`. dlaunch runs with --log_dir (console prefixed + byte-exact files);
# torchrun with -r 1 -t 1 (its tee: file + prefixed console; 1.13 on Python 3.11 needs -r/-t).
# CPU = user + sys of the launcher and everything it waited for, minus the same launcher
# running `seq 1` (start-up, rendezvous, Python imports) and minus `seq LINES` alone into a
# pipe; divided by LINES. Prints medians and the ratio. Run from the repository root after
# scripts/build.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
lines=${1:-1000000}
runs=${2:-5}
dlaunch=${DLAUNCH:-build/bin/dlaunch}  # DLAUNCH=path compares another build
python=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# cpu_of CMD...: "user+sys seconds" of CMD and its waited-for children; stdout to $tmp/out.
cpu_of() {
  /usr/bin/time -f "%U %S" -o "$tmp/time" "$@" >"$tmp/out" 2>/dev/null || true
  awk '{printf "%.4f\n", $1 + $2}' "$tmp/time"
}
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
# arrived PREFIX: how many distinct lines 1..LINES reached the console.
arrived() { sed -n "s/^$1//p" "$tmp/out" | grep -cxE '[0-9]+' | tr -d ' '; }

seq_cpu=$(for _ in $(seq "$runs"); do /usr/bin/time -f "%U %S" -o "$tmp/time" sh -c "seq $lines | cat >/dev/null"; awk '{printf "%.4f\n", $1 + $2}' "$tmp/time"; done | median)
echo "seq $lines alone into a pipe (seq + cat): ${seq_cpu} s CPU (median of $runs)"

measure() {  # name prefix cmd... ; prints the per-line figure in microseconds
  local name=$1 prefix=$2
  shift 2
  local base full got=()
  base=$(for _ in $(seq "$runs"); do rm -rf "$tmp/logs"; cpu_of "$@" seq 1; done | median)
  full=$(for _ in $(seq "$runs"); do rm -rf "$tmp/logs"; cpu_of "$@" seq "$lines"; got+=("$(arrived "$prefix")"); echo >&2 "  $name run: $(arrived "$prefix") of $lines lines on the console"; done | median)
  awk -v n="$name" -v b="$base" -v f="$full" -v s="$seq_cpu" -v l="$lines" \
    'BEGIN {us = (f - b - s) * 1e6 / l; if (us < 0) us = 0;
            printf "%-9s start-up %.3f s CPU, with %d lines %.3f s CPU: %.3f us per line\n", n, b, l, f, us > "/dev/stderr";
            printf "%.4f\n", us}'
}

d=$(measure dlaunch '\[default0\]:' "$dlaunch" --standalone --nproc_per_node 1 --log_dir "$tmp/logs" --no_python)
if "$python" -c "import torch.distributed.run" 2>/dev/null; then
  t=$(measure torchrun '\[default0\]:' "$python" -m torch.distributed.run --standalone --nproc_per_node 1 -r 1 -t 1 --log_dir "$tmp/logs" --no_python)
  awk -v d="$d" -v t="$t" 'BEGIN {printf "agent CPU per line: dlaunch %.3f us, torchrun %.3f us; dlaunch/torchrun = %.2f\n", d, t, (t > 0 ? d / t : 0)}'
else
  echo "torchrun: $python cannot import torch.distributed.run; dlaunch only: $d us per line"
fi
