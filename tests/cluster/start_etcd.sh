#!/usr/bin/env bash
# Starts a private single-member etcd (3.4, from Debian's etcd-server) on 127.0.0.1 with client
# and peer ports away from 2379/2380 and its data in DIR. The v3 JSON gateway dlaunch speaks is
# served on the client port (http://127.0.0.1:PORT/v3/...).
#
#   tests/cluster/start_etcd.sh DIR [--skip-ok] [--v2]
#   source DIR/env.sh; etcdctl put a b; echo $DLAUNCH_ETCD_ENDPOINT
#   tests/cluster/stop_etcd.sh DIR
#
# Exit codes: 0 running; 77 skipped (etcd not installed; reason in DIR/skip) or 0 with
# --skip-ok; 1 failed (the daemon is stopped again and its log printed). Root is not needed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"

dir=${1:?usage: start_etcd.sh DIR [--skip-ok] [--v2]}
shift
skip_code=77 v2=()
for arg in "$@"; do
  case $arg in
    --skip-ok) skip_code=0 ;;
    # The v2 API too: torchrun's etcd rendezvous (python-etcd) speaks only v2 (bench/etcd).
    --v2) v2=(--enable-v2=true) ;;
    *) log "unknown option '$arg'"; exit 2 ;;
  esac
done
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
rm -f "$dir/skip"
for prog in etcd etcdctl ss; do
  command -v "$prog" >/dev/null || skip "'$prog' not installed: run scripts/setup.sh --test (etcd-server etcd-client iproute2)"
done
if [[ -f $dir/etcd.pid ]] && kill -0 "$(cat "$dir/etcd.pid")" 2>/dev/null; then
  # Left over from an interrupted run (this directory is ours): start afresh.
  log "an etcd already runs in $dir; stopping it first"
  "$here/stop_etcd.sh" "$dir" --keep
fi

failed() {
  log "failed; log follows"
  [[ -f $dir/etcd.log ]] && tail -n 30 "$dir/etcd.log" >&2
  "$here/stop_etcd.sh" "$dir" --keep >&2 || true
  exit 1
}
trap failed ERR

rm -rf "$dir/data"
port=$(free_port_block $((23790 + (RANDOM % 200) * 2)) 2)
endpoint=127.0.0.1:$port
peer=http://127.0.0.1:$((port + 1))
# setsid: etcd must not die with the shell that started it (ctest fixtures, a terminal).
setsid etcd --name dltest --data-dir "$dir/data" \
  --listen-client-urls "http://$endpoint" --advertise-client-urls "http://$endpoint" \
  --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
  --initial-cluster "dltest=$peer" --initial-cluster-state new \
  --logger zap --log-outputs "$dir/etcd.log" "${v2[@]}" </dev/null >/dev/null 2>&1 &
echo $! >"$dir/etcd.pid"
echo "$endpoint" >"$dir/endpoint"

cat >"$dir/env.sh" <<ENV
# source me: points etcdctl and dlaunch's tests at the private etcd in $dir
export ETCDCTL_API=3
export ETCDCTL_ENDPOINTS=http://$endpoint
export DLAUNCH_ETCD_ENDPOINT=$endpoint
ENV
# etcdctl 3.4 refuses --endpoints when ETCDCTL_ENDPOINTS is also set (another etcd's env.sh).
wait_until 30 "etcd health on $endpoint" \
  env -u ETCDCTL_ENDPOINTS ETCDCTL_API=3 etcdctl --endpoints "http://$endpoint" endpoint health
trap - ERR
log "etcd up in $dir on $endpoint (pid $(cat "$dir/etcd.pid"))"
log "use it with: source $dir/env.sh"
