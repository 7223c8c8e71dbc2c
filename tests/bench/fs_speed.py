#!/usr/bin/python3
"""torch.save / torch.load through a ckptfs mount against a plain directory on the same disk,
in one run (issue 4's speed and memory targets):

  - a state dict of SIZE_MIB of fp32 tensors (v1), then a second version with small changes (v2);
  - torch.save wall time (return of the call; and with os.fsync of the file);
  - torch.load of the latest version, warm (the first load after the save; the second is
    printed too) and after remount (plain: after drop_caches); each load follows prefault(),
    so that both sides start from the same memory state;
  - the daemon's peak RSS (VmHWM) while saving v2 against v1 (reset before v2), and for v1;
  - bytes the store grew by for v2, against its logical size.

Usage: fs_speed.py CKPTFS_BINARY [--size-mib 1024] [--bits 3] [--opts O,...] [--dir BASE] [--json]
Needs root (drop_caches). BASE defaults to a temp dir on /var/tmp (a real disk, not tmpfs).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fs"))
from ckptfs_testlib import du, mounted, peak_rss, reset_peak_rss  # noqa: E402


def state_dict(size_mib, seed):
    g = torch.Generator().manual_seed(seed)
    n = size_mib * (1 << 20) // 4 // 16
    return {f"layer{i}.weight": torch.randn(n, generator=g) * 0.02 for i in range(16)}


def changed(sd, seed):
    g = torch.Generator().manual_seed(seed)
    return {k: v + torch.randn(v.shape, generator=g) * 1e-4 for k, v in sd.items()}


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def save(sd, path, fsync):
    torch.save(sd, path)
    if fsync:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def prefault(size_mib):
    """Touches and frees 1.5x size_mib of memory in this process, so that the load that follows
    gets pages the guest kernel has just had back. On the benchmark VM, memory the guest freed
    seconds ago is handed back to the host, and the next first touch of a page then costs
    0.5-3 s of CPU per GiB, whoever touches it: torch.load's 1 GiB of fresh tensors paid that or
    not depending on what ran before (a daemon exiting, say), which swung loads by 3-4x. Both
    sides of a comparison call this right before their load."""
    x = torch.zeros(size_mib * (1 << 20) * 3 // 2 // 4)
    del x


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckptfs")
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--bits", type=int, default=3)
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--opts", default="", help="more -o options for the mount, e.g. rep=mean")
    args = ap.parse_args()
    opts = f"bits={args.bits}" + ("," + args.opts if args.opts else "")
    torch.set_num_threads(1)

    work = tempfile.mkdtemp(prefix="ckptfs-bench-", dir=args.dir)
    plain, store, mnt = (os.path.join(work, d) for d in ("plain", "store", "mnt"))
    os.makedirs(plain)
    v1 = state_dict(args.size_mib, 1)
    v2 = changed(v1, 2)
    r = {"size_mib": args.size_mib, "bits": args.bits}
    try:
        # Plain directory on the same disk.
        r["plain_save_v1"] = timed(lambda: save(v1, os.path.join(plain, "v1.pt"), False))
        r["plain_save_v2"] = timed(lambda: save(v2, os.path.join(plain, "v2.pt"), False))
        r["plain_save_fsync_v2"] = timed(lambda: save(v2, os.path.join(plain, "v2b.pt"), True))
        prefault(args.size_mib)
        r["plain_load_warm"] = timed(lambda: torch.load(os.path.join(plain, "v2.pt")))
        drop_caches()
        prefault(args.size_mib)
        r["plain_load_cold"] = timed(lambda: torch.load(os.path.join(plain, "v2.pt")))

        with mounted(args.ckptfs, store, mnt, opts) as proc:
            # One save at a time, each against the committed previous version (the case).
            r["mount_save_v1"] = timed(lambda: save(v1, os.path.join(mnt, "v1.pt"), True))
            r["daemon_peak_rss_v1"] = peak_rss(proc.pid)
            reset_peak_rss(proc.pid)
            before = du(store)
            r["mount_save_fsync_v2"] = timed(lambda: save(v2, os.path.join(mnt, "v2.pt"), True))
            r["store_v2_bytes"] = du(store) - before
            r["daemon_peak_rss"] = peak_rss(proc.pid)
            # close() does not wait for encoding: the return of torch.save alone.
            r["mount_save_v2"] = timed(lambda: save(v2, os.path.join(mnt, "v2b.pt"), False))
            fd = os.open(os.path.join(mnt, "v2b.pt"), os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
            prefault(args.size_mib)
            r["mount_load_warm"] = timed(lambda: torch.load(os.path.join(mnt, "v2.pt")))
            r["mount_load_warm2"] = timed(lambda: torch.load(os.path.join(mnt, "v2.pt")))
        drop_caches()
        with mounted(args.ckptfs, store, mnt, opts) as proc:
            prefault(args.size_mib)
            r["mount_load_remount"] = timed(lambda: torch.load(os.path.join(mnt, "v2.pt")))
            r["daemon_peak_rss_reader"] = peak_rss(proc.pid)
        logical = os.path.getsize(os.path.join(plain, "v2.pt"))
        r["logical_v2_bytes"] = logical
        r["v2_ratio"] = logical / max(r["store_v2_bytes"], 1)
        r["save_ratio"] = r["mount_save_v2"] / r["plain_save_v2"]
        r["save_fsync_ratio"] = r["mount_save_fsync_v2"] / r["plain_save_fsync_v2"]
        r["load_warm_ratio"] = r["mount_load_warm"] / r["plain_load_warm"]
        r["load_cold_ratio"] = r["mount_load_remount"] / r["plain_load_cold"]
    finally:
        if os.path.ismount(mnt):
            subprocess.run(["fusermount3", "-uz", mnt], check=False)
        shutil.rmtree(work, ignore_errors=True)

    if args.json:
        print(json.dumps(r))
        return
    print(f"{args.size_mib} MiB fp32 state dict, bits={args.bits}; seconds, mount vs plain directory")
    print(f"  torch.save v2:            {r['mount_save_v2']:.2f} vs {r['plain_save_v2']:.2f}  ({r['save_ratio']:.2f}x)")
    print(f"  torch.save v2 + fsync:    {r['mount_save_fsync_v2']:.2f} vs {r['plain_save_fsync_v2']:.2f}  ({r['save_fsync_ratio']:.2f}x)")
    print(f"  torch.load warm:          {r['mount_load_warm']:.2f} vs {r['plain_load_warm']:.2f}  ({r['load_warm_ratio']:.2f}x; again: {r['mount_load_warm2']:.2f})")
    print(f"  torch.load after remount: {r['mount_load_remount']:.2f} vs {r['plain_load_cold']:.2f} (drop_caches)  ({r['load_cold_ratio']:.2f}x)")
    print(f"  daemon peak RSS, v2:      {r['daemon_peak_rss'] / 2**30:.2f} GiB (v1, a keyframe: {r['daemon_peak_rss_v1'] / 2**30:.2f} GiB; reader after remount: {r['daemon_peak_rss_reader'] / 2**30:.2f} GiB)")
    print(f"  store bytes for v2:       {r['store_v2_bytes']} of {r['logical_v2_bytes']} ({r['v2_ratio']:.1f}x)")


if __name__ == "__main__":
    main()
