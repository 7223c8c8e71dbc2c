#!/usr/bin/python3
"""Cold loads of older versions: the training state of fs_scale.py (--gib of weights, Adam's
exp_avg and exp_avg_sq, many small tensors) saved --versions times through a mount of each
binary (each binary its own store: a newer format may not read in an older build) and to a plain
directory; then, --repeats times, for each version in --loads and each binary in turn: a fresh
mount, drop_caches, torch.load of that version (it decodes its keyframe and the deltas after it:
only the newest has a head image), unmount; and torch.load of the same file from the plain
directory after drop_caches. Each load prints its time, the daemon's CPU seconds and how busy
the machine was (CPU seconds of all cores, and iowait) during it, and, for builds whose `ckptctl
status` counts it, the bytes the daemon decoded (again: chunks it had decoded before; stray:
single blocks for the kernel's reads away from the reader); the end prints, per binary
and version, the median of the per-load mount/plain ratios and the daemon's median CPU.

Usage: fs_cold_versions.py CKPTFS_BINARY [OTHER_BINARY ...] [--gib 1] [--versions 4]
                           [--loads 1,3] [--repeats 3] [--opts cache=2G,buffer=1G] [--dir /var/tmp]
Needs root (FUSE, drop_caches) and about (2 + binaries) x versions x --gib free under --dir.
Run by /usr/bin/python3.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "fs"))
import fs_scale  # noqa: E402
from ckptfs_testlib import mounted  # noqa: E402
from fs_speed import drop_caches  # noqa: E402
from scale_lib import cpu_seconds  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def machine_cpu():
    """(busy CPU seconds of all cores, iowait seconds) since boot."""
    f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return (sum(f) - f[3] - f[4]) / TICK, f[4] / TICK


def timed_load(path, pid=None):
    c0 = cpu_seconds(pid) if pid else 0.0
    m0 = machine_cpu()
    t = time.perf_counter()
    fs_scale.load(path)
    seconds = time.perf_counter() - t
    m1 = machine_cpu()
    return {"s": seconds, "daemon_cpu": (cpu_seconds(pid) - c0) if pid else 0.0,
            "busy": m1[0] - m0[0], "iowait": m1[1] - m0[1]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("binaries", nargs="+")
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--versions", type=int, default=4)
    ap.add_argument("--loads", default="1,3", help="versions to load, e.g. 1,3")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--opts", default="", help="mount options, e.g. cache=2G,buffer=1G")
    ap.add_argument("--dir", default="/var/tmp")
    a = ap.parse_args()
    loads = [int(x) for x in a.loads.split(",")]
    if any(v < 1 or v > a.versions for v in loads):
        sys.exit("--loads must name versions 1 .. --versions")
    opts = [o for o in a.opts.split(",") if o]
    base = os.path.join(a.dir, f"ckptfs-cold-versions-{os.getpid()}")
    os.makedirs(base)
    try:
        print(f"command: {' '.join(sys.argv)}")
        print(f"date:    {time.strftime('%Y-%m-%dT%H:%M:%S%z')}")
        state = fs_scale.TrainingState(int(a.gib * 2**30), 1)
        plain = os.path.join(base, "plain")
        os.makedirs(plain)
        stores = [(os.path.join(base, f"store{i}"), os.path.join(base, f"mnt{i}"))
                  for i in range(len(a.binaries))]
        for v in range(1, a.versions + 1):
            if v > 1:
                state.advance()
            fs_scale.save_fsync(state.sd, os.path.join(plain, f"step_{v}.pt"))
            for binary, (store, mnt) in zip(a.binaries, stores):
                with mounted(binary, store, mnt, *opts):
                    fs_scale.save_fsync(state.sd, os.path.join(mnt, f"step_{v}.pt"))
        results = {}
        for r in range(a.repeats):
            for v in loads:
                p = timed_load_plain(os.path.join(plain, f"step_{v}.pt"))
                for i, (binary, (store, mnt)) in enumerate(zip(a.binaries, stores)):
                    with mounted(binary, store, mnt, *opts) as proc:
                        drop_caches()
                        m = timed_load(os.path.join(mnt, f"step_{v}.pt"), proc.pid)
                        work = decode_work(binary, mnt)
                    ratio = m["s"] / p["s"]
                    results.setdefault((i, v), []).append((ratio, m["daemon_cpu"]))
                    print(f"repeat {r + 1} v{v} binary {i + 1}: mount {m['s']:.2f} s (daemon cpu "
                          f"{m['daemon_cpu']:.2f} s, machine busy {m['busy']:.2f} s, iowait "
                          f"{m['iowait']:.2f} s{work}), plain {p['s']:.2f} s, ratio {ratio:.2f}",
                          flush=True)
        print("\nmedians (mount / plain, daemon cpu):")
        for i, binary in enumerate(a.binaries):
            for v in loads:
                rs = results[(i, v)]
                print(f"  binary {i + 1} ({binary}) v{v}: "
                      f"{statistics.median(x for x, _ in rs):.2f}, "
                      f"{statistics.median(c for _, c in rs):.2f} s")
    finally:
        shutil.rmtree(base, ignore_errors=True)


def decode_work(binary, mnt):
    """What the load decoded, from `ckptctl status` (builds that count it): ', decoded N MiB
    (again A, stray S)', or ''."""
    ctl = os.path.join(os.path.dirname(os.path.abspath(binary)), "ckptctl")
    r = subprocess.run([ctl, "status", "--json", mnt], capture_output=True, text=True)
    try:
        reads = json.loads(r.stdout)["reads"]
        mib = {k: reads[k] / 2**20 for k in ("decoded_bytes", "decoded_again_bytes", "stray_bytes")}
    except (ValueError, KeyError):
        return ""
    return (f", decoded {mib['decoded_bytes'] + mib['stray_bytes']:.0f} MiB (again "
            f"{mib['decoded_again_bytes']:.0f}, stray {mib['stray_bytes']:.0f})")


def timed_load_plain(path):
    drop_caches()
    return timed_load(path)


if __name__ == "__main__":
    main()
