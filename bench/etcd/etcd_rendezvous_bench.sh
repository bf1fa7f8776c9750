#!/usr/bin/env bash
# etcd rendezvous benchmarks, against a private etcd 3.4 started here (tests/cluster/start_etcd.sh):
#   1. N agents (default 64) complete one rendezvous (--nnodes N): time from the first agent's
#      start to the last agent's "round complete", median of RUNS runs;
#   2. node loss: K agents (default 8, --nnodes 2:K) form a round; one is SIGKILLed; time until
#      every survivor completed the re-formed round, against the lease TTL;
#   3. the peer: P real launchers (default 8) with one worker each (`/bin/sh -c date`), dlaunch
#      --rdzv_backend etcd vs torchrun --rdzv_backend etcd (torch 1.13, python-etcd, etcd's v2
#      API), both against this etcd: time from launching the agents until the last worker runs.
# The agents are build/bin/etcd_rdzv_agent (tests/etcd/etcd_rdzv_agent.cc): the registry's
# "etcd" handler exactly as dlaunch uses it, without workers.
#
#   bench/etcd/etcd_rendezvous_bench.sh [BUILD_DIR]
#   (env: AGENTS=64 RUNS=5 LOSS_AGENTS=8 LOSS_RUNS=$RUNS PEER_AGENTS=8 PEER_RUNS=3;
#    LOSS_RUNS=0 skips part 2, PEER_RUNS=0 skips part 3)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
agent=$build/bin/etcd_rdzv_agent
[[ -x $agent ]] || { echo "build $agent first: cmake --build $build --target etcd_rdzv_agent" >&2; exit 2; }
agents=${AGENTS:-64} runs=${RUNS:-5} loss_agents=${LOSS_AGENTS:-8} loss_runs=${LOSS_RUNS:-${RUNS:-5}}
# keep_alive_interval=1 x max_attempt=3: a 3 s lease. last_call short: after a loss the
# survivors are below MAX, so the round completes after last call.
conf=${CONF:-last_call_timeout=0.2,keep_alive_interval=1,keep_alive_max_attempt=3,join_timeout=120}
ttl=3

