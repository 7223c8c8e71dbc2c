#!/usr/bin/env bash
# Every C++ source of the project is as .clang-format says (clang-format --dry-run -Werror):
# fails with the offending lines. Skips (77) where clang-format is not installed.
set -euo pipefail
root=${1:?usage: clang_format.sh SOURCE_DIR}
command -v clang-format >/dev/null || { echo "SKIPPED: clang-format is not installed"; exit 77; }
cd "$root"
mapfile -d '' files < <(find codec cache fs tools tests \( -name '*.cpp' -o -name '*.hpp' \) \
  -print0 | sort -z)
((${#files[@]} > 100)) || { echo "found only ${#files[@]} sources under $root"; exit 1; }
clang-format --dry-run -Werror "${files[@]}"
echo "${#files[@]} files formatted as .clang-format says"
