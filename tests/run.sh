#!/usr/bin/env bash
# The test command of the README: bootstrap (packages + build), then every test through ctest.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$here/scripts/bootstrap.sh"
cd "$here/build"
ctest --output-on-failure --timeout 1500 -j "$(nproc)" "$@"
