#!/usr/bin/python3
"""How training frameworks write (reference/formats.md section 4), through a real mount:

  np.save into an open file (numpy dup()s the fd: flush before the last close), np.savez
  (rewrites earlier bytes), torch.save/torch.load of a small state dict (torch.equal), temp file
  then os.replace, shutil.rmtree rotation, timm-style hard links, open-unlinked files, O_APPEND,
  reads of a file while it is being written, fsync, truncate of a closed file, a file bigger than
  the buffer= budget (spills to the staging file).

Mounted with -o lossless, so every file must read back exactly (lossy deltas are tested by
training_styles.py). Every file is checked right after close, after the caches are emptied,
and after unmount + remount.
Usage: patterns.py CKPTFS_BINARY    (as root; Debian's /usr/bin/python3)
"""
import hashlib
import os
import shutil
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckptfs_testlib import mounted, sha256  # noqa: E402

expected = {}  # path relative to the mount -> sha256 of what it must read as


def check(mnt, rel, data=None):
    path = os.path.join(mnt, rel)
    got = sha256(path)
    if data is not None:
        expected[rel] = hashlib.sha256(data).hexdigest()
    assert got == expected[rel], f"{rel}: content differs"


def numpy_patterns(mnt):
    os.makedirs(f"{mnt}/np")
    a = np.arange(100000, dtype=np.float32).reshape(100, 1000)
    with open(f"{mnt}/np/a.npy", "wb") as f:  # tofile() on a dup() of f's descriptor
        np.save(f, a)
        f.write(b"")  # the handle is still open after the dup was closed
    assert np.array_equal(np.load(f"{mnt}/np/a.npy"), a)
    np.save(f"{mnt}/np/b.npy", a * 2)
    assert np.array_equal(np.load(f"{mnt}/np/b.npy"), a * 2)
    np.savez(f"{mnt}/np/c.npz", x=a, y=np.arange(10))
    with np.load(f"{mnt}/np/c.npz") as z:
        assert np.array_equal(z["x"], a) and np.array_equal(z["y"], np.arange(10))
    np.savez_compressed(f"{mnt}/np/d.npz", x=a)
    with np.load(f"{mnt}/np/d.npz") as z:
        assert np.array_equal(z["x"], a)
    for name in ("a.npy", "b.npy", "c.npz", "d.npz"):
        with open(f"{mnt}/np/{name}", "rb") as f:
            expected[f"np/{name}"] = hashlib.sha256(f.read()).hexdigest()


def torch_patterns(mnt):
    os.makedirs(f"{mnt}/torch/ckpts")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32),
                                torch.nn.Linear(32, 4))
    state = {"model": model.state_dict(), "step": 7, "ints": torch.arange(50)}
    torch.save(state, f"{mnt}/torch/small.pt")
    back = torch.load(f"{mnt}/torch/small.pt")
    for k, v in state["model"].items():
        assert torch.equal(back["model"][k], v), k
    assert back["step"] == 7 and torch.equal(back["ints"], state["ints"])

    # Lightning-style: temp file, then os.replace over the previous version.
    for step in range(3):
        tmp = f"{mnt}/torch/last.ckpt.tmp"
        torch.save({"step": step, "w": torch.full((64,), float(step))}, tmp)
        os.replace(tmp, f"{mnt}/torch/last.ckpt")
        back = torch.load(f"{mnt}/torch/last.ckpt")
        assert back["step"] == step and torch.equal(back["w"], torch.full((64,), float(step)))
    assert not os.path.exists(f"{mnt}/torch/last.ckpt.tmp")

    # timm-style: tmp -> os.replace -> last, then hard links per epoch; old ones removed.
    for epoch in range(4):
        torch.save({"epoch": epoch}, f"{mnt}/torch/ckpts/tmp.pth.tar")
        os.replace(f"{mnt}/torch/ckpts/tmp.pth.tar", f"{mnt}/torch/ckpts/last.pth.tar")
        os.link(f"{mnt}/torch/ckpts/last.pth.tar", f"{mnt}/torch/ckpts/checkpoint-{epoch}.pth.tar")
        assert os.stat(f"{mnt}/torch/ckpts/last.pth.tar").st_nlink == 2
        if epoch >= 2:
            os.remove(f"{mnt}/torch/ckpts/checkpoint-{epoch - 2}.pth.tar")
    assert sorted(os.listdir(f"{mnt}/torch/ckpts")) == [
        "checkpoint-2.pth.tar", "checkpoint-3.pth.tar", "last.pth.tar"]
    assert torch.load(f"{mnt}/torch/ckpts/checkpoint-2.pth.tar")["epoch"] == 2
    assert torch.load(f"{mnt}/torch/ckpts/last.pth.tar")["epoch"] == 3
    for rel in ("torch/small.pt", "torch/last.ckpt", "torch/ckpts/checkpoint-2.pth.tar",
                "torch/ckpts/last.pth.tar"):
        with open(f"{mnt}/{rel}", "rb") as f:
            expected[rel] = hashlib.sha256(f.read()).hexdigest()

    # HF-style rotation: checkpoint-N directories, the oldest removed with shutil.rmtree.
    for step in range(5):
        d = f"{mnt}/torch/hf/checkpoint-{step}"
        os.makedirs(d)
        torch.save({"w": torch.full((8,), float(step))}, f"{d}/optimizer.pt")
        with open(f"{d}/trainer_state.json", "w") as f:
            f.write('{"global_step": %d}\n' % step)
        kept = sorted(os.listdir(f"{mnt}/torch/hf"), key=lambda n: int(n.split("-")[1]))
        for old in kept[:-2]:
            shutil.rmtree(f"{mnt}/torch/hf/{old}")
    assert sorted(os.listdir(f"{mnt}/torch/hf")) == ["checkpoint-3", "checkpoint-4"]
    assert torch.load(f"{mnt}/torch/hf/checkpoint-4/optimizer.pt")["w"][0] == 4.0


