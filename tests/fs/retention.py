#!/usr/bin/python3
"""Retention and management tools (issue 5) through a real mount, with real torch checkpoints in
two lineages (an MLP with Adam under run_a/, a CNN with SGD under run_b/ckpt/). One scenario per
run; each mounts fresh stores under a temporary directory and always unmounts.

  prune_policies  30 versions (15 per lineage, a 5 s pause after the 10th of each); prune with
                  --keep-last, --keep-every, --keep-newer-than and all three together (after a
                  --dry-run that changes nothing), each live and offline, selecting lineages by a
                  file, a directory, the mount root, the store directory and --store paths.
                  After each: the kept set is exactly the policy's, every kept version reads
                  back with its sha256 from before, pruned names are gone from the mount at once
                  (lookups too: the kernel's dentries were dropped), the oldest kept version of
                  each pruned lineage is a keyframe, verify --deep is clean, and the objects
                  directory shrank by at least the stored bytes of the versions that are gone
                  minus what the rewritten keyframes added.
  rm_export       export of every file (live, through the mount; offline, by the store) equals
                  reading it through the mount; export errors; rm live and offline (a bad name
                  among good ones: exit 1, the others removed); rm leaves hidden bases that a
                  later prune --keep-last 1 reclaims.
  verify_damage   verify (live and offline, plain and --deep) is clean on a good store; a flipped
                  bit, a truncated object and a missing object are each found, named by path
                  (dependents included, the other lineage not), exit 1; an orphan object is not
                  damage: offline tools leave it to gc, the daemon removes it when it opens the
                  store (not when the journal's tail was dropped: then it stays for gc).
  concurrent      a training process keeps saving new versions through the mount while prune,
                  gc and verify run over and over: no error, no lost version, everything reads
                  back as it did right after it was written.
  crash           kill -9 of the daemon in the middle of a prune (twice, at different moments),
                  and kill -9 of an offline prune: after remount, verify --deep is clean, every
                  file present reads back identical, every version the policy keeps is there;
                  the prune then completes.
  cli             exit codes (2 usage errors, 1 failures), messages for unknown paths, paths
                  outside ckptfs, offline use of a mounted store (names the daemon's pid and
                  mount point), --help of every command, --json, relative paths from a cwd in the
                  mount, progress on a terminal only, a daemon without its control socket;
                  stat shows -o weight_error and grid_error as -o takes them.
  status          `ckptctl status` on a live mount (-o cache=192M,buffer=16M,head_min=1M): the
                  budget is cache + buffer + 512 MiB, VmRSS/VmHWM agree with /proc, the head
                  image of the large lineage is published and its bytes are the image file's,
                  a file held open past buffer= shows as 16 MiB in memory and the rest spilled
                  (gone once it is stored), no commit is left counted; `ckptctl ls` counts the
                  head bytes in its totals and ratios (also offline, from the image files);
                  without a daemon, status says nothing is held and exits 1.

Usage: retention.py SCENARIO CKPTFS CKPTCTL   (as root; Debian's /usr/bin/python3)
"""
import fcntl
import json
import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckptfs_testlib import _live, daemon_log, du, require_fuse, sha256  # noqa: E402
from ckptfs_testlib import mounted as mounted_with_rotation  # noqa: E402
from retention_lib import (LINEAGES, Ctl, Trainer, all_versions, check_prune,  # noqa: E402
                           copy_store, expected_kept, generate, lineage_of, live_versions,
                           mount_files, save_version)


def mounted(binary, store, mnt, *opts, **kw):
    """The daemon without its rotation rewriter (-o reclaim=0): these scenarios check what the
    management commands do, to the byte, and a background rewrite after their deletions would
    be counted as theirs. Rotation has its own test (rotation.py)."""
    return mounted_with_rotation(binary, store, mnt, "reclaim=0", *opts, **kw)


def kill9(proc, mnt):
    """SIGKILL the daemon and detach its dead mount."""
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    subprocess.run(["fusermount3", "-uz", mnt], check=False, stderr=subprocess.DEVNULL)
    _live.pop(mnt, None)


def objects_du(store):
    return du(os.path.join(store, "objects"))


# ---- prune_policies --------------------------------------------------------------------------

