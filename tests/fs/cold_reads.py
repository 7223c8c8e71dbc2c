#!/usr/bin/python3
"""The decode work of cold torch.loads through a real mount (issue 13): every chunk decoded once.

A training state shaped like a transformer's (tests/bench/fs_scale.py: 8 fp32 matrices, 48 small
parameters of 256-16384 elements, Adam's exp_avg and exp_avg_sq of each; 0.1 GiB) is saved three
times through a mount; then, each in a fresh mount after the page cache is dropped, torch.load of
version 1 (the keyframe) and version 2 (a delta on it; version 3 is the newest and reads from its
head image). torch.load reads the zip's records in storage-key order, not file order, and the
kernel's read-ahead of each record strays into the next one in the file: the read path must tell
those reads from the reader's own steps (docs/filesystem.md, "Limits", on reading a stored
checkpoint). `ckptctl status` counts what it decoded.

Checks, at the default options and at cache=256M (a 32 MiB decoded-chunk cache, a third of the
file):
  - every version loads, each tensor within its bound of what was saved (fs_scale.check);
  - the counters move with the work: at least one chunk per 4 MiB of the file, and per chunk or
    block one frame of each version of the chain (1 for the keyframe, 2 for version 2): no base
    chunk is cached in a fresh mount;
  - at the defaults no chunk is decoded twice (the chunk cache is larger than the file);
  - at cache=256M at most AGAIN_SMALL_CACHE of the bytes decoded are chunks decoded again, and
    the kernel's reads away from the reader were served by decoding single blocks, at most
    STRAY_SHARE of the bytes (before that, 37% of the bytes decoded were decoded again);
  - in all, what the loads decoded is within OVERHEAD of the bytes of the file.

Usage: cold_reads.py CKPTFS_BINARY    (as root; Debian's /usr/bin/python3)
"""
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "bench"))
import fs_scale  # noqa: E402
from ckptfs_testlib import daemon_log, mounted, require_fuse, status_json  # noqa: E402
from fs_speed import drop_caches  # noqa: E402

GIB = 0.1
CHUNK = 4 << 20
AGAIN_SMALL_CACHE = 0.05
STRAY_SHARE = 0.2
OVERHEAD = 1.25


def reads(ctl, mnt):
    """The daemon's cold-read counters once read-ahead's decodes are done (a decode counts its
    chunk when it starts, its frames when it ends): no read-ahead job queued or running, and two
    reads 0.1 s apart agree."""
    def once():
        return status_json(ctl, mnt)["reads"]
    last = once()
    for _ in range(600):
        time.sleep(0.1)
        now = once()
        if now == last and now["read_ahead_jobs"] == 0:
            return now
        last = now
    raise AssertionError(f"read-ahead did not settle in 60 s: {last}")


def run(binary, ctl, work, label, opts):
    store, mnt = f"{work}/{label}-store", f"{work}/{label}-mnt"
    os.makedirs(mnt)
    state = fs_scale.TrainingState(int(GIB * (1 << 30)), seed=7)
    refs = {}
    with mounted(binary, store, mnt, *opts):
        for v in (1, 2, 3):
            if v > 1:
                state.advance()
            fs_scale.save_fsync(state.sd, f"{mnt}/v{v}.pt")
            refs[v] = fs_scale.snapshot(state.sd)
    results = {}
    for v, depth in ((1, 1), (2, 2)):
        with mounted(binary, store, mnt, *opts):
            file_bytes = os.path.getsize(f"{mnt}/v{v}.pt")
            drop_caches()
            before = reads(ctl, mnt)
            loaded = fs_scale.load(f"{mnt}/v{v}.pt")
            after = reads(ctl, mnt)
            fs_scale.check(loaded, refs[v], f"{label} v{v}", refs.get(v - 1))
            d = {k: after[k] - before[k] for k in after}
            print(f"{label}: v{v} ({file_bytes} bytes): {d}", flush=True)
            assert d["chunks_decoded"] >= file_bytes // CHUNK, (label, v, d)
            assert d["frames_decoded"] == depth * (d["chunks_decoded"] +
                                                   d["stray_blocks_decoded"]), (label, v, d)
            decoded = d["decoded_bytes"] + d["stray_bytes"]
            assert file_bytes * 0.9 <= decoded <= OVERHEAD * file_bytes, (label, v, d)
            results[v] = d
    with open(daemon_log(store)) as f:
        errors = [line for line in f if " error:" in line]
    assert not errors, errors[:10]
    return results


def main():
    require_fuse()
    binary = sys.argv[1]
    ctl = os.path.join(os.path.dirname(os.path.abspath(binary)), "ckptctl")
    with tempfile.TemporaryDirectory(prefix="ckptfs-cold-reads-", dir="/var/tmp") as work:
        for v, d in run(binary, ctl, work, "default", ()).items():
            assert d["chunks_decoded_again"] == 0, f"defaults: v{v}: chunks decoded twice: {d}"
        for v, d in run(binary, ctl, work, "small", ("cache=256M",)).items():
            decoded = d["decoded_bytes"] + d["stray_bytes"]
            again = d["decoded_again_bytes"] / decoded
            assert again <= AGAIN_SMALL_CACHE, f"cache=256M: v{v}: {again:.1%} again: {d}"
            assert d["stray_blocks_decoded"] > 0, f"cache=256M: v{v}: no stray reads? {d}"
            assert d["stray_bytes"] <= STRAY_SHARE * decoded, f"cache=256M: v{v}: {d}"
    print("cold_reads: ok")


if __name__ == "__main__":
    main()
