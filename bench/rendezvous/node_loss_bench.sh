#!/usr/bin/env bash
# Node loss to a re-formed round: three rdzv_agent processes (the dlaunch rendezvous code, no
# workers) in network namespaces joined by veth pairs; node C's link is cut and we time from the
# cut to the other two printing their new round. Root and iproute2 only.
#   bench/rendezvous/node_loss_bench.sh [build_dir=build] [interval=1] [max_attempt=3] [repeat=3]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}; interval=${2:-1}; attempts=${3:-3}; repeat=${4:-3}
agent=$PWD/$build/tests/rdzv_agent
[[ -x $agent ]] || { echo "build $agent first (cmake --build $build --target rdzv_agent)" >&2; exit 1; }
[[ $(id -u) == 0 ]] || { echo "needs root (ip netns)" >&2; exit 1; }
conf="keep_alive_interval=$interval,keep_alive_max_attempt=$attempts,last_call_timeout=1,join_timeout=120"
cleanup() { for ns in dlb_a dlb_b dlb_c; do ip netns del $ns 2>/dev/null || true; done; }
now() { date +%s.%N; }
times=()
for ((r = 0; r < repeat; r++)); do
  cleanup
  ip netns add dlb_a; ip netns add dlb_b; ip netns add dlb_c
  ip link add dlb_ab type veth peer name dlb_ba; ip link add dlb_ac type veth peer name dlb_ca
  ip link set dlb_ab netns dlb_a; ip link set dlb_ba netns dlb_b
  ip link set dlb_ac netns dlb_a; ip link set dlb_ca netns dlb_c
  ip -n dlb_a addr add 10.78.1.1/24 dev dlb_ab; ip -n dlb_b addr add 10.78.1.2/24 dev dlb_ba
  ip -n dlb_a addr add 10.78.2.1/24 dev dlb_ac; ip -n dlb_c addr add 10.78.2.2/24 dev dlb_ca
  for ns in dlb_a dlb_b dlb_c; do ip -n $ns link set lo up; done
  ip -n dlb_a link set dlb_ab up; ip -n dlb_a link set dlb_ac up
  ip -n dlb_b link set dlb_ba up; ip -n dlb_c link set dlb_ca up
  dir=$(mktemp -d)
  ip netns exec dlb_a "$agent" --endpoint 127.0.0.1:29478 --host a --nnodes 2:3 --conf "$conf" --serve 0.0.0.0 >"$dir/a" 2>/dev/null &
  pa=$!
  sleep 0.3
  ip netns exec dlb_b "$agent" --endpoint 10.78.1.1:29478 --host b --nnodes 2:3 --conf "$conf" >"$dir/b" 2>/dev/null &
  pb=$!
  ip netns exec dlb_c "$agent" --endpoint 10.78.2.1:29478 --host c --nnodes 2:3 --conf "$conf" >"$dir/c" 2>/dev/null &
  pc=$!
  until grep -q "^ROUND 0" "$dir/a" && grep -q "^ROUND 0" "$dir/b" && grep -q "^ROUND 0" "$dir/c"; do sleep 0.05; done
  sleep "$interval"  # let a beat or two pass so the cut lands mid-window, as in life
  t0=$(now)
  ip -n dlb_c link set dlb_ca down
  until grep -q "^ROUND 1" "$dir/a" && grep -q "^ROUND 1" "$dir/b"; do sleep 0.01; done
  t1=$(now)
  kill -9 $pa $pb $pc 2>/dev/null || true
  wait 2>/dev/null || true
  dt=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')
  times+=("$dt")
  grep -h "^ROUND 1" "$dir/a" "$dir/b" | tr '\n' ' '; echo "after $dt s"
  rm -rf "$dir"
done
cleanup
median=$(printf '%s\n' "${times[@]}" | sort -n | sed -n "$(( (repeat + 1) / 2 ))p")
window=$(awk -v i="$interval" -v n="$attempts" 'BEGIN { print i * n }')
echo "node loss (link cut) to re-formed round of 2: median $median s over $repeat runs; keep-alive window $window s (target: window + 1 s)"
