#!/usr/bin/python3
"""Streaming writes through a real mount (docs/filesystem.md, "Streaming writes"): torch.save
files larger than head_min, and DCP shards, are delta-coded while they are written.

  same      The same training run (a ~48 MiB state: weights, Adam's exp_avg and exp_avg_sq, small
            tensors; tests/fs/scale_lib.py) saved into two mounts, one streaming (the default)
            and one with -o stream=off: every version is stored the same way (keyframe, then
            deltas on its predecessor) and reads back byte for byte the same from both mounts,
            also after a remount, within the closed-loop bound of what was saved; `ckptctl stat`
            reports the relative L2 error of each tensor and class of the last version as
            torch.load reads it against what was written. Saves cover
            torch.save + fsync, a plain close (read back at once: the read waits for the
            commit), and a save under a temporary name renamed into place. `ckptctl status`
            says every save of the streaming mount was stored while written, none of the other.
            Then the same with -o heads=off,cache=64M on both mounts: without head images a
            checkpoint larger than half the cache is streamed too (its base decoded through its
            chain), with the same result.
  dcp       DCP shards (a byte item, then every tensor of the same ~48 MiB state as its own
            torch.save, smallest first as DCP writes on GPU: the step counter first) saved over 4
            steps into both mounts, the third under a temporary directory name renamed into place: the same
            kinds (keyframe, then deltas), the same served bytes from both mounts (also after a
            remount), every slice loads within the closed-loop bound, and status says the
            streaming mount stored every shard while it was written, the other none. Then the
            same with -o heads=off,cache=64M,buffer=16M: a shard larger than half the cache is
            streamed too, once its walked tensors pass that size (the bytes past buffer= waiting
            in the staging file meanwhile).
  rewrite   A checkpoint written whole and then changed inside a tensor the stream had already
            read (seek back, write, fsync): the stream's work is dropped (status: 1 redone) and
            the file is stored as its buffer held it: the rewritten elements read back as the new
            values, the others (already replaced by their reconstruction, as after a commit)
            within three times the closed-loop bound of what was first written.
  unlink    A file unlinked half-way through its write (still open), then written to the end
            and closed: its stream stops at the unlink (status: none running before the close),
            the daemon carries on, and the next save of the run is still a delta on the last
            stored version.
  declined  A 12 MiB checkpoint (over the 8 MiB at which a stream starts, under head_min=16M):
            stored at its commit; `ckptctl status` counts it as declined and says why.
  flow      A checkpoint six times buffer= saved twice: the writer waits for its stream
            instead of spilling raw bytes, so the daemon writes the delta's file about once (its
            head image; /proc/PID/io wchar at most 1.35x the file, where raw spills and the
            reconstruction written over them made it 1.84x), both versions are streamed
            and read back within the closed-loop bound.

Usage: streaming.py CKPTFS CKPTCTL
"""
import io
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckptfs_testlib import MIN_TENSOR, mounted, sha256, status_json  # noqa: E402
from scale_lib import (MiB, TrainingState, check, flat_tensors, proc_io, read_dcp,  # noqa: E402
                       sample, scratch_dir, stat, wait_published, write_dcp)

OPTS = ("head_min=16M", "cache=512M", "buffer=64M")


def status(ctl, mnt):
    return status_json(ctl, mnt)["streams"]


def save(state, path, how):
    if how == "fsync":
        with open(path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
    elif how == "close":
        with open(path, "wb") as f:
            torch.save(state, f)
    else:  # "rename": torch.save under a temporary name, then into place
        tmp = os.path.join(os.path.dirname(path), ".tmp-" + os.path.basename(path))
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)


def check_fidelity(ctl, path, written):
    """`ckptctl stat` reports each lossy tensor's relative L2 error against what was written, and
    per class the error of the class's tensors together: both match what torch.load reads."""
    info = stat(ctl, path)
    assert info["kind"] == "delta", info["kind"]
    read = flat_tensors(torch.load(path))
    want = flat_tensors(written)
    sums = {}
    lossy = 0
    for t in info["tensors"]:
        u, r = want[t["name"]].double(), read[t["name"]].double()
        err, ref = float(((r - u) ** 2).sum()), float((u ** 2).sum())
        if t["mode"] == "lossless":
            assert t["rel_error"] == 0 and err == 0, t
            continue
        lossy += 1
        assert abs(t["rel_error"] - (err / ref) ** 0.5) <= 1e-6 + 1e-3 * t["rel_error"], (t, err, ref)
        cls = t["name"].rsplit(".", 1)[-1]
        cls = cls if cls in ("exp_avg", "exp_avg_sq") else "weights"
        e, f = sums.get(cls, (0.0, 0.0))
        sums[cls] = (e + err, f + ref)
    assert lossy > 0
    got = {c["class"]: c["rel_error"] for c in info["fidelity"]}
    assert got.keys() == sums.keys(), (got, sums.keys())
    for cls, (e, f) in sums.items():
        assert abs(got[cls] - (e / f) ** 0.5) <= 1e-6 + 1e-3 * got[cls], (cls, got[cls], e, f)
    print("fidelity:", ", ".join(f"{c} {v:.3%}" for c, v in sorted(got.items())))


