#!/usr/bin/python3
"""Ordinary files (issue 14): what a partial rewrite, a sparse file and fio cost through a mount,
side by side with a plain directory on the same disk, in one run; optionally for several ckptfs
binaries (an older build as the baseline).

  - rewrites: a FILE_MIB file of random bytes, then REWRITES x (open O_RDWR, pwrite 4 KiB at a
    random offset, close) on each side, and one fsync at the end; mean seconds per rewrite (on
    a mount each open waits for the previous close's commit), and the store's growth per
    rewrite (objects on disk);
  - sparse: a 10 GiB file with 4 KiB of data (seek, write, truncate, fsync, close); seconds and
    store bytes;
  - fio (3.33, as in the issue): 4 jobs x JOB_MIB MiB, sequential 1 MiB and random 64 KiB writes,
    psync, fsync at the end of each job (end_fsync=1), verify=crc32c; MiB/s per side.
Each binary mounts a fresh store with the default options (or --opts). Prints a table and, with
--json, writes every number.

Usage: fs_ordinary.py CKPTFS_BINARY [OTHER_BINARY ...] [--file-mib 512] [--rewrites 50]
                      [--job-mib 256] [--dir BASE] [--opts OPTS] [--json OUT] [--skip-fio]
Needs root; BASE defaults to /var/tmp (a real disk, not tmpfs).
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fs"))
from ckptfs_testlib import du, mounted  # noqa: E402

MiB = 1 << 20


def make_file(path, mib, seed):
    rng = random.Random(seed)
    with open(path, "wb") as f:
        for _ in range(mib):
            f.write(rng.randbytes(MiB))
        f.flush()
        os.fsync(f.fileno())


def rewrites(path, n, seed, store=None):
    """Mean seconds per small rewrite, and mean store growth per rewrite (bytes) if `store`."""
    rng = random.Random(seed)
    size = os.path.getsize(path)
    before = du(f"{store}/objects") if store else 0
    t = time.perf_counter()
    for _ in range(n):
        fd = os.open(path, os.O_RDWR)  # a mount's open waits for the previous close's commit
        os.pwrite(fd, rng.randbytes(4096), rng.randrange(0, size - 4096))
        os.close(fd)
    fd = os.open(path, os.O_RDWR)  # ...and so does this one, for the last
    os.fsync(fd)
    os.close(fd)
    secs = (time.perf_counter() - t) / n
    grew = (du(f"{store}/objects") - before) / n if store else 0
    return secs, grew


def sparse(directory, store=None):
    before = du(f"{store}/objects") if store else 0
    t = time.perf_counter()
    p = f"{directory}/sparse.img"
    with open(p, "wb") as f:
        f.seek(5 << 30)
        f.write(b"d" * 4096)
        f.truncate(10 << 30)
        f.flush()
        os.fsync(f.fileno())
    secs = time.perf_counter() - t
    return secs, (du(f"{store}/objects") - before) if store else os.stat(p).st_blocks * 512


def fio(directory, rw, bs, job_mib):
    out = subprocess.run(
        ["fio", "--name", f"{rw}{bs}", "--directory", directory, "--rw", rw, "--bs", bs,
         "--size", f"{job_mib}M", "--numjobs", "4", "--ioengine", "psync", "--end_fsync", "1",
         "--verify", "crc32c", "--verify_state_save", "0", "--do_verify", "0", "--group_reporting",
         "--output-format", "json"], check=True, capture_output=True, text=True).stdout
    job = json.loads(out)["jobs"][0]
    return job["write"]["bw"] / 1024  # KiB/s -> MiB/s


def measure(directory, args, store=None):
    r = {}
    os.makedirs(directory, exist_ok=True)
    make_file(f"{directory}/data.bin", args.file_mib, 1)
    r["rewrite_s"], r["rewrite_store_bytes"] = rewrites(f"{directory}/data.bin", args.rewrites,
                                                         2, store)
    r["sparse_s"], r["sparse_bytes"] = sparse(directory, store)
    if not args.skip_fio:
        for rw, bs in (("write", "1M"), ("randwrite", "64k")):
            d = f"{directory}/fio_{rw}"
            os.makedirs(d)
            r[f"fio_{rw}_{bs}_mibs"] = fio(d, rw, bs, args.job_mib)
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("ckptfs", nargs="+")
    ap.add_argument("--file-mib", type=int, default=512)
    ap.add_argument("--rewrites", type=int, default=50)
    ap.add_argument("--job-mib", type=int, default=256)
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--opts", default="")
    ap.add_argument("--json", default="")
    ap.add_argument("--skip-fio", action="store_true")
    args = ap.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="ckptfs-bench-ordinary-", dir=args.dir) as work:
        results["plain"] = measure(f"{work}/plain", args)
        for i, binary in enumerate(args.ckptfs):
            store, mnt = f"{work}/store{i}", f"{work}/mnt{i}"
            opts = (args.opts,) if args.opts else ()
            with mounted(binary, store, mnt, *opts):
                results[binary] = measure(mnt, args, store)
    keys = list(results["plain"].keys())
    print(f"{'measure':28s}" + "".join(f"{k[-30:]:>32s}" for k in results))
    for k in keys:
        print(f"{k:28s}" + "".join(f"{results[s].get(k, 0):32.4g}" for s in results))
    for binary in args.ckptfs:
        r, p = results[binary], results["plain"]
        print(f"{binary}: rewrite {r['rewrite_s'] / p['rewrite_s']:.1f}x plain, "
              f"{r['rewrite_store_bytes'] / MiB:.2f} MiB stored per 4 KiB rewrite"
              + ("" if args.skip_fio else
                 f"; fio seq {r['fio_write_1M_mibs'] / p['fio_write_1M_mibs']:.2f}x, "
                 f"rand {r['fio_randwrite_64k_mibs'] / p['fio_randwrite_64k_mibs']:.2f}x "
                 f"plain throughput"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
