"""Shared by the mount tests and benchmarks: a mount that is always unmounted, and small helpers.

Run under Debian's /usr/bin/python3 (torch, numpy)."""
import atexit
import contextlib
import hashlib
import os
import subprocess
import sys
import time

# Mount points and daemons alive right now: unmounted and killed at interpreter exit even when a
# test dies in a way that skips `finally` (sys.exit from a signal handler, an exception in
# teardown). A leaked mount breaks the next run.
_live = {}


@atexit.register
def _cleanup_live():
    for mnt, proc in list(_live.items()):
        subprocess.run(["fusermount3", "-uz", mnt], check=False, stderr=subprocess.DEVNULL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    _live.clear()


@contextlib.contextmanager
def mounted(binary, store, mnt, *opts, timeout=20):
    """Runs `ckptfs STORE MNT -f [-o OPTS]` for the duration of the block; always unmounts and
    reaps the daemon, also when the block raises. Yields the daemon's Popen."""
    proc = start(binary, store, mnt, *opts)
    try:
        wait_mounted(mnt, proc, timeout)
        yield proc
    finally:
        if os.path.ismount(mnt):
            if subprocess.run(["fusermount3", "-u", mnt], check=False).returncode != 0:
                subprocess.run(["fusermount3", "-uz", mnt], check=False)  # busy: detach
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if os.path.ismount(mnt):
            subprocess.run(["fusermount3", "-uz", mnt], check=False)
        _live.pop(mnt, None)


SKIP = 77  # ctest SKIP_RETURN_CODE of the mount tests


def require_fuse():
    """Exits with SKIP (and the reason) where no mount is possible: no /dev/fuse, or not root."""
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        print("SKIPPED: /dev/fuse is not available")
        sys.exit(SKIP)
    if os.geteuid() != 0:
        print("SKIPPED: the mount tests run as root")
        sys.exit(SKIP)


def start(binary, store, mnt, *opts):
    """Starts `ckptfs STORE MNT -f` without waiting; its output goes to STORE.daemon.log (a pipe
    nobody reads would fill up and stall the daemon). Registered for cleanup at exit."""
    require_fuse()
    os.makedirs(store, exist_ok=True)
    os.makedirs(mnt, exist_ok=True)
    args = [binary, store, mnt, "-f"] + (["-o", ",".join(opts)] if opts else [])
    with open(daemon_log(store), "ab") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    _live[mnt] = proc
    return proc


def daemon_log(store):
    return os.path.normpath(store) + ".daemon.log"


def wait_mounted(mnt, proc, timeout=20):
    """Waits until `mnt` is a mount point served by `proc` (a Popen)."""
    deadline = time.time() + timeout
    while not os.path.ismount(mnt):
        if proc.poll() is not None:
            with open(daemon_log(proc.args[1]), errors="replace") as f:
                raise RuntimeError("ckptfs exited: " + f.read())
        if time.time() > deadline:
            raise RuntimeError(f"ckptfs did not mount within {timeout} s")
        time.sleep(0.05)


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


def reset_peak_rss(pid):
    """Resets VmHWM to the current RSS (Linux clear_refs), to measure the peak of one phase."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5\n")
