#!/usr/bin/python3
"""Concurrent clients: several processes run random operations on one shared tree at once
(create, write, truncate, rename across directories, link, unlink, mkdir, rmdir, reads, fsync;
errors such as ENOENT from races are expected and ignored). Afterwards the daemon must still be
serving with nothing in its error log, the tree must be self-consistent (a directory's link
count is 2 + its subdirectories, a file's link count is the number of names it has), every file
must read, and the same tree (names, types, sizes, link counts, contents) must come back after
unmount + remount.

Usage: concurrency.py CKPTFS_BINARY [--seconds S] [--procs N]
"""
import argparse
import collections
import hashlib
import multiprocessing
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckptfs_testlib import daemon_log, mounted  # noqa: E402

NAMES = ["a", "b", "c", "d", "e"]


def worker(root, seed, seconds):
    rng = random.Random(seed)
    deadline = time.time() + seconds
    ops = 0
    while time.time() < deadline:
        depth = rng.randint(0, 2)
        p = os.path.join(root, *[rng.choice(NAMES) for _ in range(depth + 1)])
        q = os.path.join(root, *[rng.choice(NAMES) for _ in range(rng.randint(1, 3))])
        k = rng.randrange(10)
        try:
            if k <= 2:
                with open(p, "wb") as f:
                    f.write(rng.randbytes(rng.choice([10, 5000, 200000])))
            elif k == 3:
                with open(p, "r+b") as f:
                    f.seek(rng.randint(0, 1000))
                    f.write(b"overwrite")
                    if rng.random() < 0.3:
                        os.fsync(f.fileno())
            elif k == 4:
                os.rename(p, q)
            elif k == 5:
                os.link(p, q)
            elif k == 6:
                os.unlink(p)
            elif k == 7:
                os.mkdir(p)
            elif k == 8:
                os.rmdir(p)
            else:
                with open(p, "rb") as f:
                    f.read()
        except OSError:
            pass
        ops += 1
    return ops


def tree(root):
    out, names = {}, collections.Counter()
    for dirpath, dirnames, filenames in os.walk(root):
        st = os.lstat(dirpath)
        assert st.st_nlink == 2 + len(dirnames), f"{dirpath}: nlink {st.st_nlink}, " \
            f"{len(dirnames)} subdirectories"
        for name in filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            names[st.st_ino] += 1
            with open(p, "rb") as f:
                sha = hashlib.sha256(f.read()).hexdigest()
            out[os.path.relpath(p, root)] = (st.st_mode, st.st_size, st.st_nlink, sha, st.st_ino)
        for name in dirnames:
            out[os.path.relpath(os.path.join(dirpath, name), root)] = ("dir",)
    for rel, v in out.items():
        if v[0] != "dir":
            assert v[2] == names[v[4]], f"{rel}: nlink {v[2]} but {names[v[4]]} names"
    return {k: v[:4] for k, v in out.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--procs", type=int, default=6)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ckptfs-conc-") as tmp:
        store, mnt = f"{tmp}/store", f"{tmp}/mnt"
        with mounted(args.binary, store, mnt) as proc:
            with multiprocessing.Pool(args.procs) as pool:
                counts = pool.starmap(worker, [(mnt, s, args.seconds) for s in range(args.procs)])
            assert proc.poll() is None, "daemon died"
            before = tree(mnt)
        with mounted(args.binary, store, mnt):
            after = tree(mnt)
        assert before == after, "tree changed across remount: " + str(
            sorted(set(before.items()) ^ set(after.items()))[:5])
        with open(daemon_log(store)) as f:
            log = f.read()
        assert " error: " not in log, log
    print(f"concurrency: {sum(counts)} ops by {args.procs} processes; {len(before)} entries "
          f"consistent and identical after remount")


if __name__ == "__main__":
    main()
