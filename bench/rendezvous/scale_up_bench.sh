#!/usr/bin/env bash
# Elastic scale-up with real PyTorch DDP workers: one c10d agent runs tests/compat/elastic_ddp.py
# (gloo on CPU), a second agent joins; measured from the second agent's start until every rank
# of the new 2-rank world has printed "joined" (init_process_group returned: a working group),
# dlaunch beside torchrun in the same run, both with last_call_timeout=2 (torchrun's default is
# 30 s), both with the workers and torchrun of one PyTorch: Debian's 1.13 by default, or another
# interpreter's (e.g. the 2.15 venv of scripts/setup_torch2.sh) with PYTHON=.
#
#   [PYTHON=~/.cache/dlaunch/venv-torch-2.15.0/bin/python] bench/rendezvous/scale_up_bench.sh [RUNS]
#   (default 5 runs per launcher)
#
# Each figure includes the workers' own start (python + import torch, about 1-3 s here), the
# same for both launchers; dlaunch's agent log also says when it restarted the workers.
# Run from the repository root after scripts/build.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=${1:-5}
python=${PYTHON:-/usr/bin/python3}
script=$PWD/tests/compat/elastic_ddp.py
dlaunch=${DLAUNCH:-$PWD/build/bin/dlaunch}
tmp=$(mktemp -d)
cleanup() { pkill -P $$ 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT

now() { date +%s.%N; }
# wait_for FILE... PATTERN TIMEOUT: until PATTERN appears in any of the files.
wait_for() {
  local pattern=$1 timeout=$2
  shift 2
  local end=$(( $(date +%s) + timeout ))
  until cat "$@" 2>/dev/null | grep -q -- "$pattern"; do
    (( $(date +%s) < end )) || return 1
    sleep 0.02
  done
}

one_run() {  # launcher-name port -> seconds to a working 2-rank group, or "timeout"
  local name=$1 port=$2 a b
  rm -f "$tmp/stop" "$tmp"/*.out "$tmp"/*.err
  local common=(--nnodes 1:2 --rdzv_backend c10d --rdzv_endpoint "127.0.0.1:$port" --rdzv_id "bench$port"
                --rdzv_conf last_call_timeout=2)
  if [[ $name == dlaunch ]]; then
    launch=("$dlaunch" "${common[@]}" --python "$python" "$script" "$tmp/stop")
  else
    launch=("$python" -m torch.distributed.run "${common[@]}" -r 1 -t 1 --log_dir "$tmp/logs_$port" "$script" "$tmp/stop")
  fi
  "${launch[@]}" >"$tmp/a.out" 2>"$tmp/a.err" &
  a=$!
  wait_for "rank 0/1: step" 120 "$tmp/a.out" || { echo timeout; kill $a; return; }
  local t0 t1
  t0=$(now)
  "${launch[@]}" >"$tmp/b.out" 2>"$tmp/b.err" &
  b=$!
  if wait_for "rank 0/2: joined" 120 "$tmp/a.out" "$tmp/b.out" &&
     wait_for "rank 1/2: joined" 120 "$tmp/a.out" "$tmp/b.out"; then
    t1=$(now)
    awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f\n", b - a}'
  else
    echo timeout
  fi
  touch "$tmp/stop"
  wait $a $b 2>/dev/null || true
}

median() { grep -v timeout | sort -g | awk '{a[NR]=$1} END {if (NR == 0) print "n/a"; else print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

declare -A all
for name in dlaunch torchrun; do
  if [[ $name == torchrun ]] && ! "$python" -c "import torch.distributed.run" 2>/dev/null; then
    echo "torchrun: $python cannot import torch.distributed.run; skipped"; continue
  fi
  figures=()
  for r in $(seq "$runs"); do
    port=$(( 31000 + RANDOM % 20000 ))
    f=$(one_run "$name" "$port")
    figures+=("$f")
    echo "$name run $r: $f s to a working 2-rank group"
  done
  all[$name]=$(printf '%s\n' "${figures[@]}" | median)
  echo "$name: median ${all[$name]} s (runs: ${figures[*]})"
done
if [[ -n ${all[torchrun]:-} && ${all[torchrun]} != n/a && ${all[dlaunch]} != n/a ]]; then
  awk -v d="${all[dlaunch]}" -v t="${all[torchrun]}" 'BEGIN {printf "scale-up 1 -> 2 to a working group: dlaunch %.2f s, torchrun %.2f s, torchrun/dlaunch = %.1fx\n", d, t, t / d}'
fi