def same(binary, ctl, work, extra=(), read_each=True):
    """`extra`: options of both mounts (heads=off with a cache that does not keep a version: a
    stream follows it too). read_each=False: every version is read after the last save, so that
    reads do not leave the next save's base in the cache (it is decoded through its chain)."""
    state = TrainingState(48 * MiB, params=3, small=6, seed=5)
    hows = ["fsync", "fsync", "close", "rename", "fsync"]
    mounts = {"on": OPTS + extra, "off": OPTS + extra + ("stream=off",)}
    served, kinds = {m: [] for m in mounts}, {m: [] for m in mounts}
    saved = []
    for k, how in enumerate(hows):
        if k:
            state.step()
        saved.append(sample(state.state_dict()))
    for m, opts in mounts.items():
        st = TrainingState(48 * MiB, params=3, small=6, seed=5)
        store, mnt = f"{work}/{m}{''.join(extra)}-store", f"{work}/{m}{''.join(extra)}-mnt"
        with mounted(binary, store, mnt, *opts):
            os.makedirs(f"{mnt}/run")
            for k, how in enumerate(hows):
                if k:
                    st.step()
                path = f"{mnt}/run/step_{k}.pt"
                save(st.state_dict(), path, how)
                if read_each:
                    served[m].append(sha256(path))  # a read after close waits for the commit
                else:
                    with open(path, "rb") as f:  # waits for the commit, decodes no tensor
                        f.read(1)
                kinds[m].append(stat(ctl, path)["kind"])
                if k == len(hows) - 1:
                    check_fidelity(ctl, path, st.state_dict())
            if not read_each:
                served[m] = [sha256(f"{mnt}/run/step_{k}.pt") for k in range(len(hows))]
            s = status(ctl, mnt)
            want = len(hows) if m == "on" else 0
            assert s["used"] == want and s["dropped"] == 0 and s["declined"] == 0, \
                f"stream={m} {extra}: {s}, want {want}"
            read = [sample(torch.load(f"{mnt}/run/step_{k}.pt")) for k in range(len(hows))]
        for k in range(len(hows)):
            check(f"stream={m} v{k}", saved[k], read[k], read[k - 1] if k else None, kinds[m][k])
        with mounted(binary, store, mnt, *opts):  # after a remount: the same bytes
            for k in range(len(hows)):
                assert sha256(f"{mnt}/run/step_{k}.pt") == served[m][k], f"stream={m} v{k} remount"
    assert kinds["on"] == ["keyframe"] + ["delta"] * (len(hows) - 1), kinds
    assert kinds["on"] == kinds["off"]
    for k in range(len(hows)):
        assert served["on"][k] == served["off"][k], f"v{k}: streamed and not: different bytes"
    print(f"same {' '.join(extra)}: {len(hows)} versions, {kinds['on']}, identical with and "
          f"without streaming")


def save_dcp(path, state, step):
    """A DCP shard of `state` (scale_lib.write_dcp, smallest first), fsync'ed; its metadata."""
    with open(path, "wb") as f:
        meta = write_dcp(f, state, {"step": step, "lr": 1e-3}, clone=True)
        f.flush()
        os.fsync(f.fileno())
    return meta


