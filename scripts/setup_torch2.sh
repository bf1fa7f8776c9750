#!/usr/bin/env bash
# Installs the pinned PyTorch 2.x that the tests run as a real 2.x client (CPU only: gloo), and
# the tensorboard whose readers check dtrain's event files, into a virtual environment outside the
# checkout, so that every clone and every CI run on this machine reuses one download (5.3 GiB on
# disk with the CUDA libraries that PyPI's torch wheel requires: PyPI has no CPU-only build of it,
# that is on download.pytorch.org only).
#   scripts/setup_torch2.sh            install if missing, broken or pinned differently; print the
#                                      venv's python
#   DLAUNCH_TORCH2_VENV=DIR            install there instead of the default place
# Debian's PyTorch 1.13 (/usr/bin/python3's python3-torch) is left as it is. The default place is
# the user's cache ($XDG_CACHE_HOME, else ~/.cache: dlaunch/venv-torch-<version>), not /opt: pip then
# needs no root, and the tests' CMake variable DLAUNCH_TORCH2_PYTHON defaults to the same place.
set -euo pipefail
cd "$(dirname "$0")/.."

torch_version=2.15.0
requirements=scripts/torch2-requirements.txt
default_venv="${XDG_CACHE_HOME:-$HOME/.cache}/dlaunch/venv-torch-$torch_version"
venv="${DLAUNCH_TORCH2_VENV:-$default_venv}"
# Written last, after the import check passed: a venv without it (an interrupted or failed install)
# is removed and made again, never used. It holds the requirements it was made from: when
# scripts/torch2-requirements.txt changed since (a pin added or moved), pip installs what is
# missing or pinned differently into the venv (the torch download is not repeated when its pin
# stayed), then the check runs again and the marker is rewritten.
marker="$venv/.dlaunch-complete"

if [[ -f "$marker" ]] && cmp -s "$marker" "$requirements" && [[ -x "$venv/bin/python" ]]; then
  echo "setup_torch2.sh: PyTorch $torch_version is in $venv (python: $venv/bin/python)" >&2
  exit 0
fi

mkdir -p "$(dirname "$venv")"
# Two clones installing at once would write into the same directory: one waits for the other.
exec 9>"$venv.lock"
flock 9
if [[ -f "$marker" ]] && cmp -s "$marker" "$requirements" && [[ -x "$venv/bin/python" ]]; then
  echo "setup_torch2.sh: PyTorch $torch_version is in $venv (installed meanwhile by another run)" >&2
  exit 0
fi

if [[ -f "$marker" && -x "$venv/bin/python" ]]; then
  echo "setup_torch2.sh: $requirements changed since $venv was made:" \
       "installing the missing and re-pinned packages into it" >&2
  rm -f "$marker"  # until the check below passes: an interrupted update is not a complete venv
else
  if [[ -e "$venv" ]]; then
    echo "setup_torch2.sh: $venv is incomplete; removing it and installing again" >&2
    rm -rf "$venv"
  fi
  echo "setup_torch2.sh: installing PyTorch $torch_version from the Python package index into $venv" \
       "(once per machine: 5.3 GiB, a few minutes)" >&2
  /usr/bin/python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --no-input --disable-pip-version-check --no-cache-dir -r "$requirements"
"$venv/bin/python" -c "import torch, torch.distributed; assert torch.__version__.startswith('$torch_version'), torch.__version__; assert torch.distributed.is_gloo_available()" \
  || { echo "setup_torch2.sh: the installed torch in $venv does not import as $torch_version with gloo; expected a working install. Remove $venv and run again." >&2; exit 1; }
"$venv/bin/python" -c "from tensorboard.backend.event_processing import event_accumulator" \
  || { echo "setup_torch2.sh: tensorboard in $venv does not import its event file readers;" \
            "expected a working install. Remove $venv and run again." >&2; exit 1; }
cp "$requirements" "$marker.tmp"
mv "$marker.tmp" "$marker"
echo "setup_torch2.sh: PyTorch $torch_version is in $venv (python: $venv/bin/python)" >&2
