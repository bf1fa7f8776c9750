#!/usr/bin/env bash
# Loading and decoding the full CIFAR-10 JPEG archive (60,000 images): dtrain's loader against
# torchvision's ImageFolder + PIL (python3-torchvision, python3-pil from Debian).
#   bench/data/image_load.sh BUILD_DIR [ARCHIVE] [RUNS]
# The archive is unpacked once to a temporary folder for torchvision (which cannot read tar);
# dtrain is timed on both the archive in place and that folder. The unpacking is not counted
# for torchvision.
set -euo pipefail
build=${1:?usage: image_load.sh BUILD_DIR [ARCHIVE] [RUNS]}
archive=${2:-$(dirname "$0")/../../../shared/data/cifar-10-jpeg.tar.gz}
runs=${3:-3}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar xzf "$archive" -C "$tmp"
folder=$(find "$tmp" -mindepth 1 -maxdepth 1 -type d | head -1)
echo "== machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== dtrain, archive in place ($archive), 2 threads"
"$build/bin/bench_image_load" "$archive" 2 "$runs"
echo "== dtrain, unpacked folder, 2 threads"
"$build/bin/bench_image_load" "$folder" 2 "$runs"
echo "== dtrain, archive in place, 1 thread"
"$build/bin/bench_image_load" "$archive" 1 "$runs"
echo "== torchvision ImageFolder + PIL, one process, unpacked folder"
/usr/bin/python3 "$here/torch_image_load.py" imagefolder "$folder" "$runs"
echo "== torchvision ImageFolder + PIL, DataLoader num_workers=2, unpacked folder"
/usr/bin/python3 "$here/torch_image_load.py" dataloader "$folder" "$runs" 2
echo "== PIL alone, archive in place (tarfile)"
/usr/bin/python3 "$here/torch_image_load.py" piltar "$archive" "$runs"
echo "== machine after: load average $(cut -d' ' -f1-3 /proc/loadavg)"
