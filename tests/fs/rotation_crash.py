#!/usr/bin/python3
"""kill -9 of the daemon while it rewrites a rotated chain in the background (issue 16's
rotation, DESIGN.md §9: nothing acknowledged is lost), through a real mount.

A ~160 MiB training state (tests/fs/scale_lib.py) is saved as HF Trainer does,
`checkpoint-N/model.pt` (the weights) and `checkpoint-N/optimizer.pt` (Adam's state), each
fsync'ed, and after each save the directories beyond the newest two go (shutil.rmtree). With
`-o reclaim=1` the daemon soon rewrites the oldest kept delta of a lineage as a keyframe, on its
own thread, to free the hidden versions below it. The daemon is killed

  mid_rewrite    while such a rewrite's object is being written (a non-empty *.obj.tmp appears
                 in STORE/objects after a save and its rotation, when no save is running), and
  after_rewrite  right after the daemon logged a rewrite as done (the new keyframe's record
                 written; the hidden versions' objects not yet removed), and
  at random      four times at a moment drawn from 0-2.5 s after a rotation (seeded): the
                 unrefs, the journal's sync, a rewrite or nothing at all.

After each kill and a remount: every kept file reads back byte-identical to what it read as
before the kill (sha256 through the mount); a file a rotation removed is gone or, its
removal not yet durable (nothing fsync'ed its directory; the journal syncs once a second),
back with the bytes it had; no *.obj.tmp is left; `ckptctl gc --dry-run` finds
nothing; `ckptctl verify --deep` is clean; the run goes on (the next save is a delta on the
lineage's newest version). At the end, once the daemon has settled its rotation work, the
weights' lineage (whose hidden versions are always worth a rewrite at reclaim=1) holds its kept
versions only: the rewrite cut short by the first kill was done again after the restart.

Usage: rotation_crash.py CKPTFS CKPTCTL   (as root; Debian's /usr/bin/python3)
"""
import json
import os
import random
import re
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckptfs_testlib import (daemon_log, kill9, mounted, rotate_checkpoints,  # noqa: E402
                            settle_rotation, sha256)
from scale_lib import (MiB, TrainingState, save, scratch_dir, stat, tmp_objects,  # noqa: E402
                       writing_object)

SIZE = 160 * MiB
KEEP = 2
OPTS = ("reclaim=1",)
SAVES = 20  # at most, for all the kills


def rewrites_logged(store):
    try:
        with open(daemon_log(store), errors="replace") as f:
            return len(re.findall(r"rotation: version \d+ rewritten as a keyframe", f.read()))
    except FileNotFoundError:
        return 0


def kept_hashes(root):
    """sha256 of every file under the kept checkpoint directories, as the mount serves it."""
    out = {}
    for d in sorted(os.listdir(root)):
        for name in sorted(os.listdir(f"{root}/{d}")):
            out[f"{d}/{name}"] = sha256(f"{root}/{d}/{name}")
    return out


def ls_json(ckptctl, store):
    r = subprocess.run([ckptctl, "ls", "--json", store], capture_output=True, text=True,
                       check=True)
    return json.loads(r.stdout)


def hidden_by_file(ckptctl, store):
    """file name (model.pt, optimizer.pt) -> its lineage's versions without a name (offline:
    the store must not be mounted)."""
    out = {}
    for lin in ls_json(ckptctl, store).get("lineages", []):
        names = {os.path.basename(p) for v in lin["versions"] for p in v.get("paths", [])}
        for name in names:
            out[name] = [v["version"] for v in lin["versions"] if not v.get("paths")]
    return out


def check_after_crash(binary, ckptctl, store, mnt, expect, seen, label):
    """Remount after a kill -9: kept files identical, a file a rotation removed gone or as it
    was (`seen`: every kept file's hash), nothing half-made, verify clean."""
    assert not os.path.ismount(mnt)
    with mounted(binary, store, mnt, *OPTS):
        assert not tmp_objects(store), f"{label}: *.obj.tmp left after the store was opened"
        got = kept_hashes(f"{mnt}/run")
        back = {k: h for k, h in got.items() if k not in expect}
        got = {k: h for k, h in got.items() if k in expect}
        assert got == expect, f"{label}: kept files changed: " + ", ".join(
            k for k in sorted(set(got) | set(expect)) if got.get(k) != expect.get(k))
        assert all(seen.get(k) == h for k, h in back.items()), \
            f"{label}: files back that were not removed, or with other bytes: {sorted(back)}"
    r = subprocess.run([ckptctl, "gc", "--dry-run", "--json", store], capture_output=True,
                       text=True, check=True)
    gc = json.loads(r.stdout)
    assert gc.get("removed_objects", 0) == 0, f"{label}: gc would remove {gc}"
    r = subprocess.run([ckptctl, "verify", "--deep", store], capture_output=True,
                       text=True)
    assert r.returncode == 0, f"{label}: verify --deep: {r.stdout} {r.stderr}"


