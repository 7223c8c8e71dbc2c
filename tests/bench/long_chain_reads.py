#!/usr/bin/python3
"""What long chains cost to read (keyframe_interval=auto, docs/codec.md, "Long chains and
refreshes"): a checkpoint of about SIZE saved as many times as the auto interval allows one
keyframe (1 GiB / the file's size within 20..1000), each version under its own name, through a mount at the
defaults and into a plain directory on the same disk, in one run. Then, after a remount (the
daemon's caches empty) and drop_caches:

  - the daemon's start: from the daemon's launch until the mount answers;
  - torch.load of the newest version (the head: below head_min it has no head image, so it is
    decoded from the keyframe through every delta), of the middle one, and of the newest again
    (now from the daemon's cache), against the plain directory's same files;
  - the store's bytes against what was written.

Each version is one Adam-like step of a state dict of fp32 tensors (weights, exp_avg,
exp_avg_sq in equal parts).

Every version but the first is checked to be a delta (`ckptctl stat`): the newest is the end of
a chain of N - 1 deltas.

Usage: long_chain_reads.py CKPTFS_BINARY [--ckptctl CKPTCTL] [--sizes-kib 512,16384,51200]
                           [--dir BASE] [--json F]
Needs root (drop_caches). BASE defaults to a temp dir on /var/tmp.
"""
import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fs"))
from ckptfs_testlib import du, mounted, stat_json  # noqa: E402
from fs_speed import drop_caches  # noqa: E402
from scale_lib import save  # noqa: E402

REPLAY = 1 << 30  # content_options::kAutoKeyframeReplay
K_MIN, K_MAX = 20, 1000


def auto_interval(size):
    return max(K_MIN, min(K_MAX, REPLAY // max(size, 1)))


class AdamLike:
    """Four weight matrices with Adam's moments; step() moves them as a training step would."""

    def __init__(self, size, seed):
        self.g = torch.Generator().manual_seed(seed)
        n = max(64, size // 4 // 12)
        self.w = [torch.randn(n, generator=self.g) * 0.02 for _ in range(4)]
        self.m = [torch.zeros(n) for _ in range(4)]
        self.v = [torch.zeros(n) for _ in range(4)]

    def step(self):
        for i in range(4):
            grad = torch.randn(self.w[i].shape, generator=self.g) * 1e-2
            self.m[i] = 0.9 * self.m[i] + 0.1 * grad
            self.v[i] = 0.999 * self.v[i] + 0.001 * grad * grad
            self.w[i] -= 1e-3 * self.m[i] / (self.v[i].sqrt() + 1e-8)

    def state(self):
        return {"model": {f"layer{i}.weight": self.w[i].clone() for i in range(4)},
                "optimizer": {"state": {i: {"exp_avg": self.m[i].clone(),
                                            "exp_avg_sq": self.v[i].clone()} for i in range(4)}}}


def timed_load(path):
    t = time.perf_counter()
    torch.load(path)
    return time.perf_counter() - t


def measure(binary, ctl, base, size):
    store, mnt, plain = f"{base}/store", f"{base}/mnt", f"{base}/plain"
    for d in (store, mnt, plain):
        shutil.rmtree(d, ignore_errors=True)
    os.makedirs(plain)
    model = AdamLike(size, seed=size)
    written, versions, kinds = 0, None, []
    with mounted(binary, store, mnt):
        k = 0
        while versions is None or k < versions:
            model.step()
            state = model.state()
            save(state, f"{mnt}/ckpt_{k:04d}.pt")
            save(state, f"{plain}/ckpt_{k:04d}.pt")
            written += os.path.getsize(f"{plain}/ckpt_{k:04d}.pt")
            if versions is None:  # the daemon's interval goes by the file, zip and pickle included
                versions = auto_interval(os.path.getsize(f"{plain}/ckpt_0000.pt"))
            kinds.append(stat_json(ctl, f"{mnt}/ckpt_{k:04d}.pt")["kind"])
            k += 1
    # One keyframe, then deltas to the newest: the chain this measures.
    assert kinds == ["keyframe"] + ["delta"] * (versions - 1), kinds
    stored = du(f"{store}/objects")
    newest, middle = f"ckpt_{versions - 1:04d}.pt", f"ckpt_{versions // 2:04d}.pt"
    drop_caches()
    t0 = time.perf_counter()
    with mounted(binary, store, mnt):
        start = time.perf_counter() - t0
        row = {"size": os.path.getsize(f"{plain}/{newest}"), "versions": versions,
               "start_s": start, "written": written, "stored": stored}
        row["newest_s"] = timed_load(f"{mnt}/{newest}")
        row["middle_s"] = timed_load(f"{mnt}/{middle}")
        row["newest_again_s"] = timed_load(f"{mnt}/{newest}")
    drop_caches()
    row["plain_newest_s"] = timed_load(f"{plain}/{newest}")
    row["plain_middle_s"] = timed_load(f"{plain}/{middle}")
    row["plain_newest_again_s"] = timed_load(f"{plain}/{newest}")
    for d in (store, mnt, plain):
        shutil.rmtree(d, ignore_errors=True)
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("binary")
    p.add_argument("--ckptctl", default=None, help="default: ckptctl beside BINARY")
    p.add_argument("--sizes-kib", default="512,16384,51200")
    p.add_argument("--dir", default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("long_chain_reads: needs root (drop_caches, mounts)")
    torch.set_num_threads(1)
    ctl = args.ckptctl or os.path.join(os.path.dirname(os.path.abspath(args.binary)), "ckptctl")
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir or "/var/tmp") as base:
        for kib in (int(s) for s in args.sizes_kib.split(",")):
            r = measure(args.binary, ctl, base, kib << 10)
            rows.append(r)
            print(f"{r['size'] / 2**20:7.2f} MiB x {r['versions']:4d} versions: start "
                  f"{r['start_s']:.2f} s; load newest {r['newest_s']:.3f} s (plain "
                  f"{r['plain_newest_s']:.3f}), middle {r['middle_s']:.3f} s (plain "
                  f"{r['plain_middle_s']:.3f}), newest again {r['newest_again_s']:.3f} s (plain "
                  f"{r['plain_newest_again_s']:.3f}); stored {r['stored'] / 2**20:.1f} of "
                  f"{r['written'] / 2**20:.1f} MiB ({r['written'] / r['stored']:.1f}x)",
                  flush=True)
    meta = {"command": " ".join(sys.argv), "machine": f"{os.cpu_count()} CPUs, "
            f"{platform.platform()}", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                     text=True, cwd=os.path.dirname(__file__)).stdout.strip()}
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
