#!/usr/bin/python3
"""A 2 GiB checkpoint through a mount with a small memory budget (issue 13, DESIGN.md §9
invariant 7): four large fp32 weight matrices with Adam's exp_avg and exp_avg_sq (2 GiB together,
tests/fs/scale_lib.py), saved three times (one training step apart) with torch.save into a file
object and os.fsync, through `-o cache=256M,buffer=128M`. Checks:

  - the daemon's peak RSS (VmHWM, over its whole life: saves and reads) stays <= 0.9 GiB,
    in the first mount and in the remount that reads every version again (the budget is
    cache + buffer + 512 MiB = 896 MiB);
  - version 1 is a keyframe, versions 2 and 3 are deltas, each on the version before
    (`ckptctl stat --json`: kind, base);
  - every version reads back (torch.load, right after its save): names, dtypes, shapes, the
    step counters and small tensors exact, a keyframe within 2^-13 (its exp_avg, coded as
    values, within |u|), a delta within the codec's
    closed-loop bound on a strided sample (scale_lib.check);
  - after unmount + remount every version reads as the same bytes (sha256 through the mount);
    the newest from its head image, the older ones decoded through their chains;
  - after the unmount the newest version's head image is in STORE/heads, complete (its size is
    the file's), and it is the only one there.

Usage: scale_memory.py CKPTFS CKPTCTL [--gib 2]   (as root; Debian's /usr/bin/python3)
"""
import argparse
import gc
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckptfs_testlib import mounted, peak_rss, sha256  # noqa: E402
from scale_lib import (GiB, TrainingState, check, cpu_seconds, mib, sample, save,  # noqa: E402
                       scratch_dir, stat)

OPTS = ("cache=256M", "buffer=128M")
LIMIT = int(0.9 * GiB)  # the bound; the budget itself is 256 + 128 + 512 MiB
VERSIONS = 3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("ckptctl")
    ap.add_argument("--gib", type=float, default=2.0)
    args = ap.parse_args()
    torch.set_num_threads(2)
    t_start = time.monotonic()

    with scratch_dir("ckptfs-scale-memory-") as work:
        store, mnt = os.path.join(work, "store"), os.path.join(work, "mnt")
        t0 = time.monotonic()
        state = TrainingState(int(args.gib * GiB), params=4, small=8, seed=1)
        size = state.nbytes()
        print(f"state: {mib(size)} in {len(state.weights) * 3} tensors + steps, built in "
              f"{time.monotonic() - t0:.1f} s", flush=True)
        hashes = {}
        reads = {}  # version id -> samples of what it read back as
        with mounted(args.binary, store, mnt, *OPTS) as proc:
            os.makedirs(f"{mnt}/run")
            prev = None
            for k in range(1, VERSIONS + 1):
                if k > 1:
                    state.step()
                saved = sample(state.state_dict())
                path = f"{mnt}/run/step_{k}.pt"
                secs = save(state.state_dict(), path)
                info = stat(args.ckptctl, path)
                want = "keyframe" if k == 1 else "delta"
                assert info["kind"] == want, f"v{k}: {info['kind']}, want {want}"
                if k > 1:
                    assert info["base"] == prev, f"v{k}: base {info['base']}, want {prev}"
                t0 = time.monotonic()
                loaded = torch.load(path)
                read = sample(loaded)
                del loaded
                gc.collect()
                t_load = time.monotonic() - t0
                worst = check(f"v{k}", saved, read, reads.get(info["base"]), info["kind"])
                reads[info["version"]] = read
                t0 = time.monotonic()
                hashes[path] = sha256(path)
                newest_size = os.path.getsize(path)
                print(f"v{k}: {info['kind']} (version {info['version']}, base {info['base']}), "
                      f"save+fsync {secs:.1f} s, stored {mib(info['stored_bytes'])}, "
                      f"load {t_load:.1f} s, sha256 {time.monotonic() - t0:.1f} s, "
                      f"worst error {worst:.2f} of the largest change, "
                      f"daemon peak RSS so far {mib(peak_rss(proc.pid))}", flush=True)
                prev = info["version"]
            newest = prev
            peak1 = peak_rss(proc.pid)
            cpu1 = cpu_seconds(proc.pid)
        print(f"first mount: daemon peak RSS {mib(peak1)} (limit {mib(LIMIT)})", flush=True)
        assert peak1 <= LIMIT, f"daemon peak RSS {mib(peak1)} > {mib(LIMIT)}"

        # Published before the daemon exited (filesystem::shutdown waits for it); named
        # <version>-<object checksum>.head, both 16 hex digits.
        heads = sorted(os.listdir(os.path.join(store, "heads")))
        assert len(heads) == 1 and heads[0].startswith(f"{newest:016x}-") and \
            heads[0].endswith(".head"), f"STORE/heads: {heads}, want version {newest}'s alone"
        head_size = os.path.getsize(os.path.join(store, "heads", heads[0]))
        assert head_size == newest_size, f"head image {head_size} bytes, file {newest_size}"

        with mounted(args.binary, store, mnt, *OPTS) as proc:
            for path, h in hashes.items():
                t0 = time.monotonic()
                assert sha256(path) == h, f"{path} reads differently after remount"
                print(f"after remount: {os.path.basename(path)} identical "
                      f"({time.monotonic() - t0:.1f} s)", flush=True)
            peak2 = peak_rss(proc.pid)
            cpu2 = cpu_seconds(proc.pid)
        print(f"remount: daemon peak RSS {mib(peak2)}", flush=True)
        assert peak2 <= LIMIT, f"daemon peak RSS after remount {mib(peak2)} > {mib(LIMIT)}"
        t = os.times()
        print(f"scale_memory: ok ({mib(size)} x {VERSIONS}, peak RSS {mib(peak1)} / "
              f"{mib(peak2)}, {time.monotonic() - t_start:.0f} s; CPU: test "
              f"{t.user + t.system:.0f} s, daemon {cpu1:.0f} + {cpu2:.0f} s)")


if __name__ == "__main__":
    main()
