#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs every test (unit, integration,
# cluster; GPU tests skip with a reason when no GPU is present).
# Extra arguments go to ctest, e.g. scripts/test.sh -L unit  or  -R Store
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
scripts/build.sh
cd build
# Jobs that fail keep their files in $TMPDIR and say where, as users' jobs do (launcher/
# worker_files.h), and the suite fails many on purpose: they go to a directory of this run's
# own, removed at the end, so that runs do not pile up directories in /tmp (thousands, which
# slowed every mkdir there).
TMPDIR="$(mktemp -d "${TMPDIR:-/tmp}/dlaunch_tests.XXXXXX")"
export TMPDIR
trap 'rm -rf "$TMPDIR"' EXIT
ctest --output-on-failure --timeout 600 -j 2 "$@"
