#!/usr/bin/python3
"""Crash soak: kill -9 of the daemon at random moments while several writers save, rotate and
rewrite files through the mount, and after every kill a check that nothing acknowledged was
lost (DESIGN.md §9 invariants 1, 4 and 5: a file closed and fsync'ed survives kill -9 and reads
back the same bytes every time).

Writers, each on its own thread and directory, with its own training state (fs_scale's shape
through tests/fs/scale_lib.py: weights, Adam's exp_avg and exp_avg_sq; --size-mib each):
  torch   saves checkpoint-K/state.pt (the state serialised as torch.save does, written in 1 MiB
          writes, fsync'ed, the directories fsync'ed), one training step each, and after each
          save removes the checkpoints beyond the newest --keep (shutil.rmtree, as HF's Trainer):
          streamed deltas, head images and the background rotation rewrites all run;
  dcp     the same as DCP shards, step_K/__0_0.distcp (scale_lib.write_dcp: a byte item, then a
          torch.save per tensor, smallest first), rotated the same way;
  exact   a 48 MiB ordinary file rewritten in place at random offsets (1-4 MiB of random bytes,
          then fsync): extents, partial rewrites, exact blocks reused from the version before;
  latest  one file, last.pt, saved over at every step (`torch.save(state, "last.pt")`): in place
          (O_TRUNC) on even steps, written as last.pt.tmp and renamed over it on odd ones.
The daemon is killed --kills times, each after a random 2-12 s of this (seeded by --seed), with
the writers in whatever state they are. Then, on a fresh mount each time:
  - every file whose fsync returned (and whose directory's) reads back: byte-identical to what
    it read as after its fsync when that read finished before the kill; otherwise (the kill came
    between the fsync and the read) torch.load / DCP's reader returns the saved tensors within
    the codec's bounds (same names, dtypes and shapes, integers exact, the weights within twice
    their change since one of the writer's last saves, Adam's exp_avg_sq within a factor 2
    element by element, exp_avg within 0.95 of its norm: fidelity_problem; with --opts lossless
    equal), and from then on byte-identical;
  - a file removed, or rewritten, when the kill came: the old bytes, the new ones, or (removed)
    no file; a file being saved: no file, an empty one, or (its commit done, its fsync cut
    short) one that passes the check above; last.pt saved over in place may also read empty
    (the truncation of a closed file is journaled at once);
  - `ckptctl verify --deep` (the store offline) finds no damage and `ckptctl gc --dry-run` no
    garbage the daemon should have removed when it opened the store;
  - no writer saw an error before its daemon was killed.
Then the writers go on from where they were (their next saves are deltas on what survived).
At the end, the daemon's log holds no error a kill does not explain (EXPECTED_ERRORS).

A benchmark-style tool, not a timed test: its output is the number of kills survived and what
was checked. A short run is a ctest (bench.crash_soak_short: 4 kills of 96 MiB states).

Usage: crash_soak.py CKPTFS [--ckptctl PATH] [--kills 20] [--size-mib 128] [--keep 2]
                     [--seed 1] [--opts O,...] [--dir BASE]
Needs root and FUSE; run by Debian's /usr/bin/python3.
"""
import argparse
import dataclasses
import hashlib
import io
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "fs"))
from ckptfs_testlib import daemon_log, kill9, mounted, require_fuse, start, wait_mounted  # noqa: E402
from scale_lib import MiB, TrainingState, flat_tensors, read_dcp, sample, write_dcp  # noqa: E402

EXACT_BYTES = 48 * MiB


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(MiB), b""):
            h.update(chunk)
    return h.hexdigest()


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(path, data, offset=None):
    """Writes `data` (whole file, or at `offset` into an existing one) in 1 MiB writes, fsyncs,
    closes. Raises OSError (the daemon gone, or a real error)."""
    flags = os.O_WRONLY | (os.O_CREAT | os.O_TRUNC if offset is None else 0)
    fd = os.open(path, flags, 0o644)
    try:
        at = 0 if offset is None else offset
        view = memoryview(data)
        for i in range(0, len(view), MiB):
            os.pwrite(fd, view[i:i + MiB], at + i)
        os.fsync(fd)
    finally:
        try:
            os.close(fd)
        except OSError:
            pass


