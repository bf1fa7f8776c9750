#!/usr/bin/env bash
# Stops the etcd started by start_etcd.sh DIR (every member of a --members cluster) and removes
# DIR unless --keep.
#   tests/cluster/stop_etcd.sh DIR [--keep]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
dir=${1:?usage: stop_etcd.sh DIR [--keep]}
[[ -d $dir ]] || exit 0
pids=()
for pidfile in "$dir"/etcd.pid "$dir"/member*/etcd.pid; do
  [[ -f $pidfile ]] && pids+=("$(cat "$pidfile")")
  rm -f "$pidfile"
done
terminate_pids 10 "${pids[@]}"
if [[ ${2:-} == --keep ]]; then log "stopped; log kept in $dir/etcd.log"; else rm -rf "$dir"; log "stopped and removed $dir"; fi
