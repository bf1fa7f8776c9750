#!/usr/bin/env bash
# The generated bash completion (launcher/config/completion.h) against the real dlaunch: every flag that
# `dlaunch --help` lists completes, in both spellings, and the flags with fixed values offer them.
# Usage: completion_test.sh <dlaunch> <completion script>
set -uo pipefail
dlaunch=$1 script=$2
# shellcheck disable=SC1090
source "$script" || { echo "FAIL: $script does not load in bash"; exit 1; }
# shellcheck disable=SC2317  # called by _dlaunch
compopt() { :; }  # only valid inside a real completion; the tests call _dlaunch directly
failed=0
complete_words() {  # words of the command line, the last one being completed
  COMP_WORDS=("$@")
  COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
  COMPREPLY=()
  _dlaunch
  echo "${COMPREPLY[*]}"
}
expect() {  # expected-reply words...
  local want=$1 got
  shift
  got=$(complete_words "$@")
  if [[ $got != "$want" ]]; then
    echo "FAIL: completing '$*': expected '$want', got '$got'"
    failed=1
  fi
}
expect "static c10d etcd" dlaunch --rdzv_backend ""
expect "static c10d etcd" dlaunch --rdzv-backend = ""
expect "c10d" dlaunch --nnodes 2 --rdzv_backend c
expect "cpu gpu auto" dlaunch --nproc_per_node ""
expect "0 1 2 3" dlaunch -r ""
expect "0 1 2 3" dlaunch --tee ""
expect "auto agent task" dlaunch --slurm_mode ""
expect "rank group" dlaunch --restart_scope ""
expect "--standalone" dlaunch --nproc_per_node 2 --stand
# After the program, words belong to it: no dlaunch flags.
expect "" dlaunch --standalone train.py --stand
# The job control subcommands and their flags.
expect "restart" dlaunch restar
expect "--rdzv_id" dlaunch status --rdzv_i
expect "--rdzv-id" dlaunch status --rdzv-i
expect "--json" dlaunch status --master_port 29500 --js
expect "etcd" dlaunch stop --rdzv_backend e

all=" $(complete_words dlaunch --) "
help_flags=$("$dlaunch" --help | grep -oE '^  (-[a-z], )?--[a-z_]+' | grep -oE -- '--[a-z_]+')
[[ -n $help_flags ]] || { echo "FAIL: found no flags in '$dlaunch --help'"; exit 1; }
n=0
for f in $help_flags; do
  n=$((n + 1))
  for spelling in "$f" "${f//_/-}"; do
    if [[ $all != *" $spelling "* ]]; then
      echo "FAIL: $spelling is in 'dlaunch --help' but the completion does not offer it"
      failed=1
    fi
  done
done
((failed == 0)) && echo "ok: $n flags of --help complete, values complete"
exit $failed
