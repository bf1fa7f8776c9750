#!/usr/bin/env bash
# The Debian package as a user gets it: cpack builds it from the build tree, `dpkg-deb -x`
# unpacks it into a temporary root (no root needed, nothing installed system-wide), and the
# unpacked binaries run: --version, dlaunch finding dtrain beside itself, and a 2-worker dtrain
# job. Then its Depends is checked against the libraries the binaries need: every NEEDED library
# is owned (dpkg -S) by a package that Depends names (directly, or as one of the alternatives of
# a package it names, e.g. libopenblas0 -> libopenblas0-pthread), no -dev package, and nothing
# from outside Debian (/usr/local/cuda). A CUDA build's package also holds the GPU plugins
# (usr/lib/dlaunch/), which add nothing to Depends, and its dtrain --device auto trains on the CPU
# where no GPU is usable.
# Usage: package_test.sh <build dir> <project version> <expect man pages: ON|OFF>
# Exit 77 (skipped) when the Debian tools are missing (scripts/setup.sh installs them).
set -uo pipefail
build=$1 version=$2 man_pages=$3
for tool in cpack dpkg-deb dpkg-shlibdeps file; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool is missing (scripts/setup.sh installs it)"; exit 77; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0
fail() { echo "FAIL: $*"; failed=1; }

# -B: a private output directory, so a concurrent scripts/package.sh is not disturbed.
if ! cpack -G DEB --config "$build/CPackConfig.cmake" -B "$tmp/out" >"$tmp/cpack.log" 2>&1; then
  cat "$tmp/cpack.log"
  echo "FAIL: cpack could not build the package (log above)"
  exit 1
fi
debs=("$tmp"/out/dlaunch_*.deb)
deb=${debs[0]}
[[ -f $deb ]] || { echo "FAIL: cpack made no dlaunch_*.deb in $tmp/out"; ls -R "$tmp/out"; exit 1; }
size=$(stat -c %s "$deb")
echo "package: $(basename "$deb"), $size bytes"
((size < 10 * 1024 * 1024)) || fail "the package is $size bytes; expected under 10 MiB"
[[ $(dpkg-deb -f "$deb" Package) == dlaunch ]] || fail "Package is '$(dpkg-deb -f "$deb" Package)', expected dlaunch"
[[ $(dpkg-deb -f "$deb" Version) == "$version" ]] || fail "Version is '$(dpkg-deb -f "$deb" Version)', expected $version"
[[ -n $(dpkg-deb -f "$deb" Maintainer) ]] || fail "the package has no Maintainer"

root=$tmp/root
dpkg-deb -x "$deb" "$root" || { echo "FAIL: dpkg-deb -x failed"; exit 1; }
expected=(usr/bin/dlaunch usr/bin/dtrain usr/share/bash-completion/completions/dlaunch
  usr/share/bash-completion/completions/dtrain
  usr/share/doc/dlaunch/README.md usr/share/doc/dlaunch/quickstart.md usr/share/doc/dlaunch/copyright
  usr/share/doc/dlaunch/examples/slurm/dtrain.sbatch usr/share/dlaunch/python/sitecustomize.py)
[[ $man_pages == ON ]] && expected+=(usr/share/man/man1/dlaunch.1 usr/share/man/man1/dtrain.1)
for f in "${expected[@]}"; do
  [[ -f $root/$f ]] || fail "$f is not in the package"
done
if [[ $man_pages == ON ]]; then
  # help2man's --include part (docs/man/dlaunch.h2m) made it in.
  for section in "EXIT STATUS" ENVIRONMENT; do
    grep -q "^\.SH \"\?$section" "$root/usr/share/man/man1/dlaunch.1" ||
      fail "dlaunch.1 has no $section section (docs/man/dlaunch.h2m)"
  done
fi

# --version of the unpacked binaries.
for prog in dlaunch dtrain; do
  out=$("$root/usr/bin/$prog" --version)
  [[ $out == "$prog $version (commit "* ]] || fail "'$prog --version' printed '$out'; expected '$prog $version (commit ...'"
done

# dlaunch's default program is the dtrain beside it, wherever the package was unpacked.
out=$("$root/usr/bin/dlaunch" --standalone --nproc_per_node 2 --dry_run 2>&1)
[[ $out == *"$root/usr/bin/dtrain  <- default"* ]] ||
  fail "dlaunch --dry_run without a program does not pick $root/usr/bin/dtrain:"$'\n'"$out"

# The unpacked dlaunch finds its Python hooks beside itself and puts them first on PYTHONPATH.
out=$(PYTHONPATH=/mine "$root/usr/bin/dlaunch" --standalone --no_python /bin/sh -c 'echo "pp=$PYTHONPATH"' 2>&1)
[[ $out == *"pp=$(realpath "$root/usr/share/dlaunch/python"):/mine"* ]] ||
  fail "the unpacked dlaunch does not put $root/usr/share/dlaunch/python first on the workers' PYTHONPATH:"$'\n'"$out"

# A 2-worker job with the unpacked dtrain (two steps; DLAUNCH_CONV_CACHE=off: no ~/.cache).
mkdir -p "$tmp/run"
if ! (cd "$tmp/run" && DLAUNCH_CONV_CACHE=off "$root/usr/bin/dlaunch" --standalone --nproc_per_node 2 \
      "$root/usr/bin/dtrain" --dataset synthetic --epochs 1 --max_steps 2 --batch_size 8 \
      --output_dir out >"$tmp/job.log" 2>&1); then
  tail -30 "$tmp/job.log"
  fail "the 2-worker dtrain job from the package failed (log tail above)"
