#!/usr/bin/env bash
# Runs the single-node examples of README.md against a build directory (default: build) and
# checks each one's exit code. Usage: examples/single_node/run.sh [build_dir]
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build}
D="$B/bin/dlaunch"
W="$B/bin/dlaunch_test_worker"
[[ -x $D && -x $W ]] || { echo "build first: $D and $W are missing" >&2; exit 2; }
failed=0
check() {  # expected-exit-code description command...
  local want=$1 what=$2
  shift 2
  echo "=== $what"
  "$@"
  local rc=$?
  if [[ $rc == "$want" ]]; then echo "=== ok (exit $rc)"; else echo "=== UNEXPECTED exit $rc (wanted $want)"; failed=1; fi
}
if /usr/bin/python3 -c 'import torch.distributed' 2>/dev/null; then
  check 0 "PyTorch all_reduce over the agent's store" \
    "$D" --standalone --nproc_per_node 2 --python /usr/bin/python3 examples/single_node/allreduce.py
else
  echo "=== skipping the PyTorch example: /usr/bin/python3 has no torch (apt-get install python3-torch)"
fi
check 0 "the worker contract" "$D" --standalone --nproc_per_node 2 "$W" print-env
check 0 "crash once, restarted" "$D" --standalone --nproc_per_node 2 --max_restarts 1 "$W" crash-once
check 1 "a failure and its report" "$D" --standalone --nproc_per_node 2 "$W" crash code=7 rank=1
check 1 "a hung worker" "$D" --standalone --hang_timeout 2 --shutdown_grace 1 "$W" hang
check 0 "dry run" env DLAUNCH_NPROC_PER_NODE=4 "$D" --dry_run --max_restarts 3 train.py
exit $failed
