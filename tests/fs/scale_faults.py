#!/usr/bin/python3
"""Faults around the streaming write path and head images (issue 13), through a real mount with
~160 MiB training states (tests/fs/scale_lib.py; over head_min, so every version's write buffer
becomes its lineage's head image):

  scratch_unusable  -o scratch= names a regular file, then a read-only tmpfs. A checkpoint that
                    fits in buffer= saves and reads back (keyframe within 2^-13, exp_avg within |u|, then a delta within the
                    closed-loop bound): heads fall back to decoding the chain, and the daemon
                    says so in STORE.daemon.log. One that does not fit needs a staging file
                    there: its save fails with EIO (logged, naming the directory), not with an
                    errno about a path of the writer's own (ENOTDIR, EROFS, EACCES); the daemon
                    keeps serving and the files stored before read back identical.
  scratch_full      scratch on a tmpfs with room for one head image, not two. While a reader
                    holds version 1 open (its image stays), version 2's image cannot be
                    published: the save still succeeds, the daemon logs that the image was not
                    kept, version 2 reads back within the bound through its chain, and the next
                    save's delta is coded against it. Once the reader is gone, version 3's image
                    is published again. Every version reads the same bytes after a remount.
  kill9             kill -9 of the daemon while a large checkpoint's object is being streamed
                    (STORE/objects/*.obj.tmp present), and again right after a save's fsync
                    returned (its head image not yet published). After each remount: the files
                    closed and fsync'ed before read back identical (sha256), no *.obj.tmp is
                    left, `ckptctl gc` finds nothing to remove, STORE/heads holds no image but a
                    complete one of a lineage's newest version, and the newest version reads the
                    same with heads=off (decoded through its chain).
  kill9_heads_off   the same two kills with heads=off,cache=64M (a stream follows a checkpoint
                    over half of the cache, decoding its base through the chain): the versions
                    before were streamed (`ckptctl status`), what was fsync'ed reads identical,
                    nothing half-made is left, no head image appears, and the delta killed right
                    after its fsync reads within the bound, the same with head images on.
  kill9_dcp_heads_off  the mid-stream kill with DCP shards (`__0_0.distcp`, smallest tensor
                    first) and heads=off: two shards streamed and read back with DCP's reader
                    within the bound, the third killed while streamed; the same checks.

Usage: scale_faults.py CKPTFS CKPTCTL [SCENARIO...]   (as root; Debian's /usr/bin/python3)
"""
import errno
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckptfs_testlib import (daemon_log, kill9, mounted, sha256, start,  # noqa: E402
                            status_json, wait_mounted)
from scale_lib import (MiB, TrainingState, check, flat_tensors, heads_of, read_dcp,  # noqa: E402
                       sample, save, scratch_dir, stat, tmp_objects, wait_published, write_dcp,
                       writing_object)

SIZE = 160 * MiB


def log_of(store):
    with open(daemon_log(store), errors="replace") as f:
        return f.read()


def tmpfs(path, *opts):
    os.makedirs(path, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(opts), "tmpfs", path],
                       capture_output=True, text=True)
    if r.returncode != 0:
        print(f"SKIPPED: cannot mount a tmpfs: {r.stderr.strip()}")
        sys.exit(77)


def umount(path):
    subprocess.run(["umount", "-l", path], check=False)


class Lineage:
    """One checkpoint's versions as saved and as read back, checked as they come."""

    def __init__(self, ckptctl, seed, size=SIZE):
        self.ckptctl = ckptctl
        self.state = TrainingState(size, params=2, small=4, seed=seed)
        self.reads = {}  # version id -> samples as read back
        self.k = 0

    def save(self, path):
        if self.k:
            self.state.step()
        self.k += 1
        saved = sample(self.state.state_dict())
        save(self.state.state_dict(), path)
        return saved

    def verify(self, label, path, saved):
        info = stat(self.ckptctl, path)
        read = sample(torch.load(path))
        check(label, saved, read, self.reads.get(info["base"]), info["kind"])
        self.reads[info["version"]] = read
        return info


