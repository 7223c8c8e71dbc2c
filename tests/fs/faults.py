#!/usr/bin/python3
"""Crashes, a full store, damaged store data and bad command lines, through a real mount:

  crash     write + fsync, kill -9 of the daemon (also in the middle of a burst of writes, and
            while large files are being stored: they read as before or as written, never half),
            fusermount3 -u of the dead mount, remount: the fsynced file reads back identical,
            every file reads (no dangling reference), no staging leftovers.
  enospc    a store on an 8 MiB tmpfs (needs root; skipped with a reason otherwise): writes that
            spill past buffer= fail with ENOSPC; a file that cannot be stored fails fsync with
            ENOSPC, and its next close reports it; earlier files still read back; after
            deleting, the store works again. A full disk under the journal: fsyncdir fails,
            further changes fail with EIO (none half-applied), and they work again once there is
            room (the daemon rewrites the journal from memory).
  eio       one flipped byte in the object of one file: reading that file fails with EIO, other
            files read fine, the daemon keeps serving.
  sigterm   SIGTERM right after a close: the daemon stores the file, exits 0, and it reads back.
  refusals  a second daemon on the same store exits 1 with a message naming the store; -o bits=9
            and a bad size exit 2 before mounting.

Usage: faults.py CKPTFS_BINARY
"""
import errno
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckptfs_testlib import daemon_log, kill9, mounted, start, wait_mounted, _live  # noqa: E402


def sha(data):
    return hashlib.sha256(data).hexdigest()


def read(path):
    with open(path, "rb") as f:
        return f.read()


def expect_errno(err, fn, *args):
    try:
        fn(*args)
    except OSError as e:
        assert e.errno == err, f"{fn.__name__}: expected {errno.errorcode[err]}, got {e!r}"
        return
    raise AssertionError(f"{fn.__name__}: expected {errno.errorcode[err]}, got success")


def all_files(root):
    for dirpath, _, files in os.walk(root):
        for f in files:
            yield os.path.join(dirpath, f)


def test_crash(binary, tmp):
    store, mnt = f"{tmp}/crash-store", f"{tmp}/crash-mnt"
    durable = os.urandom(3 << 20)
    proc = start(binary, store, mnt)
    try:
        wait_mounted(mnt, proc)
        os.makedirs(f"{mnt}/run")
        fd = os.open(f"{mnt}/run/fsynced.bin", os.O_CREAT | os.O_WRONLY, 0o644)
        os.write(fd, durable)
        os.fsync(fd)
        os.close(fd)
        dfd = os.open(f"{mnt}/run", os.O_RDONLY)
        os.fsync(dfd)  # fsyncdir
        os.close(dfd)
    finally:
        kill9(proc, mnt)
    proc = start(binary, store, mnt)
    try:
        wait_mounted(mnt, proc)
        assert sha(read(f"{mnt}/run/fsynced.bin")) == sha(durable), "fsynced file changed"
        # A burst of writes, renames and deletes, killed in the middle.
        for i in range(40):
            with open(f"{mnt}/run/f{i}.bin", "wb") as f:
                f.write(os.urandom(64 << 10))
            if i % 3 == 0:
                os.replace(f"{mnt}/run/f{i}.bin", f"{mnt}/run/g{i}.bin")
            if i % 5 == 1:
                os.unlink(f"{mnt}/run/f{i - 1}.bin" if (i - 1) % 3 else f"{mnt}/run/g{i - 1}.bin")
    finally:
        kill9(proc, mnt)
    # Killed while a large file is being stored: afterwards it reads as nothing or as all of it.
    big = os.urandom(48 << 20)
    proc = start(binary, store, mnt)
    try:
        wait_mounted(mnt, proc)
        with open(f"{mnt}/run/fsynced.bin", "wb") as f:  # an overwrite, killed mid-commit
            f.write(big)
        with open(f"{mnt}/run/new.bin", "wb") as f:
            f.write(big)
        time.sleep(0.05)
    finally:
        kill9(proc, mnt)
    with mounted(binary, store, mnt):
        got = sha(read(f"{mnt}/run/fsynced.bin"))
        assert got in (sha(durable), sha(big)), "a file half-stored after a crash"
        if os.path.exists(f"{mnt}/run/new.bin"):
            assert sha(read(f"{mnt}/run/new.bin")) in (sha(b""), sha(big))
    with mounted(binary, store, mnt):
        n = 0
        for p in all_files(mnt):
            read(p)  # EIO here would be a dangling reference
            n += 1
    assert not os.listdir(f"{store}/staging"), "staging leftovers after crash"
    with open(daemon_log(store)) as f:
        log = f.read()
    assert " error: " not in log, "daemon logged errors:\n" + log
    print(f"crash: fsynced file identical after kill -9, mid-burst and mid-commit kills leave "
          f"old or whole contents; {n} files readable")


