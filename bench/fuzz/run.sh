#!/usr/bin/env bash
# Builds the store-decoder fuzzer with clang (libFuzzer + ASan + UBSan) and runs it.
#   bench/fuzz/run.sh [seconds=60] [jobs=1]
# Needs clang and libclang-rt-14-dev (scripts/setup.sh --bench). Crashes land in
# build-fuzz/crashes/; the corpus persists in build-fuzz/corpus/ between runs.
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${1:-60}
jobs=${2:-1}
out=build-fuzz
mkdir -p "$out/corpus" "$out/crashes"
command -v clang++ >/dev/null || { echo "run.sh: clang++ missing; run scripts/setup.sh --bench" >&2; exit 1; }
flags=(-std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I.)
if [[ ! -x $out/store_codec_fuzz || bench/fuzz/store_codec_fuzz.cc -nt $out/store_codec_fuzz ||
      rendezvous/tcp/store_codec.cc -nt $out/store_codec_fuzz ]]; then
  clang++ "${flags[@]}" bench/fuzz/store_codec_fuzz.cc rendezvous/tcp/store_codec.cc common/error.cc \
    -o "$out/store_codec_fuzz"
fi
# Seeds: one valid frame per opcode of each dialect (first byte picks the dialect).
seed() { printf "$2" > "$out/corpus/seed_$1"; }
seed 113_set '\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00k\x01\x00\x00\x00\x00\x00\x00\x00v'
seed 113_add '\x00\x03\x01\x00\x00\x00\x00\x00\x00\x00c\x05\x00\x00\x00\x00\x00\x00\x00'
seed 113_wait '\x00\x05\x01\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00k'
seed 2_validate_ping '\x01\x00\xce\xf7\x85\x3c\x0d\x01\x02\x03\x04'
seed 2_multiset '\x01\x0b\x01\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00a\x01\x00\x00\x00\x00\x00\x00\x001'
seed 2_auth '\x01\xa0AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA'
parallel=()
# With -jobs libFuzzer writes fuzz-N.log into the current directory: run from $out.
((jobs > 1)) && parallel=(-jobs="$jobs" -workers="$jobs")
cd "$out"
./store_codec_fuzz corpus -max_total_time="$seconds" "${parallel[@]}" \
  -artifact_prefix=crashes/ -max_len=4096 -print_final_stats=1 2>&1 | tail -25
