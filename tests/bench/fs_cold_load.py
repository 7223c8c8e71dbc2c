#!/usr/bin/python3
"""The cold-read half of fs_speed.py, repeated: torch.load of the latest version after a remount
against torch.load of the same file from a plain directory after drop_caches (issue 4's load
target), REPEATS times in one run.

  - writes v1 (a keyframe) and v2 (a delta on it) through one mount of the first binary, and v2
    to a plain directory;
  - per repeat, after drop_caches each: torch.load from the plain directory, and for each binary
    a mount, torch.load of v2, unmount, with the daemon's CPU seconds (user + system) during the
    load and its peak RSS. The order rotates from repeat to repeat (plain first, then each
    binary first), so a slow spell of the machine does not always fall on the same side;
  - after each drop_caches, touches and frees 1.5x the size in this process (fs_speed.prefault),
    so that neither side's fresh tensors land on pages the VM must first get back from its host
    (0.5-3 s per GiB on the benchmark VM); --no-prefault leaves that out;
  - checks that every mount load returns the same tensors as the first one;
  - prints each repeat and, per binary, the median of the per-repeat mount/plain ratios, the
    ratio of the medians, and the ratio of the fastest loads (the least disturbed ones).

Usage: fs_cold_load.py CKPTFS_BINARY [OTHER_BINARY ...] [--size-mib 1024] [--repeats 5]
                       [--bits 3] [--dir BASE] [--opts MOUNT_OPTS] [--perf PERF_DATA] [--json]
                       [--no-prefault]
Further binaries (an older build, say) read the store the first one wrote: same-run comparisons.
--perf records `perf record -e cpu-clock -g` of the first binary's daemon during the last
repeat's load. Needs root (drop_caches). BASE defaults to /var/tmp (a real disk, not tmpfs).
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fs"))
from ckptfs_testlib import mounted, peak_rss  # noqa: E402
from fs_speed import changed, drop_caches, prefault, save, state_dict  # noqa: E402
from scale_lib import cpu_seconds  # noqa: E402


def load_plain(path, warm):
    drop_caches()
    warm()
    t = time.perf_counter()
    torch.load(path)
    return time.perf_counter() - t


def load_mount(binary, store, mnt, opts, perf_to, warm):
    """Mounts, loads v2, unmounts: (state dict, seconds, daemon CPU seconds, daemon peak RSS)."""
    drop_caches()
    with mounted(binary, store, mnt, opts) as proc:
        perf = None
        if perf_to:
            perf = subprocess.Popen(["perf", "record", "-q", "-e", "cpu-clock", "-g", "-o",
                                     perf_to, "-p", str(proc.pid)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)
        warm()
        cpu0 = cpu_seconds(proc.pid)
        t = time.perf_counter()
        sd = torch.load(os.path.join(mnt, "v2.pt"))
        seconds = time.perf_counter() - t
        cpu = cpu_seconds(proc.pid) - cpu0
        rss = peak_rss(proc.pid)
        if perf:
            perf.send_signal(signal.SIGINT)
            perf.wait()
    return sd, seconds, cpu, rss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckptfs", nargs="+")
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--bits", type=int, default=3)
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--opts", default="")
    ap.add_argument("--perf", default="")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-prefault", action="store_true")
    args = ap.parse_args()
    warm = (lambda: None) if args.no_prefault else (lambda: prefault(args.size_mib))
    torch.set_num_threads(1)
    opts = f"bits={args.bits}" + ("," + args.opts if args.opts else "")
    names = [os.path.basename(b) if args.ckptfs.count(b) == 1 else f"{b}#{i}"
             for i, b in enumerate(args.ckptfs)]

    work = tempfile.mkdtemp(prefix="ckptfs-cold-", dir=args.dir)
    plain, store, mnt = (os.path.join(work, d) for d in ("plain", "store", "mnt"))
    os.makedirs(plain)
    runs = {n: [] for n in names}
    plains = []
    try:
        v1 = state_dict(args.size_mib, 1)
        v2 = changed(v1, 2)
        save(v2, os.path.join(plain, "v2.pt"), True)
        with mounted(args.ckptfs[0], store, mnt, opts):
            save(v1, os.path.join(mnt, "v1.pt"), True)
            save(v2, os.path.join(mnt, "v2.pt"), True)
        del v1, v2
        reference = None
        for i in range(args.repeats):
            sides = [None] + list(range(len(names)))  # None: the plain directory
            k = i % len(sides)
            sides = sides[k:] + sides[:k]
            got = {}
            for side in sides:
                if side is None:
                    plain_s = load_plain(os.path.join(plain, "v2.pt"), warm)
                    continue
                perf_to = args.perf if args.perf and side == 0 and i == args.repeats - 1 else ""
                sd, seconds, cpu, rss = load_mount(args.ckptfs[side], store, mnt, opts, perf_to,
                                                   warm)
                if reference is None:
                    reference = sd
                elif sd.keys() != reference.keys() or not all(
                        torch.equal(sd[key], reference[key]) for key in sd):
                    raise SystemExit(f"repeat {i}: {names[side]} served different tensors")
                del sd
                got[names[side]] = (seconds, cpu, rss)
            plains.append(plain_s)
            for n, (seconds, cpu, rss) in got.items():
                runs[n].append({"plain": plain_s, "mount": seconds, "ratio": seconds / plain_s,
                                "daemon_cpu": cpu, "daemon_peak_rss": rss})
            if not args.json:
                print(f"repeat {i}: plain {plain_s:.3f} s | " + " | ".join(
                    f"{n} {g[0]:.3f} s, ratio {g[0] / plain_s:.2f}, daemon cpu {g[1]:.2f} s, "
                    f"peak rss {g[2] / 2**30:.2f} GiB" for n, g in got.items()), flush=True)
    finally:
        if os.path.ismount(mnt):
            subprocess.run(["fusermount3", "-uz", mnt], check=False)
        shutil.rmtree(work, ignore_errors=True)

    summary = {}
    for n, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        med["ratio_of_medians"] = med["mount"] / med["plain"]
        med["ratio_of_fastest"] = min(r["mount"] for r in rs) / min(plains)
        summary[n] = med
    if args.json:
        print(json.dumps({"size_mib": args.size_mib, "runs": runs, "median": summary}))
        return
    for n, med in summary.items():
        print(f"{n}: {args.size_mib} MiB, {args.repeats} repeats, medians: mount "
              f"{med['mount']:.3f} s, plain {med['plain']:.3f} s, ratio {med['ratio']:.2f} "
              f"(of the medians {med['ratio_of_medians']:.2f}, of the fastest loads "
              f"{med['ratio_of_fastest']:.2f}), daemon cpu {med['daemon_cpu']:.2f} s")


if __name__ == "__main__":
    main()
