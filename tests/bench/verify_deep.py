#!/usr/bin/python3
"""`ckptctl verify --deep` over a chain of large checkpoints, for one or more builds.

Each build's daemon saves VERSIONS versions of a GIB GiB fp32 state dict (four tensors drifting
a little each version: one keyframe, then deltas) into its own store through a mount with
`-o cache=CACHE,buffer=BUFFER`; then, per repeat, `verify --deep` runs through the live mount
and offline on the store after the unmount, with the page cache dropped before each. Prints the
seconds of each, the median per build, and its ratio to the first build's.

Usage: verify_deep.py BIN_DIR [BIN_DIR...] [--gib 1] [--versions 14] [--repeats 3]
       [--cache 256M] [--buffer 128M]     (as root; Debian's /usr/bin/python3)
BIN_DIR holds ckptfs and ckptctl.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, os.path.join(here, "..", "fs"))
from ckptfs_testlib import mounted, require_fuse  # noqa: E402
from fs_speed import drop_caches  # noqa: E402


def timed_verify(ctl, target):
    drop_caches()
    t = time.monotonic()
    r = subprocess.run([ctl, "verify", "--deep", target], capture_output=True, text=True)
    secs = time.monotonic() - t
    if r.returncode != 0:
        raise SystemExit(f"verify --deep {target} failed: {r.stdout}{r.stderr}")
    return secs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bins", nargs="+")
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--versions", type=int, default=14)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cache", default="256M")
    ap.add_argument("--buffer", default="128M")
    a = ap.parse_args()
    require_fuse()
    per_tensor = int(a.gib * 2**30 / 4 / 4)
    opts = f"cache={a.cache},buffer={a.buffer}"
    results = {}
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        for b in a.bins:
            ckptfs, ctl = os.path.join(b, "ckptfs"), os.path.join(b, "ckptctl")
            store, mnt = f"{tmp}/{len(results)}/store", f"{tmp}/{len(results)}/mnt"
            os.makedirs(mnt)
            live, offline = [], []
            with mounted(ckptfs, store, mnt, opts):
                torch.manual_seed(0)
                state = {f"layer{i}.weight": torch.randn(per_tensor) for i in range(4)}
                for v in range(a.versions):
                    for t in state.values():
                        t.add_(torch.randn(per_tensor), alpha=1e-3)
                    path = f"{mnt}/ckpt_{v:03d}.pt"
                    torch.save(state, path)
                    fd = os.open(path, os.O_RDONLY)
                    os.fsync(fd)  # stored before the next one
                    os.close(fd)
                for _ in range(a.repeats):
                    live.append(timed_verify(ctl, mnt))
            for _ in range(a.repeats):
                offline.append(timed_verify(ctl, store))
            results[b] = (live, offline)
            print(f"{b}: live {', '.join(f'{x:.2f}' for x in live)} s; "
                  f"offline {', '.join(f'{x:.2f}' for x in offline)} s", flush=True)
    first = a.bins[0]
    print(f"\n{a.versions} versions of {a.gib:g} GiB, -o {opts}, medians of {a.repeats}:")
    print("| build | live verify --deep | offline | live / first | offline / first |")
    print("|---|---|---|---|---|")
    for b, (live, offline) in results.items():
        lm, om = statistics.median(live), statistics.median(offline)
        fl, fo = (statistics.median(x) for x in results[first])
        print(f"| {b} | {lm:.2f} s | {om:.2f} s | {lm / fl:.2f} | {om / fo:.2f} |")


if __name__ == "__main__":
    main()