def serialised(state):
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getbuffer()


def write_file(path, data):
    """Writes `data` in 1 MiB writes, fsyncs, closes; returns the first OSError, or None."""
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    try:
        for at in range(0, len(data), MiB):
            os.write(fd, data[at:at + MiB])
        os.fsync(fd)
    except OSError as e:
        return e
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
    return None


def test_scratch_unusable(binary, ckptctl, tmp):
    blocker = f"{tmp}/not-a-dir"
    with open(blocker, "w") as f:
        f.write("a file where the scratch directory should be\n")
    ro = f"{tmp}/ro-scratch"
    tmpfs(ro, "size=16m", "ro")
    try:
        for n, scratch in enumerate((blocker, ro)):
            store, mnt = f"{tmp}/unusable{n}-store", f"{tmp}/unusable{n}-mnt"
            lin = Lineage(ckptctl, seed=10 + n)
            hashes = {}
            with mounted(binary, store, mnt, f"scratch={scratch}", "buffer=256M",
                         errors_ok=True):
                for k in (1, 2):
                    path = f"{mnt}/step_{k}.pt"
                    saved = lin.save(path)
                    info = lin.verify(f"{scratch} v{k}", path, saved)
                    assert info["kind"] == ("keyframe" if k == 1 else "delta"), info["kind"]
                    hashes[path] = sha256(path)
            log = log_of(store)
            assert "head images are off" in log, f"no log line about the heads:\n{log}"
            # Too large for buffer=: the rest needs a staging file in the unusable scratch.
            with mounted(binary, store, mnt, f"scratch={scratch}", "buffer=32M",
                         errors_ok=True) as proc:
                # Raw writes of the serialised checkpoint: torch.save aborts the process when a
                # write into its zip writer fails (its destructor throws again).
                err = write_file(f"{mnt}/big.pt", serialised(lin.state.state_dict()))
                assert err is not None, f"{scratch}: a save past buffer= succeeded"
                assert err.errno in (errno.EIO, errno.ENOSPC), (
                    f"{scratch}: the save failed with {err!r}, want EIO or ENOSPC")
                assert proc.poll() is None, "the daemon died"
                for path, h in hashes.items():
                    assert sha256(path) == h, f"{path} changed"
            log = log_of(store)
            assert "scratch file" in log, f"the failed staging file was not logged:\n{log}"
            assert "Not a directory" in log or "Read-only" in log, log
            with mounted(binary, store, mnt, f"scratch={scratch}", errors_ok=True):
                for path, h in hashes.items():
                    assert sha256(path) == h, f"{path} changed after remount"
            print(f"scratch_unusable ({'a file' if n == 0 else 'read-only tmpfs'}): saves within "
                  f"buffer= work (heads off, logged), larger ones fail with EIO, nothing lost")
    finally:
        umount(ro)


