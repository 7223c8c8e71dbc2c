#!/usr/bin/python3
"""Where a save's time goes inside the daemon: the training state of fs_scale.py (--gib of
weights, Adam's exp_avg and exp_avg_sq), saved --versions times through one mount, and for each
save the daemon's CPU seconds and the bytes it moved through read/write system calls
(/proc/PID/io rchar and wchar: FUSE requests, the staging file and head images, objects; bytes
moved by direct I/O count too). A streamed delta's floor is the file once in (the FUSE writes),
its base once read and its head image once written; bytes above it are copies the write path
could avoid. No plain directory: compare builds or options with the same command (ratios
against a plain directory are fs_scale.py's).

Usage: save_io.py CKPTFS_BINARY [--gib 4] [--versions 4] [--opts cache=512M,buffer=256M]
                  [--drop-caches] [--dir /var/tmp]
--drop-caches: drop the page cache before each save (the base is then read from the disk).
Needs root (FUSE, drop_caches) and about 3x --gib free under --dir. Run by /usr/bin/python3.
"""
import argparse
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "fs"))
import fs_scale  # noqa: E402
from ckptfs_testlib import mounted  # noqa: E402
from scale_lib import cpu_seconds, proc_io  # noqa: E402


def daemon_counters(pid):
    """(bytes read, bytes written, CPU seconds) of the process so far."""
    io = proc_io(pid)
    return io["rchar"], io["wchar"], cpu_seconds(pid)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ckptfs")
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--versions", type=int, default=4)
    ap.add_argument("--opts", default="cache=512M,buffer=256M")
    ap.add_argument("--drop-caches", action="store_true")
    ap.add_argument("--dir", default="/var/tmp")
    args = ap.parse_args()
    if args.gib <= 0 or args.versions < 1:
        ap.error("--gib must be positive and --versions at least 1")
    base = os.path.join(args.dir, f"save_io.{os.getpid()}")
    os.makedirs(base)
    try:
        state = fs_scale.TrainingState(int(args.gib * (1 << 30)), 1)
        print(f"{args.gib:g} GiB: {state.describe()}; -o {args.opts}", flush=True)
        opts = [o for o in args.opts.split(",") if o]
        with mounted(args.ckptfs, f"{base}/store", f"{base}/mnt", *opts) as proc:
            os.makedirs(f"{base}/mnt/run")
            for v in range(1, args.versions + 1):
                if v > 1:
                    state.advance()
                if args.drop_caches:
                    subprocess.run(["sync"], check=True)
                    with open("/proc/sys/vm/drop_caches", "w") as f:
                        f.write("1")
                before = daemon_counters(proc.pid)
                returned, total = fs_scale.save_fsync(state.sd, f"{base}/mnt/run/step_{v}.pt")
                after = daemon_counters(proc.pid)
                read, written, cpu = (a - b for a, b in zip(after, before))
                print(f"v{v}: torch.save returned {returned:.2f} s, save+fsync {total:.2f} s; "
                      f"daemon CPU {cpu:.2f} s, read {read / 2**30:.2f} GiB, "
                      f"written {written / 2**30:.2f} GiB", flush=True)
                time.sleep(3)  # the previous head image's publication, off the next save
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
