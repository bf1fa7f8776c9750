#!/bin/bash
# The accuracy runs of docs/benchmarks.md ("Accuracy"), dtrain beside PyTorch 1.13 on the same
# data files and schedule. Long (tens of minutes on 2 cores): run when the machine is quiet,
#   nohup bench/train/accuracy.sh build /tmp/accuracy > /tmp/accuracy.log 2>&1 &
# Arguments: build directory (with bin/dtrain and bin/dlaunch), output directory, and optionally
# which runs (mnist cifar torch_cifar torch2_cifar cifar_full; default the first three). Data: DLAUNCH_DATA_DIR or ../shared/data.
# SEED (default 0) seeds both trainers' weights, shuffle and augmentation; runs with another seed
# write to <output>/seed<SEED>/ so several seeds can sit side by side.
set -euo pipefail
build=${1:-build}
out=${2:-/tmp/dtrain_accuracy}
shift 2 || true
runs=${*:-mnist cifar torch_cifar}
here=$(cd "$(dirname "$0")" && pwd)
data=${DLAUNCH_DATA_DIR:-$here/../../../shared/data}
seed=${SEED:-0}
torch2_python=${TORCH2_PYTHON:-$HOME/.cache/dlaunch/venv-torch-2.15.0/bin/python}
[ "$seed" = 0 ] || out="$out/seed$seed"
mkdir -p "$out"
export OMP_NUM_THREADS=1

for run in $runs; do
  start=$(date +%s)
  case $run in
    mnist)
      # 2 workers x 64 = global batch 128, 2 epochs; target >= 99.0% test accuracy.
      "$build/bin/dlaunch" --standalone --nproc_per_node=2 "$build/bin/dtrain" \
        --dataset=mnist --data_dir="$data/mnist" --width=16 --epochs=2 --batch_size=64 \
        --lr=0.1 --warmup_epochs=0.2 --nesterov --weight_decay=5e-4 --resume=none \
        --log_every=50 --output_dir="$out/mnist" ;;
    cifar)
      # The issue's recipe: data_batch_1.bin, test_batch.bin, width 16, batch 128, SGD nesterov
      # 0.9, wd 5e-4, lr 0.1, 1 warm-up epoch then cosine, 20 epochs. 2 workers x 64 = 128.
      "$build/bin/dlaunch" --standalone --nproc_per_node=2 "$build/bin/dtrain" \
        --dataset=cifar10 --data_dir="$data/cifar-10-batches-bin" --width=16 --epochs=20 \
        --batch_size=64 --lr=0.1 --warmup_epochs=1 --nesterov --weight_decay=5e-4 \
        --resume=none --log_every=20 --seed="$seed" --output_dir="$out/cifar" ;;
    cifar_full)
      # Issue 12: the same recipe on all 50,000 training images of the JPEG archive (read in
      # place), tested on its 10,000, 15 epochs (PyTorch 1.13 reached 85.23% on these images).
      "$build/bin/dlaunch" --standalone --nproc_per_node=2 "$build/bin/dtrain" \
        --dataset=imagefolder --data_dir="$data/cifar-10-jpeg.tar.gz" --width=16 --epochs=15 \
        --batch_size=64 --lr=0.1 --warmup_epochs=1 --nesterov --weight_decay=5e-4 \
        --resume=none --log_every=50 --seed="$seed" --output_dir="$out/cifar_full" ;;
    torch_cifar)
      # Same recipe in PyTorch 1.13, 2 DDP workers x 64 (gloo), same files, launched by dlaunch
      # (torchrun --standalone's fixed port 29400 collides with other jobs on a shared machine).
      "$build/bin/dlaunch" --standalone --nproc_per_node=2 --python=/usr/bin/python3 \
        "$here/torch_cifar.py" --data_dir="$data/cifar-10-batches-bin" --width=16 --epochs=20 \
        --batch_size=64 --lr=0.1 --warmup_epochs=1 --threads=1 --seed="$seed" \
        --output="$out/torch_cifar.json" ;;
    torch2_cifar)
      # The same twin in PyTorch 2.15 (the venv scripts/setup.sh --test makes; TORCH2_PYTHON
      # names another interpreter), for the comparison beside PyTorch 2.x.
      "$build/bin/dlaunch" --standalone --nproc_per_node=2 --python="$torch2_python" \
        "$here/torch_cifar.py" --data_dir="$data/cifar-10-batches-bin" --width=16 --epochs=20 \
        --batch_size=64 --lr=0.1 --warmup_epochs=1 --threads=1 --seed="$seed" \
        --output="$out/torch2_cifar.json" ;;
    *) echo "unknown run $run" >&2; exit 2 ;;
  esac
  echo "== $run took $(( $(date +%s) - start )) s"
done