def test_scratch_full(binary, ckptctl, tmp):
    store, mnt, scratch = f"{tmp}/full-store", f"{tmp}/full-mnt", f"{tmp}/full-scratch"
    # Room for one image (~160 MiB) and change, not for two.
    tmpfs(scratch, "size=240m")
    try:
        lin = Lineage(ckptctl, seed=20)
        hashes = {}
        with mounted(binary, store, mnt, f"scratch={scratch}", "buffer=512M", errors_ok=True):
            p1 = f"{mnt}/run/step_1.pt"
            os.makedirs(f"{mnt}/run")
            saved = lin.save(p1)
            v1 = lin.verify("full v1", p1, saved)
            wait_published(scratch, v1["version"])
            hashes[p1] = sha256(p1)
            with open(p1, "rb") as holder:  # version 1's image stays while this is open
                holder.read(4096)
                p2 = f"{mnt}/run/step_2.pt"
                saved = lin.save(p2)
                v2 = lin.verify("full v2", p2, saved)
                assert v2["kind"] == "delta" and v2["base"] == v1["version"], v2
                deadline = time.monotonic() + 60
                while "not kept" not in log_of(store):
                    assert time.monotonic() < deadline, (
                        f"no log line about the lost image; scratch heads {heads_of(scratch)}, "
                        f"free {shutil.disk_usage(scratch).free}, "
                        f"status {status_json(ckptctl, mnt)['heads']}:\n{log_of(store)}")
                    time.sleep(0.05)
                hashes[p2] = sha256(p2)
                assert not any(h.startswith(f"{v2['version']:016x}-") for h in heads_of(scratch))
            p3 = f"{mnt}/run/step_3.pt"
            saved = lin.save(p3)
            v3 = lin.verify("full v3", p3, saved)
            assert v3["kind"] == "delta" and v3["base"] == v2["version"], v3
            wait_published(scratch, v3["version"])
            hashes[p3] = sha256(p3)
        assert heads_of(scratch) and heads_of(scratch)[0].startswith(f"{v3['version']:016x}-")
        with mounted(binary, store, mnt, f"scratch={scratch}"):
            for path, h in hashes.items():
                assert sha256(path) == h, f"{path} reads differently after remount"
        print("scratch_full: an image that did not fit was not kept (logged), its version read "
              "through the chain and served as the next base; the next image was published")
    finally:
        umount(scratch)


def after_crash(binary, ckptctl, store, mnt, hashes, label, opts=()):
    """Remount after a kill -9: what was fsync'ed reads identical, nothing half-made is left."""
    with mounted(binary, store, mnt, *opts):
        assert not tmp_objects(store), f"{label}: *.obj.tmp left after the store was opened"
        for path, h in hashes.items():
            assert sha256(path) == h, f"{label}: fsync'ed {path} changed"
    r = subprocess.run([ckptctl, "gc", "--dry-run", "--json", store], capture_output=True,
                       text=True, check=True)
    gc = json.loads(r.stdout)
    assert gc.get("removed_objects", 0) == 0, f"{label}: gc would remove {gc}"
    for name in heads_of(store):
        assert name.endswith(".head"), f"{label}: {name} left in STORE/heads"
    return gc


def torch_files(lin):
    """kill_mid_stream's versions as torch.save files: (save version k, the third's bytes)."""
    def save_version(mnt, k):
        path = f"{mnt}/run/step_{k}.pt"
        saved = lin.save(path)
        info = lin.verify(f"kill v{k}", path, saved)
        assert info["kind"] == ("delta" if k > 1 else "keyframe"), info
        return path

    def third(mnt):
        lin.state.step()
        return f"{mnt}/run/step_3.pt", serialised(lin.state.state_dict())
    return save_version, third


def kill_mid_stream(binary, ckptctl, store, mnt, hashes, opts, versions):
    """Two versions stored and fsync'ed through a mount with `opts`, then the daemon killed while
    the third one's object is streamed; checked after a remount with the same options.
    `versions` is (save_version(mnt, k) -> path, third(mnt) -> (path, bytes))."""
    save_version, third_version = versions
    proc = start(binary, store, mnt, *opts)
    try:
        wait_mounted(mnt, proc)
        os.makedirs(f"{mnt}/run", exist_ok=True)
        for k in (1, 2):
            path = save_version(mnt, k)
            hashes[path] = sha256(path)
        dfd = os.open(f"{mnt}/run", os.O_RDONLY)
        os.fsync(dfd)
        os.close(dfd)
        streams = status_json(ckptctl, mnt)["streams"]
        assert streams["used"] == 2 and streams["declined"] == 0, \
            f"versions 1-2 were not streamed with {opts}: {streams}"
        errors = []
        # Raw writes of the serialised checkpoint, as above: a torch.save whose writes fail keeps
        # its zip writer alive in the traceback, and the writer's destructor aborts the
        # interpreter at exit (it throws again: "unexpected pos").
        p3, third_data = third_version(mnt)

        def third():
            try:
                err = write_file(p3, third_data)
                if err is not None:
                    errors.append(err)
            except BaseException as e:  # the daemon dies under it
                errors.append(e)

        t = threading.Thread(target=third)
        t.start()
        deadline = time.monotonic() + 120
        while not writing_object(store):
            assert t.is_alive() and time.monotonic() < deadline, \
                "never saw the third version's object being streamed"
            time.sleep(0.002)
    finally:
        kill9(proc, mnt)
    t.join()
    assert errors, "the save of the third version succeeded although the daemon was killed"
    after_crash(binary, ckptctl, store, mnt, hashes, "killed mid-stream", opts)
    with mounted(binary, store, mnt, *opts):
        assert not os.path.exists(p3) or os.path.getsize(p3) == 0, "a half-stored version"


