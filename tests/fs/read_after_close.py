#!/usr/bin/python3
"""A read right after close() sees the version as stored, not the bytes as written.

close() returns once the kernel's FLUSH is answered; the RELEASE that starts the commit follows
asynchronously. A lossy coded checkpoint reads back differently before and after its commit, so
a reader in between must wait for it (filesystem::wait_for_release). The race is made wide and
deterministic by a child process that inherits the writer's descriptor and keeps the file open
for a while after the writer's close():

  - held 0.25 s: the reader right after close() waits and reads the stored version, the same
    bytes as after the child is gone and after a remount, and not the bytes written (the test
    checks that they differ: the checkpoint is coded lossily);
  - held 4 s (past the 1 s deadline): the reader gets the bytes as written without waiting for
    the child, a second reader does not wait again, and once the child is gone the file reads as
    stored; the next round of writes to it is waited for again;
  - torch.save then at once torch.load/sha256, over a lineage of ten versions: the same bytes as
    after a remount.

Usage: read_after_close.py CKPTFS_BINARY    (as root; Debian's /usr/bin/python3)
"""
import hashlib
import io
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckptfs_testlib import mounted, require_fuse, sha256  # noqa: E402


def state(step):
    g = torch.Generator().manual_seed(step)
    torch.manual_seed(0)
    base = {f"layer{i}.weight": torch.randn(256, 256) for i in range(4)}
    return {k: v + 0.01 * step * torch.randn(v.shape, generator=g) for k, v in base.items()}


def raw_bytes(obj):
    b = io.BytesIO()
    torch.save(obj, b)
    return b.getvalue()


def write_held(path, data, hold):
    """Writes `data` to `path` and closes it while a forked child keeps the descriptor (and so
    the kernel's file) open for `hold` seconds. Returns the child's pid."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    pid = os.fork()
    if pid == 0:
        time.sleep(hold)
        os._exit(0)
    os.close(fd)
    return pid


def timed_sha(path):
    t = time.monotonic()
    digest = sha256(path)
    return digest, time.monotonic() - t


def main():
    require_fuse()
    binary = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        store, mnt = f"{tmp}/store", f"{tmp}/mnt"
        os.makedirs(mnt)
        after = {}  # name -> sha256 read once its commit is surely in
        with mounted(binary, store, mnt):
            # Held briefly: the reader waits for the release and the commit.
            for step in range(3):
                data = raw_bytes(state(step))
                path = f"{mnt}/short.pt"
                pid = write_held(path, data, 0.25)
                now = sha256(path)
                os.waitpid(pid, 0)
                later = sha256(path)  # waits for the release and the commit as well
                written = hashlib.sha256(data).hexdigest()
                assert later != written, f"step {step}: stored exactly; the test needs a lossy file"
                assert now == later, (f"step {step}: read right after close() differs from the "
                                      "stored version")
                after["short.pt"] = later

            # Held past the deadline: bytes as written, without waiting for the holder.
            data = raw_bytes(state(7))
            path = f"{mnt}/long.pt"
            pid = write_held(path, data, 4.0)
            first, t1 = timed_sha(path)
            second, t2 = timed_sha(path)
            written = hashlib.sha256(data).hexdigest()
            assert first == written and second == written, "before the release: bytes as written"
            assert t1 < 3.0, f"the reader waited {t1:.1f} s for a writer that kept its file open"
            assert t2 < 0.9, f"a second reader waited again ({t2:.1f} s)"
            os.waitpid(pid, 0)
            # This round's wait was spent: the reader does not wait for the release again, and
            # the kernel sends it after the child's exit, asynchronously.
            deadline = time.monotonic() + 20
            while (stored := sha256(path)) == written and time.monotonic() < deadline:
                time.sleep(0.1)
            assert stored != written, "after the release: the version as stored"
            # The next round of writes is waited for again.
            data = raw_bytes(state(8))
            pid = write_held(path, data, 0.25)
            now = sha256(path)
            os.waitpid(pid, 0)
            assert now != hashlib.sha256(data).hexdigest(), "the next round: not waited for"
            assert now == sha256(path), "the next round: read right after close() differs"
            after["long.pt"] = now

            # A real client: torch.save, then torch.load and sha256 at once.
            os.makedirs(f"{mnt}/run")
            for step in range(10):
                path = f"{mnt}/run/ckpt_{step:03d}.pt"
                want = state(step)
                torch.save(want, path)
                after[f"run/ckpt_{step:03d}.pt"] = sha256(path)
                got = torch.load(path)
                assert set(got) == set(want)
                for k in want:
                    err = (got[k] - want[k]).norm() / want[k].norm()
                    assert err < 0.25, f"{path} {k}: relative error {err:.3g}"  # lossy deltas

        with mounted(binary, store, mnt):
            for name, digest in after.items():
                assert sha256(f"{mnt}/{name}") == digest, f"{name}: differs after a remount"
    print("read_after_close: ok")


if __name__ == "__main__":
    main()
