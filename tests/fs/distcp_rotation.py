#!/usr/bin/python3
"""Rotation of DCP checkpoints through a real mount: many ranks' shards, only the newest kept.

A checkpoint manager over torch.distributed.checkpoint keeps the newest few `step_N/` directories
and removes the rest (as HF Trainer's save_total_limit does for its directories). Each step here
is DCP's exact layout as distcp.py writes it: four ranks writing `__R_0.distcp` at once (byte
items, then one torch.save per tensor in the same file) and `.metadata` renamed into place; after
each step the oldest directories beyond the newest three go with shutil.rmtree, in the mount and
in a plain directory on the same disk. Every rank's shard is its own lineage, so a rank's chain
behind its oldest kept step must be freed by rewriting that step (docs/filesystem.md,
"Rotation"), four lineages at once.

Checks, at the default options:
  - from the 4th step on, the store holds at most 0.4x the rotated plain directory, and what was
    written to the store (new versions plus rewrites) is at most 1/3 of what the plain directory
    was written (issue 16's rotation target, as tests/fs/rotation.py asserts for HF layouts);
  - every rank's lineage was rewritten at least once, and the rewrites wrote at most 1/1.25 of
    what they freed (ckptctl status; 5% slack for the rewrites' own headers);
  - every kept step reads back with DCP's reader at the end, each rank's byte items exact and
    every tensor equal to what it read as right after it was written (before any rewrite of it
    or of its bases), and again after a remount;
  - with -o reclaim=0 the store keeps the hidden chains and ends above the bound above: the
    saving is the rewrites' doing.

Usage: distcp_rotation.py CKPTFS_BINARY    (as root; Debian's /usr/bin/python3)
"""
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckptfs_testlib import (daemon_log, du, info, mounted, require_fuse,  # noqa: E402
                            rotate_checkpoints, settle_rotation)
from distcp import RANKS, read_step, train_states, write_step  # noqa: E402
from rotation import KEEP  # noqa: E402

STEPS, FACTOR = 10, 1.25


def shards(root, step):
    return [f"{root}/step_{step}/__{r}_0.distcp" for r in range(RANKS)]


def same(a, b):
    if isinstance(a, bytes):
        return a == b
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def run(binary, ctl, work, label, opts, target):
    store, mnt, plain = f"{work}/{label}-store", f"{work}/{label}-mnt", f"{work}/{label}-plain"
    os.makedirs(mnt)
    os.makedirs(plain)
    keyframe = {}  # rank -> stored bytes of its lineage's first (keyframe) version
    new_bytes = plain_written = 0
    lineages = {}
    first_read = {}  # step directory -> what it read as right after it was written
    with mounted(binary, store, mnt, *opts):
        for step, state in enumerate(train_states(STEPS, classes=10), start=1):
            write_step(mnt, step, state)
            write_step(plain, step, state)
            first_read[f"step_{step}"] = read_step(f"{mnt}/step_{step}")
            for r, path in enumerate(shards(mnt, step)):
                vi = info(path)
                assert vi["format"] == "distcp", (path, vi["format"])
                lineages.setdefault(r, vi["lineage"])
                assert vi["lineage"] == lineages[r], f"{label}: rank {r} left its lineage"
                assert step == 1 or vi["kind"] == "delta", (path, vi["kind"])
                keyframe.setdefault(r, vi["stored_bytes"])
                new_bytes += vi["stored_bytes"]
            plain_written += sum(os.path.getsize(p) for p in shards(plain, step))
            kept = rotate_checkpoints(mnt, KEEP, "step_")
            assert rotate_checkpoints(plain, KEEP, "step_") == kept
            s = settle_rotation(ctl, mnt, store)
            live = sum(info(p)["stored_bytes"] for d in kept
                       for p in shards(mnt, int(d.split("_")[1])))
            objects = du(f"{store}/objects")
            plain_bytes = du(plain)
            bound = live + FACTOR * sum(keyframe.values()) + 64 * 1024 * len(kept)
            rot = s["rotation"]
            print(f"{label}: step {step}: store {objects} bytes, kept versions {live}, bound "
                  f"{bound:.0f}, rotated plain {plain_bytes} ({plain_bytes / objects:.2f}x); "
                  f"rewrites {rot['rewrites']}, written {rot['written_bytes']}, "
                  f"freed {rot['freed_bytes']}")
            if target:
                assert objects <= bound, f"{label}: step {step}: hidden chains were not freed"
                if step > KEEP:
                    assert objects <= 0.4 * plain_bytes, f"{label}: step {step}: over 0.4x plain"
        assert len(set(lineages.values())) == RANKS, f"{label}: ranks share lineages {lineages}"
        written = new_bytes + rot["written_bytes"]
        print(f"{label}: written to the store {written} bytes (new versions {new_bytes}, "
              f"rewrites {rot['written_bytes']}) for {plain_written} to plain "
              f"({written / plain_written:.2f}x)")
        if target:
            assert rot["rewrites"] >= RANKS, f"{label}: not every rank's chain was freed: {rot}"
            assert rot["written_bytes"] <= rot["freed_bytes"] / FACTOR * 1.05, rot
            assert written <= plain_written / 3, f"{label}: wrote {written} of {plain_written}"
        else:
            assert rot["rewrites"] == 0, f"{label}: rewrites with reclaim=0: {rot}"
        def unchanged(when):
            for d in kept:
                now, then = read_step(f"{mnt}/{d}"), first_read[d]
                assert now.keys() == then.keys(), (label, d, when)
                for key, want in then.items():
                    assert same(want, now[key]), f"{label}: {d} {key} changed {when}"
        unchanged("by the rewrites")
    with mounted(binary, store, mnt, *opts):
        unchanged("over the remount")
    for d in kept:
        for key, want in read_step(f"{plain}/{d}").items():
            if isinstance(want, bytes):
                assert first_read[d][key] == want, f"{label}: {d} {key}: byte item differs"
    with open(daemon_log(store)) as f:
        errors = [line for line in f if " error:" in line]
    assert not errors, errors[:10]
    return objects, bound


def main():
    require_fuse()
    binary = sys.argv[1]
    ctl = os.path.join(os.path.dirname(os.path.abspath(binary)), "ckptctl")
    with tempfile.TemporaryDirectory(prefix="ckptfs-distcp-rotation-", dir="/var/tmp") as work:
        on, _ = run(binary, ctl, work, "default", (), target=True)
        off, bound = run(binary, ctl, work, "off", ("reclaim=0",), target=False)
        assert off > bound, f"reclaim=0 kept {off} bytes, within the bound {bound:.0f}"
        assert off > 1.3 * on, f"reclaim=0 kept {off} bytes, the default {on}: no difference"
    print("distcp_rotation: ok")


if __name__ == "__main__":
    main()
