#!/usr/bin/env bash
# bench/gpu/gpu_bench.py (issue 11's GPU benchmarks) run on the CPU at tiny sizes, so the script a
# GPU session runs in one call cannot rot unseen here: every section runs end to end against the
# built dtrain and Debian's PyTorch 1.13, and each table row carries a figure (torch.compile's row
# says it is unavailable in 1.13). The figures themselves mean nothing at these sizes.
#   gpu_bench_selftest.sh REPO BUILD
set -euo pipefail
repo=$1 build=$2
/usr/bin/python3 -c 'import torch' 2>/dev/null || { echo "SKIP: python3-torch missing"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
data=$repo/../shared/data/cifar-10-batches-bin
sections=throughput,profile
[[ -d $data ]] && sections=throughput,accuracy,long,profile
/usr/bin/python3 "$repo/bench/gpu/gpu_bench.py" --dtrain "$build/bin/dtrain" --out "$tmp" --device cpu --quick \
  --python /usr/bin/python3 --seeds 0 --sections "$sections" ${data:+--archive "$data"} >"$tmp/out.txt" 2>&1 ||
  { cat "$tmp/out.txt"; echo "FAIL: gpu_bench.py exited non-zero"; exit 1; }
md=$tmp/bench.md
fail() { cat "$md"; echo "FAIL: $*"; exit 1; }
for who in "PyTorch eager bf16 channels_last" "dtrain bf16" "dtrain fp16"; do
  grep -qE "^\| 32 \| $who \| [0-9]+ \|" "$md" || fail "no images/s for '$who'"
done
grep -q "^| 32 | PyTorch torch.compile bf16 channels_last | - |.*needs PyTorch 2.x" "$md" ||
  fail "torch.compile's row should say it is unavailable with PyTorch 1.13"
if [[ $sections == *accuracy* ]]; then
  for who in dtrain PyTorch; do
    grep -qE "^\| $who \| 0 \| [0-9.]+% \|" "$md" || fail "no test accuracy for $who"
  done
  grep -q "test accuracy [0-9.]*%" "$md" || fail "the long run gave no accuracy"
else
  echo "note: $data not found, so the accuracy sections were not run"
fi
grep -q "aten::" "$md" || fail "the profile section printed no PyTorch profile"
grep -qE "^conv2d_forward +[0-9]+ " "$md" || fail "the profile section has no dtrain op table (DTRAIN_PROFILE_OPS)"
echo "gpu_bench.py: sections $sections ran on the CPU with a figure in every row"