elif ! grep -q "all 2 worker(s) finished successfully" "$tmp/job.log"; then
  tail -30 "$tmp/job.log"
  fail "the 2-worker dtrain job did not report success (log tail above)"
fi

# Depends against what the binaries need.
depends=$(dpkg-deb -f "$deb" Depends)
echo "Depends: $depends"

# The GPU plugins of a CUDA build: shipped, but never a dependency (docs/install.md: CUDA), and
# the unpacked dtrain loads them from ../lib/dlaunch and still trains on a machine without a GPU.
if [[ -f $build/bin/libdlaunch_cuda.so ]]; then
  for f in usr/lib/dlaunch/libdlaunch_cuda.so usr/lib/dlaunch/libdlaunch_nccl.so; do
    [[ -f $root/$f ]] || fail "$f is not in the package (a CUDA build ships the plugins)"
  done
  [[ $depends =~ (cuda|cudnn|cublas|nccl) ]] && fail "Depends names a CUDA library: $depends"
  if ! nvidia-smi -L >/dev/null 2>&1; then
    out=$(cd "$tmp/run" && CUDA_VISIBLE_DEVICES= DTRAIN_LIMIT_TRAIN_SAMPLES=16 DTRAIN_LIMIT_TEST_SAMPLES=8 \
      DLAUNCH_CONV_CACHE=off "$root/usr/bin/dtrain" --device auto --dataset synthetic --epochs 1 \
      --max_steps 1 --batch_size 8 --width 4 --output_dir auto_out 2>&1)
    [[ $out == *"device: cpu (--device auto: looked for a CUDA GPU and found"* ]] ||
      fail "the unpacked dtrain --device auto did not say it trains on the CPU:"$'\n'"$out"
    # Without a driver dtrain does not load the plugin at all (kernels/device.cc); named
    # explicitly, the packaged plugin must load (its libraries resolve) and find no device.
    out=$(cd "$tmp/run" && CUDA_VISIBLE_DEVICES= DTRAIN_LIMIT_TRAIN_SAMPLES=16 DTRAIN_LIMIT_TEST_SAMPLES=8 \
      DLAUNCH_CUDA_PLUGIN="$root/usr/lib/dlaunch/libdlaunch_cuda.so" DLAUNCH_CONV_CACHE=off \
      "$root/usr/bin/dtrain" --device auto --dataset synthetic --epochs 1 --max_steps 1 \
      --batch_size 8 --width 4 --output_dir auto_out2 2>&1)
    [[ $out == *"device: cpu (--device auto: looked for a CUDA GPU and found no device through the CUDA runtime ($root/usr/lib/dlaunch/libdlaunch_cuda.so"* ]] ||
      fail "the packaged CUDA plugin, named with DLAUNCH_CUDA_PLUGIN, did not load and answer:"$'\n'"$out"
  fi
fi
# Package names in Depends, without versions and alternatives' bars.
names=" $(echo "$depends" | tr ',|' '\n\n' | sed -E 's/\(.*\)//; s/^ +//; s/ +$//' | sort -u | tr '\n' ' ') "
for n in $names; do
  [[ $n == *-dev ]] && fail "Depends names a -dev package: $n"
done
for bin in "$root"/usr/bin/*; do
  needed=$(objdump -p "$bin" | awk '$1 == "NEEDED" {print $2}')
  [[ -n $needed ]] || fail "objdump found no NEEDED libraries in $bin"
  for lib in $needed; do
    # "libfmt.so.9 => /lib/.../libfmt.so.9 (0x...)"; the loader: "/lib64/ld-linux-x86-64.so.2 (0x...)".
    path=$(ldd "$bin" | awk -v l="$lib" '$1 == l {print $3} $1 ~ ("/" l "$") {print $1}' | head -1)
    [[ -n $path && $path != "not" ]] || { fail "$(basename "$bin") needs $lib, which ldd does not find"; continue; }
    case $(readlink -f "$path") in
      /usr/local/*|/opt/*) fail "$(basename "$bin") needs $path, outside Debian's packages (docs/install.md: CUDA)"; continue ;;
    esac
    # Debian 12 merges /lib into /usr/lib; dpkg knows each file under one of the two names.
    owner=""
    for p in "$path" "/usr$path" "$(readlink -f "$path")" "${path#/usr}"; do
      owner=$(dpkg -S "$p" 2>/dev/null | head -1 | cut -d: -f1) && [[ -n $owner ]] && break
    done
    [[ -n $owner ]] || { fail "no Debian package owns $path ($lib, needed by $(basename "$bin"))"; continue; }
    if [[ $names == *" $owner "* ]]; then
      continue
    fi
    # An alternative: a package Depends names depends on the owner (libopenblas0 -> -pthread).
    found=0
    for n in $names; do
      alts=$(dpkg-query -W -f='${Depends}' "$n" 2>/dev/null | tr ',|' '\n\n' | sed -E 's/\(.*\)//; s/ //g')
      if grep -qx "$owner" <<<"$alts"; then found=1; break; fi
    done
    ((found)) || fail "$(basename "$bin") needs $lib from $owner, but Depends does not name it: $depends"
  done
done
((failed == 0)) && echo "ok: package installs, runs a 2-worker job from its own root, Depends matches the libraries"
exit $failed
