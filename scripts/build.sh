#!/usr/bin/env bash
# Configures and builds into build/ (Release). Extra arguments go to cmake's configure step.
# DLAUNCH_BUILD_TARGET="T ..." builds only those targets (scripts/package.sh: what the package
# holds; scripts/demo.sh: what the demo runs).
set -euo pipefail
cd "$(dirname "$0")/.."
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
if [[ ! -f build/CMakeCache.txt ]]; then
  cmake -S . -B build "${generator[@]}" "$@"
elif (($# > 0)); then
  cmake -S . -B build "$@"
fi
targets=()
for t in ${DLAUNCH_BUILD_TARGET:-}; do targets+=(--target "$t"); done
cmake --build build -j "$(nproc)" "${targets[@]}"