class Entry:
    """What a path may read as after a crash: one of `hashes` (sha256 of its bytes); or, with
    `loose` (a Loose), anything that passes the loose check (its bytes as served were not read
    before the kill); `absent_ok`: no file (or, `empty_ok`, an empty one)."""

    def __init__(self, hashes=(), loose=None, absent_ok=False, empty_ok=False):
        self.hashes = set(hashes)
        self.loose = loose
        self.absent_ok = absent_ok
        self.empty_ok = empty_ok


class Ledger:
    """path -> Entry, shared by the writers (which update it around every operation) and the
    check after a kill."""

    def __init__(self):
        self.mu = threading.Lock()
        self.entries = {}  # path relative to the mount -> Entry

    def set(self, rel, entry):
        with self.mu:
            self.entries[rel] = entry

    def get(self, rel):
        with self.mu:
            return self.entries.get(rel)

    def drop(self, rel):
        with self.mu:
            self.entries.pop(rel, None)

    def items(self):
        with self.mu:
            return list(self.entries.items())


@dataclasses.dataclass(frozen=True)
class Loose:
    """A save whose read-back is checked against the codec's bounds: its kind ("torch" or "dcp"),
    the samples of what was saved, the DCP metadata to read it with, and the samples of the
    writer's saves before it (newest first, up to HISTORY): its base is one of those (each
    writer's saves form one lineage) or, for a lineage's first save, a look-alike whose weights
    are then coded as a keyframe."""
    kind: str
    saved: dict
    meta: object = None
    priors: tuple = ()


# A kill can cost a writer its in-flight save, so its next save's base may be a few saves back.
HISTORY = 4


def change_norm(name, u, priors):
    """The largest L2 distance from `u` to the same tensor in a prior save (0 with none)."""
    return max((float((u.double() - p[name][2].double()).norm()) for p in priors if name in p),
               default=0.0)


def fidelity_problem(name, u, g, priors):
    """What is wrong with float tensor `g` read back for `u` saved as `name`, or None.
    Adam's exp_avg_sq within a factor 2 element by element (ratio-coded); exp_avg within 0.95
    of its norm (coded as values: each element within |u|); the weights within 2^-12 of their
    norm plus twice their largest change since a prior save. A delta reads back within its
    change from its base's read-back (docs/codec.md "Guarantees"), so its error is its change
    plus what its base's read-back was off, and a chain's error stays near its change (this
    state's steps are heavy-tailed: a delta here reads back about 0.8 of its change off); a
    lineage's first save is a keyframe or, forked from a look-alike, has its weights coded as
    one (2^-13). A base from another writer's lineage predicts nothing: the fork fault found
    on 2026-12-07 read back 59-100% off, where this allows about a quarter."""
    if not torch.isfinite(g).all():
        return "not finite"
    if name.endswith("exp_avg_sq"):
        far = int(((g < u / 2) | (g > u * 2)).sum())
        return f"{far} elements off by more than 2x" if far else None
    norm = float(u.double().norm())
    err = float((g.double() - u.double()).norm())
    if name.endswith("exp_avg"):
        bound = 0.95 * norm
    else:
        bound = norm * 2.0 ** -12 + 2 * change_norm(name, u, priors)
    if err > bound:
        return f"L2 error {err:.4g} over its bound {bound:.4g} (norm {norm:.4g})"
    return None


