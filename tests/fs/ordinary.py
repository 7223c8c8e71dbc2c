#!/usr/bin/python3
"""Ordinary files through a real mount (issue 14): what logs, databases, datasets and tools need.

  - a huge ftruncate fails with EFBIG at once and the mount keeps answering;
  - a 10 GiB sparse file with 4 KiB of data costs < 1 MiB in the store, reports its hole
    (SEEK_DATA/SEEK_HOLE, st_blocks) and reads back, also after a remount;
  - 50 x (open O_RDWR, pwrite 4 KiB at a random offset, close) on a 512 MiB file leaves it
    byte-identical to the same writes on a plain copy, and each rewrite adds about the chunk it
    touched to the store (work in proportion to the bytes touched, not to the file);
  - fallocate: posix_fallocate extends, KEEP_SIZE does not, PUNCH_HOLE and ZERO_RANGE zero;
    COLLAPSE_RANGE is refused with EOPNOTSUPP; compared with the same calls on ext4;
  - shared mappings through O_RDWR descriptors, read-only and writable, of a new file and of one
    stored long ago; numpy.memmap(mode='r+'); SQLite in WAL mode (create, insert, reopen,
    integrity_check); LMDB;
  - a non-root user reads a 0644 file and is refused a 0600 one and a write into a 0755
    directory it does not own (the mount is shared like a system filesystem when root mounts it);
  - everything still reads the same after a remount.

Usage: ordinary.py CKPTFS_BINARY    (as root; Debian's /usr/bin/python3)
"""
import ctypes
import errno
import json
import mmap
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckptfs_testlib import du, mounted, require_fuse, sha256  # noqa: E402

MiB = 1 << 20
FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 0x01, 0x02
FALLOC_FL_COLLAPSE_RANGE, FALLOC_FL_ZERO_RANGE = 0x08, 0x10
libc = ctypes.CDLL(None, use_errno=True)
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]


def fallocate(fd, mode, off, length):
    if libc.fallocate(fd, mode, off, length) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def huge_truncate(mnt):
    fd = os.open(f"{mnt}/huge", os.O_CREAT | os.O_RDWR, 0o644)
    t = time.monotonic()
    try:
        os.ftruncate(fd, 999999999999999)
        raise AssertionError("a 909 TiB truncate succeeded")
    except OSError as e:
        assert e.errno in (errno.EFBIG, errno.EINVAL), e
    finally:
        os.close(fd)
    # Not a timing test of speed: a hang here (the old behaviour) takes minutes.
    assert time.monotonic() - t < 5, "the huge truncate was not refused promptly"
    assert "huge" in os.listdir(mnt)  # the mount answers
    assert os.path.getsize(f"{mnt}/huge") == 0


def sparse_file(mnt, store):
    before = du(store)
    path = f"{mnt}/sparse.img"
    with open(path, "wb") as f:
        f.seek(5 << 30)
        f.write(b"d" * 4096)
        f.truncate(10 << 30)
        f.flush()
        os.fsync(f.fileno())
    grew = du(store) - before
    assert grew < MiB, f"a 10 GiB file with 4 KiB of data took {grew} bytes"
    check_sparse(path)


def check_sparse(path):
    st = os.stat(path)
    assert st.st_size == 10 << 30
    assert st.st_blocks * 512 <= MiB, st.st_blocks  # 1 MiB: a chunk of the write buffer
    assert 4096 <= st.st_blksize <= 128 << 10, st.st_blksize
    fd = os.open(path, os.O_RDONLY)
    try:
        assert os.lseek(fd, 0, os.SEEK_HOLE) == 0
        assert os.lseek(fd, 0, os.SEEK_DATA) == 5 << 30
        hole = os.lseek(fd, 5 << 30, os.SEEK_HOLE)
        assert (5 << 30) + 4096 <= hole <= (5 << 30) + MiB, hole
        try:
            os.lseek(fd, hole, os.SEEK_DATA)
            raise AssertionError("data reported after the last data")
        except OSError as e:
            assert e.errno == errno.ENXIO, e
        assert os.pread(fd, 8192, (5 << 30) - 4096) == b"\0" * 4096 + b"d" * 4096
        assert os.pread(fd, 4096, (10 << 30) - 4096) == b"\0" * 4096
    finally:
        os.close(fd)