work=$(mktemp -d /tmp/dlaunch-etcd-bench.XXXXXX)
pids=()
cleanup() {
  ((${#pids[@]})) && kill -9 "${pids[@]}" 2>/dev/null || true
  "$root/tests/cluster/stop_etcd.sh" "$work/etcd" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
"$root/tests/cluster/start_etcd.sh" "$work/etcd" --v2 >/dev/null 2>&1
endpoint=$(cat "$work/etcd/endpoint")
ulimit -n 20000 2>/dev/null || true

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

echo "etcd rendezvous, $agents agents (--nnodes $agents), etcd 3.4 on $endpoint, $(nproc) cores"
times=()
for ((run = 1; run <= runs; run++)); do
  dir=$work/r$run; mkdir -p "$dir"; pids=()
  for ((i = 0; i < agents; i++)); do
    "$agent" --endpoint "$endpoint" --run_id "bench-$run-$$" --nnodes "$agents" --rounds 1 \
      --conf "$conf" --stats >"$dir/$i.out" 2>"$dir/$i.err" &
    pids+=($!)
  done
  wait "${pids[@]}" || { echo "an agent failed:"; cat "$dir"/*.out | grep -v '^start\|^round' | head; exit 1; }
  pids=()
  t=$(cat "$dir"/*.out | awk '/^start/ {sub("t=","",$2); if (s=="" || $2<s) s=$2}
                              /^round/ {sub("t=","",$NF); if ($NF>e) e=$NF}
                              END {printf "%.3f", e - s}')
  n=$(grep -l '^round 0 rank' "$dir"/*.out | wc -l)
  [[ $n == "$agents" ]] || { echo "run $run: only $n of $agents agents completed"; exit 1; }
  echo "  run $run: ${t} s"
  times+=("$t")
done
echo "rendezvous of $agents agents: median $(printf '%s\n' "${times[@]}" | median) s over $runs runs (target <= 3 s)"
# What each agent asked of etcd (etcd_rdzv_agent --stats), averaged over every agent of every run.
echo "per agent, mean over all runs: what it asked of etcd (gateway calls by path, watch events)"
cat "$work"/r*/*.out | awk -v n=$((agents * runs)) '
  /^stat / {name = $2; for (i = 3; i < NF; i++) name = name " " $i; c[name] += $NF
            if ($2 ~ /^\/v3\//) calls += $NF}
  END {for (k in c) printf "  %-30s %8.1f\n", k, c[k] / n; printf "  %-30s %8.1f\n", "all gateway calls", calls / n}' | sort

if ((loss_runs > 0)); then
echo
echo "node loss: $loss_agents agents (--nnodes 2:$loss_agents), lease TTL ${ttl} s, conf $conf"
losses=()
for ((run = 1; run <= loss_runs; run++)); do
  dir=$work/l$run; mkdir -p "$dir"; pids=()
  for ((i = 0; i < loss_agents; i++)); do
    "$agent" --endpoint "$endpoint" --run_id "loss-$run-$$" --nnodes "2:$loss_agents" \
      --conf "$conf" >"$dir/$i.out" 2>"$dir/$i.err" &
    pids+=($!)
  done
  for _ in $(seq 1 300); do
    [[ $(grep -l '^round 0 ' "$dir"/*.out 2>/dev/null | wc -l) == "$loss_agents" ]] && break
    sleep 0.1
  done
  # Kill the agent with node rank 1 (not the workers' store host), after a keep-alive beat.
  victim=$(grep -l '^round 0 rank 1 ' "$dir"/*.out | head -1)
  victim_index=$(basename "$victim" .out)
  sleep 1.5
  tk=$(python3 -c "import os,time; os.kill(${pids[$victim_index]}, 9); print('%.6f' % time.monotonic())")
  for _ in $(seq 1 300); do
    done_count=0
    for ((i = 0; i < loss_agents; i++)); do
      ((i == victim_index)) && continue
      grep -q '^round 1 ' "$dir/$i.out" && done_count=$((done_count + 1))
    done
    ((done_count == loss_agents - 1)) && break
    sleep 0.1
  done
  ((done_count == loss_agents - 1)) || { echo "run $run: survivors did not re-form"; tail -3 "$dir"/*.out; exit 1; }
  t=$(for ((i = 0; i < loss_agents; i++)); do ((i == victim_index)) || cat "$dir/$i.out"; done |
      awk -v tk="$tk" '/^round 1 / {sub("t=","",$NF); if ($NF>e) e=$NF} END {printf "%.3f", e - tk}')
  echo "  run $run: killed node rank 1, group of $((loss_agents - 1)) re-formed after ${t} s"
  losses+=("$t")
  kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; pids=()
done
echo "node loss to re-formed group: median $(printf '%s\n' "${losses[@]}" | median) s over $loss_runs runs (target <= TTL + 1 = $((ttl + 1)) s)"
fi

peer_agents=${PEER_AGENTS:-8} peer_runs=${PEER_RUNS:-3}
((peer_runs > 0)) || exit 0
if ! /usr/bin/python3 -c 'import etcd, torch.distributed.run' 2>/dev/null; then
  echo; echo "peer skipped: /usr/bin/python3 lacks torch or python-etcd (scripts/setup.sh --bench)"; exit 0
fi
echo
echo "launch with etcd rendezvous, $peer_agents agents x 1 worker (/bin/sh), until the last worker runs"
# $1: dlaunch|torchrun, $2: run number. Prints milliseconds.
launch() {
  local who=$1 run=$2 dir=$work/p-$1-$2 t0 i
  mkdir -p "$dir"
  t0=$(date +%s%N)
  for ((i = 0; i < peer_agents; i++)); do
    if [[ $who == dlaunch ]]; then
      "$build/bin/dlaunch" --nnodes "$peer_agents" --nproc_per_node 1 --rdzv_backend etcd \
        --rdzv_endpoint "$endpoint" --rdzv_id "peer-$run-$$" --local_addr 127.0.0.1 \
        --no_slurm --no_python /bin/sh -c "date +%s%N > $dir/w.\$RANK" >"$dir/a$i.log" 2>&1 &
    else
      # -r/-t: torch 1.13 on Python 3.11 crashes at argument parsing without them.
      /usr/bin/python3 -m torch.distributed.run --nnodes "$peer_agents" --nproc_per_node 1 \
        --rdzv_backend etcd --rdzv_endpoint "$endpoint" --rdzv_id "tpeer-$run-$$" -r 1 -t 1 \
        --no_python /bin/sh -c "date +%s%N > $dir/w.\$RANK" >"$dir/a$i.log" 2>&1 &
    fi
    pids+=($!)
  done
  wait "${pids[@]}" || true
  pids=()
  local n; n=$(ls "$dir" | grep -c '^w\.' || true)
  [[ $n == "$peer_agents" ]] || { echo "$who run $run: $n of $peer_agents workers ran" >&2; tail -5 "$dir/a0.log" >&2; exit 1; }
  echo $(( ($(cat "$dir"/w.* | sort -n | tail -1) - t0) / 1000000 ))
}
ours=() theirs=()
for ((run = 1; run <= peer_runs; run++)); do
  ours+=("$(launch dlaunch "$run")")
  theirs+=("$(launch torchrun "$run")")
  echo "  run $run: dlaunch ${ours[-1]} ms, torchrun ${theirs[-1]} ms"
done
o=$(printf '%s\n' "${ours[@]}" | median) t=$(printf '%s\n' "${theirs[@]}" | median)
echo "medians over $peer_runs runs: dlaunch $o ms, torchrun $t ms, torchrun/dlaunch $(awk -v a="$t" -v b="$o" 'BEGIN {printf "%.1f", a / b}')x"