def test_sigterm(binary, tmp):
    store, mnt = f"{tmp}/term-store", f"{tmp}/term-mnt"
    data = os.urandom(40 << 20)
    proc = start(binary, store, mnt)
    try:
        wait_mounted(mnt, proc)
        with open(f"{mnt}/closed.bin", "wb") as f:
            f.write(data)
        proc.send_signal(signal.SIGTERM)  # the commit of closed.bin may still be running
        assert proc.wait(timeout=120) == 0, "SIGTERM: exit status not 0"
    finally:
        if proc.poll() is None:
            kill9(proc, mnt)
        _live.pop(mnt, None)
    assert not os.path.ismount(mnt)
    with mounted(binary, store, mnt):
        assert sha(read(f"{mnt}/closed.bin")) == sha(data), "file closed before SIGTERM lost"
    print("sigterm: pending file stored, exit 0")


def test_enospc(binary, tmp):
    if os.geteuid() != 0:
        print("enospc: SKIPPED (needs root to mount a small tmpfs)")
        return
    store, mnt = f"{tmp}/full-store", f"{tmp}/full-mnt"
    os.makedirs(store)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", store],
                       capture_output=True, text=True)
    if r.returncode != 0:
        print(f"enospc: SKIPPED (cannot mount a tmpfs: {r.stderr.strip()})")
        return
    try:
        early = {f"early{i}": os.urandom(200 << 10) for i in range(3)}
        # Memory buffers: the store refuses at commit time.
        with mounted(binary, store, mnt, errors_ok=True):
            for name, data in early.items():
                with open(f"{mnt}/{name}", "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
            fd = os.open(f"{mnt}/big", os.O_CREAT | os.O_WRONLY, 0o644)
            os.write(fd, os.urandom(12 << 20))
            expect_errno(errno.ENOSPC, os.fsync, fd)
            os.close(fd)  # release: stored again in the background, fails again
            time.sleep(0.5)
            fd = os.open(f"{mnt}/big", os.O_RDONLY)
            expect_errno(errno.ENOSPC, os.close, fd)  # the remembered error, on flush
            assert os.stat(f"{mnt}/big").st_size == 0, "a failed file must keep its old content"
            for name, data in early.items():
                assert read(f"{mnt}/{name}") == data, f"{name} changed"
            os.unlink(f"{mnt}/big")
        # A small buffer: the staging file fills up, so write() itself fails.
        with mounted(binary, store, mnt, "buffer=1M", errors_ok=True):
            with open(f"{mnt}/spill", "wb", buffering=0) as f:
                try:
                    for _ in range(16):
                        f.write(os.urandom(1 << 20))
                    raise AssertionError("16 MiB written into an 8 MiB store")
                except OSError as e:
                    assert e.errno == errno.ENOSPC, repr(e)
            os.unlink(f"{mnt}/spill")
            for name, data in early.items():
                assert read(f"{mnt}/{name}") == data, f"{name} changed"
            # The store works again once the background commit of the deleted file gave up.
            for attempt in range(50):
                try:
                    with open(f"{mnt}/after", "wb") as f:
                        f.write(b"ok")
                        f.flush()
                        os.fsync(f.fileno())
                    break
                except OSError as e:
                    assert e.errno == errno.ENOSPC and attempt < 49, repr(e)
                    time.sleep(0.1)
        # A full disk under the journal: fsyncdir fails, later changes fail with EIO (never
        # half-applied), and once there is room again the daemon rewrites the journal and
        # changes work again.
        with mounted(binary, store, mnt, errors_ok=True):
            with open(f"{store}/filler", "wb") as f:
                try:
                    while True:
                        f.write(bytes(1 << 16))
                except OSError:
                    pass
            for i in range(300):  # journal records, buffered in memory
                os.mkdir(f"{mnt}/dir{i}")
            dfd = os.open(mnt, os.O_RDONLY)
            expect_errno(errno.ENOSPC, os.fsync, dfd)
            expect_errno(errno.EIO, os.mkdir, f"{mnt}/refused")
            assert not os.path.exists(f"{mnt}/refused")
            os.unlink(f"{store}/filler")
            for attempt in range(50):
                try:
                    os.mkdir(f"{mnt}/recovered")
                    break
                except OSError as e:
                    assert e.errno == errno.EIO and attempt < 49, repr(e)
                    time.sleep(0.1)
            os.fsync(dfd)
            os.close(dfd)
        with mounted(binary, store, mnt):
            for name, data in early.items():
                assert read(f"{mnt}/{name}") == data, f"{name} changed after remount"
            assert read(f"{mnt}/after") == b"ok"
            assert os.path.isdir(f"{mnt}/recovered") and os.path.isdir(f"{mnt}/dir299")
            assert not os.path.exists(f"{mnt}/refused")
    finally:
        subprocess.run(["umount", "-l", store], check=False)
    print("enospc: ENOSPC from write, fsync and the next close; earlier files intact; a full "
          "journal refuses changes (EIO) and recovers once there is room")


def test_eio(binary, tmp):
    store, mnt = f"{tmp}/eio-store", f"{tmp}/eio-mnt"
    good = os.urandom(500 << 10)
    bad = os.urandom(500 << 10)
    with mounted(binary, store, mnt):
        with open(f"{mnt}/good", "wb") as f:
            f.write(good)
        read(f"{mnt}/good")  # waits for the commit
        before = set(os.listdir(f"{store}/objects"))
        with open(f"{mnt}/bad", "wb") as f:
            f.write(bad)
        read(f"{mnt}/bad")
        new = sorted(set(os.listdir(f"{store}/objects")) - before)
    assert len(new) == 1, f"expected one new object, got {new}"
    obj = f"{store}/objects/{new[0]}"
    size = os.path.getsize(obj)
    with open(obj, "r+b") as f:
        f.seek(size // 2)
        b = f.read(1)
        f.seek(size // 2)
        f.write(bytes([b[0] ^ 0x10]))
    with mounted(binary, store, mnt, errors_ok=True):
        expect_errno(errno.EIO, read, f"{mnt}/bad")
        assert read(f"{mnt}/good") == good
        expect_errno(errno.EIO, read, f"{mnt}/bad")  # still EIO, daemon still serving
        assert os.listdir(mnt) == ["bad", "good"] or sorted(os.listdir(mnt)) == ["bad", "good"]
    with open(daemon_log(store)) as f:
        assert " error: " in f.read(), "the damaged read was not logged"
    print("eio: damaged file reads EIO (logged), other files intact")


def test_refusals(binary, tmp):
    store, mnt, mnt2 = f"{tmp}/ref-store", f"{tmp}/ref-mnt", f"{tmp}/ref-mnt2"
    os.makedirs(mnt2)
    with mounted(binary, store, mnt):
        r = subprocess.run([binary, store, mnt2, "-f"], capture_output=True, text=True,
                           timeout=30)
        assert r.returncode == 1, (r.returncode, r.stderr)
        assert "in use" in r.stderr and os.path.basename(store) in r.stderr, r.stderr
        assert not os.path.ismount(mnt2)
    for bad in (["-o", "bits=9"], ["-o", "cache=lots"], ["-o", "keyframe_interval=0"],
                ["--bogus"]):
        r = subprocess.run([binary, store, mnt2] + bad, capture_output=True, text=True, timeout=30)
        assert r.returncode == 2, (bad, r.returncode, r.stderr)
        assert r.stderr.startswith("ckptfs: "), r.stderr
        assert not os.path.ismount(mnt2)
    r = subprocess.run([binary, "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "bits=N" in r.stdout
    r = subprocess.run([binary, "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("ckptfs ")
    print("refusals: second daemon exit 1, bad options exit 2, --help/--version exit 0")


def main():
    binary = sys.argv[1]
    only = sys.argv[2:] or ["crash", "sigterm", "enospc", "eio", "refusals"]
    tmp = tempfile.mkdtemp(prefix="ckptfs-faults-")
    try:
        for name in only:
            globals()[f"test_{name}"](binary, tmp)
    finally:
        if os.environ.get("KEEP"): print("kept", tmp)
        else: shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
