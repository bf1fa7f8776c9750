#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs dlaunch with 2 local workers
# training the bundled ResNet (dtrain) on its embedded defaults.
# Extra arguments go to dtrain, e.g. scripts/demo.sh --dataset cifar10 --data_dir ../shared/data/cifar-10-batches-bin
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# What the demo runs, not the tests (most of the build): dlaunch, dtrain and, where a GPU is
# present and the CUDA toolkit was found, dtrain's CUDA and NCCL plugins.
targets="dlaunch dtrain"
if [[ -e /dev/nvidia0 ]]; then targets+=" dlaunch_cuda_plugins"; fi
DLAUNCH_BUILD_TARGET="$targets" scripts/build.sh
exec build/bin/dlaunch --standalone --nproc_per_node=2 build/bin/dtrain "$@"