def rewrites(mnt, store, plain):
    """50 small in-place rewrites of a 512 MiB file, mirrored on a plain copy."""
    rng = random.Random(14)
    src = f"{mnt}/data.bin"
    with open(src, "wb") as a, open(plain, "wb") as b:
        for _ in range(512):
            block = os.urandom(MiB)
            a.write(block)
            b.write(block)
        a.flush()
        os.fsync(a.fileno())  # stored now: a close's commit runs after close() returns
    for i in range(50):
        off = rng.randrange(0, 512 * MiB - 4096)
        data = os.urandom(4096)
        before = du(store)
        for p in (src, plain):
            fd = os.open(p, os.O_RDWR)
            os.pwrite(fd, data, off)
            if p == src and i % 2:
                os.fsync(fd)  # every other one stored by fsync, the others by the close
            os.close(fd)
        if i % 2 == 0:
            fd = os.open(src, os.O_RDONLY)  # waits for the close's commit...
            os.fsync(fd)  # ...and for the journal
            os.close(fd)
        grew = du(store) - before
        # One or two 1 MiB chunks (a write across a chunk boundary) and metadata.
        assert grew < 2 * MiB + 256 * 1024, f"a 4 KiB rewrite added {grew} bytes to the store"
    assert sha256(src) == sha256(plain), "the mount and the plain copy differ after the rewrites"
    # What `ckptctl ls` counts is what the store holds: the hidden donors whose blocks the
    # rewritten file reuses are listed and counted.
    ctl = os.path.join(os.path.dirname(os.path.abspath(sys.argv[1])), "ckptctl")
    out = json.loads(subprocess.run([ctl, "ls", "--json", src], check=True, capture_output=True,
                                    text=True).stdout)
    donors = [v for v in out["files"] if not v["live"]]
    assert donors and all(v["kind"] == "exact" for v in donors), out["files"]
    objects = du(f"{store}/objects")
    assert abs(out["totals"]["stored_bytes"] - objects) < 0.02 * objects, (out["totals"], objects)


def fallocate_modes(mnt, plain_dir):
    """The same fallocate calls on the mount and on the plain directory give the same bytes."""
    results = []
    for d in (mnt, plain_dir):
        p = f"{d}/falloc.bin"
        fd = os.open(p, os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o644)
        try:
            os.write(fd, bytes(range(256)) * (3 * 4096))  # 3 MiB
            os.posix_fallocate(fd, 0, 5 * MiB)  # extends
            assert os.fstat(fd).st_size == 5 * MiB, (d, os.fstat(fd).st_size)
            fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, 8 * MiB)
            assert os.fstat(fd).st_size == 5 * MiB, (d, os.fstat(fd).st_size)
            fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 4096, MiB + 8192)
            fallocate(fd, FALLOC_FL_ZERO_RANGE, 5 * MiB - 4096, 8192)  # zeros, extends
            if d == mnt:  # ext4 would do it
                try:
                    fallocate(fd, FALLOC_FL_COLLAPSE_RANGE, 0, MiB)
                    raise AssertionError("COLLAPSE_RANGE succeeded on the mount")
                except OSError as e:
                    assert e.errno == errno.EOPNOTSUPP, e
        finally:
            os.close(fd)
        results.append((os.path.getsize(p), sha256(p)))
    assert results[0] == results[1], results


def shared_mmaps(mnt):
    # A file stored long ago (closed, committed), mapped through an O_RDWR descriptor.
    old = f"{mnt}/old.bin"
    with open(old, "wb") as f:
        f.write(b"a" * (4 * MiB))
    os.stat(old)
    fd = os.open(old, os.O_RDWR)
    try:
        with mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ) as m:
            assert m[:4] == b"aaaa"
        with mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) as m:
            m[MiB:MiB + 5] = b"MMAP!"
            m.flush()
    finally:
        os.close(fd)
    with open(old, "rb") as f:
        f.seek(MiB)
        assert f.read(5) == b"MMAP!", "a write through a shared mapping was lost"
    # numpy.memmap r+ of a new file.
    arr = np.lib.format.open_memmap(f"{mnt}/arr.npy", mode="w+", dtype=np.float32, shape=(1000,))
    arr[:] = np.arange(1000, dtype=np.float32)
    arr.flush()
    del arr
    arr = np.load(f"{mnt}/arr.npy", mmap_mode="r+")
    arr[10] = -1.0
    arr.flush()
    del arr
    back = np.load(f"{mnt}/arr.npy")
    assert back[10] == -1.0 and back[11] == 11.0


