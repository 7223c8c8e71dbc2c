#!/usr/bin/env bash
# Builds the format fuzz targets with clang++ (-fsanitize=fuzzer,address,undefined) directly,
# whatever compiler CMake uses, and runs one for a bounded time on a seed corpus.
#   build_and_run.sh build OUTDIR                 compile every target (the ctest fixture)
#   build_and_run.sh run OUTDIR TARGET SECONDS SEED_DIR...
# A crash, leak, UB report or a slow input (-timeout) makes libFuzzer exit non-zero: the test fails.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
mode=$1 out=$2
cxx=${CKPTFS_FUZZ_CXX:-clang++}
flags=(-std=c++20 -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined
       -fno-sanitize-recover=undefined -I"$repo" -I"$here")
targets=(torch_zip pickle safetensors npy distcp)

if [[ $mode == build ]]; then
  command -v "$cxx" >/dev/null || { echo "fuzz: $cxx not found (apt-get install clang libclang-rt-14-dev)"; exit 1; }
  mkdir -p "$out/obj"
  srcs=("$repo"/codec/format/*.cpp)
  # Rebuild only when a format source or header changed since the last build.
  stamp="$out/.stamp"
  if [[ -f $stamp ]] && [[ -z $(find "$repo/codec/format" "$repo/codec"/*.hpp "$here" -newer "$stamp" -print -quit) ]]; then
    echo "fuzz: targets up to date"; exit 0
  fi
  printf '%s\n' "${srcs[@]}" | xargs -P "$(nproc)" -I{} sh -c \
    '"$0" "$@" -fsanitize=fuzzer-no-link -c "{}" -o "'"$out"'/obj/$(basename "{}" .cpp).o"' \
    "$cxx" "${flags[@]/-fsanitize=fuzzer,address,undefined/-fsanitize=address,undefined}"
  printf '%s\n' "${targets[@]}" | xargs -P "$(nproc)" -I{} "$cxx" "${flags[@]}" \
    "$here/fuzz_{}.cpp" "$out"/obj/*.o -ldeflate -o "$out/fuzz_{}"
  touch "$stamp"
  echo "fuzz: built ${targets[*]} in $out"
  exit 0
fi

target=$3 seconds=$4
shift 4
work="$out/corpus_$target"
mkdir -p "$work" "$out/artifacts"
# The working corpus (first directory) collects new inputs; seeds are only read.
exec "$out/fuzz_$target" "$work" "$@" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
  -max_len=1048576 -artifact_prefix="$out/artifacts/${target}-" -print_final_stats=1