def posix_patterns(mnt):
    d = f"{mnt}/posix"
    os.makedirs(d)
    # Open-unlinked: readable and writable until the last close.
    fd = os.open(f"{d}/gone", os.O_CREAT | os.O_RDWR, 0o644)
    os.write(fd, b"still here")
    os.unlink(f"{d}/gone")
    assert os.pread(fd, 100, 0) == b"still here"
    os.pwrite(fd, b"THERE", 6)
    assert os.pread(fd, 100, 0) == b"still THERE"
    os.close(fd)
    assert not os.path.exists(f"{d}/gone")

    # Unlinked while only an O_PATH descriptor holds it (no open file on the daemon's side):
    # reopened through /proc/self/fd it still reads its stored bytes, as on a local filesystem.
    kept = os.urandom(3 << 20)
    with open(f"{d}/opath", "wb") as f:
        f.write(kept)
    os.stat(f"{d}/opath")  # waits for the commit
    fd = os.open(f"{d}/opath", os.O_PATH)
    os.unlink(f"{d}/opath")
    with open(f"/proc/self/fd/{fd}", "rb") as f:
        assert f.read() == kept, "an unlinked file reopened through O_PATH lost its content"
    assert os.fstat(fd).st_size == len(kept)
    os.close(fd)

    # O_APPEND and a second reader while writing.
    with open(f"{d}/log", "ab") as w:
        w.write(b"one\n")
        w.flush()
        with open(f"{d}/log", "rb") as r:
            assert r.read() == b"one\n"
        w.write(b"two\n")
    with open(f"{d}/log", "ab") as w:
        w.write(b"three\n")
    check(mnt, "posix/log", b"one\ntwo\nthree\n")

    # Writes at offsets, a hole, overwrite of earlier bytes, fsync, truncate after close.
    fd = os.open(f"{d}/sparse", os.O_CREAT | os.O_WRONLY, 0o600)
    os.pwrite(fd, b"end", 3 << 20)
    os.pwrite(fd, b"start", 0)
    os.fsync(fd)
    os.pwrite(fd, b"START", 0)
    os.close(fd)
    data = bytearray((3 << 20) + 3)
    data[0:5] = b"START"
    data[-3:] = b"end"
    check(mnt, "posix/sparse", bytes(data))
    os.truncate(f"{d}/sparse", 4)
    check(mnt, "posix/sparse", b"STAR")
    os.truncate(f"{d}/sparse", 10)
    check(mnt, "posix/sparse", b"STAR" + bytes(6))

    # Opened for writing without O_TRUNC: starts from the stored content.
    with open(f"{d}/sparse", "r+b") as f:
        f.seek(2)
        f.write(b"XY")
    check(mnt, "posix/sparse", b"STXY" + bytes(6))

    # Bigger than buffer= (4 MiB in this test): spills to STORE/staging.
    big = os.urandom(1 << 20) * 11
    with open(f"{d}/big", "wb") as f:
        f.write(big)
    check(mnt, "posix/big", big)
    st = os.stat(f"{d}/big")
    assert st.st_size == len(big)


def main():
    binary = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="ckptfs-patterns-") as tmp:
        store, mnt = f"{tmp}/store", f"{tmp}/mnt"
        with mounted(binary, store, mnt, "buffer=4M", "lossless"):
            numpy_patterns(mnt)
            torch_patterns(mnt)
            posix_patterns(mnt)
            for rel in expected:
                check(mnt, rel)
            # Emptied caches (daemon and kernel): the same bytes again.
            os.setxattr(mnt, "user.ckptfs.drop_caches", b"1")
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
            for rel in expected:
                check(mnt, rel)
        with mounted(binary, store, mnt, "buffer=4M", "lossless"):
            for rel in expected:
                check(mnt, rel)
            assert not os.listdir(f"{store}/staging"), "staging files left behind"
    print(f"patterns: {len(expected)} files verified, after close and after remount")


if __name__ == "__main__":
    main()
