#!/usr/bin/python3
"""Differential test: a seeded random sequence of ordinary file operations is applied to a ckptfs
mount and to a plain directory (ext4/tmpfs), and the results must agree: the same success or
errno for every operation, the same bytes for every read, and the same tree after every step
(names, types, sizes, permission bits, link counts, contents, symlink targets, user xattrs).
The tree is compared once more after unmount + remount (everything must have been journaled).

Operations: create, write at an offset (with and without O_TRUNC, holes), truncate, unlink, mkdir,
rmdir, rename (files and directories, within and across directories, replacing, RENAME_NOREPLACE
and RENAME_EXCHANGE through renameat2), link, symlink, chmod, utime, setxattr/removexattr,
fsync, read; and (issue 14) fallocate (mode 0, KEEP_SIZE, PUNCH_HOLE), sparse extension by a
write megabytes past the end, small in-place rewrites anywhere in a multi-megabyte file
(O_RDWR, no truncate), and writes through a shared mapping of an O_RDWR descriptor.

Usage: differential.py CKPTFS_BINARY [--steps N] [--seed S]
"""
import argparse
import ctypes
import errno
import hashlib
import mmap
import os
import random
import stat
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckptfs_testlib import daemon_log, mounted  # noqa: E402

NAMES = ["a", "b", "c", "d", "e", "f.pt", "g.json"]
XATTRS = ["user.k1", "user.k2", "user.k3"]
MODES = [0o600, 0o644, 0o755, 0o700, 0o640]

libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD = -100
RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2
FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 1, 2
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]


