#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs dlaunch with 2 local workers
# training the bundled ResNet (dtrain) on its embedded defaults.
# Extra arguments go to dtrain, e.g. scripts/demo.sh --dataset cifar10 --data_dir ../shared/data/cifar-10-batches-bin
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
exec build/bin/dlaunch --standalone --nproc_per_node=2 build/bin/dtrain "$@"