def scenario_prune_policies(ckptfs, ctl, tmp):
    base, mnt = f"{tmp}/base", f"{tmp}/mnt"
    with mounted(ckptfs, base, mnt, "keyframe_interval=6"):
        record = generate(mnt, base, 15, pause_after=10, pause=5.0)
        base_ls = ctl.ls(mnt)
    la = lineage_of(base_ls, "run_a/step_000.pt")
    lb = lineage_of(base_ls, "run_b/ckpt/model_000.pt")
    assert la != lb, "the two models must be two lineages"
    second_batch = {p for p in record["order"] if int(p[-6:-3]) >= 10}
    t1, t2 = record["t_pause"]

    def newer_rule():
        """--keep-newer-than D: D seconds sits inside the pause, so it keeps the second batch
        (the daemon may decide up to 2 s after `now` and still agree)."""
        now = time.time()
        d = int(now - t2) + 3
        assert d < now - t1, "the pause is too short for a whole-second rule"
        return d, now

    cases = [
        # name, live, prune arguments (D filled in later), targets, lineages pruned
        ("last-live", True, ["--keep-last", "3"], ["run_a/step_007.pt"], {la}),
        ("last-offline", False, ["--keep-last", "3"], ["--store", "run_b/ckpt"], {lb}),
        ("every-live", True, ["--keep-every", "4"], ["run_b"], {lb}),
        ("every-offline", False, ["--keep-every", "5"], ["STORE"], {la, lb}),
        ("newer-live", True, ["--keep-newer-than", None], [""], {la, lb}),
        ("newer-offline", False, ["--keep-newer-than", None], ["--store", "run_a/step_000.pt"],
         {la}),
        ("all-live", True, ["--keep-last", "2", "--keep-every", "6", "--keep-newer-than", None],
         ["run_a", "run_b/ckpt/model_003.pt"], {la, lb}),
        ("all-offline", False,
         ["--keep-last", "2", "--keep-every", "6", "--keep-newer-than", None],
         ["--store", "run_a", "run_b"], {la, lb}),
    ]
    for name, live, rule_args, targets, lineages in cases:
        store = f"{tmp}/{name}"
        copy_store(base, store)
        du_before = objects_du(store)

        def rules():
            args, d, now = list(rule_args), None, None
            if None in args:
                d, now = newer_rule()
                args[args.index(None)] = f"{d}s" if d % 60 else f"{d // 60}m"
            kw = {}
            for flag, key in (("--keep-last", "keep_last"), ("--keep-every", "keep_every")):
                if flag in args:
                    kw[key] = int(args[args.index(flag) + 1])
            if d is not None:
                kw["keep_newer_than"], kw["now"] = d, now
            return args, kw

        def target_args(root):
            out = []
            for t in targets:
                if t == "STORE":
                    out.append(store)
                elif t == "--store":
                    out += ["--store", store]
                else:
                    out.append(os.path.join(root, t) if root else t)
            return out

        if live:
            with mounted(ckptfs, store, mnt):
                before_ls = ctl.ls(mnt)
                for p in record["sha"]:  # every name in the kernel's dentry cache
                    os.stat(os.path.join(mnt, p))
                if name == "all-live":  # a dry run first: nothing changes
                    args, _ = rules()
                    dry = ctl.json("prune", *args, "--dry-run", *target_args(mnt))
                    assert dry["dry_run"] and dry["freed_bytes"] == 0 and not dry["rekeyed"]
                    assert ctl.ls(mnt) == before_ls, "a dry run changed the store"
                    assert mount_files(mnt) == set(record["sha"]), "a dry run removed files"
                    assert objects_du(store) == du_before
                args, kw = rules()
                result = ctl.json("prune", *args, *target_args(mnt))
                after_ls = ctl.ls(mnt)
                kept = expected_kept(before_ls, lineages, **kw)
                if "keep_newer_than" in kw and len(kw) == 2:
                    assert kept == {p for p in second_batch
                                    if live_versions(before_ls)[p]["lineage"] in lineages}
                msg = check_prune(ctl, mnt, store, record, before_ls, after_ls, result, kept,
                                  lineages, du_before, live=True)
        else:
            before_ls = ctl.ls(store)  # offline ls of the whole store
            assert live_versions(before_ls).keys() == live_versions(base_ls).keys()
            if name == "all-offline":
                args, _ = rules()
                dry = ctl.json("prune", *args, "--dry-run", *target_args(None))
                assert dry["dry_run"] and not dry["rekeyed"]
                assert ctl.ls(store) == before_ls, "a dry run changed the store"
            args, kw = rules()
            result = ctl.json("prune", *args, *target_args(None))
            offline_after = ctl.ls(store)
            kept = expected_kept(before_ls, lineages, **kw)
            with mounted(ckptfs, store, mnt):
                after_ls = ctl.ls(mnt)
                assert live_versions(after_ls).keys() == live_versions(offline_after).keys()
                msg = check_prune(ctl, mnt, store, record, before_ls, after_ls, result, kept,
                                  lineages, du_before, live=False)
            ctl.run("verify", "--deep", store)  # offline too
        print(f"prune {name} ({' '.join(args)}): {msg}", flush=True)
        shutil.rmtree(store)
    print("prune_policies: every policy live and offline keeps exactly its set, identical bytes")


# ---- rm_export --------------------------------------------------------------------------------

