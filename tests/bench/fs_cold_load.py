#!/usr/bin/python3
"""The cold-read half of fs_speed.py, repeated: torch.load of the latest version after a remount
against torch.load of the same file from a plain directory after drop_caches (issue 4's load
target), REPEATS times in one run, mount and plain alternating so both see the same load.

  - writes v1 (a keyframe) and v2 (a delta on it) through one mount, and v2 to a plain directory;
  - per repeat: drop_caches, torch.load from the plain directory; drop_caches, mount, torch.load
    of v2, unmount; also the daemon's CPU seconds (user + system) during that load and its peak
    RSS;
  - checks that every mount load returns the same tensors as the first one;
  - prints each repeat and the medians (ratio = median of the per-repeat mount/plain ratios).

Usage: fs_cold_load.py CKPTFS_BINARY [--size-mib 1024] [--repeats 3] [--bits 3] [--dir BASE]
                       [--opts MOUNT_OPTS] [--perf PERF_DATA] [--json]
--perf records `perf record -e cpu-clock -g` of the daemon during the last repeat's load.
Needs root (drop_caches). BASE defaults to /var/tmp (a real disk, not tmpfs).
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
from fs_speed import changed, drop_caches, save, state_dict  # noqa: E402


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckptfs")
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--bits", type=int, default=3)
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--opts", default="")
    ap.add_argument("--perf", default="")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    opts = f"bits={args.bits}" + ("," + args.opts if args.opts else "")

    work = tempfile.mkdtemp(prefix="ckptfs-cold-", dir=args.dir)
    plain, store, mnt = (os.path.join(work, d) for d in ("plain", "store", "mnt"))
    os.makedirs(plain)
    runs = []
    try:
        v1 = state_dict(args.size_mib, 1)
        v2 = changed(v1, 2)
        save(v2, os.path.join(plain, "v2.pt"), True)
        with mounted(args.ckptfs, store, mnt, opts):
            save(v1, os.path.join(mnt, "v1.pt"), True)
            save(v2, os.path.join(mnt, "v2.pt"), True)
        del v1, v2
        reference = None
        for i in range(args.repeats):
            drop_caches()
            t = time.perf_counter()
            torch.load(os.path.join(plain, "v2.pt"))
            plain_s = time.perf_counter() - t
            drop_caches()
            with mounted(args.ckptfs, store, mnt, opts) as proc:
                perf = None
                if args.perf and i == args.repeats - 1:
                    perf = subprocess.Popen(["perf", "record", "-q", "-e", "cpu-clock", "-g", "-o",
                                             args.perf, "-p", str(proc.pid)],
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    time.sleep(1.0)
                cpu0 = cpu_seconds(proc.pid)
                t = time.perf_counter()
                sd = torch.load(os.path.join(mnt, "v2.pt"))
                mount_s = time.perf_counter() - t
                cpu = cpu_seconds(proc.pid) - cpu0
                rss = peak_rss(proc.pid)
                if perf:
                    perf.send_signal(signal.SIGINT)
                    perf.wait()
            if reference is None:
                reference = sd
            elif sd.keys() != reference.keys() or not all(
                    torch.equal(sd[k], reference[k]) for k in sd):
                raise SystemExit(f"repeat {i}: the mount served different tensors")
            del sd
            runs.append({"plain": plain_s, "mount": mount_s, "ratio": mount_s / plain_s,
                         "daemon_cpu": cpu, "daemon_peak_rss": rss})
            if not args.json:
                print(f"repeat {i}: mount {mount_s:.3f} s, plain {plain_s:.3f} s, "
                      f"ratio {mount_s / plain_s:.2f}, daemon cpu {cpu:.2f} s, "
                      f"peak rss {rss / 2**30:.2f} GiB", flush=True)
    finally:
        if os.path.ismount(mnt):
            subprocess.run(["fusermount3", "-uz", mnt], check=False)
        shutil.rmtree(work, ignore_errors=True)

    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    if args.json:
        print(json.dumps({"size_mib": args.size_mib, "runs": runs, "median": med}))
        return
    print(f"{args.size_mib} MiB, {args.repeats} repeats, medians: mount {med['mount']:.3f} s, "
          f"plain {med['plain']:.3f} s, ratio {med['ratio']:.2f}, daemon cpu "
          f"{med['daemon_cpu']:.2f} s")


if __name__ == "__main__":
    main()