def test_kill9(binary, ckptctl, tmp):
    store, mnt = f"{tmp}/kill-store", f"{tmp}/kill-mnt"
    lin = Lineage(ckptctl, seed=30)
    hashes = {}
    kill_mid_stream(binary, ckptctl, store, mnt, hashes, ["buffer=64M"], torch_files(lin))
    print("kill9: killed while an object was streamed: fsync'ed versions identical, no .obj.tmp, "
          "gc finds nothing")

    # Killed right after a save's fsync returned: the version is durable, its head image not
    # published yet (or whole: it is named only once complete and synced).
    proc = start(binary, store, mnt)
    try:
        wait_mounted(mnt, proc)
        p4 = f"{mnt}/run/step_4.pt"
        lin.state.step()
        saved4 = sample(lin.state.state_dict())
        data = serialised(lin.state.state_dict())
        fd = os.open(p4, os.O_CREAT | os.O_WRONLY, 0o644)
        for at in range(0, len(data), MiB):
            os.write(fd, data[at:at + MiB])
        os.fsync(fd)  # returns once the version is stored; its image is published after
        proc.send_signal(signal.SIGKILL)
        try:
            os.close(fd)
        except OSError:  # ECONNABORTED: the daemon is gone
            pass
    finally:
        kill9(proc, mnt)
    heads_at_kill = heads_of(store)
    after_crash(binary, ckptctl, store, mnt, hashes, "killed after fsync")
    with mounted(binary, store, mnt):
        info = lin.verify("kill v4", p4, saved4)
        assert info["kind"] == "delta", info
        h4, size4 = sha256(p4), os.path.getsize(p4)
        heads_after = heads_of(store)
    for name in heads_at_kill + heads_after:
        assert name not in heads_after or name.startswith(f"{info['version']:016x}-"), \
            f"a head image of a superseded version kept: {name}"
    for name in heads_after:
        assert os.path.getsize(f"{store}/heads/{name}") == size4, f"incomplete head image {name}"
    with mounted(binary, store, mnt, "heads=off"):
        assert sha256(p4) == h4, "the newest version reads differently through its chain"
    print(f"kill9: killed right after fsync: the version reads back within the bound, the same "
          f"through its chain; head images at the kill {heads_at_kill}, after {heads_after}")