def sqlite_wal(mnt):
    db = sqlite3.connect(f"{mnt}/runs.db")
    assert db.execute("pragma journal_mode=wal").fetchone()[0] == "wal"
    db.execute("create table metrics(step integer primary key, loss real)")
    db.executemany("insert into metrics values(?, ?)", [(i, 1.0 / (i + 1)) for i in range(5000)])
    db.commit()
    # A second connection while the first is open (the -shm file is shared memory).
    db2 = sqlite3.connect(f"{mnt}/runs.db")
    assert db2.execute("select count(*) from metrics").fetchone()[0] == 5000
    db.execute("update metrics set loss = 0 where step < 10")
    db.commit()
    assert db2.execute("select sum(loss = 0) from metrics").fetchone()[0] == 10
    db2.close()
    db.close()
    check_sqlite(mnt)


def check_sqlite(mnt):
    db = sqlite3.connect(f"{mnt}/runs.db")
    assert db.execute("pragma integrity_check").fetchone()[0] == "ok"
    assert db.execute("select count(*), sum(loss = 0) from metrics").fetchone() == (5000, 10)
    db.close()


def lmdb_store(mnt):
    try:
        import lmdb
    except ImportError:
        print("ordinary: python3-lmdb is not installed; LMDB not checked")
        return
    env = lmdb.open(f"{mnt}/lmdb", map_size=64 * MiB)
    with env.begin(write=True) as txn:
        for i in range(2000):
            txn.put(f"key{i}".encode(), os.urandom(100) + str(i).encode())
    env.close()
    env = lmdb.open(f"{mnt}/lmdb", map_size=64 * MiB, readonly=True)
    with env.begin() as txn:
        assert txn.get(b"key1999").endswith(b"1999")
        assert txn.stat()["entries"] == 2000
    env.close()


def other_user(mnt):
    os.chmod(mnt, 0o755)
    with open(f"{mnt}/public.txt", "w") as f:
        f.write("readable\n")
    os.chmod(f"{mnt}/public.txt", 0o644)
    with open(f"{mnt}/private.txt", "w") as f:
        f.write("secret\n")
    os.chmod(f"{mnt}/private.txt", 0o600)

    def as_nobody(*cmd):
        return subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                               *cmd], capture_output=True, text=True)

    r = as_nobody("cat", f"{mnt}/public.txt")
    assert r.returncode == 0 and r.stdout == "readable\n", r
    r = as_nobody("cat", f"{mnt}/private.txt")
    assert r.returncode != 0 and "Permission denied" in r.stderr, r
    r = as_nobody("touch", f"{mnt}/by_nobody")
    assert r.returncode != 0 and "Permission denied" in r.stderr, r
    assert not os.path.exists(f"{mnt}/by_nobody")


def main():
    require_fuse()
    binary = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="ckptfs-ordinary-", dir="/var/tmp") as work:
        store, mnt, plain = f"{work}/store", f"{work}/mnt", f"{work}/plain"
        os.makedirs(mnt)
        os.makedirs(plain)
        os.chmod(work, 0o755)  # the other user must reach the mount point
        with mounted(binary, store, mnt, "cache=256M,buffer=128M"):
            huge_truncate(mnt)
            sparse_file(mnt, store)
            rewrites(mnt, store, f"{plain}/data.bin")
            fallocate_modes(mnt, plain)
            shared_mmaps(mnt)
            sqlite_wal(mnt)
            lmdb_store(mnt)
            other_user(mnt)
            digest = sha256(f"{mnt}/data.bin")
        with mounted(binary, store, mnt, "cache=256M,buffer=128M"):
            check_sparse(f"{mnt}/sparse.img")
            assert sha256(f"{mnt}/data.bin") == digest
            assert sha256(f"{mnt}/falloc.bin") == sha256(f"{plain}/falloc.bin")
            check_sqlite(mnt)
            with open(f"{mnt}/old.bin", "rb") as f:
                f.seek(MiB)
                assert f.read(5) == b"MMAP!"
    print("ordinary: ok")


if __name__ == "__main__":
    main()