def loose_check(path, loose, exact=False):
    """The codec's bounds, for a file whose served bytes were never read: same tensors, integers
    exact, every float tensor as fidelity_problem allows (`exact`, a lossless mount: equal)."""
    saved = loose.saved
    if loose.kind == "dcp":
        got = sample(read_dcp(path, loose.meta))
    else:
        got = sample(torch.load(path))
    names = {k for k in saved if k != "#step"}
    gnames = {k for k in got if k != "#step"}
    if names != gnames:
        return f"tensor names differ ({len(names)} saved, {len(gnames)} read)"
    if saved.get("#step") != got.get("#step"):
        return "step counter differs"
    for name in names:
        dtype, shape, u = saved[name]
        gdtype, gshape, g = got[name]
        if (gdtype, gshape) != (dtype, shape):
            return f"{name}: dtype or shape differs"
        if not u.is_floating_point():
            if not torch.equal(g, u):
                return f"{name}: integers differ"
            continue
        if exact:
            why = None if torch.equal(g, u) else "differs on a lossless mount"
        else:
            why = fidelity_problem(name, u, g, loose.priors)
        if why:
            return f"{name}: read back outside the codec's bounds: {why}"
    return None


# The daemon's error lines a kill -9 explains: a journal write it cut short (its bytes are
# dropped and kept aside at the next open), and the unrecorded objects then left for gc. Routine
# work after a crash (a head image rebuilt from its chain) is logged at info. Any other error
# line fails the soak.
EXPECTED_ERRORS = ("were not intact records and were dropped",
                   "no version records, as the journal was not whole")


