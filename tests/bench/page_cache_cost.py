#!/usr/bin/python3
"""What it costs to move a checkpoint's bytes into a file on this machine, three ways, 1 MiB at a
time from one page-aligned buffer (as the daemon writes chunks of a head image):

  new file, page cache      - pwrite into a new file: every page is allocated in the page cache
  overwrite, page cache     - the same file again: its pages are still cached
  new file, direct I/O      - O_DIRECT: no page cache, the disk reads the buffer itself

For each: GB/s of the writes, CPU seconds of the writing process (user + system: the kernel's
copy is charged to it), and the fdatasync that follows. Then the direct-I/O file read back by
direct I/O. The write path chose direct I/O for streamed chunks from these numbers
(docs/benchmarks.md, "Flow control and direct I/O").

Usage: page_cache_cost.py [--gib 4] [--dir /var/tmp]    (a real disk: tmpfs has no O_DIRECT)
"""
import argparse
import mmap
import os
import resource
import time


def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run(label, path, flags, n, buf, write=True):
    fd = os.open(path, os.O_RDWR | os.O_CREAT | flags, 0o600)
    try:
        t, c = time.perf_counter(), cpu()
        for i in range(n):
            if write:
                done = os.pwrite(fd, buf, i << 20)
            else:
                done = os.preadv(fd, [buf], i << 20)
            if done != len(buf):
                raise OSError(f"short transfer at MiB {i}")
        wall, used = time.perf_counter() - t, cpu() - c
        t = time.perf_counter()
        if write:
            os.fdatasync(fd)
        sync = time.perf_counter() - t
    finally:
        os.close(fd)
    print(f"{label:28s} {n / 1024 * (1 << 30) / wall / 1e9:6.2f} GB/s  CPU {used:5.2f} s"
          + (f"  fdatasync {sync:5.2f} s" if write else ""), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--dir", default="/var/tmp")
    args = ap.parse_args()
    n = int(args.gib * 1024)
    if n < 1:
        ap.error("--gib must be at least 1/1024")
    buf = mmap.mmap(-1, 1 << 20)  # page-aligned, as the daemon's chunk memory
    buf.write(bytes(range(256)) * 4096)
    paths = [os.path.join(args.dir, f"page_cache_cost.{os.getpid()}.{k}") for k in "ab"]
    print(f"{args.gib:g} GiB in 1 MiB writes under {args.dir}")
    try:
        run("new file, page cache", paths[0], os.O_TRUNC, n, buf)
        run("overwrite, page cache", paths[0], 0, n, buf)
        run("new file, direct I/O", paths[1], os.O_TRUNC | os.O_DIRECT, n, buf)
        run("read back, direct I/O", paths[1], os.O_DIRECT, n, buf, write=False)
    finally:
        for p in paths:
            if os.path.exists(p):
                os.unlink(p)


if __name__ == "__main__":
    main()
