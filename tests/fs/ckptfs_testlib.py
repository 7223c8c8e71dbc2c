"""Shared by the mount tests and benchmarks: a mount that is always unmounted, and small helpers.

Run under Debian's /usr/bin/python3 (torch, numpy)."""
import contextlib
import hashlib
import os
import subprocess
import time


@contextlib.contextmanager
def mounted(binary, store, mnt, *opts, timeout=20):
    """Runs `ckptfs STORE MNT -f [-o OPTS]` for the duration of the block; always unmounts and
    reaps the daemon, also when the block raises. Yields the daemon's Popen."""
    os.makedirs(store, exist_ok=True)
    os.makedirs(mnt, exist_ok=True)
    args = [binary, store, mnt, "-f"] + (["-o", ",".join(opts)] if opts else [])
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + timeout
        while not os.path.ismount(mnt):
            if proc.poll() is not None:
                raise RuntimeError("ckptfs exited: " + proc.stdout.read().decode(errors="replace"))
            if time.time() > deadline:
                raise RuntimeError(f"ckptfs did not mount within {timeout} s")
            time.sleep(0.05)
        yield proc
    finally:
        if os.path.ismount(mnt):
            subprocess.run(["fusermount3", "-u", mnt], check=False)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if os.path.ismount(mnt):
            subprocess.run(["fusermount3", "-uz", mnt], check=False)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def du(path):
    """Bytes allocated under `path` (what the store really costs on disk)."""
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            total += os.lstat(os.path.join(root, f)).st_blocks * 512
    return total


def peak_rss(pid):
    """VmHWM of a process, in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0