class Writer:
    """One writer's loop over the mount (run(), on a thread of its own per daemon); it stops at
    the first OSError (expected once the daemon is killed: `killed` set) and records an error
    seen before that."""

    def __init__(self, kind, index, args, ledger, rng):
        self.kind, self.index, self.args, self.ledger, self.rng = kind, index, args, ledger, rng
        self.dir = f"w{index}-{kind}"
        self.k = 0
        self.state = TrainingState(args.size_mib * MiB, params=2, small=4, seed=100 + index) \
            if kind != "exact" else None
        self.exact = None  # the exact file's bytes as they should be (bytearray)
        self.priors = []  # samples of this writer's latest saves, newest first
        self.mnt = None
        self.killed = None
        self.failure = None
        self.ops = 0

    def loose(self, kind, saved, meta=None):
        """The Loose of this save (saved: its samples), which also becomes the newest prior of
        the writer's next save (the step is taken whether or not this save survives)."""
        e = Loose(kind, saved, meta, tuple(self.priors))
        self.priors = ([saved] + self.priors)[:HISTORY]
        return e

    def run(self, mnt, killed):
        self.mnt, self.killed = mnt, killed
        try:
            os.makedirs(f"{self.mnt}/{self.dir}", exist_ok=True)
            while not self.killed.is_set():
                {"torch": self.save, "dcp": self.save, "exact": self.rewrite,
                 "latest": self.latest}[self.kind]()
                self.ops += 1
        except OSError as e:
            if not self.killed.is_set():
                self.failure = f"{self.dir}: {e!r} before the daemon was killed"
        except Exception as e:  # noqa: BLE001 (a wrong read-back, say)
            if not self.killed.is_set():
                self.failure = f"{self.dir}: {e!r}"

    def save(self):
        k = self.k + 1
        if k > 1:
            self.state.step()
        self.k = k  # the step is taken: a save cut short is not redone
        sd = self.state.state_dict()
        buf = io.BytesIO()
        if self.kind == "dcp":
            d = f"{self.dir}/step_{k}"
            rel = f"{d}/__0_0.distcp"
            meta = write_dcp(buf, sd, {"step": k}, clone=True)
            loose = self.loose("dcp", sample(flat_tensors(sd)), meta)
        else:
            d = f"{self.dir}/checkpoint-{k}"
            rel = f"{d}/state.pt"
            torch.save(sd, buf)
            loose = self.loose("torch", sample(sd))
        os.makedirs(f"{self.mnt}/{d}", exist_ok=True)
        self.ledger.set(rel, Entry(loose=loose, absent_ok=True, empty_ok=True))
        write_all(f"{self.mnt}/{rel}", buf.getbuffer())
        fsync_dir(f"{self.mnt}/{d}")
        fsync_dir(f"{self.mnt}/{self.dir}")
        self.ledger.set(rel, Entry(loose=loose))  # durable: its served bytes not read yet
        self.ledger.set(rel, Entry(hashes=[sha256_file(f"{self.mnt}/{rel}")]))
        self.rotate()

    def rotate(self):
        prefix = "step_" if self.kind == "dcp" else "checkpoint-"
        root = f"{self.mnt}/{self.dir}"
        dirs = sorted((d for d in os.listdir(root) if d.startswith(prefix)),
                      key=lambda d: int(d[len(prefix):]))
        for d in dirs[:-self.args.keep]:
            names = os.listdir(f"{root}/{d}")
            for name in names:
                e = self.ledger.get(f"{self.dir}/{d}/{name}")
                if e:
                    e.absent_ok = True
            shutil.rmtree(f"{root}/{d}")
            fsync_dir(root)
            for name in names:
                self.ledger.drop(f"{self.dir}/{d}/{name}")

    def latest(self):
        """One file saved over and over (`torch.save(state, "last.pt")` every step): in place
        (O_TRUNC) on even steps, on odd ones a temporary file renamed over it (safe-save)."""
        self.k += 1
        if self.k > 1:
            self.state.step()
        rel = f"{self.dir}/last.pt"
        path = f"{self.mnt}/{rel}"
        sd = self.state.state_dict()
        buf = io.BytesIO()
        torch.save(sd, buf)
        loose = self.loose("torch", sample(sd))
        old = self.ledger.get(rel)
        # Until the new bytes are acknowledged: the old ones, or the new ones (the commit done,
        # its acknowledgement cut short); in place also empty (the truncation is journaled at
        # once) and, for a first save, no file.
        before = Entry(hashes=old.hashes if old else (), loose=loose, absent_ok=old is None,
                       empty_ok=True)
        if self.k % 2 == 0:
            self.ledger.set(rel, before)
            write_all(path, buf.getbuffer())
            fsync_dir(f"{self.mnt}/{self.dir}")
        else:
            tmp_rel = f"{self.dir}/last.pt.tmp"
            self.ledger.set(tmp_rel, Entry(loose=loose, absent_ok=True, empty_ok=True))
            write_all(f"{self.mnt}/{tmp_rel}", buf.getbuffer())
            before.empty_ok = old is None
            self.ledger.set(rel, before)
            os.rename(f"{self.mnt}/{tmp_rel}", path)
            self.ledger.drop(tmp_rel)
            fsync_dir(f"{self.mnt}/{self.dir}")
        self.ledger.set(rel, Entry(loose=loose))
        self.ledger.set(rel, Entry(hashes=[sha256_file(path)]))

    def rewrite(self):
        rel = f"{self.dir}/data.bin"
        path = f"{self.mnt}/{rel}"
        if self.exact is None:
            self.exact = bytearray(self.rng.randbytes(EXACT_BYTES))
            self.ledger.set(rel, Entry(absent_ok=True, empty_ok=True,
                                       hashes=[hashlib.sha256(self.exact).hexdigest()]))
            write_all(path, self.exact)
            fsync_dir(f"{self.mnt}/{self.dir}")
            self.ledger.set(rel, Entry(hashes=[hashlib.sha256(self.exact).hexdigest()]))
            return
        n = self.rng.randint(1, 4) * MiB - self.rng.randint(0, 4095)
        at = self.rng.randint(0, EXACT_BYTES - n)
        chunk = self.rng.randbytes(n)
        old = hashlib.sha256(self.exact).hexdigest()
        self.exact[at:at + n] = chunk
        new = hashlib.sha256(self.exact).hexdigest()
        self.ledger.set(rel, Entry(hashes=[old, new]))
        write_all(path, chunk, offset=at)
        self.ledger.set(rel, Entry(hashes=[new]))

    def resync(self):
        """After a crash: the exact file's model from what survived (old or new bytes)."""
        if self.kind == "exact" and self.exact is not None:
            path = f"{self.mnt}/{self.dir}/data.bin"
            if os.path.exists(path) and os.path.getsize(path) == EXACT_BYTES:
                with open(path, "rb") as f:
                    self.exact = bytearray(f.read())
            else:
                self.exact = None


