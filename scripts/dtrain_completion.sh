#!/usr/bin/env bash
# Writes dtrain's bash completion to stdout, from the flags `dtrain --help` lists (run at build
# time by cmake/Install.cmake, so it always matches the binary). Usage: dtrain_completion.sh DTRAIN
set -euo pipefail
flags=$("$1" --help | grep -oE '^  --[a-z0-9_]+' | sed 's/^  //' | sort -u)
[[ -n $flags ]] || { echo "dtrain_completion.sh: no flags in '$1 --help'" >&2; exit 1; }
words=()
for f in $flags; do
  words+=("$f")
  [[ $f == *_* ]] && words+=("${f//_/-}")
done
cat <<SCRIPT
# bash completion for dtrain. Generated at build time from \`dtrain --help\`
# (scripts/dtrain_completion.sh); do not edit, rebuild.
_dtrain() {
  local cur=\${COMP_WORDS[COMP_CWORD]}
  if [[ \$cur == -* ]]; then
    mapfile -t COMPREPLY < <(compgen -W "${words[*]}" -- "\$cur")
    return
  fi
  # A flag's value (--data_dir=PATH or --data_dir PATH): files and directories.
  compopt -o default
  COMPREPLY=()
}
complete -F _dtrain dtrain
SCRIPT
