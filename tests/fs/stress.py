#!/usr/bin/python3
"""Standard filesystem exercisers through a real mount (issue 14), with the daemon's memory watched.

  - stress-ng's filesystem stressors (hdd, seek, dentry, dir, rename, link, symlink, chmod,
    fallocate, mmap on files, sync-file, io, fiemap, copy-file, fpunch, lockf, flock, sendfile,
    splice, xattr, utime, msync, readahead), two rounds of a bounded time on a small budget
    (cache=256M,buffer=128M): stress-ng must report success, and the daemon's RSS, sampled
    throughout, must stay within cache + buffer + 512 MiB;
  - fio with verify=crc32c: sequential 1 MiB and random 64 KiB writes (psync), and random writes
    through a shared mapping (mmap engine), 2 jobs each; then a remount and fio --verify_only of
    every file, and a full read of the tree (nothing unreadable, no daemon error in its log).

Usage: stress.py CKPTFS_BINARY    (as root; Debian's /usr/bin/python3, stress-ng, fio)
"""
import os
import shutil
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckptfs_testlib import daemon_log, mounted, require_fuse  # noqa: E402

CACHE, BUFFER = 256 << 20, 128 << 20
BUDGET = CACHE + BUFFER + (512 << 20)
ROUNDS = [
    ["--hdd", "2", "--hdd-bytes", "64M", "--seek", "2", "--seek-size", "64M", "--dentry", "1",
     "--dir", "1", "--rename", "1", "--link", "1", "--symlink", "1", "--chmod", "1",
     "--fallocate", "2", "--fallocate-bytes", "64M", "--mmap", "1", "--mmap-file",
     "--mmap-bytes", "32M", "--sync-file", "1", "--sync-file-bytes", "64M", "--io", "1",
     "--fiemap", "1"],
    ["--copy-file", "2", "--copy-file-bytes", "128M", "--fpunch", "1", "--lockf", "1",
     "--flock", "1", "--sendfile", "1", "--splice", "1", "--xattr", "1", "--utime", "1",
     "--msync", "1", "--msync-bytes", "32M", "--readahead", "1", "--readahead-bytes", "64M",
     "--filename", "1"],
]
SECONDS = 25


class rss_watch:
    """Samples the daemon's VmRSS every 0.2 s while the block runs."""

    def __init__(self, pid):
        self.pid, self.peak, self.stop = pid, 0, threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stop.wait(0.2):
            try:
                with open(f"/proc/{self.pid}/status") as f:
                    for line in f:
                        if line.startswith("VmRSS:"):
                            self.peak = max(self.peak, int(line.split()[1]) * 1024)
            except OSError:
                return

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r


def fio_jobs(directory, verify_only=False):
    common = ["--directory", directory, "--size", "96M", "--numjobs", "2", "--verify", "crc32c", "--verify_state_save", "0",
              "--do_verify", "1", "--group_reporting", "--output-format", "terse"]
    if verify_only:
        common += ["--verify_only"]
    return [
        ["fio", "--name", "seq", "--rw", "write", "--bs", "1M", "--ioengine", "psync", *common],
        ["fio", "--name", "rand", "--rw", "randwrite", "--bs", "64k", "--ioengine", "psync",
         *common],
        ["fio", "--name", "map", "--rw", "randwrite", "--bs", "64k", "--ioengine", "mmap",
         *common],
    ]


def read_tree(root):
    n = 0
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            if os.path.islink(p) or not os.path.isfile(p):
                continue
            with open(p, "rb") as fh:
                while fh.read(1 << 20):
                    pass
            n += 1
    return n


def main():
    require_fuse()
    for tool in ("stress-ng", "fio"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} is not installed (scripts/bootstrap.sh installs it)")
    binary = sys.argv[1]
    opts = f"cache={CACHE >> 20}M,buffer={BUFFER >> 20}M"
    with tempfile.TemporaryDirectory(prefix="ckptfs-stress-", dir="/var/tmp") as work:
        store, mnt = f"{work}/store", f"{work}/mnt"
        os.makedirs(mnt)
        with mounted(binary, store, mnt, opts) as proc:
            with rss_watch(proc.pid) as watch:
                for i, stressors in enumerate(ROUNDS):
                    tmp = f"{mnt}/stress{i}"
                    os.makedirs(tmp)
                    r = run(["stress-ng", "--temp-path", tmp, *stressors, "-t", str(SECONDS),
                             "--metrics-brief"], timeout=SECONDS * 8)
                    assert "successful run completed" in r.stdout + r.stderr, r.stdout + r.stderr
                os.makedirs(f"{mnt}/fio")
                for job in fio_jobs(f"{mnt}/fio"):
                    run(job, timeout=600)
            print(f"stress: daemon peak RSS {watch.peak / 2**20:.0f} MiB "
                  f"(budget {BUDGET / 2**20:.0f} MiB)")
            assert 0 < watch.peak <= BUDGET, f"daemon RSS {watch.peak} past the budget {BUDGET}"
        with mounted(binary, store, mnt, opts):
            for job in fio_jobs(f"{mnt}/fio", verify_only=True):
                run(job, timeout=600)
            files = read_tree(mnt)
            assert files >= 6, files  # fio's files at least
        with open(daemon_log(store)) as f:
            errors = [line for line in f.read().splitlines() if " error:" in line]
        assert not errors, "daemon errors:\n" + "\n".join(errors[:20])
    print("stress: ok")


if __name__ == "__main__":
    main()
