#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs every test (unit, integration,
# cluster; GPU tests skip with a reason when no GPU is present).
# Extra arguments go to ctest, e.g. scripts/test.sh -L unit  or  -R Store
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
scripts/build.sh
cd build
ctest --output-on-failure --timeout 600 -j 2 "$@"
