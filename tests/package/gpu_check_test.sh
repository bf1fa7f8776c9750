#!/usr/bin/env bash
# scripts/gpu_check.sh end to end on a machine without a GPU: --bundle packs, --run unpacks and
# runs every check; the GPU checks must say SKIP (not PASS, not FAIL) and the PyTorch checks over
# gloo (DDP, hang detection, step heartbeats) must pass with the bundled dlaunch (its RUNPATH
# finds the bundled libraries) and hooks.
#   gpu_check_test.sh REPO BUILD
set -euo pipefail
repo=$1 build=$2
command -v patchelf >/dev/null || { echo "SKIP: patchelf missing (scripts/setup.sh --test installs it)"; exit 77; }
/usr/bin/python3 -c 'import torch' 2>/dev/null || { echo "SKIP: python3-torch missing"; exit 77; }
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  echo "SKIP: this machine has a GPU; this test checks the GPU-less path"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$repo/scripts/gpu_check.sh" --bundle "$tmp/bundle.tar.gz" --build "$build"
PYTHON=/usr/bin/python3 "$repo/scripts/gpu_check.sh" --run "$tmp/bundle.tar.gz" --out "$tmp/out"
results=$tmp/out/results.txt
fail() {
  echo "FAIL: $*"
  cat "$results"
  exit 1
}
grep -q '^PASS environment ' "$results" || fail "environment did not pass"
grep -q '^PASS torch_gloo_4_ranks ' "$results" || fail "PyTorch over gloo under the bundled dlaunch did not pass"
# The bundled hooks (share/dlaunch/python) catch an unmodified DDP script's hang and beat per step.
for c in torch_hang_detected torch_step_heartbeats; do
  grep -q "^PASS $c " "$results" || fail "$c did not pass with Debian's PyTorch"
done
for c in kernels_cuda_test worker_nccl_test torch_nccl_1_rank dtrain_gpu gpu_speed; do
  grep -q "^SKIP $c " "$results" || fail "$c should be SKIP without a GPU"
done
! grep -q '^FAIL' "$results" || fail "a check failed"
# The bundled binaries resolve the bundled libraries, not the build machine's.
tar -C "$tmp" -xzf "$tmp/bundle.tar.gz"
# Not `ldd | grep -q`: with pipefail, grep -q leaving at the first match can SIGPIPE ldd and
# fail the pipeline although the line was there (seen once: "does not load the bundled oneDNN").
libs=$(ldd "$tmp/gpu_check/bin/dtrain")
[[ $libs == *"gpu_check/bin/../lib/libdnnl"* ]] || fail "dtrain does not load the bundled oneDNN:"$'\n'"$libs"
# The new precision checks are in the bundle's test list (they skip here without a GPU).
for t in backend_test worker_device_test worker_augment_test; do
  grep -q "^PASS $t " "$results" || fail "$t did not pass (its GPU cases skip here)"
done
# --bench runs only the benchmarks (bench/gpu/gpu_bench.py, carried in the bundle): SKIP here.
PYTHON=/usr/bin/python3 "$repo/scripts/gpu_check.sh" --run "$tmp/bundle.tar.gz" --bench throughput --out "$tmp/bench"
grep -q '^SKIP gpu_bench .*no GPU' "$tmp/bench/results.txt" || { cat "$tmp/bench/results.txt"; echo "FAIL: gpu_bench should be SKIP without a GPU"; exit 1; }
! grep -q 'kernels_cuda_test' "$tmp/bench/results.txt" || { echo "FAIL: --bench ran the checks too"; exit 1; }
[[ -f $tmp/gpu_check/python/gpu_bench.py && -f $tmp/gpu_check/python/torch_cifar_gpu.py ]] || { echo "FAIL: the bundle lacks bench/gpu"; exit 1; }
echo "gpu_check.sh: bundle and run without a GPU as expected"