def scenario_rm_export(ckptfs, ctl, tmp):
    store, mnt, out = f"{tmp}/store", f"{tmp}/mnt", f"{tmp}/out"
    os.makedirs(out)
    with mounted(ckptfs, store, mnt):
        record = generate(mnt, store, 6)
        # Live export of every file equals reading it through the mount.
        for rel, digest in record["sha"].items():
            dest = os.path.join(out, rel.replace("/", "_"))
            r = ctl.json("export", os.path.join(mnt, rel), dest)
            assert r["bytes"] == os.path.getsize(dest) == os.path.getsize(os.path.join(mnt, rel))
            assert sha256(dest) == digest == sha256(os.path.join(mnt, rel)), f"export {rel}"
        # DEST a directory: the file keeps its name; text output names it.
        r = ctl.run("export", os.path.join(mnt, "run_a/step_004.pt"), out)
        assert "step_004.pt" in r.stdout
        assert sha256(os.path.join(out, "step_004.pt")) == record["sha"]["run_a/step_004.pt"]
        assert not [f for f in os.listdir(out) if f.endswith(".tmp")], "temporary files left"
        # Errors: a missing file, a directory, a destination in a missing directory.
        r = ctl.run("export", os.path.join(mnt, "run_a/nope.pt"), f"{out}/x", rc=1)
        assert "No such file" in r.stderr, r.stderr
        ctl.run("export", os.path.join(mnt, "run_a"), f"{out}/x", rc=1)
        ctl.run("export", os.path.join(mnt, "notes.txt"), f"{out}/no/such/dir/x", rc=1)

        # rm: two good names and a bad one. The bad one is reported, the others removed.
        for p in record["sha"]:
            os.stat(os.path.join(mnt, p))
        r = ctl.run("rm", os.path.join(mnt, "run_a/step_000.pt"),
                    os.path.join(mnt, "run_b/ckpt/model_002.pt"),
                    os.path.join(mnt, "run_a/missing.pt"), rc=1)
        assert "missing.pt" in r.stderr, r.stderr
        assert "removed run_a/step_000.pt" in r.stdout and "model_002.pt" in r.stdout, r.stdout
        gone = {"run_a/step_000.pt", "run_b/ckpt/model_002.pt"}
        for p in gone:
            assert not os.path.exists(os.path.join(mnt, p)), f"{p} still visible after rm"
        # The same through the mount: plain unlink.
        os.unlink(os.path.join(mnt, "run_b/ckpt/model_003.pt"))
        gone.add("run_b/ckpt/model_003.pt")
        assert mount_files(mnt) == set(record["sha"]) - gone
        for p in set(record["sha"]) - gone:
            assert sha256(os.path.join(mnt, p)) == record["sha"][p], f"{p} changed after rm"
        ls = ctl.ls(mnt)
        hidden = [v for v in all_versions(ls).values() if not v["live"]]
        assert hidden, "deleted bases of kept deltas should stay as hidden bases"
        ctl.run("verify", "--deep", mnt)

    # Offline rm, then offline export of a delta and an exact file.
    r = ctl.json("rm", "--store", store, "run_a/step_003.pt", "/run_a/../run_a/step_004.pt")
    assert {x["path"] for x in r["removed"]} == {"run_a/step_003.pt", "run_a/step_004.pt"}
    assert not r["errors"]
    gone |= {"run_a/step_003.pt", "run_a/step_004.pt"}
    for rel in ("run_a/step_005.pt", "run_b/ckpt/model_004.pt", "notes.txt"):
        dest = f"{out}/offline_{rel.replace('/', '_')}"
        ctl.run("export", "--store", store, rel, dest)
        assert sha256(dest) == record["sha"][rel], f"offline export {rel}"
    ctl.run("export", "--store", store, "run_a/step_003.pt", f"{out}/y", rc=1)  # removed
    ctl.run("verify", "--deep", store)

    with mounted(ckptfs, store, mnt):
        assert mount_files(mnt) == set(record["sha"]) - gone
        for p in set(record["sha"]) - gone:
            assert sha256(os.path.join(mnt, p)) == record["sha"][p], f"{p} changed after rm"
        # rm of every version of run_a but the newest leaves its chain as hidden bases; a
        # prune --keep-last 1 then rewrites the newest as a keyframe and reclaims them.
        ctl.run("rm", *[os.path.join(mnt, f"run_a/step_{i:03d}.pt") for i in (1, 2)])
        before = objects_du(store)
        ls = ctl.ls(os.path.join(mnt, "run_a"))
        la = lineage_of(ls, "run_a/step_005.pt")
        versions_a = [l for l in ls["lineages"] if l["lineage"] == la][0]["versions"]
        assert len(versions_a) > 1 and sum(v["live"] for v in versions_a) == 1
        r = ctl.json("prune", "--keep-last", "1", os.path.join(mnt, "run_a"))
        assert r["rekeyed"], "the newest (a delta) should have been rewritten"
        ls = ctl.ls(os.path.join(mnt, "run_a"))
        versions_a = [l for l in ls["lineages"] if l["lineage"] == la][0]["versions"]
        assert len(versions_a) == 1 and versions_a[0]["kind"] == "keyframe", versions_a
        assert sha256(os.path.join(mnt, "run_a/step_005.pt")) == record["sha"]["run_a/step_005.pt"]
        assert objects_du(store) < before, "hidden bases were not reclaimed"
        ctl.run("verify", "--deep", mnt)
    print("rm_export: exports byte-identical live and offline; rm live/offline keeps every other "
          "file identical; hidden bases reclaimed by prune")


# ---- verify_damage ----------------------------------------------------------------------------

