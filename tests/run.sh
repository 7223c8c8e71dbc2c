#!/usr/bin/env bash
# The test command of the README: bootstrap (packages + build), then every test through ctest,
# then the unit tests once more from a build for baseline x86-64: the codec's SIMD kernels each
# fall back to portable loops (the code a CPU without AVX2, or an aarch64 build, runs), and only
# that build compiles and checks them.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$here/scripts/bootstrap.sh"
(cd "$here/build" && ctest --output-on-failure --timeout 1500 -j "$(nproc)" "$@")
portable="$here/build-portable"
cmake -S "$here" -B "$portable" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCKPTFS_ARCH_FLAGS=-march=x86-64 >/dev/null
cmake --build "$portable" --parallel "$(nproc)" --target unit_tests
"$portable/bin/unit_tests"
