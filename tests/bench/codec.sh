#!/usr/bin/env bash
# The codec benchmark on synthetic and real deltas: builds, makes the real checkpoint pairs once
# (tests/bench/data/, not committed), then runs `ckptctl bench codec`. Extra arguments go to it,
# e.g. tests/bench/codec.sh --threads 1,2 --json
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
"$here/scripts/bootstrap.sh" >/dev/null
data="$here/tests/bench/data"
for gap in 1 10; do
  [[ -f "$data/adam-gap$gap.json" ]] || /usr/bin/python3 "$here/tests/bench/make_real_deltas.py" "$data" --gap "$gap"
done
exec "$here/build/bin/ckptctl" bench codec --data "$data" "$@"
