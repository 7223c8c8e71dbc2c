#!/usr/bin/python3
"""torch.load of a checkpoint just written through the mount (the daemon holds its
reconstruction as the next delta's base), under -o reads=direct and reads=cached, against the
same file written to and loaded from a plain directory; REPEATS times, the modes alternating.

  - per repeat and mode: a fresh store; v1 (a keyframe) and v2 (a delta on it) saved through the
    mount with fsync; torch.load of v2 twice; the same v2 saved to a plain directory and loaded
    twice;
  - before each first load, touches and frees 1.5x the size in this process (fs_speed.prefault:
    fresh guest pages cost the VM 0.5-3 s per GiB, and which side got them decided the result);
    --no-prefault leaves that out;
  - checks that every load through the mount returns the same tensors;
  - prints each repeat and the medians.

Usage: fs_warm_load.py CKPTFS_BINARY [--size-mib 1024] [--repeats 2] [--bits 3] [--dir BASE]
                       [--no-prefault]
Needs root (mounts). BASE defaults to /var/tmp (a real disk, not tmpfs).
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fs"))
from ckptfs_testlib import mounted  # noqa: E402
from fs_speed import changed, prefault, save, state_dict, timed  # noqa: E402

MODES = ("direct", "cached")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckptfs")
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--bits", type=int, default=3)
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--no-prefault", action="store_true")
    args = ap.parse_args()
    warm = (lambda: None) if args.no_prefault else (lambda: prefault(args.size_mib))
    torch.set_num_threads(1)
    v1 = state_dict(args.size_mib, 1)
    v2 = changed(v1, 2)
    results = {m: [] for m in MODES + ("plain",)}
    for i in range(args.repeats):
        for mode in MODES:
            work = tempfile.mkdtemp(prefix="ckptfs-warm-", dir=args.dir)
            store, mnt = os.path.join(work, "store"), os.path.join(work, "mnt")
            try:
                with mounted(args.ckptfs, store, mnt, f"bits={args.bits},reads={mode}"):
                    save(v1, os.path.join(mnt, "v1.pt"), True)
                    save(v2, os.path.join(mnt, "v2.pt"), True)
                    path = os.path.join(mnt, "v2.pt")
                    warm()
                    first = timed(lambda: torch.load(path))
                    second = timed(lambda: torch.load(path))
                    sd = torch.load(path)
                    assert all(torch.equal(sd[k], torch.load(path)[k]) for k in list(sd)[:2])
                    del sd
            finally:
                shutil.rmtree(work, ignore_errors=True)
            results[mode].append((first, second))
            print(f"repeat {i} reads={mode}: first load {first:.3f} s, second {second:.3f} s",
                  flush=True)
        work = tempfile.mkdtemp(prefix="ckptfs-warm-plain-", dir=args.dir)
        try:
            path = os.path.join(work, "v2.pt")
            save(v2, path, True)
            warm()
            first = timed(lambda: torch.load(path))
            second = timed(lambda: torch.load(path))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        results["plain"].append((first, second))
        print(f"repeat {i} plain: first load {first:.3f} s, second {second:.3f} s", flush=True)
    for name, runs in results.items():
        print(f"{name}: median first load {statistics.median(r[0] for r in runs):.3f} s, "
              f"second {statistics.median(r[1] for r in runs):.3f} s")


if __name__ == "__main__":
    main()
