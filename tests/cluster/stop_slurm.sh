#!/usr/bin/env bash
# Stops the cluster started by start_slurm.sh DIR: cancels its jobs, stops slurmd, slurmctld and
# munged, then kills anything still carrying this cluster's SLURM_CONF in its environment (job
# steps, workers), and nothing else. Removes DIR unless --keep (the logs stay with --keep).
#
#   tests/cluster/stop_slurm.sh DIR [--keep]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
dir=${1:?usage: stop_slurm.sh DIR [--keep]}
keep=0
[[ ${2:-} == --keep ]] && keep=1
[[ -d $dir ]] || exit 0
dir=$(cd "$dir" && pwd)
conf=$dir/slurm.conf

if [[ -f $conf ]] && [[ -e $dir/run/slurmctld.pid ]] && kill -0 "$(cat "$dir/run/slurmctld.pid")" 2>/dev/null; then
  export SLURM_CONF=$conf
  # Cancel every job so steps end through Slurm (SIGTERM, KillWait, SIGKILL) first.
  scancel --full --quiet --user="$(id -un)" 2>/dev/null || true
  for _ in $(seq 1 50); do
    [[ -z $(squeue -h -o %i 2>/dev/null) ]] && break
    sleep 0.2
  done
fi

pidfiles=("$dir"/run/slurmd-*.pid "$dir/run/slurmctld.pid")
pids=()
for f in "${pidfiles[@]}"; do
  [[ -f $f ]] && pids+=("$(cat "$f")")
done
terminate_pids 10 "${pids[@]}"
# Job steps and their tasks outlive slurmd; they all inherited SLURM_CONF=$conf.
mapfile -t left < <(pids_with_env "SLURM_CONF=$conf")
terminate_pids 5 "${left[@]}"
[[ -f $dir/munge/munged.pid ]] && terminate_pids 5 "$(cat "$dir/munge/munged.pid")"
rm -f "$dir"/run/*.pid

if ((keep)); then
  log "stopped; logs kept in $dir/log"
else
  rm -rf "$dir"
  log "stopped and removed $dir"
fi
