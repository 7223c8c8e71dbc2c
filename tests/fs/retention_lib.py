"""Helpers of the retention tests (tests/fs/retention.py): real torch checkpoints written through
a mount in two lineages, ckptctl runs, and the checks every prune must pass.

Run under Debian's /usr/bin/python3 (torch)."""
import json
import os
import shutil
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckptfs_testlib import du, sha256  # noqa: E402

# Two lineages with different tensor signatures: an MLP with Adam (~3 MiB a checkpoint) and a
# small CNN with SGD + momentum (~1 MiB).
LINEAGES = {
    "run_a": "step_{:03d}.pt",
    "run_b": "ckpt/model_{:03d}.pt",
}


class Trainer:
    """Trains two tiny models a little between saves, so consecutive checkpoints differ like a
    real run's (small deltas in weights and optimizer state)."""

    def __init__(self, seed=0):
        torch.manual_seed(seed)
        torch.set_num_threads(1)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                       torch.nn.Linear(512, 256))
        self.mlp_opt = torch.optim.Adam(self.mlp.parameters(), lr=1e-3)
        self.cnn = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(),
                                       torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(),
                                       torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                       torch.nn.Linear(64, 10))
        self.cnn_opt = torch.optim.SGD(self.cnn.parameters(), lr=1e-2, momentum=0.9)
        self.step = 0

    def train(self):
        self.step += 1
        x = torch.randn(32, 256)
        loss = (self.mlp(x) - x).pow(2).mean()
        self.mlp_opt.zero_grad()
        loss.backward()
        self.mlp_opt.step()
        img = torch.randn(8, 3, 16, 16)
        loss = torch.nn.functional.cross_entropy(self.cnn(img), torch.randint(0, 10, (8,)))
        self.cnn_opt.zero_grad()
        loss.backward()
        self.cnn_opt.step()

    def state(self, lineage):
        if lineage == "run_a":
            return {"model": self.mlp.state_dict(), "optimizer": self.mlp_opt.state_dict(),
                    "step": self.step}
        return {"model": self.cnn.state_dict(), "optimizer": self.cnn_opt.state_dict(),
                "epoch": self.step // 10, "step": self.step}


def objects(store):
    return set(os.listdir(os.path.join(store, "objects")))


def read(path):
    with open(path, "rb") as f:
        return f.read()


def save_version(trainer, mnt, store, lineage, index, record):
    """Trains a step, saves lineage's checkpoint `index` through the mount, waits for its commit
    (a read waits for it) and records its sha256 and its new object file."""
    trainer.train()
    rel = f"{lineage}/" + LINEAGES[lineage].format(index)
    path = os.path.join(mnt, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    before = objects(store)
    torch.save(trainer.state(lineage), path)
    record["sha"][rel] = sha256(path)  # waits for the commit: what it reads as from now on
    new = sorted(objects(store) - before)
    assert len(new) == 1, f"{rel}: expected one new object, got {new}"
    record["object"][rel] = new[0]
    record["order"].append(rel)
    return rel


def generate(mnt, store, per_lineage, pause_after=None, pause=3.0, seed=0):
    """Writes `per_lineage` versions of each lineage, interleaved, through the mount at `mnt`.
    With pause_after=k: after the k-th version of each lineage, waits `pause` seconds (versions
    on both sides of the pause differ in age by at least that). Also writes two exact files.
    Returns {"sha": {rel: sha256}, "object": {rel: object file}, "order": [rel...] (completion
    order), "t_pause": (end of the first batch, start of the second) or None}."""
    trainer = Trainer(seed)
    record = {"sha": {}, "object": {}, "order": [], "t_pause": None}
    for i in range(per_lineage):
        for lineage in LINEAGES:
            save_version(trainer, mnt, store, lineage, i, record)
        if pause_after is not None and i + 1 == pause_after:
            t1 = time.time()
            time.sleep(pause)
            record["t_pause"] = (t1, time.time())
    for rel, text in (("run_a/config.json", '{"lr": 0.001}\n'), ("notes.txt", "exact bytes\n")):
        before = objects(store)
        with open(os.path.join(mnt, rel), "w") as f:
            f.write(text)
        record["sha"][rel] = sha256(os.path.join(mnt, rel))
        new = sorted(objects(store) - before)
        assert len(new) == 1, f"{rel}: expected one new object, got {new}"
        record["object"][rel] = new[0]
    return record


def copy_store(src, dst):
    """A copy of an unmounted store (its lock, socket and pid file are not copied)."""
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("control.sock", "ckptfs.pid", "lock"))


class Ctl:
    """Runs build/bin/ckptctl and checks its exit status."""

    def __init__(self, binary):
        self.binary = binary

    def run(self, *args, rc=0, timeout=240):
        r = subprocess.run([self.binary, *args], capture_output=True, text=True, timeout=timeout)
        if rc is not None and r.returncode != rc:
            raise AssertionError(f"ckptctl {' '.join(args)}: exit {r.returncode}, expected {rc}\n"
                                 f"stdout: {r.stdout}\nstderr: {r.stderr}")
        return r

    def json(self, *args, rc=0):
        r = self.run(*args, "--json", rc=rc)
        return json.loads(r.stdout)

    def ls(self, *target):
        return self.json("ls", *target)


def live_versions(ls):
    """path -> version entry, for every name of every live version of an `ls --json` answer."""
    out = {}
    for lineage in ls["lineages"]:
        for v in lineage["versions"]:
            for p in v["paths"]:
                out[p] = v
    for v in ls["files"]:
        for p in v["paths"]:
            out[p] = v
    return out


def all_versions(ls):
    """version id -> entry, live and hidden."""
    out = {}
    for lineage in ls["lineages"]:
        for v in lineage["versions"]:
            out[v["version"]] = v
    for v in ls["files"]:
        out[v["version"]] = v
    return out


def expected_kept(ls, lineage_ids, keep_last=None, keep_every=None, keep_newer_than=None,
                  now=None):
    """The paths a prune keeps in the given lineages, by the rules of docs/management.md,
    computed from an `ls --json` taken before it."""
    kept = set()
    for lineage in ls["lineages"]:
        if lineage["lineage"] not in lineage_ids:
            continue
        live = [v for v in lineage["versions"] if v["live"]]
        live.sort(key=lambda v: v["version"])
        for i, v in enumerate(live):
            keep = ((keep_last and i + keep_last >= len(live)) or
                    (keep_every and i % keep_every == 0) or
                    (keep_newer_than is not None and now - v["created"] < keep_newer_than))
            if keep:
                kept.update(v["paths"])
    return kept


def lineage_of(ls, rel):
    return live_versions(ls)[rel]["lineage"]


def mount_files(mnt):
    out = set()
    for root, _, files in os.walk(mnt):
        for f in files:
            out.add(os.path.relpath(os.path.join(root, f), mnt))
    return out


def needed_versions(before_ls, kept, lineage_ids):
    """Versions of the given lineages a prune keeping the paths `kept` must keep stored: the kept
    versions and the chains of bases they decode from (the oldest kept one is rewritten as a
    keyframe, so its chain is not needed), plus the lineage's head and its chain (the base of
    the lineage's next delta, kept as a hidden base when its names are gone)."""
    versions = all_versions(before_ls)
    needed = set()
    for lineage in before_ls["lineages"]:
        if lineage["lineage"] not in lineage_ids:
            continue
        mine = sorted(v["version"] for v in lineage["versions"])
        keep = sorted(v["version"] for v in lineage["versions"] if set(v["paths"]) & kept)

        def chain(v):
            while v and v not in needed:
                needed.add(v)
                v = versions[v]["base"] if versions[v]["kind"] == "delta" else 0

        if keep:
            needed.add(keep[0])  # rewritten as a keyframe if it was a delta
            for v in keep[1:]:
                chain(v)
        chain(mine[-1])
    return needed


def lineage_versions(ls, lineage_ids):
    return {v for l in ls["lineages"] if l["lineage"] in lineage_ids for v in
            (x["version"] for x in l["versions"])}


def wait_reclaimed(ctl, target, lineage_ids, needed, timeout=30):
    """Live, a removed version's data is released once the kernel has forgotten its inode
    (FORGET) and the journal synced: waits until the lineages store exactly `needed`. Returns
    the last `ls --json` of `target`."""
    deadline = time.time() + timeout
    while True:
        ls = ctl.ls(target)
        have = lineage_versions(ls, lineage_ids)
        if have == needed or time.time() > deadline:
            return ls
        time.sleep(0.2)


def check_prune(ctl, mnt, store, record, before_ls, after_ls, result, kept, pruned_lineages,
                du_before, live):
    """The invariants of a finished prune (mounted at `mnt` now):
    - the lineages pruned keep exactly `kept`; every other file is untouched;
    - pruned names are gone from the mount's listing and from lookups at once (live: the kernel
      was told), and from `ls`;
    - every remaining file reads back with the sha256 it had before;
    - the oldest kept version of each pruned lineage is a keyframe (it was rewritten if it was a
      delta); verify --deep is clean;
    - a removed version's data goes once nothing needs it (at once offline; live, once the kernel
      forgot the inode): the lineages store exactly the kept versions, their bases and the head;
    - the objects directory shrank by at least the stored bytes of the versions that are gone
      minus what the rewritten keyframes added."""
    before = live_versions(before_ls)
    after = live_versions(after_ls)
    in_pruned = {p for p, v in before.items() if v["lineage"] in pruned_lineages}
    removed = in_pruned - kept
    expect_names = (set(before) - removed)
    assert set(after) == expect_names, (
        f"ls after prune: unexpected {sorted(set(after) - expect_names)}, "
        f"missing {sorted(expect_names - set(after))}")
    for p in removed:
        assert not os.path.exists(os.path.join(mnt, p)), f"{p} still visible after prune"
    files = mount_files(mnt)
    assert files == expect_names, (f"mount after prune: unexpected {sorted(files - expect_names)},"
                                   f" missing {sorted(expect_names - files)}")
    reported = {x["path"] for l in result["lineages"] for x in l["removed"]}
    assert reported == removed, f"prune reported {sorted(reported)}, removed {sorted(removed)}"
    for p in sorted(expect_names):
        assert sha256(os.path.join(mnt, p)) == record["sha"][p], f"{p} changed after prune"
    # Oldest kept of each pruned lineage: a keyframe now.
    for lid in pruned_lineages:
        remaining = sorted((v for v in after.values() if v["lineage"] == lid),
                           key=lambda v: v["version"])
        if remaining:
            st = ctl.json("stat", os.path.join(mnt, remaining[0]["paths"][0]))
            assert st["kind"] == "keyframe", (
                f"oldest kept {remaining[0]['paths']} is {st['kind']}")
    # Space: what nothing needs is gone.
    needed = needed_versions(before_ls, kept, pruned_lineages)
    t0 = time.time()
    final_ls = wait_reclaimed(ctl, mnt, pruned_lineages, needed, timeout=30 if live else 0)
    waited = time.time() - t0
    have = lineage_versions(final_ls, pruned_lineages)
    assert have == needed, (f"stored versions after prune: {sorted(have)}, expected "
                            f"{sorted(needed)} (kept, their bases, the heads)")
    ctl.run("verify", "--deep", mnt)
    vb, va = all_versions(before_ls), all_versions(final_ls)
    gone = [v for v in vb if v not in va]
    gone_bytes = sum(vb[v]["stored_bytes"] for v in gone)
    rekeyed = result["rekeyed"]
    grown = sum(max(0, va[v]["stored_bytes"] - vb[v]["stored_bytes"]) for v in rekeyed if v in va)
    bound = gone_bytes - grown - 4096 * (len(rekeyed) + 1)
    du_after = du(os.path.join(store, "objects"))
    assert du_before - du_after >= bound, (
        f"objects shrank by {du_before - du_after} B, expected at least {bound} B "
        f"({len(gone)} versions gone storing {gone_bytes} B, keyframes grew {grown} B)")
    mode = "live" if live else "offline"
    return (f"{mode}: kept {len(kept)}, removed {len(removed)}, {len(gone)} versions gone "
            f"(after {waited:.1f} s), objects -{(du_before - du_after) >> 10} KiB "
            f"(bound {max(bound, 0) >> 10} KiB, reported freed {result['freed_bytes'] >> 10} KiB)")