def flip_bit(path):
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(size // 2)
        b = f.read(1)
        f.seek(size // 2)
        f.write(bytes([b[0] ^ 0x08]))


def damaged_paths(result):
    return {d["path"] for d in result["damaged"] if d["path"]}


def scenario_verify_damage(ckptfs, ctl, tmp):
    base, mnt = f"{tmp}/base", f"{tmp}/mnt"
    with mounted(ckptfs, base, mnt):
        record = generate(mnt, base, 6)
        r = ctl.json("verify", mnt)
        assert r["ok"] and not r["damaged"], r
        r = ctl.json("verify", "--deep", mnt)
        assert r["ok"] and r["versions"] >= 14, r
    r = ctl.json("verify", "--deep", base)
    assert r["ok"] and r["unreferenced_objects"] == 0, r
    ctl.run("verify", base)
    lineage_a = {p for p in record["sha"] if p.startswith("run_a/step_")}

    def expect_damage(store, target, must, may=(), deep=False, live=False):
        args = ["verify"] + (["--deep"] if deep else [])
        r = ctl.json(*args, target, rc=1)
        assert not r["ok"], r
        names = damaged_paths(r)
        assert set(must) <= names, f"verify did not name {sorted(set(must) - names)}: {r}"
        assert names <= set(must) | set(may), f"verify named more: {sorted(names)}"
        text = ctl.run(*args, target, rc=1).stdout
        for p in must:
            assert p in text, f"{p} not named in:\n{text}"
        return names

    # A flipped bit in a delta in the middle of run_a: it and the deltas after it are damaged.
    store = f"{tmp}/flip"
    copy_store(base, store)
    flip_bit(os.path.join(store, "objects", record["object"]["run_a/step_002.pt"]))
    later_a = {p for p in lineage_a if int(p[-6:-3]) > 2}
    names = expect_damage(store, store, ["run_a/step_002.pt"], later_a)
    expect_damage(store, store, ["run_a/step_002.pt"], later_a, deep=True)
    with mounted(ckptfs, store, mnt):
        expect_damage(store, mnt, ["run_a/step_002.pt"], later_a, live=True)
        for p in record["sha"]:  # everything else still reads
            if p not in names:
                assert sha256(os.path.join(mnt, p)) == record["sha"][p], p
    print(f"verify: flipped bit found: {sorted(names)}", flush=True)

    # A truncated keyframe of run_b: every version of run_b is damaged, run_a is not.
    store = f"{tmp}/trunc"
    copy_store(base, store)
    obj = os.path.join(store, "objects", record["object"]["run_b/ckpt/model_000.pt"])
    os.truncate(obj, os.path.getsize(obj) // 2)
    lineage_b = {p for p in record["sha"] if p.startswith("run_b/")}
    names = expect_damage(store, store, ["run_b/ckpt/model_000.pt"], lineage_b)
    with mounted(ckptfs, store, mnt):
        expect_damage(store, mnt, ["run_b/ckpt/model_000.pt"], lineage_b, deep=True, live=True)
    print(f"verify: truncated object found: {sorted(names)}", flush=True)

    # Missing objects: an exact file's and the newest delta's.
    store = f"{tmp}/missing"
    copy_store(base, store)
    for rel in ("notes.txt", "run_a/step_005.pt"):
        os.unlink(os.path.join(store, "objects", record["object"][rel]))
    names = expect_damage(store, store, ["notes.txt", "run_a/step_005.pt"])
    with mounted(ckptfs, store, mnt):
        expect_damage(store, mnt, ["notes.txt", "run_a/step_005.pt"], live=True)
    print(f"verify: missing objects found: {sorted(names)}", flush=True)

    # An orphan object (as a crash between writing an object and its record leaves): not
    # damage. Offline tools leave it (verify counts it, gc removes it); the daemon removes it
    # when it opens the store, and only it.
    store = f"{tmp}/orphan"
    copy_store(base, store)
    orphan = os.path.join(store, "objects", "00000000000fffff.obj")
    some = os.path.join(store, "objects", record["object"]["run_a/step_001.pt"])
    shutil.copyfile(some, orphan)
    r = ctl.json("verify", store)
    assert r["ok"] and r["unreferenced_objects"] >= 1, r
    r = ctl.json("gc", "--dry-run", store)
    assert r["removed_objects"] >= 1 and os.path.exists(orphan), r
    with mounted(ckptfs, store, mnt):
        assert not os.path.exists(orphan), "the daemon's open left an object no version records"
        r = ctl.json("gc", "--dry-run", mnt)
        assert r["removed_objects"] == 0, r
        r = ctl.json("verify", "--deep", mnt)
        assert r["ok"] and r["unreferenced_objects"] == 0, r
        for p, digest in record["sha"].items():
            assert sha256(os.path.join(mnt, p)) == digest, f"{p} changed by the sweep"
    with open(daemon_log(store)) as f:
        assert "no version records" in f.read(), "the sweep was not logged"
    # And with a journal whose tail was dropped (as damage leaves it), the daemon keeps it.
    store = f"{tmp}/orphan-tail"
    copy_store(base, store)
    shutil.copyfile(some, orphan.replace(f"{tmp}/orphan/", f"{tmp}/orphan-tail/"))
    with open(os.path.join(store, "journal"), "ab") as f:
        f.write(b"\xab" * 20)
    with mounted(ckptfs, store, mnt, errors_ok=True):
        assert os.path.exists(os.path.join(store, "objects", "00000000000fffff.obj")), \
            "an unrecorded object went although the journal's tail was dropped"
    tails = [n for n in os.listdir(store) if n.startswith("journal.tail-")]
    assert len(tails) == 1, os.listdir(store)
    print("verify_damage: flipped bit, truncated and missing objects named by path, exit 1; "
          "orphans are not damage: tools leave them to gc, the daemon's open removes them "
          "(kept when the journal's tail was dropped, the tail kept aside)")


# ---- concurrent -------------------------------------------------------------------------------

def writer_main(mnt, store, count, out_path):
    """The training process of the concurrent scenario: saves `count` versions of run_a (and
    every third step one of run_b), printing "rel sha256" for each once it reads back."""
    trainer = Trainer(seed=1)
    with open(out_path, "w") as out:
        for i in range(10, 10 + count):  # after the names generate() used
            trainer.train()
            for lineage in ["run_a"] + (["run_b"] if i % 3 == 0 else []):
                rel = f"{lineage}/" + LINEAGES[lineage].format(i)
                path = os.path.join(mnt, rel)
                torch_save(trainer.state(lineage), path)
                out.write(f"{rel} {sha256(path)}\n")
                out.flush()
            time.sleep(0.05)


def torch_save(state, path):
    import torch
    torch.save(state, path)


def scenario_concurrent(ckptfs, ctl, tmp):
    store, mnt = f"{tmp}/store", f"{tmp}/mnt"
    out = f"{tmp}/written.txt"
    with mounted(ckptfs, store, mnt):
        record = generate(mnt, store, 2)  # run_a/ and run_b/ exist with a few versions
        writer = subprocess.Popen([sys.executable, os.path.abspath(__file__), "writer", mnt,
                                   store, "45", out])
        runs = {"prune": 0, "gc": 0, "verify": 0}
        try:
            while writer.poll() is None:
                ctl.run("prune", "--keep-last", "3", os.path.join(mnt, "run_a"))
                runs["prune"] += 1
                ctl.run("gc", mnt)
                runs["gc"] += 1
                if runs["prune"] % 2 == 0:
                    ctl.run("verify", mnt)
                    runs["verify"] += 1
                time.sleep(0.05)
        finally:
            if writer.poll() is None:
                writer.kill()
            rc = writer.wait()
        assert rc == 0, f"the writer failed ({rc})"
        assert runs["prune"] >= 3, f"too few prunes ran during the writes: {runs}"
        written = []
        with open(out) as f:
            for line in f:
                rel, digest = line.split()
                written.append(rel)
                record["sha"][rel] = digest
        # One more prune now that the writer is done: run_a keeps exactly its newest three.
        ctl.run("prune", "--keep-last", "3", os.path.join(mnt, "run_a"))
        newest_a = [p for p in written if p.startswith("run_a/")][-3:]
        files = mount_files(mnt)
        assert {p for p in files if p.startswith("run_a/step_")} == set(newest_a), sorted(files)
        # Nothing of run_b was pruned: every version written is there. Every file reads as it
        # did right after it was written.
        for p in [p for p in record["sha"] if p.startswith("run_b/")]:
            assert p in files, f"{p} lost"
        for p in files:
            assert sha256(os.path.join(mnt, p)) == record["sha"][p], f"{p} changed"
        ctl.run("verify", "--deep", mnt)
    ctl.run("verify", "--deep", store)
    print(f"concurrent: {len(written)} versions written while {runs} ran; nothing lost, "
          f"all identical")


# ---- crash ------------------------------------------------------------------------------------

def check_after_crash(ctl, ckptfs, store, mnt, record, kept, label):
    """Remount after a crash: verify --deep clean; every file present reads identical; every
    kept version is present. Then the prune again, to completion."""
    with mounted(ckptfs, store, mnt):
        ctl.run("verify", "--deep", mnt)
        files = mount_files(mnt)
        assert kept <= files, f"{label}: kept versions lost: {sorted(kept - files)}"
        for p in files:
            assert sha256(os.path.join(mnt, p)) == record["sha"][p], f"{label}: {p} changed"
        r = ctl.json("prune", "--keep-last", "2", mnt)
        assert mount_files(mnt) == kept, f"{label}: prune after the crash kept the wrong set"
        for p in kept:
            assert sha256(os.path.join(mnt, p)) == record["sha"][p], f"{label}: {p} changed"
        ctl.run("verify", "--deep", mnt)
    ctl.run("verify", "--deep", store)
    return len(files), r


def scenario_crash(ckptfs, ctl, tmp):
    base, mnt = f"{tmp}/base", f"{tmp}/mnt"
    with mounted(ckptfs, base, mnt):
        record = generate(mnt, base, 15)
        before_ls = ctl.ls(mnt)
    lineages = {v["lineage"] for v in live_versions(before_ls).values() if v["lineage"]}
    kept = expected_kept(before_ls, lineages, keep_last=2) | {"run_a/config.json", "notes.txt"}
    first_pruned = "run_a/step_000.pt"
    assert first_pruned not in kept

    def journal_state(store):
        st = os.stat(os.path.join(store, "journal"))
        return st.st_size, st.st_mtime_ns, st.st_ino

    def wait_for(cond, prune, what):
        deadline = time.time() + 60
        while not cond() and prune.poll() is None:
            assert time.time() < deadline, f"the prune never {what}"

    # The daemon killed (1) as soon as the prune removed its first name (before it is durable),
    # (2) as soon as the journal changed (removals being made durable; keyframes not yet
    # rewritten), (3) after a fixed delay.
    for trial, trigger in (("first-name", "name"), ("journal", "journal"), ("delay", 0.25)):
        store = f"{tmp}/crash-{trial}"
        copy_store(base, store)
        with mounted(ckptfs, store, mnt) as daemon:
            for p in record["sha"]:
                os.stat(os.path.join(mnt, p))
            journal0 = journal_state(store)
            prune = subprocess.Popen([ctl.binary, "prune", "--keep-last", "2", mnt],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            if trigger == "name":
                wait_for(lambda: not os.path.exists(os.path.join(mnt, first_pruned)), prune,
                         "removed a name")
            elif trigger == "journal":
                wait_for(lambda: journal_state(store) != journal0, prune, "wrote the journal")
            else:
                time.sleep(trigger)
            finished = prune.poll() is not None
            kill9(daemon, mnt)
            _, err = prune.communicate(timeout=60)
            assert prune.returncode in (0, 1), (prune.returncode, err)
            if prune.returncode == 1:  # killed while it waited for the answer (or before it)
                assert "closed the control connection" in err or "cannot reach" in err, err
        n, _ = check_after_crash(ctl, ckptfs, store, mnt, record, kept, trial)
        print(f"crash ({trial}): daemon killed {'after' if finished else 'during'} the prune; "
              f"{n} files present after remount, all intact, verify clean", flush=True)

    # An offline prune killed as soon as it changed the journal, and after a delay.
    for trial, trigger in (("offline-journal", "journal"), ("offline-delay", 0.3)):
        store = f"{tmp}/crash-{trial}"
        copy_store(base, store)
        journal0 = journal_state(store)
        prune = subprocess.Popen([ctl.binary, "prune", "--keep-last", "2", store],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if trigger == "journal":
            wait_for(lambda: journal_state(store) != journal0, prune, "wrote the journal")
        else:
            time.sleep(trigger)
        finished = prune.poll() is not None
        prune.send_signal(signal.SIGKILL)
        prune.wait()
        ctl.run("verify", "--deep", store)
        n, _ = check_after_crash(ctl, ckptfs, store, mnt, record, kept, trial)
        print(f"crash ({trial}): ckptctl killed {'after' if finished else 'during'} the prune; "
              f"{n} files present, all intact, verify clean", flush=True)


# ---- cli --------------------------------------------------------------------------------------

def run_with_tty_stderr(args):
    """Runs a command with stderr on a pseudo-terminal (stdout a pipe); returns (rc, stdout,
    what the terminal got)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    tty = b""
    while True:
        r, _, _ = select.select([master], [], [], 0.1)
        if r:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the other side closed
                chunk = b""
            if not chunk and proc.poll() is not None:
                break
            tty += chunk
        elif proc.poll() is not None:
            break
    out = proc.stdout.read()
    proc.wait()
    os.close(master)
    return proc.returncode, out.decode(), tty.decode(errors="replace")


def scenario_cli(ckptfs, ctl, tmp):
    store, mnt = f"{tmp}/store", f"{tmp}/mnt"
    # Usage errors (exit 2), before any store is involved.
    for args in ([], ["nonsense"], ["ls", "--bogus"], ["stat"], ["rm"], ["verify"], ["gc"],
                 ["export", "x"], ["prune", "/tmp"], ["prune", "--keep-last", "2"],
                 ["prune", "--keep-every", "0", "/tmp"], ["prune", "--keep-last", "-1", "/tmp"],
                 ["prune", "--keep-last", "x", "/tmp"],
                 ["prune", "--keep-newer-than", "3x", "/tmp"],
                 ["prune", "--keep-newer-than", "10", "/tmp"],
                 ["stat", "/tmp"], ["ls", "/"], ["verify", "/tmp"],
                 ["ls", "--store", "/tmp", "x"], ["ls", "--store", f"{tmp}/no-such-store"]):
        r = ctl.run(*args, rc=2)
        assert r.stderr.strip(), f"ckptctl {args}: no message"
    r = ctl.run("stat", "/tmp", rc=2)
    assert "neither inside a ckptfs mount nor a ckptfs store" in r.stderr, r.stderr
    assert not os.path.exists(f"{tmp}/no-such-store"), "a typo created a store"
    # --help of every command.
    for cmd, words in (("ls", ["lineage", "--store", "--json"]),
                       ("stat", ["tensor", "--json"]),
                       ("prune", ["--keep-last", "--keep-every", "--keep-newer-than",
                                  "--dry-run", "keyframe"]),
                       ("rm", ["hidden base", "--json"]),
                       ("verify", ["--deep", "checksum", "Exit status 1"]),
                       ("export", ["DEST", "byte", "through the mount"]),
                       ("gc", ["--dry-run", "objects"]),
                       ("status", ["--json", "VmRSS", "buffer=", "head images", "exits 1"])):
        r = ctl.run(cmd, "--help")
        for w in words:
            assert w in r.stdout, f"ckptctl {cmd} --help does not mention {w!r}:\n{r.stdout}"

    with mounted(ckptfs, store, mnt) as daemon:
        trainer = Trainer()
        record = {"sha": {}, "object": {}, "order": []}
        for i in range(3):
            save_version(trainer, mnt, store, "run_a", i, record)
        with open(f"{mnt}/notes.txt", "w") as f:
            f.write("exact\n")
        # Failures (exit 1) with a message naming the path.
        for args, text in ((["stat", f"{mnt}/run_a/nope.pt"], "No such file"),
                           (["ls", f"{mnt}/nope"], "No such file"),
                           (["rm", f"{mnt}/run_a/nope.pt"], "nope.pt"),
                           (["stat", f"{mnt}/run_a"], "not a regular file"),
                           (["prune", "--keep-last", "1", f"{mnt}/notes.txt"], "not a checkpoint"),
                           (["stat", "--store", store, "run_a/step_000.pt"], "in use")):
            r = ctl.run(*args, rc=1)
            assert text in r.stderr, f"ckptctl {args}: {r.stderr!r} lacks {text!r}"
        # A store directory where a file is expected: usage.
        ctl.run("rm", store, rc=2)
        ctl.run("stat", "--store", store, "..", rc=2)
        # Offline while the daemon holds the store: refused, naming its pid and mount point.
        for args in (["ls", store], ["verify", store], ["gc", store],
                     ["prune", "--keep-last", "1", store]):
            r = ctl.run(*args, rc=1)
            assert "in use" in r.stderr and f"pid {daemon.pid}" in r.stderr, r.stderr
            assert mnt in r.stderr and "inside its mount" in r.stderr, r.stderr
        # JSON everywhere it prints data.
        ls = ctl.ls(mnt)
        assert set(live_versions(ls)) == {"run_a/step_000.pt", "run_a/step_001.pt",
                                          "run_a/step_002.pt", "notes.txt"}
        st = ctl.json("stat", f"{mnt}/run_a/step_001.pt")
        assert st["kind"] == "delta" and st["tensors"] and st["coding"] and st["ratio"] > 1, st
        assert all({"name", "dtype", "elements", "mode", "stored_bytes"} <= t.keys()
                   for t in st["tensors"])
        assert ctl.json("verify", mnt)["ok"] and "removed_objects" in ctl.json("gc", mnt)
        # Text output has the promised fields.
        text = ctl.run("stat", f"{mnt}/run_a/step_001.pt").stdout
        for w in ("format:", "lineage:", "kind:", "delta (base version", "logical:", "stored:",
                  "ratio:", "coding:", "bits=", "tensors:", "model.0.weight"):
            assert w in text, f"stat output lacks {w!r}:\n{text}"
        text = ctl.run("ls", mnt).stdout
        for w in ("lineage", "keyframe", "delta", "run_a/step_002.pt", "total:", "MiB", "x"):
            assert w in text, f"ls output lacks {w!r}:\n{text}"
        # Paths relative to a working directory inside the mount.
        r = subprocess.run([ctl.binary, "stat", "--json", "step_002.pt"], cwd=f"{mnt}/run_a",
                           capture_output=True, text=True, check=True)
        assert json.loads(r.stdout)["path"] == "run_a/step_002.pt"
        # Progress: drawn on a terminal, never into a pipe.
        r = ctl.run("verify", "--deep", mnt)
        assert "\r" not in r.stderr and "[#" not in r.stderr and "%" not in r.stderr, r.stderr
        rc, out, tty = run_with_tty_stderr([ctl.binary, "verify", "--deep", mnt])
        assert rc == 0 and out.startswith("ok:"), (rc, out, tty)
        assert "verify" in tty and "%" in tty and "\r" in tty, f"no progress bar: {tty!r}"
        rc, out, tty = run_with_tty_stderr([ctl.binary, "export", f"{mnt}/run_a/step_002.pt",
                                            f"{tmp}/exported.pt"])
        assert rc == 0 and "export" in tty and "%" in tty, (rc, out, tty)
        # A daemon whose control socket is gone: a clear message, exit 1.
        os.unlink(f"{store}/control.sock")
        r = ctl.run("ls", mnt, rc=1)
        assert "cannot reach the ckptfs daemon" in r.stderr, r.stderr
    # The opt-in error allowance, as -o takes it: a percentage and a factor in stat's text.
    store2, mnt2 = f"{tmp}/store_we", f"{tmp}/mnt_we"
    os.makedirs(mnt2)
    with mounted(ckptfs, store2, mnt2, "weight_error=2.5%,grid_error=3"):
        trainer = Trainer()
        record = {"sha": {}, "object": {}, "order": []}
        for i in range(2):
            save_version(trainer, mnt2, store2, "run_a", i, record)
        path = f"{mnt2}/run_a/step_001.pt"
        coding = ctl.json("stat", path)["coding"]
        assert coding.get("weight_error") == 0.025 and coding.get("grid_error") == 3, coding
        text = ctl.run("stat", path).stdout
        assert " weight_error=2.5%" in text and " grid_error=3 " in text, text
    # Offline while another offline ckptctl holds the store: told to wait, not to use a mount.
    # (A stand-in process named ckptctl holds the lock, as a long offline verify would.)
    fake = shutil.copy("/bin/sleep", f"{tmp}/ckptctl")
    holder = subprocess.Popen([fake, "30"])
    try:
        fd = os.open(f"{store}/lock", os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{holder.pid}\n".encode(), 0)
        r = ctl.run("ls", store, rc=1)
        assert f"open offline by another ckptctl (pid {holder.pid})" in r.stderr, r.stderr
        os.close(fd)
    finally:
        holder.kill()
        holder.wait()
    ctl.run("ls", store)
    print("cli: usage errors exit 2, failures exit 1 with the path named, offline use of a "
          "mounted store refused naming the daemon, --help/--json, progress on terminals only")


# ---- status ----------------------------------------------------------------------------------

def wait_for(what, fn, timeout=30.0):
    """Polls fn() until it returns a true value; returns it. Fails naming `what` on timeout."""
    deadline = time.time() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def proc_status_kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def ratio_text(logical, disk):
    """tools/ctl_util.cpp's ratio_text."""
    r = logical / disk
    return f"{r:.0f}x" if r >= 100 else f"{r:.1f}x"


def scenario_status(ckptfs, ctl, tmp):
    store, mnt = f"{tmp}/store", f"{tmp}/mnt"
    mib = 1 << 20
    cache, buffer = 192 * mib, 16 * mib
    for args in (["status"], ["status", "/tmp"], ["status", "--bogus", mnt]):
        r = ctl.run(*args, rc=2)
        assert r.stderr.strip(), f"ckptctl {args}: no message"
    with mounted(ckptfs, store, mnt, "cache=192M", "buffer=16M", "head_min=1M") as daemon:
        trainer = Trainer()
        record = {"sha": {}, "object": {}, "order": []}
        for i in range(3):
            for lineage in LINEAGES:
                save_version(trainer, mnt, store, lineage, i, record)
        newest = f"{mnt}/run_a/step_002.pt"  # ~3 MiB of tensors: past head_min; run_b is not
        image_size = os.path.getsize(newest)

        def settled():
            # A read waits for its file's commit, not for what follows it (the head image's
            # publication, the commit's bookkeeping, a staging file's removal): the daemon is
            # asked until all of that is done, then every count below must be exact.
            st = last[0] = ctl.json("status", mnt)
            idle = st["heads"]["published"] >= 1 and st["heads"]["memory_bytes"] == 0 and \
                st["commits"] == {"queued": 0, "running": 0} and \
                st["encodes"]["in_use"] == 0 and st["scratch"]["bytes"] == image_size
            return st if idle else None
        last = [None]
        try:
            st = wait_for("the head image to be published and the daemon idle", settled)
        except AssertionError as e:
            raise AssertionError(f"{e}; the last status: {last[0]}") from None
        assert st["pid"] == daemon.pid, st
        assert st["store"] == store and st["mountpoint"] == mnt, st
        bound = cache + buffer + 512 * mib
        assert st["budget"] == {"cache_bytes": cache, "buffer_bytes": buffer,
                                "overhead_bytes": 512 * mib, "bound_bytes": bound}, st["budget"]
        p = st["process"]
        rss_now = proc_status_kib(daemon.pid, "VmRSS")
        assert 0 < p["rss_bytes"] <= p["peak_rss_bytes"] <= proc_status_kib(daemon.pid, "VmHWM")
        assert abs(p["rss_bytes"] - rss_now) < 64 * mib, (p, rss_now)
        assert p["peak_within_bound"] is (p["peak_rss_bytes"] <= bound), p
        c, b, e = st["cache"], st["buffers"], st["encodes"]
        # What is resident besides the counted pools: the rest of VmRSS (0 when the pools'
        # charges exceed it: charged pages not touched yet), within the allowance.
        k = st["codec"]
        counted = (c["bytes"] + c["chunk_bytes"] + b["memory_bytes"] + b["pooled_bytes"]
                   + e["memory_bytes"] + k["scratch_bytes"])
        # The saves were coded: their threads keep the codec's scratch, counted, not "other".
        assert k["scratch_bytes"] > 0 and k["scratch_threads"] >= 1, k
        assert abs(p["uncounted_bytes"] - max(0, p["rss_bytes"] - counted)) < 16 * mib, (p, counted)
        assert p["uncounted_bytes"] <= 512 * mib, p
        c = st["cache"]
        # Two encode sets and this little scratch stay inside the coding's allowance: the cache
        # lends nothing.
        assert c["lent_to_coding_bytes"] == 0, c
        assert c["budget_bytes"] + c["chunk_budget_bytes"] == cache, c
        assert c["bytes"] <= c["budget_bytes"] and c["chunk_bytes"] <= c["chunk_budget_bytes"], c
        b = st["buffers"]
        assert b["budget_bytes"] == buffer and b["spilled_bytes"] == 0, b
        assert b["memory_bytes"] + b["pooled_bytes"] <= buffer, b
        assert st["commits"] == {"queued": 0, "running": 0}, st["commits"]
        assert st["encodes"]["slots"] >= 2 and st["encodes"]["in_use"] == 0, st["encodes"]
        h = st["heads"]
        assert h["enabled"] and h["min_bytes"] == mib, h
        assert h["images"] == 1 and h["published"] == 1, f"one lineage is past head_min: {h}"
        assert h["disk_bytes"] == image_size, (h, image_size)
        images = os.listdir(f"{store}/heads")
        assert len(images) == 1 and images[0].endswith(".head"), images
        assert os.path.getsize(f"{store}/heads/{images[0]}") == image_size
        sc = st["scratch"]
        assert sc["dir"] == store and sc["heads_dir"] == f"{store}/heads", sc
        assert sc["staging_dir"] == f"{store}/staging" and sc["bytes"] == image_size, sc
        assert 0 < sc["free_bytes"] <= shutil.disk_usage(store).total, sc
        # The same daemon answers for its store directory.
        assert ctl.json("status", store)["pid"] == daemon.pid
        text = ctl.run("status", mnt).stdout
        for w in ("daemon:", f"pid {daemon.pid}", "memory:", "bound", "cache:", "buffers:",
                  "spilled", "commits:", "encodes:", "codec:", "per-thread scratch", "other:",
                  "heads:", "1 image (1 published)",
                  "scratch:", store):
            assert w in text, f"status output lacks {w!r}:\n{text}"

        # ls: the head image counts in the stored bytes and the ratios.
        ls = ctl.ls(mnt)
        t = ls["totals"]
        assert t["head_bytes"] == image_size, t
        assert t["disk_bytes"] == t["stored_bytes"] + t["head_bytes"], t
        head_of = {v["paths"][0]: v["head_bytes"] for v in live_versions(ls).values()}
        assert head_of["run_a/step_002.pt"] == image_size, head_of
        assert all(n == 0 for p_, n in head_of.items() if p_ != "run_a/step_002.pt"), head_of
        la = next(l for l in ls["lineages"] if l["versions"][-1]["paths"] == ["run_a/step_002.pt"])
        assert la["head_bytes"] == image_size and \
            la["disk_bytes"] == la["stored_bytes"] + image_size, la
        text = ctl.run("ls", mnt).stdout
        total = [line for line in text.splitlines() if line.startswith("total:")]
        assert len(total) == 1, text
        want = ratio_text(t["logical_bytes"], t["disk_bytes"])
        assert "+ heads" in total[0] and "on disk" in total[0], total[0]
        assert total[0].endswith(", " + want), (total[0], want,
                                                ratio_text(t["logical_bytes"], t["stored_bytes"]))
        assert "HEAD" in text and "+ head" in text, text

        # A file held open past buffer=: 16 MiB in memory, the rest in a staging file.
        with open(f"{mnt}/big.bin", "wb") as f:
            f.write(os.urandom(40 * mib))
            f.flush()
            b = ctl.json("status", mnt)["buffers"]
            assert b["memory_bytes"] == buffer and b["spilled_bytes"] == 40 * mib - buffer, b
        os.stat(f"{mnt}/big.bin")  # waits for its commit
        st = wait_for("the staging file to go",
                      lambda: (lambda s: s if s["buffers"]["spilled_bytes"] == 0 else None)(
                          ctl.json("status", mnt)))
        assert st["commits"] == {"queued": 0, "running": 0}, st["commits"]
        assert st["buffers"]["memory_bytes"] == 0, st["buffers"]
        live_ls = ctl.ls(mnt)
    # No daemon: nothing is held, and status says so (exit 1); ls still counts the image.
    r = ctl.run("status", store, rc=1)
    assert "no ckptfs daemon serves" in r.stderr and "nothing is held" in r.stderr, r.stderr
    off = ctl.ls(store)["totals"]
    for key in ("stored_bytes", "head_bytes", "disk_bytes", "logical_bytes"):
        assert off[key] == live_ls["totals"][key], (key, off, live_ls["totals"])
    print("status: budget, memory, cache, buffers (spilled past buffer=), commits, heads and "
          "scratch reported live; ls totals count the head image; offline: nothing held, exit 1")


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "writer":
        writer_main(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
        return
    scenario = sys.argv[1]
    ckptfs, ckptctl = os.path.abspath(sys.argv[2]), os.path.abspath(sys.argv[3])
    require_fuse()
    fn = globals().get(f"scenario_{scenario}")
    if fn is None:
        sys.exit(f"unknown scenario {scenario}")
    tmp = tempfile.mkdtemp(prefix=f"ckptfs-retention-{scenario}-")
    ok = False
    try:
        start = time.time()
        fn(ckptfs, Ctl(ckptctl), tmp)
        print(f"{scenario}: passed in {time.time() - start:.1f} s")
        ok = True
    finally:
        if ok:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"kept for inspection: {tmp}")


if __name__ == "__main__":
    main()
