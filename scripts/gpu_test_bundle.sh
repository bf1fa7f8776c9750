#!/usr/bin/env bash
# Packs the GPU tests (kernels_cuda_test, worker_nccl_test) with the Debian libraries they need
# into one folder, so they can run on a GPU machine that has a CUDA 13 driver, cuDNN 9, cuBLAS
# and NCCL but not this project's Debian packages (oneDNN, OpenBLAS, fmt). CI has no GPU; this is
# how the GPU results in docs/benchmarks.md ("GPU checks") were taken.
#   scripts/gpu_test_bundle.sh [build-dir] [out-dir]     (defaults: build, gpu_bundle)
# Then, on the GPU machine:  out-dir/run.sh   (also under compute-sanitizer: see run.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=${2:-gpu_bundle}
[[ -f $build/CMakeCache.txt ]] || cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" --target kernels_cuda_test worker_nccl_test -j "$(nproc)"
mkdir -p "$out/lib"
cp "$build/tests/kernels_cuda_test" "$build/tests/worker_nccl_test" "$out/"
# Every resolved library except the C runtime and the CUDA ones, which must come from the GPU
# host itself (they have to match its driver).
ldd "$out/kernels_cuda_test" "$out/worker_nccl_test" | awk '$3 ~ /^\// {print $3}' | sort -u |
  grep -Ev '/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so|/usr/local/cuda' |
  xargs -r cp -L -t "$out/lib/"
cat > "$out/run.sh" <<'EOF'
#!/usr/bin/env bash
# Runs the GPU tests with the bundled libraries first, then the host's CUDA libraries: set
# CUDA_LIBS to the folders holding libcudart.so.13, libcublas.so.13, libcudnn.so.9, libnccl.so.2
# when they are not in the loader's default path. WRAP=compute-sanitizer runs them under it.
here=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH=$here/lib${CUDA_LIBS:+:$CUDA_LIBS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
status=0
for t in kernels_cuda_test worker_nccl_test; do ${WRAP:-} "$here/$t" || status=1; done
exit $status
EOF
chmod +x "$out/run.sh"
du -sh "$out"
