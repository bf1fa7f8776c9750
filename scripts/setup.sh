#!/usr/bin/env bash
# Installs what dlaunch needs from Debian's archive (apt-get); --test also PyTorch 2.x from the
# Python package index (pip, into a venv of its own; Debian has only 1.13).
#   scripts/setup.sh          build and run dependencies
#   scripts/setup.sh --test   plus what the tests use: PyTorch 1.13 (Debian's), PyTorch 2.15 and
#                             tensorboard (from the Python package index into a venv outside the
#                             checkout: scripts/setup_torch2.sh), Pillow, PyYAML (reads the
#                             Kubernetes examples), Slurm, munge, etcd, gdb, iproute2,
#                             prometheus (scrapes the agents' /metrics in a test),
#                             universal-ctags (scripts/long_functions.sh), dnsmasq-base (a DNS
#                             server whose records appear late, in a namespace of a test's own)
#   scripts/setup.sh --bench  plus what the benchmarks use (hyperfine, clang for the fuzzer,
#                             torchvision + Pillow for the image loading peer)
#   scripts/setup.sh --gpu-bundle  plus what scripts/gpu_check.sh --bundle uses (patchelf)
# Idempotent and quick when everything is present: apt-get runs only for missing packages, pip
# only when the PyTorch 2.x venv is missing, incomplete or made from other pins.
set -euo pipefail
cd "$(dirname "$0")/.."

want_torch2=0
packages=(
  g++ cmake make ninja-build pkg-config git ca-certificates
  libboost-dev libfmt-dev nlohmann-json3-dev libgtest-dev
  libdnnl-dev libopenblas-dev libgloo-dev zlib1g-dev
  libarchive-dev libturbojpeg0-dev libpng-dev libssl-dev
  libprotobuf-dev protobuf-compiler
  procps python3
  help2man dpkg-dev file
)
for arg in "$@"; do
  case "$arg" in
    --test)
      packages+=(python3-torch python3-venv python3-pil python3-yaml gdb elfutils iproute2 slurm-wlm munge etcd-server etcd-client patchelf prometheus universal-ctags dnsmasq-base)
      want_torch2=1
      ;;
    --bench)
      packages+=(python3-torch python3-torchvision python3-pil hyperfine clang libclang-rt-14-dev time python3-etcd)
      ;;
    --gpu-bundle)
      packages+=(patchelf)
      ;;
    *) echo "setup.sh: unknown option '$arg'; expected --test, --bench or --gpu-bundle" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
install_missing() {
  sudo=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "setup.sh: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
    sudo=(sudo)
  fi
  echo "setup.sh: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # Daemons from the packages (slurmctld, munge, etcd, prometheus) must not start system-wide: the tests
  # start their own on private ports. policy-rc.d is Debian's switch for that.
  policy=/usr/sbin/policy-rc.d
  created_policy=0
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee $policy >/dev/null
    "${sudo[@]}" chmod +x $policy
    created_policy=1
  fi
  trap '[[ $created_policy == 1 ]] && "${sudo[@]}" rm -f $policy' EXIT
  "${sudo[@]}" apt-get update -q
  "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
}

((${#missing[@]} == 0)) || install_missing
if ((want_torch2)); then
  scripts/setup_torch2.sh
fi