def check_store(args, ledger, writers, store, mnt, kill_no):
    """After a kill: every ledger entry as allowed (the writers' models brought up to date from
    what survived), then the store offline."""
    problems = []
    checked = {"identical": 0, "loose": 0, "absent": 0, "empty": 0}
    log_at = os.path.getsize(daemon_log(store))
    with mounted(args.ckptfs, store, mnt, *args.opt_list):
        for rel, e in sorted(ledger.items()):
            path = f"{mnt}/{rel}"
            if not os.path.exists(path):
                if e.absent_ok:
                    ledger.drop(rel)
                    checked["absent"] += 1
                else:
                    problems.append(f"{rel}: lost (acknowledged, then gone)")
                continue
            if os.path.getsize(path) == 0 and e.empty_ok:
                checked["empty"] += 1
                ledger.drop(rel)
                continue
            h = sha256_file(path)
            if h in e.hashes:
                checked["identical"] += 1
                ledger.set(rel, Entry(hashes=[h]))
                continue
            if e.loose:
                why = loose_check(path, e.loose, exact="lossless" in args.opt_list)
                if why is None:
                    checked["loose"] += 1
                    ledger.set(rel, Entry(hashes=[h]))  # from now on, exactly these bytes
                    continue
                problems.append(f"{rel}: {why}")
                continue
            problems.append(f"{rel}: reads differently from every acknowledged state")
        for w in writers:
            w.mnt = mnt
            w.resync()
    ctl = args.ckptctl
    r = subprocess.run([ctl, "verify", "--deep", "--json", store], capture_output=True, text=True)
    if r.returncode != 0:
        problems.append(f"verify --deep: {r.stdout[-2000:]} {r.stderr[-500:]}")
    # The daemon removes objects no version records (a commit's object whose record the kill
    # kept from the journal) when it opens the store, unless the journal's tail was dropped (a
    # write the kill cut short): then they wait for gc, and the log says so.
    with open(daemon_log(store), errors="replace") as f:
        f.seek(log_at)
        opened = f.read()
    tail_cut = "were not intact records and were dropped" in opened
    r = subprocess.run([ctl, "gc", "--dry-run", "--json", store], capture_output=True, text=True)
    if r.returncode != 0 or (json.loads(r.stdout).get("removed_objects", 0) and not tail_cut):
        problems.append(f"gc --dry-run after opening the store: {r.stdout} {r.stderr}")
    swept = sum(int(line.split("removed ")[1].split(" ")[0]) for line in opened.splitlines()
                if "no version records" in line and " removed " in line)
    checked["swept"] = swept
    checked["tail_cut"] = tail_cut
    print(f"  kill {kill_no}: {checked['identical']} files identical, {checked['loose']} read "
          f"within the bounds (read for the first time), {checked['absent']} absent and "
          f"{checked['empty']} empty where allowed; the daemon's open removed {swept} "
          f"unrecorded objects" + ("; the journal's tail was cut" if tail_cut else "")
          + (f"; PROBLEMS: {problems}" if problems
                                                      else ""), flush=True)
    return problems


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ckptfs")
    ap.add_argument("--ckptctl")
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--size-mib", type=int, default=128)
    ap.add_argument("--keep", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--min-s", type=float, default=2.0, help=argparse.SUPPRESS)
    ap.add_argument("--max-s", type=float, default=12.0, help=argparse.SUPPRESS)
    ap.add_argument("--opts", default="")
    ap.add_argument("--dir", default="/var/tmp")
    a = ap.parse_args()
    a.ckptctl = a.ckptctl or os.path.join(os.path.dirname(os.path.abspath(a.ckptfs)), "ckptctl")
    a.opt_list = [o for o in a.opts.split(",") if o]
    if a.kills < 1 or a.size_mib < 8 or a.keep < 1 or a.min_s > a.max_s:
        ap.error("--kills >= 1, --size-mib >= 8, --keep >= 1")
    return a


def main():
    args = parse_args()
    # The mount library's watchdog ends a hung run: a kill and its checks take well under 60 s.
    os.environ.setdefault("CKPTFS_TEST_DEADLINE", str(120 + 60 * args.kills))
    require_fuse()
    torch.set_num_threads(1)
    rng = random.Random(args.seed)
    ledger = Ledger()
    writers = [Writer(kind, i, args, ledger, random.Random(args.seed * 100 + i))
               for i, kind in enumerate(("torch", "dcp", "exact", "latest"))]
    work = tempfile.mkdtemp(prefix="ckptfs-soak-", dir=args.dir)
    store, mnt = f"{work}/store", f"{work}/mnt"
    failures = []
    t0 = time.monotonic()
    print(f"crash_soak: {args.kills} kills, writers torch/dcp/exact/latest, {args.size_mib} MiB states, "
          f"keep {args.keep}, seed {args.seed}, -o {args.opts or '(defaults)'}; {work}", flush=True)
    try:
        for kill_no in range(1, args.kills + 1):
            proc = start(args.ckptfs, store, mnt, *args.opt_list)
            killed = threading.Event()
            threads = []
            try:
                wait_mounted(mnt, proc)
                for w in writers:
                    threads.append(threading.Thread(target=w.run, args=(mnt, killed), daemon=True))
                    threads[-1].start()
                delay = rng.uniform(args.min_s, args.max_s)
                time.sleep(delay)
            finally:
                # The daemon dies first and its mount stays (every operation on it now fails
                # with ENOTCONN) until the writers have stopped: unmounted earlier, a writer's
                # next operation would go to the directory underneath and succeed.
                killed.set()
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                for w, t in zip(writers, threads):
                    t.join(timeout=120)
                    assert not t.is_alive(), f"{w.dir}: writer hung after the kill"
                kill9(proc, mnt)
            assert not os.listdir(mnt), f"writes went under the mount point: {os.listdir(mnt)}"
            for w in writers:
                if w.failure:
                    failures.append(f"kill {kill_no}: {w.failure}")
                    w.failure = None
            ops = ", ".join(f"{w.dir} {w.ops}" for w in writers)
            print(f"  kill {kill_no} after {delay:.1f} s (operations so far: {ops})", flush=True)
            failures += [f"kill {kill_no}: {p}"
                         for p in check_store(args, ledger, writers, store, mnt, kill_no)]
            if failures:
                break
        with open(daemon_log(store), errors="replace") as f:
            errors = [line.split(" error: ", 1)[1].strip() for line in f if " error: " in line]
        print(f"crash_soak: {kill_no} kills in {time.monotonic() - t0:.0f} s; operations "
              + ", ".join(f"{w.dir} {w.ops}" for w in writers)
              + f"; daemon log error lines: {len(errors)}", flush=True)
        kinds = {}  # the messages with their numbers masked, and how often each came
        for e in errors:
            kinds.setdefault(re.sub(r"[0-9]+", "N", e), []).append(e)
        for kind, lines in sorted(kinds.items(), key=lambda kv: -len(kv[1])):
            expected = any(p in kind for p in EXPECTED_ERRORS)
            print(f"  {len(lines)} x {kind}" + ("" if expected else "  (UNEXPECTED)"))
            if not expected:
                failures.append(f"the daemon logged an error a kill does not explain: {lines[0]}")
    finally:
        if not failures:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"crash_soak: store kept for inspection: {work}")
    if failures:
        print("crash_soak: FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("crash_soak: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