def dcp(binary, ctl, work, extra=(), read_each=True):
    """`extra` and `read_each` as in same()."""
    mounts = {"on": OPTS + extra, "off": OPTS + extra + ("stream=off",)}
    steps, temp_step = 4, 2
    served, kinds = {m: [] for m in mounts}, {m: [] for m in mounts}
    saved, metas = [], []
    for m, opts in mounts.items():
        st = TrainingState(48 * MiB, params=3, small=6, seed=7)
        store, mnt = f"{work}/dcp-{m}{''.join(extra)}-store", f"{work}/dcp-{m}{''.join(extra)}-mnt"
        with mounted(binary, store, mnt, *opts):
            for k in range(steps):
                if k:
                    st.step()
                final = f"{mnt}/dcp/step_{k}"
                where = f"{mnt}/dcp/.tmp-q81x" if k == temp_step else final
                os.makedirs(where)
                meta = save_dcp(f"{where}/__0_0.distcp", st.state_dict(), k)
                if where != final:
                    os.rename(where, final)
                if m == "on":
                    saved.append(sample(flat_tensors(st.state_dict())))
                    metas.append(meta)
                path = f"{final}/__0_0.distcp"
                if read_each:
                    served[m].append(sha256(path))
                else:
                    with open(path, "rb") as f:  # waits for the commit, decodes no tensor
                        f.read(1)
                info = stat(ctl, path)
                assert info["format"] == "distcp", info["format"]
                kinds[m].append(info["kind"])
            if not read_each:
                served[m] = [sha256(f"{mnt}/dcp/step_{k}/__0_0.distcp") for k in range(steps)]
            s = status(ctl, mnt)
            want = steps if m == "on" else 0
            assert s["used"] == want and s["dropped"] == 0 and s["declined"] == 0, \
                f"dcp stream={m} {extra}: {s}, want {want} used"
            read = [sample(read_dcp(f"{mnt}/dcp/step_{k}/__0_0.distcp", metas[k]))
                    for k in range(steps)]
        for k in range(steps):
            check(f"dcp stream={m} v{k}", saved[k], read[k], read[k - 1] if k else None,
                  kinds[m][k])
        with mounted(binary, store, mnt, *opts):
            for k in range(steps):
                assert sha256(f"{mnt}/dcp/step_{k}/__0_0.distcp") == served[m][k], \
                    f"dcp stream={m} v{k} remount"
    assert kinds["on"] == ["keyframe"] + ["delta"] * (steps - 1), kinds
    assert kinds["on"] == kinds["off"], kinds
    for k in range(steps):
        assert served["on"][k] == served["off"][k], f"dcp v{k}: streamed and not: different bytes"
    print(f"dcp {' '.join(extra)}: {steps} shards, {kinds['on']}, identical with and without "
          f"streaming")


def rewrite(binary, ctl, work):
    state = TrainingState(48 * MiB, params=3, small=6, seed=6)
    store, mnt = f"{work}/rw-store", f"{work}/rw-mnt"
    with mounted(binary, store, mnt, *OPTS):
        save(state.state_dict(), f"{mnt}/a.pt", "fsync")
        state.step()
        sd = state.state_dict()
        # The largest weight (not Adam's state: ratio-coded exp_avg_sq has other bounds).
        name, big = max(((n, t) for n, t in flat_tensors(sd).items()
                         if t.is_floating_point() and "exp_avg" not in n),
                        key=lambda x: x[1].numel())
        base = flat_tensors(torch.load(f"{mnt}/a.pt"))[name]
        buf = io.BytesIO()
        torch.save(sd, buf)
        raw = buf.getvalue()
        # The tensor's bytes in the archive: find its first 64 bytes.
        at = raw.find(big.reshape(-1)[:16].numpy().tobytes())
        assert at > 0
        patch = torch.full((1024,), 7.5).numpy().tobytes()
        # The float tensors the stream codes (the mount's -o min_tensor).
        coded = sum(t.numel() * t.element_size() for t in flat_tensors(sd).values()
                    if t.is_floating_point() and t.numel() * t.element_size() >= MIN_TENSOR)
        before = status(ctl, mnt)["coded_bytes"]
        with open(f"{mnt}/b.pt", "wb") as f:
            f.write(raw)
            f.flush()
            # Once the stream has coded every tensor, rewrite bytes it read.
            deadline = time.monotonic() + 60
            while status(ctl, mnt)["coded_bytes"] < before + coded:
                assert time.monotonic() < deadline, "the stream did not code the file"
                time.sleep(0.05)
            f.seek(at)
            f.write(patch)
            f.flush()
            os.fsync(f.fileno())
        s = status(ctl, mnt)
        assert s["dropped"] == 1 and s["used"] == 1, s
        got = flat_tensors(torch.load(f"{mnt}/b.pt"))[name].reshape(-1)
        assert stat(ctl, f"{mnt}/b.pt")["kind"] == "delta"
        assert float((got[:1024] - 7.5).abs().max()) < 1.5, got[:8]
        # The rest: the stream's reconstruction, coded once more against the same base, so within
        # three times the closed-loop bound of what was written: |got - u| <= 3 |u - base|.
        u = big.reshape(-1)[1024:].double()
        b = base.reshape(-1)[1024:].double()
        bad = int(((got[1024:].double() - u).abs() > 3 * (u - b).abs() + 1e-6).sum())
        assert bad == 0, f"{bad} elements outside the bound"
    print("rewrite: the stream's work dropped, the rewritten elements stored")


