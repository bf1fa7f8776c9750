#!/usr/bin/env bash
# Starts a private etcd (3.4, from Debian's etcd-server) on 127.0.0.1 with client and peer
# ports away from 2379/2380 and its data in DIR: one member, or a cluster of N members with
# --members N. The v3 JSON gateway dlaunch speaks is served on the client port
# (http://127.0.0.1:PORT/v3/...).
#
#   tests/cluster/start_etcd.sh DIR [--skip-ok] [--v2] [--members N]
#   source DIR/env.sh; etcdctl put a b; echo $DLAUNCH_ETCD_ENDPOINT
#   tests/cluster/stop_etcd.sh DIR
#
# DIR/endpoint holds the client endpoint (host:port), with --members N the comma-separated list
# of the members' (etcdctl's form, what --rdzv_endpoint takes). One member keeps its pid in
# DIR/etcd.pid; member i of a cluster (1-based) in DIR/member<i>/etcd.pid, with its endpoint in
# DIR/member<i>/endpoint and DIR/member<i>/start.sh, which starts it again on its data (after a
# test killed it).
#
# Exit codes: 0 running; 77 skipped (etcd not installed; reason in DIR/skip) or 0 with
# --skip-ok; 1 failed (the daemon is stopped again and its log printed). Root is not needed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"

dir=${1:?usage: start_etcd.sh DIR [--skip-ok] [--v2]}
shift
skip_code=77 v2=() members=1
while (($# > 0)); do
  case $1 in
    --skip-ok) skip_code=0 ;;
    # The v2 API too: torchrun's etcd rendezvous (python-etcd) speaks only v2 (bench/etcd).
    --v2) v2=(--enable-v2=true) ;;
    --members)
      members=${2:-}
      [[ $members =~ ^[1-9]$ ]] || { log "--members needs a count 1-9, got '$members'"; exit 2; }
      shift ;;
    *) log "unknown option '$1'"; exit 2 ;;
  esac
  shift
done
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
rm -f "$dir/skip"
for prog in etcd etcdctl ss; do
  command -v "$prog" >/dev/null || skip "'$prog' not installed: run scripts/setup.sh --test (etcd-server etcd-client iproute2)"
done
for pidfile in "$dir"/etcd.pid "$dir"/member*/etcd.pid; do
  if [[ -f $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    # Left over from an interrupted run (this directory is ours): start afresh.
    log "an etcd already runs in $dir; stopping it first"
    "$here/stop_etcd.sh" "$dir" --keep
    break
  fi
done

failed() {
  log "failed; log follows"
  for f in "$dir"/etcd.log "$dir"/member*/etcd.log; do [[ -f $f ]] && tail -n 30 "$f" >&2; done
  "$here/stop_etcd.sh" "$dir" --keep >&2 || true
  exit 1
}
trap failed ERR

rm -rf "$dir/data" "$dir"/member*
port=$(free_port_block $((23790 + (RANDOM % 200) * 2)) $((2 * members)))

# start_member DIR NAME CLIENT_PORT PEER_PORT: writes DIR/start.sh and runs it. setsid: etcd
# must not die with the shell that started it (ctest fixtures, a terminal).
start_member() {
  local mdir=$1 name=$2 client=127.0.0.1:$3 peer=http://127.0.0.1:$4
  mkdir -p "$mdir"
  cat >"$mdir/start.sh" <<START
#!/usr/bin/env bash
# Starts etcd member $name (again) on its data in $mdir.
setsid etcd --name $name --data-dir "$mdir/data" \\
  --listen-client-urls "http://$client" --advertise-client-urls "http://$client" \\
  --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \\
  --initial-cluster "$cluster" --initial-cluster-state new \\
  --logger zap --log-outputs "$mdir/etcd.log" ${v2[*]} </dev/null >/dev/null 2>&1 &
echo \$! >"$mdir/etcd.pid"
START
  chmod +x "$mdir/start.sh"
  echo "$client" >"$mdir/endpoint"
  "$mdir/start.sh"
}

if ((members == 1)); then
  cluster="dltest=http://127.0.0.1:$((port + 1))"
  start_member "$dir" dltest "$port" $((port + 1))
  endpoint=$(cat "$dir/endpoint")
  urls=http://$endpoint
else
  cluster= endpoint= urls=
  for ((i = 1; i <= members; i++)); do
    cluster+=${cluster:+,}m$i=http://127.0.0.1:$((port + 2 * i - 1))
  done
  for ((i = 1; i <= members; i++)); do
    start_member "$dir/member$i" "m$i" $((port + 2 * i - 2)) $((port + 2 * i - 1))
    endpoint+=${endpoint:+,}$(cat "$dir/member$i/endpoint")
    urls+=${urls:+,}http://$(cat "$dir/member$i/endpoint")
  done
  echo "$endpoint" >"$dir/endpoint"
fi

cat >"$dir/env.sh" <<ENV
# source me: points etcdctl and dlaunch's tests at the private etcd in $dir
export ETCDCTL_API=3
export ETCDCTL_ENDPOINTS=$urls
export DLAUNCH_ETCD_ENDPOINT=$endpoint
ENV
# etcdctl 3.4 refuses --endpoints when ETCDCTL_ENDPOINTS is also set (another etcd's env.sh).
wait_until 30 "etcd health on $endpoint" \
  env -u ETCDCTL_ENDPOINTS ETCDCTL_API=3 etcdctl --endpoints "$urls" endpoint health
trap - ERR
log "etcd up in $dir on $endpoint ($members member(s))"
log "use it with: source $dir/env.sh"
