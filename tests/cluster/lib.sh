# Shared helpers for the cluster scripts (sourced, not run).

log() { echo "[$(basename "$0")] $*" >&2; }

# Prints the first port P >= $1 such that P .. P+$2-1 are all free on this host (TCP listen).
free_port_block() {
  local base=$1 count=$2 p ok
  for ((; base < 60000; base += count)); do
    ok=1
    for ((p = base; p < base + count; p++)); do
      if [[ -n $(ss -Htln "sport = :$p" 2>/dev/null) ]]; then ok=0; break; fi
    done
    if ((ok)); then echo "$base"; return 0; fi
  done
  return 1
}

# wait_until SECONDS DESCRIPTION COMMAND...: retries COMMAND every 0.2 s.
wait_until() {
  local limit=$1 what=$2; shift 2
  local deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then log "timed out after ${limit}s waiting for $what"; return 1; fi
    sleep 0.2
  done
}

# Skips (exit 77, or 0 with --skip-ok) with a reason written to $dir/skip.
skip() {
  log "skipped: $*"
  [[ -n ${dir:-} ]] && { mkdir -p "$dir"; echo "$*" >"$dir/skip"; }
  exit "${skip_code:-77}"
}

# Pids of every process whose environment holds the exact line $1 (e.g. SLURM_CONF=/x/slurm.conf):
# the daemons we started with it and everything they spawned, and nothing else on the host.
pids_with_env() {
  local needle=$1 pid
  for pid in /proc/[0-9]*; do
    pid=${pid#/proc/}
    [[ $pid == "$$" || $pid == "$BASHPID" ]] && continue
    # Kernel threads and other users' processes have no readable environment: skip them.
    if { tr '\0' '\n' <"/proc/$pid/environ"; } 2>/dev/null | grep -qxF "$needle"; then echo "$pid"; fi
  done
}

# Sends SIGTERM to the pids, waits up to $1 seconds, then SIGKILLs what is left.
terminate_pids() {
  local grace=$1; shift
  (($# == 0)) && return 0
  kill -TERM "$@" 2>/dev/null || true
  local deadline=$((SECONDS + grace)) alive pid
  while :; do
    alive=()
    for pid in "$@"; do kill -0 "$pid" 2>/dev/null && alive+=("$pid"); done
    ((${#alive[@]} == 0)) && return 0
    ((SECONDS >= deadline)) && break
    sleep 0.1
  done
  log "killing ${alive[*]} after ${grace}s"
  kill -KILL "${alive[@]}" 2>/dev/null || true
}