def fallocate(fd, mode, off, length):
    if libc.fallocate(fd, mode, off, length) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def renameat2(src, dst, flags):
    if libc.renameat2(AT_FDCWD, src.encode(), AT_FDCWD, dst.encode(), flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def snapshot(root):
    """Everything the comparison looks at, keyed by path relative to root."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, root)
            st = os.lstat(p)
            entry = {"type": stat.S_IFMT(st.st_mode), "mode": stat.S_IMODE(st.st_mode),
                     "nlink": st.st_nlink}
            if stat.S_ISREG(st.st_mode):
                entry["size"] = st.st_size
                with open(p, "rb") as f:
                    entry["sha"] = hashlib.sha256(f.read()).hexdigest()
                # Times set by utime (years 2001-2017) must agree; "now" stamps cannot.
                entry["mtime"] = st.st_mtime_ns if st.st_mtime_ns < 1.6e18 else None
            if stat.S_ISLNK(st.st_mode):
                entry["target"] = os.readlink(p)
            else:
                entry["xattrs"] = {k: os.getxattr(p, k) for k in sorted(os.listxattr(p))
                                   if k.startswith("user.")}
            out[rel] = entry
    return out


def diff(a, b):
    lines = []
    for k in sorted(set(a) | set(b)):
        if a.get(k) != b.get(k):
            lines.append(f"  {k}: mount={a.get(k)} plain={b.get(k)}")
    return "\n".join(lines[:20])


class Ops:
    """Random operations; each returns a function f(root) -> result, applied to both trees."""

    def __init__(self, seed, plain):
        self.rng = random.Random(seed)
        self.plain = plain

    def listing(self):
        files, dirs, links, everything = [], [""], [], []
        for dirpath, dirnames, filenames in os.walk(self.plain):
            for name in dirnames + filenames:
                rel = os.path.relpath(os.path.join(dirpath, name), self.plain)
                st = os.lstat(os.path.join(self.plain, rel))
                everything.append(rel)
                if stat.S_ISDIR(st.st_mode):
                    dirs.append(rel)
                elif stat.S_ISREG(st.st_mode):
                    files.append(rel)
                else:
                    links.append(rel)
        return files, dirs, links, everything

    def new_path(self, dirs):
        return os.path.join(self.rng.choice(dirs), self.rng.choice(NAMES))

    def data(self):
        r = self.rng.random()
        n = self.rng.randint(0, 64) if r < 0.3 else self.rng.randint(0, 8192) if r < 0.9 else \
            self.rng.randint(0, 300000)
        return self.rng.randbytes(n)

    def next(self):
        rng = self.rng
        files, dirs, links, everything = self.listing()
        any_path = lambda: rng.choice(everything) if everything and rng.random() < 0.8 \
            else self.new_path(dirs)  # noqa: E731
        file_path = lambda: rng.choice(files) if files and rng.random() < 0.9 \
            else self.new_path(dirs)  # noqa: E731
        kind = rng.choices(
            ["create", "write", "truncate", "unlink", "mkdir", "rmdir", "rename", "rename2",
             "link", "symlink", "chmod", "utime", "setxattr", "rmxattr", "fsync", "read",
             "fallocate", "sparse", "rewrite", "mmapwrite"],
            # Past ~80 entries removals win, which keeps every step's full comparison cheap.
            [12, 12, 5, 6 if len(everything) < 80 else 30, 8, 4 if len(everything) < 80 else 20,
             10, 3, 4, 3, 4, 2, 4, 2, 3, 6, 4, 2, 5, 3])[0]
        if kind == "create":
            p, d, trunc = self.new_path(dirs), self.data(), rng.random() < 0.7

            def op(root):
                flags = os.O_CREAT | os.O_WRONLY | (os.O_TRUNC if trunc else 0)
                fd = os.open(os.path.join(root, p), flags, 0o644)
                try:
                    os.write(fd, d)
                finally:
                    os.close(fd)
        elif kind == "write":
            p, d = file_path(), self.data()
            off = rng.randint(0, 20000)
            trunc = rng.random() < 0.2

            def op(root):
                fd = os.open(os.path.join(root, p), os.O_WRONLY | (os.O_TRUNC if trunc else 0))
                try:
                    os.pwrite(fd, d, off)
                    os.pwrite(fd, d[:10], 0)  # np.savez: rewrite earlier bytes
                finally:
                    os.close(fd)
        elif kind == "truncate":
            p, n = file_path(), rng.choice([0, rng.randint(0, 5000), rng.randint(0, 400000)])

            def op(root):
                os.truncate(os.path.join(root, p), n)
        elif kind == "unlink":
            p = any_path()

            def op(root):
                os.unlink(os.path.join(root, p))
        elif kind == "mkdir":
            p, m = self.new_path(dirs), rng.choice(MODES) | 0o700

            def op(root):
                os.mkdir(os.path.join(root, p), m)
        elif kind == "rmdir":
            p = rng.choice(dirs[1:]) if len(dirs) > 1 and rng.random() < 0.8 else any_path()

            def op(root):
                os.rmdir(os.path.join(root, p))
        elif kind in ("rename", "rename2"):
            src = any_path()
            dst = any_path() if rng.random() < 0.5 else self.new_path(dirs)
            flags = 0 if kind == "rename" else rng.choice([RENAME_NOREPLACE, RENAME_EXCHANGE])

            def op(root):
                a, b = os.path.join(root, src), os.path.join(root, dst)
                if flags:
                    renameat2(a, b, flags)
                else:
                    os.rename(a, b)
        elif kind == "link":
            src, dst = file_path(), self.new_path(dirs)

            def op(root):
                os.link(os.path.join(root, src), os.path.join(root, dst))
        elif kind == "symlink":
            target = rng.choice(["a", "../b", "/nonexistent/x", "c/d"])
            p = self.new_path(dirs)

            def op(root):
                os.symlink(target, os.path.join(root, p))
        elif kind == "chmod":
            p, m = rng.choice(files + dirs[1:]) if files or dirs[1:] else "", rng.choice(MODES)
            if p in dirs:
                m |= 0o700

            def op(root):
                os.chmod(os.path.join(root, p), m)
        elif kind == "utime":
            p = file_path()
            t = rng.randint(10**18, 15 * 10**17)  # in the past: compared by snapshot()

            def op(root):
                os.utime(os.path.join(root, p), ns=(t, t))
        elif kind == "setxattr":
            p, k, v = any_path(), rng.choice(XATTRS), rng.randbytes(rng.randint(0, 100))
            flags = rng.choice([0, 0, os.XATTR_CREATE, os.XATTR_REPLACE])

            def op(root):
                os.setxattr(os.path.join(root, p), k, v, flags, follow_symlinks=False)
        elif kind == "rmxattr":
            p, k = any_path(), rng.choice(XATTRS)

            def op(root):
                os.removexattr(os.path.join(root, p), k, follow_symlinks=False)
        elif kind == "fsync":
            p = file_path()

            def op(root):
                fd = os.open(os.path.join(root, p), os.O_RDWR)
                try:
                    os.pwrite(fd, b"fsync!", 3)
                    os.fsync(fd)
                finally:
                    os.close(fd)
        elif kind == "fallocate":
            p = file_path()
            mode = rng.choice([0, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE])
            off, n = rng.randint(0, 3 << 20), rng.randint(1, 2 << 20)

            def op(root):
                fd = os.open(os.path.join(root, p), os.O_RDWR)
                try:
                    fallocate(fd, mode, off, n)
                finally:
                    os.close(fd)
        elif kind == "sparse":
            p, d, gap = file_path(), self.data()[:4096], rng.randint(1 << 20, 6 << 20)

            def op(root):
                fd = os.open(os.path.join(root, p), os.O_RDWR)
                try:
                    os.pwrite(fd, d, os.fstat(fd).st_size + gap)
                finally:
                    os.close(fd)
        elif kind == "rewrite":
            p, d, where = file_path(), rng.randbytes(rng.choice([1, 100, 4096, 70000])), rng.random()

            def op(root):
                fd = os.open(os.path.join(root, p), os.O_RDWR)
                try:
                    os.pwrite(fd, d, int(where * os.fstat(fd).st_size))
                finally:
                    os.close(fd)
        elif kind == "mmapwrite":
            p, d, where = file_path(), rng.randbytes(rng.randint(1, 5000)), rng.random()

            def op(root):
                fd = os.open(os.path.join(root, p), os.O_RDWR)
                try:
                    size = os.fstat(fd).st_size
                    if size == 0:
                        return "empty"
                    with mmap.mmap(fd, size, mmap.MAP_SHARED,
                                   mmap.PROT_READ | mmap.PROT_WRITE) as m:
                        at = int(where * size)
                        part = d[:size - at]
                        m[at:at + len(part)] = part
                        m.flush()
                        return m[max(0, at - 10):at + 10]
                finally:
                    os.close(fd)
        else:  # read
            p, off, n = file_path(), rng.randint(0, 10000), rng.randint(0, 70000)

            def op(root):
                with open(os.path.join(root, p), "rb") as f:
                    f.seek(off)
                    return f.read(n)
        return kind, op


def run(op, root):
    try:
        return ("ok", op(root))
    except OSError as e:
        return ("err", errno.errorcode.get(e.errno, e.errno))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=20261121)
    args = ap.parse_args()
    # Small journal snapshots: compaction runs many times during the sequence, and the remount
    # at the end replays a compacted journal.
    os.environ["CKPTFS_COMPACT_BYTES"] = "32K"
    with tempfile.TemporaryDirectory(prefix="ckptfs-diff-") as tmp:
        store, mnt, plain = f"{tmp}/store", f"{tmp}/mnt", f"{tmp}/plain"
        os.makedirs(plain)
        ops = Ops(args.seed, plain)
        counts = {}
        with mounted(args.binary, store, mnt):
            os.chmod(mnt, 0o755)
            os.chmod(plain, 0o755)
            for step in range(args.steps):
                kind, op = ops.next()
                got, want = run(op, mnt), run(op, plain)
                counts[kind] = counts.get(kind, 0) + 1
                if got != want:
                    sys.exit(f"step {step} ({kind}): mount gave {str(got)[:200]}, "
                             f"plain gave {str(want)[:200]}")
                a, b = snapshot(mnt), snapshot(plain)
                if a != b:
                    sys.exit(f"step {step} ({kind}): trees differ\n{diff(a, b)}")
            entries = len(snapshot(plain))
        with mounted(args.binary, store, mnt):
            a, b = snapshot(mnt), snapshot(plain)
            if a != b:
                sys.exit(f"after remount: trees differ\n{diff(a, b)}")
            with open(daemon_log(store)) as f:
                log = f.read()
    assert " error: " not in log, log
    print(f"differential: {args.steps} steps agree ({entries} entries at the end), and after "
          f"remount; {log.count('journal compacted')} journal snapshots; "
          f"ops: {dict(sorted(counts.items()))}")


if __name__ == "__main__":
    main()
