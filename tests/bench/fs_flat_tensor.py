#!/usr/bin/python3
"""One flat fp32 tensor of more than 4 GiB, and of more than 2^31 elements, through a mount
(DESIGN.md §12, issue 13): the shape of a DeepSpeed ZeRO partition (one flat tensor per rank)
or of a large model's embedding, which fs_scale.py's state dicts (tensors of at most 0.5 GiB)
never reach. Side by side with a plain directory on the same disk, in one run.

--versions saves of {"flat": w, "step": v} (torch.save into a file object, flush, fsync, close),
plain directory first, the page cache dropped before the mount's save; between versions
w += N(0, 1e-4) (w starts as N(0, 0.02)), in place, 2^27 elements at a time. Then, with the
state freed, each version is loaded (torch.load) from the plain directory and from the mount,
newest first, the page cache dropped before each, and the mount's tensor compared with the
plain one: the relative L2 error, and every element finite. Reported per version: save and
load seconds and their ratio to plain, the daemon's peak RSS (VmHWM) so far; then `ckptctl ls`.

Usage: fs_flat_tensor.py CKPTFS_BINARY [--elements 2200000000] [--versions 3] [--opts O,...]
                         [--dir BASE] [--ckptctl PATH]
Needs root (drop_caches, FUSE), RAM for two copies of the tensor (8.8 GB each at the default),
checked a piece at a time, and disk under BASE (default /var/tmp) for the plain versions, the
store and a head image: about (versions + 2) times the tensor. Run by Debian's /usr/bin/python3 (torch 1.13).
"""
import argparse
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "fs"))
import torch  # noqa: E402
from ckptfs_testlib import mounted, peak_rss, stat_json  # noqa: E402
from scale_lib import save  # noqa: E402
from fs_speed import drop_caches  # noqa: E402

STEP = 1 << 27  # elements per piece of an in-place update


def load(path):
    drop_caches()
    t = time.perf_counter()
    obj = torch.load(path)
    return time.perf_counter() - t, obj


def wait_for_head(ctl, path, timeout=120):
    """A head image is published after the commit: waits until `ckptctl stat` counts it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if stat_json(ctl, path).get("head_bytes", 0) > 0:
            return True
        time.sleep(0.5)
    return False


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("binary")
    ap.add_argument("--elements", type=int, default=2_200_000_000)
    ap.add_argument("--versions", type=int, default=3)
    ap.add_argument("--opts", default="")
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--ckptctl", default=None)
    a = ap.parse_args()
    # ckptfs_testlib's watchdog: about a minute per GiB saved or loaded, both sides.
    os.environ.setdefault("CKPTFS_TEST_DEADLINE",
                          str(int(1800 + 60 * 4 * a.versions * a.elements * 4 / 2**30)))
    ctl = a.ckptctl or os.path.join(os.path.dirname(os.path.abspath(a.binary)), "ckptctl")
    base = os.path.join(a.dir, f"fs_flat_tensor.{os.getpid()}")
    plain = os.path.join(base, "plain")
    os.makedirs(plain)
    opts = [o for o in a.opts.split(",") if o]
    commit = subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "?"
    print(f"{' '.join(sys.argv)}\n{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, "
          f"{os.cpu_count()} CPUs, scripts at commit {commit}, binary {a.binary}\n"
          f"one flat fp32 tensor of {a.elements} elements ({a.elements * 4 / 2**30:.2f} GiB), "
          f"{a.versions} versions, options: {a.opts or 'defaults'}", flush=True)
    try:
        g = torch.Generator().manual_seed(1)
        w = torch.empty(a.elements).normal_(0, 0.02, generator=g)
        with mounted(a.binary, f"{base}/store", f"{base}/mnt", *opts) as proc:
            for v in range(1, a.versions + 1):
                if v > 1:
                    for i in range(0, a.elements, STEP):
                        k = min(STEP, a.elements - i)
                        w[i:i + k].add_(torch.empty(k).normal_(0, 1e-4, generator=g))
                drop_caches()
                tp = save({"flat": w, "step": v}, f"{plain}/flat_{v}.pt")
                drop_caches()
                tm = save({"flat": w, "step": v}, f"{base}/mnt/flat_{v}.pt")
                print(f"v{v} save+fsync: plain {tp:.1f} s, mount {tm:.1f} s ({tm / tp:.2f}x); "
                      f"daemon peak RSS {peak_rss(proc.pid) / 2**30:.2f} GiB", flush=True)
            del w
            if not wait_for_head(ctl, f"{base}/mnt/flat_{a.versions}.pt"):
                print("the newest version has no head image (heads=off, or not published)")
            print(subprocess.run([ctl, "ls", f"{base}/mnt"], capture_output=True,
                                 text=True).stdout, flush=True)
            failed = False
            for v in range(a.versions, 0, -1):
                tp, obj = load(f"{plain}/flat_{v}.pt")
                want = obj["flat"]
                os.unlink(f"{plain}/flat_{v}.pt")
                tm, obj = load(f"{base}/mnt/flat_{v}.pt")
                got = obj["flat"]
                if obj["step"] != v or got.shape != want.shape:
                    sys.exit(f"v{v} read back as step {obj['step']} of shape {tuple(got.shape)}")
                del obj
                finite, sq_err, sq_ref = True, 0.0, 0.0
                for i in range(0, a.elements, STEP):  # no third copy of the tensor
                    g_, w_ = got[i:i + STEP].double(), want[i:i + STEP].double()
                    finite &= bool(torch.isfinite(g_).all())
                    sq_err += float((g_ - w_).square().sum())
                    sq_ref += float(w_.square().sum())
                err = (sq_err / sq_ref) ** 0.5 if sq_ref > 0 else 0.0
                failed |= not finite or not err < 0.05
                print(f"v{v} load: plain {tp:.1f} s, mount {tm:.1f} s ({tm / tp:.2f}x); relative "
                      f"L2 error {err:.2e}, all finite: {finite}; daemon peak RSS "
                      f"{peak_rss(proc.pid) / 2**30:.2f} GiB", flush=True)
                del want, got
        if failed:
            sys.exit("a version read back wrong")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
