#!/usr/bin/env bash
# Slurm launch benchmark, on a private Slurm started here (tests/cluster/start_slurm.sh; root):
# inside one 4-node allocation (salloc), per run:
#   baseline  `srun -N4 -n4 /bin/true`: wall time of a Slurm step (launch and teardown)
#   slurm     `srun -N4 --ntasks-per-node=2 sh -c 'date > $SLURM_PROCID'`: Slurm itself starts
#             the 8 processes; time from srun's start until the last one runs
#   dlaunch   `srun -N4 --ntasks-per-node=1 dlaunch --nproc_per_node=2 sh -c 'date > $RANK'`:
#             one agent per node, static rendezvous from SLURM_*, 2 workers each; time until
#             the last of the 8 workers runs
# Prints the medians and dlaunch's overhead over Slurm's own launch (target: <= 0.5 s).
#
#   bench/slurm/srun_launch_bench.sh [BUILD_DIR]     (env: RUNS=7)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)

if [[ ${1:-} == --inner ]]; then
  # Runs inside the allocation: $2 = dlaunch binary, $3 = output dir, $4 = runs.
  dlaunch=$2 out=$3 runs=$4
  now() { date +%s%N; }
  for ((run = 1; run <= runs; run++)); do
    t0=$(now); srun -N4 -n4 /bin/true; t1=$(now)
    echo "baseline $(( (t1 - t0) / 1000 ))" >>"$out/times"

    d=$out/s$run; mkdir -p "$d"
    t0=$(now)
    srun -N4 -n8 --ntasks-per-node=2 /bin/sh -c "date +%s%N > $d/\$SLURM_PROCID"
    last=$(cat "$d"/* | sort -n | tail -1)
    echo "slurm $(( (last - t0) / 1000 ))" >>"$out/times"

    d=$out/d$run; mkdir -p "$d"
    t0=$(now)
    srun -N4 -n4 --ntasks-per-node=1 "$dlaunch" --nproc_per_node=2 --no_python \
      /bin/sh -c "date +%s%N > $d/\$RANK" 2>>"$out/dlaunch.log"
    n=$(ls "$d" | wc -l)
    [[ $n == 8 ]] || { echo "dlaunch run $run: $n of 8 workers ran" >&2; exit 1; }
    last=$(cat "$d"/* | sort -n | tail -1)
    echo "dlaunch $(( (last - t0) / 1000 ))" >>"$out/times"
  done
  exit 0
fi

build=${1:-$root/build}
dlaunch=$build/bin/dlaunch
[[ -x $dlaunch ]] || { echo "build $dlaunch first" >&2; exit 2; }
runs=${RUNS:-7}
work=$(mktemp -d /tmp/dlaunch-slurm-bench.XXXXXX)
cleanup() { "$root/tests/cluster/stop_slurm.sh" "$work/cluster" >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT
"$root/tests/cluster/start_slurm.sh" "$work/cluster" --nodes 4 >/dev/null 2>&1 ||
  { echo "could not start the test Slurm (needs root and scripts/setup.sh --test)" >&2; exit 1; }
export SLURM_CONF=$work/cluster/slurm.conf
mkdir -p "$work/out"
# --exclusive: every CPU of the 4 nodes, so steps of 1 and of 2 tasks per node both fit.
salloc -N4 --exclusive -Q "$0" --inner "$dlaunch" "$work/out" "$runs"

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
ms() { awk -v k="$1" '$1 == k {print $2 / 1000}' "$work/out/times" | median; }
base=$(ms baseline) slurm=$(ms slurm) ours=$(ms dlaunch)
echo "Slurm 22.05, 4 nodes (multiple-slurmd on one host, $(nproc) cores), medians of $runs runs:"
printf '  srun -N4 /bin/true (step launch, wall)          %8.1f ms\n' "$base"
printf '  srun -N4 x2 tasks: last of 8 processes running  %8.1f ms\n' "$slurm"
printf '  srun -N4 dlaunch x2 workers: last of 8 running  %8.1f ms\n' "$ours"
awk -v o="$ours" -v s="$slurm" -v b="$base" 'BEGIN {
  printf "  dlaunch overhead over Slurm launching the 8 itself: %.1f ms (target <= 500 ms); vs srun /bin/true: %.1f ms; ratio %.2fx\n", o - s, o - b, o / s }'