def unlink(binary, ctl, work):
    state = TrainingState(48 * MiB, params=3, small=6, seed=7)
    store, mnt = f"{work}/ul-store", f"{work}/ul-mnt"
    with mounted(binary, store, mnt, *OPTS) as proc:
        save(state.state_dict(), f"{mnt}/step_1.pt", "fsync")
        state.step()
        buf = io.BytesIO()
        torch.save(state.state_dict(), buf)
        raw = buf.getvalue()
        with open(f"{mnt}/step_2.pt", "wb") as f:
            f.write(raw[: len(raw) // 2])
            f.flush()
            deadline = time.monotonic() + 30
            while status(ctl, mnt)["running"] != 1:
                assert time.monotonic() < deadline, "no stream follows the file"
                time.sleep(0.05)
            os.unlink(f"{mnt}/step_2.pt")
            # Unlinked while still open for writing: the stream stops at once, not at the close.
            while status(ctl, mnt)["running"] != 0:
                assert time.monotonic() < deadline, "the unlinked file's stream still runs"
                time.sleep(0.05)
            f.write(raw[len(raw) // 2:])
        assert proc.poll() is None
        state.step()
        save(state.state_dict(), f"{mnt}/step_3.pt", "fsync")
        info = stat(ctl, f"{mnt}/step_3.pt")
        assert info["kind"] == "delta" and info["base"] == stat(ctl, f"{mnt}/step_1.pt")["version"], info
    print("unlink: stream cancelled, the next save a delta on the last stored version")


def declined(binary, ctl, work):
    """A checkpoint a stream starts to follow (over 8 MiB) whose tensors stay below head_min:
    stored at its commit, and `ckptctl status` says why, in JSON and in text."""
    state = TrainingState(12 * MiB, params=2, small=4, seed=8)
    store, mnt = f"{work}/dc-store", f"{work}/dc-mnt"
    with mounted(binary, store, mnt, *OPTS):
        save(state.state_dict(), f"{mnt}/small.pt", "fsync")
        s = status(ctl, mnt)
        assert s["used"] == 0 and s["declined"] == 1, s
        assert s["last_declined"] == "smaller than head_min", s
        text = subprocess.run([ctl, "status", mnt], check=True, capture_output=True,
                              text=True).stdout
        assert "1 file left to the commit by its stream (the last: smaller than head_min)" \
            in text, text
        assert stat(ctl, f"{mnt}/small.pt")["kind"] == "keyframe"
    print("declined: a checkpoint below head_min stored at its commit, status says why")


def daemon_written(pid):
    return proc_io(pid)["wchar"]


def flow(binary, ctl, work):
    state = TrainingState(384 * MiB, params=4, small=6, seed=9)
    store, mnt = f"{work}/flow-store", f"{work}/flow-mnt"
    saved, read, kinds = [], [], []
    with mounted(binary, store, mnt, *OPTS) as proc:
        os.makedirs(f"{mnt}/run")
        for k in range(2):
            if k:
                state.step()
                # The keyframe's head image published, off the delta's count.
                wait_published(store, stat(ctl, f"{mnt}/run/step_{k - 1}.pt")["version"])
            saved.append(sample(state.state_dict()))
            path = f"{mnt}/run/step_{k}.pt"
            before = daemon_written(proc.pid)
            save(state.state_dict(), path, "fsync")
            written = daemon_written(proc.pid) - before
            size = os.path.getsize(path)
            kinds.append(stat(ctl, path)["kind"])
            print(f"flow: v{k} {kinds[-1]}, daemon wrote {written / size:.2f}x the file")
            if k:
                assert written <= 1.35 * size, f"the delta's save wrote {written / size:.2f}x"
        s = status(ctl, mnt)
        assert s["used"] == 2 and s["dropped"] == 0, s
        read = [sample(torch.load(f"{mnt}/run/step_{k}.pt")) for k in range(2)]
    assert kinds == ["keyframe", "delta"], kinds
    for k in range(2):
        check(f"flow v{k}", saved[k], read[k], read[k - 1] if k else None, kinds[k])


def main():
    binary, ctl = sys.argv[1], sys.argv[2]
    with scratch_dir("ckptfs-streaming-") as work:
        flow(binary, ctl, work)
        same(binary, ctl, work)
        # 48 MiB of tensors, over half of what cache=64M leaves reconstructions.
        same(binary, ctl, work, ("heads=off", "cache=64M"), read_each=False)
        dcp(binary, ctl, work)
        # Past buffer=16M while the stream walks: the newest chunks go to the staging file.
        dcp(binary, ctl, work, ("heads=off", "cache=64M", "buffer=16M"), read_each=False)
        rewrite(binary, ctl, work)
        unlink(binary, ctl, work)
        declined(binary, ctl, work)


if __name__ == "__main__":
    main()
