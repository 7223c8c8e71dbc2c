#!/usr/bin/python3
"""Memory-mapped reads through a real mount, and the two read modes (-o reads=direct|cached).

  - torch checkpoints (a keyframe and a lossy delta on it), an .npy checkpoint (keyframe and
    delta) and an exact text file are written through the mount;
  - each is read with read() and mapped private copy-on-write (mmap ACCESS_COPY: numpy
    mmap_mode='c', torch.load(mmap=True) on newer torch) and read-only shared (ACCESS_READ: numpy
    mmap_mode='r', safetensors); every mapping must show exactly the bytes read() returns, a
    write into a private mapping must not reach the file, and np.load(mmap_mode='r') must equal
    np.load();
  - with reads=direct (the default) reading a whole torch checkpoint leaves none of it in the
    kernel page cache (fincore, before any mapping); a shared mapping of it works on kernels that
    accept FUSE_DIRECT_IO_ALLOW_MMAP (6.6+, which the daemon asks for at INIT) and shows the same
    bytes, and is refused with ENODEV on older ones (documented); .npy checkpoints and exact
    files are cached and map shared; with reads=cached every file is cached and maps shared;
  - everything again after the daemon's caches and the kernel's are emptied and after a
    remount.

Usage: mmap_reads.py CKPTFS_BINARY    (as root; Debian's /usr/bin/python3)
"""
import errno
import mmap
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckptfs_testlib import mounted, require_fuse  # noqa: E402

FILES = ("step_1.pt", "step_2.pt", "w_1.npy", "w_2.npy", "notes.txt")
TORCH = FILES[:2]  # read past the page cache under reads=direct


def write_files(mnt):
    g = torch.Generator().manual_seed(5)
    sd = {"a.weight": torch.randn(300, 500, generator=g) * 0.02,
          "b.weight": torch.randn(200_000, generator=g) * 0.02,
          "steps": torch.arange(10)}
    torch.save(sd, f"{mnt}/step_1.pt")
    sd = {k: (v + torch.randn(v.shape, generator=g) * 1e-4 if v.is_floating_point() else v)
          for k, v in sd.items()}
    torch.save(sd, f"{mnt}/step_2.pt")
    w = np.random.default_rng(1).standard_normal(400_000).astype(np.float32) * 0.02
    np.save(f"{mnt}/w_1.npy", w)
    np.save(f"{mnt}/w_2.npy", w + np.float32(1e-4))
    with open(f"{mnt}/notes.txt", "w") as f:
        f.write("exact bytes\n" * 5000)


def direct_io_mmap():
    """True when the kernel maps direct-I/O FUSE files shared (FUSE_DIRECT_IO_ALLOW_MMAP, 6.6+)."""
    major, minor = (int(x) for x in os.uname().release.split(".")[:2])
    return (major, minor) >= (6, 6)


def kind(mnt, name):
    return os.getxattr(f"{mnt}/{name}", "user.ckptfs.info").decode()


def cached_pages(path):
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", path],
                         check=True, capture_output=True, text=True).stdout
    return int(out.split()[0])


def empty_kernel_cache():
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def check_mode(mnt, direct):
    os.setxattr(mnt, "user.ckptfs.drop_caches", b"1")
    empty_kernel_cache()
    for name in FILES:
        path = f"{mnt}/{name}"
        with open(path, "rb") as f:
            data = f.read()
        assert len(data) == os.path.getsize(path), f"{name}: short read"
        pages = cached_pages(path)
        uncached = name in TORCH and direct
        if uncached:
            assert pages == 0, f"{name}: {pages} bytes in the page cache under reads=direct"
        else:
            assert pages > 0, f"{name}: not in the page cache after a read (reads=cached)"
        with open(path, "rb") as f:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) as m:
                assert m[:] == data, f"{name}: private mapping differs from read()"
                m[0:4] = b"XXXX"  # copy-on-write: stays in this process
            if uncached and not direct_io_mmap():
                try:
                    mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                    raise AssertionError(f"{name}: shared mapping of a direct-I/O file worked")
                except OSError as e:
                    assert e.errno == errno.ENODEV, f"{name}: {e}"
            else:
                with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                    assert m[:] == data, f"{name}: shared mapping differs from read()"
                    assert m[len(data) // 2:len(data) // 2 + 4096] == \
                        data[len(data) // 2:len(data) // 2 + 4096]
        with open(path, "rb") as f:
            assert f.read() == data, f"{name}: a private mapping's write reached the file"
    for name in ("w_1.npy", "w_2.npy"):
        full = np.load(f"{mnt}/{name}")
        assert np.array_equal(np.load(f"{mnt}/{name}", mmap_mode="r"), full), name
        cow = np.load(f"{mnt}/{name}", mmap_mode="c")
        cow[0] = 42.0
        assert np.array_equal(np.load(f"{mnt}/{name}"), full), f"{name}: mode 'c' wrote"
    sd = torch.load(f"{mnt}/step_2.pt")
    assert torch.equal(sd["steps"], torch.arange(10))


def main():
    require_fuse()
    binary = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="ckptfs-mmap-", dir="/var/tmp") as work:
        store, mnt = f"{work}/store", f"{work}/mnt"
        os.makedirs(mnt)
        with mounted(binary, store, mnt, "bits=3"):
            write_files(mnt)
            assert '"kind":"delta"' in kind(mnt, "step_2.pt").replace(" ", ""), \
                kind(mnt, "step_2.pt")
            assert '"kind":"delta"' in kind(mnt, "w_2.npy").replace(" ", "")
            assert '"kind":"exact"' in kind(mnt, "notes.txt").replace(" ", "")
            check_mode(mnt, direct=True)
        for opts, direct in (("bits=3", True), ("bits=3,reads=cached", False),
                             ("bits=3,reads=direct", True)):
            with mounted(binary, store, mnt, opts):
                check_mode(mnt, direct)
    print("mmap_reads: ok")


if __name__ == "__main__":
    main()
