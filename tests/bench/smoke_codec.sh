#!/usr/bin/env bash
# ctest: the codec benchmark runs end to end on synthetic and real (Debian torch) deltas, prints
# the documented JSON keys, verifies its own round trips (it exits non-zero otherwise), and the
# ratio claims hold: grouped b=2 <= 0.35 bits/param on real Adam deltas, paper mode >= 1 bit.
# No timing is asserted: speed is measured by the benchmark, not by tests.
set -euo pipefail
ckptctl=$1
src=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

/usr/bin/python3 "$src/tests/bench/make_real_deltas.py" "$work/data" --steps 30 --gap 1 --hidden 256 >/dev/null
"$ckptctl" bench codec --json --elements 200000 --repeats 1 --threads 1,2 --data "$work/data" >"$work/out.jsonl"

/usr/bin/python3 - "$work/out.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
keys = {"mode", "bits", "data", "dtype", "threads", "bits_per_param", "ratio", "encode_gbps", "decode_gbps"}
assert rows, "no output"
for r in rows:
    missing = keys - r.keys()
    assert not missing, f"missing keys {missing} in {r}"
    assert r["ratio"] > 0 and r["encode_gbps"] > 0 and r["decode_gbps"] > 0, r
def get(data, mode, bits, threads=1):
    (r,) = [r for r in rows if r["data"] == data and r["mode"] == mode and r["bits"] == bits and r["threads"] == threads]
    return r
for data in ("gauss", "laplace", "adam-gap1", "sgd-gap1"):
    for bits in (2, 3):
        assert get(data, "paper", bits)["bits_per_param"] >= 1.0, (data, bits)
    assert get(data, "grouped", 2)["bits_per_param"] < get(data, "paper", 2)["bits_per_param"] / 2, data
assert get("adam-gap1", "grouped", 2)["bits_per_param"] <= 0.35
# Per-tensor buckets keep more symbols alive (that is their point), still well under the paper's.
assert get("adam-gap1", "grouped-tensor", 2)["bits_per_param"] < get("adam-gap1", "paper", 2)["bits_per_param"] / 1.5
assert get("gauss", "lossless", 0)["ratio"] >= 1.1
# Keyframes rounded to 12 mantissa bits (the mount's): 1 sign bit + 12 + the exponent, ~2x.
assert get("gauss", "lossless-round12", 0)["ratio"] >= 1.9
# Ratio deltas (relative=on) change only nonnegative tensors: Adam's v, none of SGD's state.
for bits in (3, 4):
    assert get("sgd-gap1", "grouped-tensor-rel", bits)["bits_per_param"] == get("sgd-gap1", "grouped-tensor", bits)["bits_per_param"]
    assert get("adam-gap1", "grouped-tensor-rel", bits)["bits_per_param"] != get("adam-gap1", "grouped-tensor", bits)["bits_per_param"]
assert get("adam-gap1", "grouped-tensor-rel", 4)["bits_per_param"] < 1.1 * get("adam-gap1", "grouped-tensor", 4)["bits_per_param"]
# Same bytes whatever the thread count.
for r in rows:
    if r["threads"] == 2:
        one = [o for o in rows if o["threads"] == 1 and all(o[k] == r[k] for k in ("data", "mode", "bits", "scope"))]
        assert one and one[0]["bits_per_param"] == r["bits_per_param"], r
print(f"{len(rows)} benchmark rows checked")
PY

# Bad input is refused cleanly: usage errors exit 2, bad values exit 1 with a message.
set +e
"$ckptctl" >/dev/null 2>&1; [[ $? == 2 ]] || { echo "no subcommand should exit 2"; exit 1; }
"$ckptctl" bench codec --threads 0 >/dev/null 2>&1; [[ $? == 2 ]] || { echo "--threads 0 should exit 2"; exit 1; }
"$ckptctl" bench codec --data /nonexistent >/dev/null 2>&1; [[ $? == 2 ]] || { echo "missing --data dir should exit 2"; exit 1; }
msg=$("$ckptctl" bench codec --dtype f64 --elements 10 2>&1); rc=$?
[[ $rc == 1 && $msg == *"--dtype"* ]] || { echo "--dtype f64 should exit 1 with a message, got $rc: $msg"; exit 1; }
mkdir -p "$work/empty"
msg=$("$ckptctl" bench codec --data "$work/empty" --elements 10 2>&1); rc=$?
[[ $rc == 1 && $msg == *"no *.json"* ]] || { echo "empty --data should exit 1, got $rc: $msg"; exit 1; }
echo '{"name": "x", "prev": "x.prev.f32", "cur": "x.cur.f32", "tensors": [{"name": "w", "numel": 10}]}' >"$work/empty/x.json"
head -c 40 /dev/zero >"$work/empty/x.prev.f32"; head -c 36 /dev/zero >"$work/empty/x.cur.f32"
msg=$("$ckptctl" bench codec --data "$work/empty" --elements 10 2>&1); rc=$?
[[ $rc == 1 && $msg == *"inconsistent"* ]] || { echo "inconsistent data should exit 1, got $rc: $msg"; exit 1; }
"$ckptctl" bench codec --help | grep -q -- "--threads" || { echo "--help lacks --threads"; exit 1; }
echo "smoke_codec: ok"
