#!/usr/bin/env bash
# Format recognition cost vs payload size (docs/benchmarks.md, "Format recognition"): torch.save
# files of 64 MiB and 1 GiB with the same structure (16 fp32 tensors plus an int64 buffer), and a
# 1 GiB file of 1000 tensors; each is recognised 50 times by `ckptctl inspect --bench`, which
# reports the median wall time and how many bytes recognition read. Also CRC-32 throughput.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bin=$here/build/bin
dir=${1:-$(mktemp -d)}
mkdir -p "$dir"
trap 'rm -f "$dir"/rec_*.pt' EXIT
/usr/bin/python3 - "$dir" <<'PY'
import sys, torch
d = sys.argv[1]
for name, total, count in (("rec_64m", 64 << 20, 16), ("rec_1g", 1 << 30, 16), ("rec_1g_1000", 1 << 30, 1000)):
    n = total // 4 // count
    sd = {f"layer{i}.weight": torch.empty(n).fill_(i) for i in range(count)}
    sd["buf"] = torch.arange(10)
    torch.save(sd, f"{d}/{name}.pt")
PY
for f in "$dir"/rec_64m.pt "$dir"/rec_1g.pt "$dir"/rec_1g_1000.pt; do
  "$bin/ckptctl" inspect --bench 50 "$f"
done
"$bin/format_tool" crc-speed 256
