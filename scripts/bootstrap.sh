#!/usr/bin/env bash
# The one bootstrap: make sure the Debian packages ckptfs needs are installed (installing them when
# run as root, otherwise printing the exact apt-get line and stopping), then configure and build
# into build/. Used by mount.sh, tests/run.sh and .ci/run. Idempotent and quiet when nothing to do.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# Build and run-time dependencies. Why each one is here: README.md, "Dependencies".
packages=(
  build-essential cmake ninja-build pkg-config
  libfuse3-dev fuse3 libtbb-dev liburing-dev libboost-filesystem-dev catch2
  libxxhash-dev libzstd-dev libdeflate-dev libcli11-dev nlohmann-json3-dev
)
# Real clients for tests and benchmarks (Debian's interpreter at /usr/bin/python3), and the
# fuzzing toolchain.
test_packages=(
  python3-torch python3-numpy python3-sklearn libopenblas0-pthread python3-lmdb perl-doc
  clang libclang-rt-14-dev clang-format stress-ng fio
)

want=("${packages[@]}")
if [[ "${CKPTFS_NO_TEST_PACKAGES:-0}" != 1 ]]; then want+=("${test_packages[@]}"); fi

missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "ckptfs: missing packages. Install them with:" >&2
    echo "  sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  echo "ckptfs: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 || {
    apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null
  }
fi

build_type=${CKPTFS_BUILD_TYPE:-Release}
if [[ ! -f "$here/build/build.ninja" ]]; then
  cmake -S "$here" -B "$here/build" -G Ninja -DCMAKE_BUILD_TYPE="$build_type" >/dev/null
fi
cmake --build "$here/build" --parallel "$(nproc)"