def test_kill9_heads_off(binary, ckptctl, tmp):
    """The same with heads=off, where a stream decodes its base through the chain a slab at a
    time and leaves the written bytes as they are (staging file, no image)."""
    store, mnt = f"{tmp}/kill-off-store", f"{tmp}/kill-off-mnt"
    # cache=64M: the checkpoint is more than half of it, so a stream follows it with heads=off.
    opts = ["heads=off", "cache=64M", "buffer=64M"]
    lin = Lineage(ckptctl, seed=31)
    hashes = {}
    kill_mid_stream(binary, ckptctl, store, mnt, hashes, opts, torch_files(lin))
    assert not heads_of(store), f"heads=off left head images: {heads_of(store)}"
    # Killed right after the fsync of a streamed delta: durable, and the same with images on.
    proc = start(binary, store, mnt, *opts)
    try:
        wait_mounted(mnt, proc)
        p4 = f"{mnt}/run/step_4.pt"
        lin.state.step()
        saved4 = sample(lin.state.state_dict())
        assert write_file(p4, serialised(lin.state.state_dict())) is None
        proc.send_signal(signal.SIGKILL)
    finally:
        kill9(proc, mnt)
    after_crash(binary, ckptctl, store, mnt, hashes, "killed after fsync, heads=off", opts)
    with mounted(binary, store, mnt, *opts):
        info = lin.verify("kill v4, heads=off", p4, saved4)
        assert info["kind"] == "delta", info
        h4 = sha256(p4)
    with mounted(binary, store, mnt):
        assert sha256(p4) == h4, "the version reads differently with head images on"
    print("kill9_heads_off: killed mid-stream and after fsync with heads=off: fsync'ed versions "
          "identical, no .obj.tmp, gc finds nothing, the last delta within the bound")


def dcp_shards(ckptctl, seed):
    """kill_mid_stream's versions as DCP shards (`run/step_K/__0_0.distcp`, scale_lib.write_dcp:
    smallest tensor first), each read back with DCP's reader and checked."""
    st = TrainingState(SIZE, params=2, small=4, seed=seed)
    reads = {}

    def shard(mnt, k):
        if k > 1:
            st.step()
        os.makedirs(f"{mnt}/run/step_{k}", exist_ok=True)
        buf = io.BytesIO()
        meta = write_dcp(buf, st.state_dict(), {"step": k}, clone=True)
        return f"{mnt}/run/step_{k}/__0_0.distcp", buf.getbuffer(), meta

    def save_version(mnt, k):
        path, data, meta = shard(mnt, k)
        saved = sample(flat_tensors(st.state_dict()))
        assert write_file(path, data) is None
        info = stat(ckptctl, path)
        assert info["format"] == "distcp", info
        assert info["kind"] == ("delta" if k > 1 else "keyframe"), info
        read = sample(read_dcp(path, meta))
        check(f"kill dcp v{k}", saved, read, reads.get(info["base"]), info["kind"])
        reads[info["version"]] = read
        return path

    def third(mnt):
        path, data, _ = shard(mnt, 3)
        return path, data
    return save_version, third


def test_kill9_dcp_heads_off(binary, ckptctl, tmp):
    """kill -9 while a DCP shard is streamed with heads=off (its first tensors walked and held,
    then the rest coded as it arrives)."""
    store, mnt = f"{tmp}/kill-dcp-store", f"{tmp}/kill-dcp-mnt"
    opts = ["heads=off", "cache=64M", "buffer=64M"]
    hashes = {}
    kill_mid_stream(binary, ckptctl, store, mnt, hashes, opts, dcp_shards(ckptctl, seed=32))
    assert not heads_of(store), f"heads=off left head images: {heads_of(store)}"
    print("kill9_dcp_heads_off: killed while a DCP shard was streamed with heads=off: fsync'ed "
          "shards identical, no .obj.tmp, gc finds nothing")


def main():
    binary, ckptctl = sys.argv[1], sys.argv[2]
    only = sys.argv[3:] or ["scratch_unusable", "scratch_full", "kill9", "kill9_heads_off",
                            "kill9_dcp_heads_off"]
    torch.set_num_threads(2)
    if os.geteuid() != 0:
        print("SKIPPED: the mount tests run as root")
        sys.exit(77)
    with scratch_dir("ckptfs-scale-faults-") as tmp:
        for name in only:
            t0 = time.monotonic()
            globals()[f"test_{name}"](binary, ckptctl, tmp)
            print(f"  ({name}: {time.monotonic() - t0:.0f} s)", flush=True)
        print("scale_faults: ok")


if __name__ == "__main__":
    main()