def save_step(state, root, k):
    """checkpoint-k/{model,optimizer}.pt, each fsync'ed, then the directory."""
    d = f"{root}/checkpoint-{k}"
    os.makedirs(d)
    sd = state.state_dict()
    save(sd["model"], f"{d}/model.pt")
    save({"optimizer": sd["optimizer"], "step": sd["step"]}, f"{d}/optimizer.pt")
    fd = os.open(root, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


def save_and_rotate(ckptctl, state, root, k):
    """Save k (a delta on each lineage's newest version after the first), then the rotation.
    Returns the kept files' hashes as served."""
    if k > 1:
        state.step()
    save_step(state, root, k)
    for name in ("model.pt", "optimizer.pt"):
        info = stat(ckptctl, f"{root}/checkpoint-{k}/{name}")
        assert info["kind"] == ("delta" if k > 1 else "keyframe"), f"save {k} {name}: {info}"
    rotate_checkpoints(root, KEEP)
    return kept_hashes(root)


def watch(store, want, before):
    """Waits (up to 6 s: the unrefs follow the journal sync, the rewriter looks once a second)
    for the moment to kill: a rewrite's object being written, a rewrite logged done, or (a
    number) that many seconds after the rotation, whatever the daemon is doing then."""
    if isinstance(want, float):
        time.sleep(want)
        return True
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        if want == "mid_rewrite" and writing_object(store):
            return True
        if want == "after_rewrite" and rewrites_logged(store) > before:
            return True
        time.sleep(0.002)
    return False


def main():
    binary, ckptctl = sys.argv[1], sys.argv[2]
    if os.geteuid() != 0:
        print("SKIPPED: the mount tests run as root")
        sys.exit(77)
    torch.set_num_threads(2)
    state = TrainingState(SIZE, params=2, small=4, seed=40)
    with scratch_dir("ckptfs-rotation-crash-") as tmp:
        store, mnt = f"{tmp}/store", f"{tmp}/mnt"
        k = 0
        seen = {}  # every file a rotation kept, as it read then (none is ever rewritten)
        rng = random.Random(7)
        for want in ["mid_rewrite", "after_rewrite"] + [rng.uniform(0, 2.5) for _ in range(4)]:
            with mounted(binary, store, mnt, *OPTS) as proc:
                root = f"{mnt}/run"
                os.makedirs(root, exist_ok=True)
                while True:
                    k += 1
                    assert k <= SAVES, f"no rewrite to kill ({want}) in {SAVES} saves"
                    before = rewrites_logged(store)
                    expect = save_and_rotate(ckptctl, state, root, k)
                    seen.update(expect)
                    # Nothing but the rotation work runs now: the saves are fsync'ed.
                    if watch(store, want, before):
                        kill9(proc, mnt)
                        break
                    settle_rotation(ckptctl, mnt, store)
            label = f"{want:.2f} s after the rotation" if isinstance(want, float) else want
            print(f"rotation_crash: killed {label} after save {k}", flush=True)
            check_after_crash(binary, ckptctl, store, mnt, expect, seen, label)
        # The run goes on, and the rotation work cut short is done. With reclaim=1 a hidden
        # version of the weights' lineage is always worth its rewrite (its keyframe costs what
        # a rewrite writes): once settled, that lineage holds its kept versions only. (Adam's
        # state is not: its exact m makes a rewrite cost more than its hidden deltas for
        # several saves.)
        with mounted(binary, store, mnt, *OPTS):
            root = f"{mnt}/run"
            k += 1
            expect = save_and_rotate(ckptctl, state, root, k)
            s = settle_rotation(ckptctl, mnt, store)
            assert kept_hashes(root) == expect
        hidden = hidden_by_file(ckptctl, store)
        assert hidden.get("model.pt") == [], f"the weights' hidden versions were not freed: {hidden}"
        print(f"rotation_crash: ok: {k} saves, every kill survived; after the last restart "
              f"{s['rotation']['rewrites']} rewrite(s); hidden versions left {hidden}")


if __name__ == "__main__":
    main()
