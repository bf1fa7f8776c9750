#!/usr/bin/env bash
# Starts a private Slurm cluster on this host: munged with its own key and socket, slurmctld and
# N slurmd in Slurm's multiple-slurmd mode, all on non-default ports, all state in DIR. Nothing
# system-wide is touched; clients find the cluster through SLURM_CONF (source DIR/env.sh).
#
#   tests/cluster/start_slurm.sh DIR [--nodes N] [--cpus C] [--skip-ok]
#   source DIR/env.sh; srun -N2 hostname; sinfo
#   tests/cluster/stop_slurm.sh DIR
#
# Nodes are named after loopback addresses 127.0.0.11, .12, ... so each "host" has its own
# address (Linux routes all of 127/8 to lo) and SLURM_JOB_NODELIST names addresses dlaunch can
# use as MASTER_ADDR without DNS. Each slurmd listens on its own port.
#
# Exit codes: 0 running; 77 skipped (not root, packages missing; reason in DIR/skip) or 0 with
# --skip-ok (for ctest fixtures: the tests read DIR/skip and skip with the reason); 1 failed
# (everything started is stopped again, logs are printed).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"

dir=${1:?usage: start_slurm.sh DIR [--nodes N] [--cpus C] [--skip-ok]}
shift
nodes=4 cpus=4 skip_code=77
while (($#)); do
  case $1 in
    --nodes) nodes=$2; shift 2 ;;
    --cpus) cpus=$2; shift 2 ;;
    --skip-ok) skip_code=0; shift ;;
    *) log "unknown option '$1'"; exit 2 ;;
  esac
done
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
rm -f "$dir/skip"

[[ $(id -u) == 0 ]] || skip "needs root (slurmd runs jobs as any user and SlurmUser=root); run as root"
for prog in munged mungekey slurmctld slurmd srun sbatch sinfo ss; do
  command -v "$prog" >/dev/null || skip "'$prog' not installed: run scripts/setup.sh --test (slurm-wlm munge iproute2)"
done
if [[ -e $dir/run/slurmctld.pid ]] && kill -0 "$(cat "$dir/run/slurmctld.pid")" 2>/dev/null; then
  # Left over from an interrupted run (this directory is ours): start afresh.
  log "a cluster already runs in $dir; stopping it first"
  "$here/stop_slurm.sh" "$dir" --keep
fi

failed() {
  log "failed; logs follow"
  for f in "$dir"/log/*.log; do [[ -f $f ]] && { echo "== $f" >&2; tail -n 20 "$f" >&2; }; done
  "$here/stop_slurm.sh" "$dir" --keep >&2 || true
  exit 1
}
trap failed ERR

rm -rf "$dir/state" "$dir/spool" "$dir/run" "$dir/munge"
mkdir -p "$dir/state" "$dir/spool" "$dir/run" "$dir/log" "$dir/tmp" "$dir/munge"
chmod 700 "$dir/munge"

# Ports: one for slurmctld, one per slurmd; start the search away from Slurm's 6817/6818 and
# below 20000: dlaunch derives a job's --master_port as 20000 + SLURM_JOB_ID % 10000, and a
# slurmd already listening there (job 1 -> 20001) would take the store's port.
port=$(free_port_block $((17000 + (RANDOM % 140) * 20)) $((nodes + 1)))

# munge: a private key and socket, so we never depend on (or disturb) a system munged.
dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$dir/munge/munge.key"
# --force: munged refuses a socket directory under world-writable /tmp without it.
munged --force --socket="$dir/munge/munge.sock" --key-file="$dir/munge/munge.key" \
  --pid-file="$dir/munge/munged.pid" --log-file="$dir/log/munged.log" --seed-file="$dir/munge/seed"
wait_until 10 munged test -S "$dir/munge/munge.sock"

{
  cat <<CONF
# Written by tests/cluster/start_slurm.sh; private test cluster, state under $dir.
ClusterName=dltest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$port
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
TmpFS=$dir/tmp
# linuxproc tracks a step's processes by parentage (no cgroups needed in containers);
# task/none binds nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
SchedulerType=sched/builtin
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
# The host has fewer cores than the nodes claim: trust slurm.conf, do not drain.
SlurmdParameters=config_overrides
ReturnToService=2
# SIGTERM -> SIGKILL delay on scancel / time limit: short, so the signal tests run quickly.
KillWait=5
InactiveLimit=0
MinJobAge=60
CONF
  for ((i = 1; i <= nodes; i++)); do
    echo "NodeName=127.0.0.$((10 + i)) NodeAddr=127.0.0.$((10 + i)) Port=$((port + i)) CPUs=$cpus State=UNKNOWN"
  done
  echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
} >"$dir/slurm.conf"

cat >"$dir/env.sh" <<ENV
# source me: points Slurm's clients at the private cluster in $dir
export SLURM_CONF=$dir/slurm.conf
ENV
export SLURM_CONF=$dir/slurm.conf

# -i: ignore state from an earlier run in this directory.
slurmctld -i
for ((i = 1; i <= nodes; i++)); do slurmd -N "127.0.0.$((10 + i))"; done

all_idle() {
  local states
  states=$(sinfo -h -N -o '%T' 2>/dev/null) || return 1
  [[ $(grep -c '^idle$' <<<"$states") == "$nodes" ]]
}
wait_until 60 "$nodes idle nodes (sinfo)" all_idle
trap - ERR
log "Slurm cluster up in $dir: $nodes nodes 127.0.0.[11-$((10 + nodes))], slurmctld port $port"
log "use it with: source $dir/env.sh"
