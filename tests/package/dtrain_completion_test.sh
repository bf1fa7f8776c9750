#!/usr/bin/env bash
# dtrain's generated bash completion (scripts/dtrain_completion.sh) against the real dtrain: every
# flag of `dtrain --help` completes, in both spellings.
# Usage: dtrain_completion_test.sh <dtrain> <completion script>
set -uo pipefail
dtrain=$1 script=$2
# shellcheck disable=SC1090
source "$script" || { echo "FAIL: $script does not load in bash"; exit 1; }
# shellcheck disable=SC2317  # called by _dtrain
compopt() { :; }
complete_words() {
  COMP_WORDS=("$@")
  COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
  COMPREPLY=()
  _dtrain
  echo " ${COMPREPLY[*]} "
}
failed=0
all=$(complete_words dtrain --)
flags=$("$dtrain" --help | grep -oE '^  --[a-z0-9_]+' | sed 's/^  //')
[[ -n $flags ]] || { echo "FAIL: found no flags in '$dtrain --help'"; exit 1; }
n=0
for f in $flags; do
  n=$((n + 1))
  for spelling in "$f" "${f//_/-}"; do
    [[ $all == *" $spelling "* ]] || { echo "FAIL: $spelling does not complete"; failed=1; }
  done
done
[[ $(complete_words dtrain --batch_s) == " --batch_size " ]] || { echo "FAIL: --batch_s"; failed=1; }
((failed == 0)) && echo "ok: $n flags of dtrain --help complete"
exit $failed
