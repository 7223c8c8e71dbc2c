#!/usr/bin/python3
"""ckptfs at the sizes users have (DESIGN.md §12, issue 13): multi-GiB training states saved
version after version, restored after a remount, and several ranks writing at once; a ckptfs
mount against a plain directory on the same disk, side by side in one run.

State dicts, for each size S in --sizes (GiB): a realistic training state built in place and
reused from version to version (never two copies in memory): 8 large fp32 weight matrices, 56
small parameters (biases, norms; 256-16384 elements), Adam's exp_avg and exp_avg_sq (nonnegative)
of every parameter under "optimizer", a float step per parameter and an int64 step counter:
about 1/3 weights, 1/3 exp_avg, 1/3 exp_avg_sq, 233 small tensors. Each new version is one
training step: weights += N(0, 1e-4), exp_avg = 0.9 exp_avg + 0.1 g,
exp_avg_sq = 0.999 exp_avg_sq + 0.001 g^2 with a fresh gradient g ~ N(0, 1e-3). --versions of
them are saved as run/step_K.pt through the mount and to the plain directory (interleaved, the
side that goes first alternating). Per size:
  - save+fsync time of each version (torch.save into a file object, flush, os.fsync, close) and
    when torch.save returned; v1 (the keyframe) reported apart from the median of the deltas;
  - torch.load of the newest version, and of the oldest version of the newest keyframe interval
    (the last version `ckptctl stat` calls a keyframe: v1 at keyframe_interval=20), and of the
    version before the newest ("prev": the keyframe and every delta after it decoded), after a
    remount with the page cache dropped (plain: drop_caches, then load), --repeats times, the
    order rotating; before every load the client touches and frees 1.5x the size
    (fs_speed.prefault, see docs/benchmarks.md) so that fresh pages do not decide the comparison;
  - the daemon's peak RSS (VmHWM, reset before each save; each load has a fresh daemon) for the
    saves, the loads and the whole size, against the budget cache + buffer + 512 MiB (DESIGN.md
    §9.7); sampled every 50 ms: its anonymous RSS, and its scratch files: the staging files
    and head images it holds open in the store (unlinked ones too, which du cannot see); and
    the disk space used at the peak of each mount save (anything else writing to the disk
    moves that too);
  - store bytes (du -sb and du -sB1, and per top-level entry of the store) against the logical
    bytes of all versions; the plain side keeps at most three versions on disk (the newest, the
    one before it and the load's oldest), the logical total counts all of them;
  - every load is checked against what was saved: same tensor names, dtypes and shapes, integer
    tensors (step counters) exact, float tensors (a strided sample of up to 65536 elements each)
    within 0.2 of the tensor's range (TOLERANCE: garbage, not codec error; exp_avg, coded as
    its values in keyframes, within 0.5 and a relative L2 error under 0.95); a load that fails
    stops the benchmark. Reported: the largest error as a share of the range, and as a multiple
    of the largest change since the previous version.

Concurrent writers: --writers processes, each with its own state of --shard-gib, save
ckpt_rankR/step_K.pt (one lineage per rank) at the same moment, released by a barrier, for
--writer-steps steps, mount and plain directory in turn (the plain side keeps two versions per
rank). Per step: wall time from the release to the last fsync, the daemon's peak RSS and
scratch files, and what bound the step: the share of the machine's CPU time busy and in iowait
(/proc/stat, both sides), the daemon's CPU seconds and the bytes it read from and wrote to the
disk (/proc/PID/io); then whether every version after the first of each rank is a delta on its own
rank's previous version (`ckptctl stat --json`), and store bytes. Then every rank restores its
newest version at once, as after a failure: --repeats rounds, each from a fresh daemon (a
remount, the page cache dropped) and from the plain directory (the page cache dropped), the
side that goes first alternating: wall time from the release to the last torch.load (or DCP
read), the daemon's peak RSS and CPU, each load checked as above against the rank's last state.
With --writer-keep K the writers rotate, as a training run that keeps its last K checkpoints
does: after each step every rank's versions beyond its newest K go on both sides, and once the
daemon has done its rotation work (`ckptctl status`: nothing pending, the store's size steady)
the store's bytes (objects, head images, journal) are measured against the rotated plain
directory's, with the rewrites and the bytes the daemon wrote to the disk.

Usage: fs_scale.py CKPTFS_BINARY [--sizes 1,4,12] [--versions 6] [--repeats 3] [--writers 8]
                   [--shard-gib 1] [--writer-steps 3] [--writer-keep K] [--skip-sizes]
                   [--skip-writers]
                   [--cache 2G] [--buffer 1G] [--opts O,...] [--dir BASE] [--keep]
                   [--json PATH] [--ckptctl PATH] [--quick] [--layout torch|dcp]
--quick: 0.25 GiB, 3 versions, 2 writers x 128 MiB, 1 repeat (a smoke test, 15-60 seconds).
--layout dcp: every version (and every rank's) is a torch.distributed.checkpoint shard,
run/step_K/__0_0.distcp (ckpt_rankR/step_K/__R_0.distcp), written as FileSystemWriter writes it
(one torch.save per tensor, smallest first as on GPU, after a byte item; scale_lib.write_dcp),
fsync'ed, its .metadata renamed into place beside it; loads are DCP's reader's (each item's
slice, torch.load'ed).
--cache/--buffer are passed as -o cache=,buffer= (defaults: the daemon's, read from its --help)
and set the memory budget checked; --opts adds other -o options (bits=4, ...).
Needs root (drop_caches, FUSE) and free disk under BASE (default /var/tmp, a real disk: not
tmpfs) of about 3x the largest size plus 3x the writers' shards; RAM for the largest state plus
the daemon's budget. Run by Debian's /usr/bin/python3 (torch 1.13).
"""
import argparse
import contextlib
import datetime
import gc
import json
import math
import multiprocessing
import os
import pickle
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "fs"))
sys.path.insert(0, HERE)
from ckptfs_testlib import (is_first_moment, mounted, peak_rss, reset_peak_rss,  # noqa: E402
                            settle_rotation, stat_json, status_json)
from fs_speed import drop_caches, prefault  # noqa: E402
from scale_lib import (cpu_seconds, flat_tensors, open_file_blocks, proc_io, read_dcp,  # noqa: E402
                       write_dcp)

GiB = 1 << 30
MiB = 1 << 20
SLACK = 512 * MiB  # the "small constant" of the memory budget
N_LARGE = 8  # large weight matrices
COLS = 4096  # their width
SMALL_NAMES = ("attn.qkv.bias", "attn.out.bias", "ln1.weight", "ln1.bias", "ln2.weight",
               "ln2.bias", "mlp.fc2.bias")  # per layer: 7 x 8 = 56 small parameters
SMALL_SIZES = (256, 1024, 4096, 16384)  # elements, cycled
GRAD_STD = 1e-3
WEIGHT_NOISE = 1e-4
SAMPLE = 65536  # elements per tensor kept to check loads against
# A load fails the check when a float tensor's max abs error exceeds this share of its range
# (max - min). Loose on purpose: it catches garbage (zeros, another tensor, shifted bytes: 0.5 and
# more), not codec error, which is bounded by each element's change against its base as read
# back (the closed-loop bound): Adam's exp_avg moves by up to a sixth of its range in one step
# (0.1 (g - exp_avg)) and read back up to 5% of its range off, at bits=3 and bits=4 alike (the
# largest error is set by the top power-of-two bucket of the delta, not by bits; rep=mean: 8%),
# so 1e-2 failed. Stale versions are caught by the step counters, which must be exact.
TOLERANCE = 0.2
# exp_avg as a lossy keyframe codes it, as its values (docs/codec.md, "Intra slabs", item 4):
# each element within |u|, up to max |u|: about half the range for a zero-centred m like this
# one's. Zeros would be too, so its relative L2 error must also stay below that of zeros (1).
FIRST_MOMENT_TOLERANCE, FIRST_MOMENT_L2 = 0.5, 0.95
BARRIER_TIMEOUT = 3600.0


# ---------------------------------------------------------------------------------------------
# The training state


class TrainingState:
    """A model's parameters and Adam's moments, built in place in about `total_bytes`; `advance`
    is one training step, in place. `sd` is the object torch.save gets; it shares the tensors."""

    def __init__(self, total_bytes, seed):
        self.gen = torch.Generator().manual_seed(seed)
        small = [(f"layers.{layer}.{name}", SMALL_SIZES[(layer * len(SMALL_NAMES) + j) % 4])
                 for layer in range(N_LARGE) for j, name in enumerate(SMALL_NAMES)]
        small_bytes = 3 * 4 * sum(n for _, n in small)
        rows = max(1, (total_bytes // 3 - small_bytes // 3) // 4 // N_LARGE // COLS)
        large = [(f"layers.{i}.{'attn.qkv' if i % 2 == 0 else 'mlp.fc1'}.weight", (rows, COLS))
                 for i in range(N_LARGE)]
        shapes = large + [(name, (n,)) for name, n in small]
        shapes.sort(key=lambda s: s[0])
        self.names = [name for name, _ in shapes]
        self.params = [torch.empty(shape) for _, shape in shapes]
        self.exp_avg = [torch.empty(shape) for _, shape in shapes]
        self.exp_avg_sq = [torch.empty(shape) for _, shape in shapes]
        for name, p, m, v in zip(self.names, self.params, self.exp_avg, self.exp_avg_sq):
            if ".ln" in name and name.endswith(".weight"):
                p.normal_(1.0, 0.02, generator=self.gen)
            else:
                p.normal_(0.0, 0.02, generator=self.gen)
            m.normal_(0.0, 0.3 * GRAD_STD, generator=self.gen)
            v.normal_(0.0, GRAD_STD, generator=self.gen).square_()
        self.scratch = torch.empty(max(p.numel() for p in self.params))  # the gradient
        self.step = 1
        self.sd = self._state_dict()

    def _state_dict(self):
        state = {i: {"step": torch.tensor(float(self.step)), "exp_avg": m, "exp_avg_sq": v}
                 for i, (m, v) in enumerate(zip(self.exp_avg, self.exp_avg_sq))}
        group = {"lr": 1e-4, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0,
                 "amsgrad": False, "maximize": False, "foreach": None, "capturable": False,
                 "differentiable": False, "fused": False, "params": list(range(len(self.params)))}
        return {"model": dict(zip(self.names, self.params)),
                "optimizer": {"state": state, "param_groups": [group]},
                "step": torch.tensor(100 * self.step, dtype=torch.int64)}

    def advance(self):
        self.step += 1
        for p, m, v in zip(self.params, self.exp_avg, self.exp_avg_sq):
            g = self.scratch[:p.numel()].view(p.shape)
            g.normal_(0.0, GRAD_STD, generator=self.gen)
            m.mul_(0.9).add_(g, alpha=0.1)
            v.mul_(0.999).addcmul_(g, g, value=0.001)
            g.normal_(0.0, 1.0, generator=self.gen)
            p.add_(g, alpha=WEIGHT_NOISE)
        self.sd = self._state_dict()

    def describe(self):
        large = [p for p in self.params if p.dim() == 2]
        n = len(flat_tensors(self.sd))
        return (f"{len(large)} fp32 matrices {tuple(large[0].shape)}, "
                f"{len(self.params) - len(large)} small parameters, Adam's exp_avg and "
                f"exp_avg_sq of each, steps: {n} tensors ({n - 3 * len(large)} small)")


def snapshot(sd):
    """What a load is checked against: per tensor its dtype, shape, range and a strided sample
    (the whole tensor when small). A few MiB, whatever the size of the state."""
    ref = {}
    for name, t in flat_tensors(sd).items():
        flat = t.reshape(-1)
        stride = max(1, math.ceil(flat.numel() / SAMPLE))
        entry = {"dtype": t.dtype, "shape": tuple(t.shape), "stride": stride,
                 "sample": flat[::stride].clone()}
        if t.is_floating_point() and t.numel():
            entry["range"] = (t.max() - t.min()).item()
        ref[name] = entry
    return ref


def check(loaded, ref, label, prev=None):
    """Compares a loaded checkpoint with its snapshot. Raises on a difference beyond the
    tolerance; returns the worst error relative to the tensor's range, the worst error relative
    to the tensor's largest change since `prev` (the previous version's snapshot, if given: the
    codec bounds an element's error by its change against the base as read back, itself off by
    the base's error, so a small multiple of 1), and how many sampled exp_avg_sq elements read
    back off by more than 2x."""
    got = flat_tensors(loaded)
    if got.keys() != ref.keys():
        missing, extra = sorted(ref.keys() - got.keys()), sorted(got.keys() - ref.keys())
        raise VerifyError(f"{label}: tensor names differ (missing {missing[:5]}, "
                          f"extra {extra[:5]})")
    worst, worst_name, far, vs_change = 0.0, "", 0, 0.0
    for name, e in ref.items():
        t = got[name]
        if t.dtype != e["dtype"] or tuple(t.shape) != e["shape"]:
            raise VerifyError(f"{label}: {name} is {t.dtype} {tuple(t.shape)}, "
                              f"saved {e['dtype']} {e['shape']}")
        sample = t.reshape(-1)[::e["stride"]]
        if not t.is_floating_point():
            if not torch.equal(sample, e["sample"]):
                raise VerifyError(f"{label}: integer tensor {name} differs")
            continue
        if not sample.numel():
            continue
        err = (sample.double() - e["sample"].double()).abs().max().item()
        rel = err / e["range"] if e["range"] > 0 else (0.0 if err == 0 else math.inf)
        tolerance = FIRST_MOMENT_TOLERANCE if is_first_moment(name) else TOLERANCE
        if not rel <= tolerance:
            raise VerifyError(f"{label}: {name} max abs error {err:.3g} is {rel:.3g} of its "
                              f"range (tolerance {tolerance})")
        if is_first_moment(name):
            l2 = ((sample.double() - e["sample"].double()).norm() /
                  max(e["sample"].double().norm().item(), 1e-30)).item()
            if not l2 <= FIRST_MOMENT_L2:
                raise VerifyError(f"{label}: {name} relative L2 error {l2:.3g} (at most "
                                  f"{FIRST_MOMENT_L2}: zeros read 1)")
        if rel > worst:
            worst, worst_name = rel, name
        if prev is not None and err > 0:
            change = (e["sample"].double() - prev[name]["sample"].double()).abs().max().item()
            vs_change = max(vs_change, err / change if change > 0 else math.inf)
        if name.endswith("exp_avg_sq"):
            s, u = sample.double(), e["sample"].double()
            far += int(((s < u / 2) | (s > u * 2)).sum().item())
    return {"max_rel_err": worst, "worst_tensor": worst_name, "exp_avg_sq_off_2x": far,
            "max_err_vs_change": vs_change if prev is not None else None}


class VerifyError(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# Measuring


class Interrupts:
    """Ctrl-C and SIGTERM raise KeyboardInterrupt, except inside torch.save / torch.load: an
    exception raised in torch's C++ zip writer was lost, or came out as a RuntimeError, or aborted
    the process ("terminate called after throwing c10::Error"), which skips every cleanup and
    leaves the mount behind. Inside them the signal is noted and raised when the call returns."""

    depth = 0
    pending = None  # the signal number waiting to be raised
    received = None  # the last one

    @classmethod
    def install(cls):
        signal.signal(signal.SIGINT, cls.handler)
        signal.signal(signal.SIGTERM, cls.handler)

    @classmethod
    def handler(cls, signum, _frame):
        cls.received = signum
        if cls.depth:
            cls.pending = signum
            return
        raise KeyboardInterrupt

    @classmethod
    @contextlib.contextmanager
    def deferred(cls):
        cls.depth += 1
        try:
            yield
        finally:
            cls.depth -= 1
            if not cls.depth and cls.pending:
                cls.pending = None
                raise KeyboardInterrupt


def ckpt_name(layout, step, rank=0):
    """A version's file under its run directory: step_K.pt, or a DCP shard step_K/__R_0.distcp
    (its .metadata beside it)."""
    if layout == "torch":
        return f"step_{step}.pt"
    return os.path.join(f"step_{step}", f"__{rank}_0.distcp")


def remove_version(run_dir, layout, step, rank=0):
    """A plain version goes: its file, or its DCP step directory."""
    if layout == "torch":
        os.remove(os.path.join(run_dir, ckpt_name(layout, step, rank)))
    else:
        shutil.rmtree(os.path.join(run_dir, f"step_{step}"))


def save_fsync(sd, path, layout="torch"):
    """torch.save (or a DCP shard and its .metadata, renamed into place as DCP does) into a file
    object, flush, fsync, close: (seconds until the last write returned, seconds until closed)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    t = time.perf_counter()
    with open(path, "wb") as f:
        with Interrupts.deferred():
            if layout == "torch":
                torch.save(sd, f)
            else:
                meta = write_dcp(f, sd, {"param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999)}]})
        f.flush()
        returned = time.perf_counter() - t
        os.fsync(f.fileno())
    if layout == "dcp":
        md = os.path.join(os.path.dirname(path), ".metadata")
        with open(md + ".tmp", "wb") as f:
            pickle.dump(meta, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(md + ".tmp", md)
    return returned, time.perf_counter() - t


def load(path, layout="torch"):
    """torch.load, or DCP's reader: each item's slice of the shard (as .metadata names it) read
    and torch.load'ed; a flat name -> tensor dict."""
    with Interrupts.deferred():
        if layout == "torch":
            return torch.load(path)
        with open(os.path.join(os.path.dirname(path), ".metadata"), "rb") as f:
            return read_dcp(path, pickle.load(f))


def proc_status(pid):
    """kB fields of /proc/PID/status, in bytes."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            parts = value.split()
            if len(parts) == 2 and parts[1] == "kB":
                out[key] = int(parts[0]) * 1024
    return out


def free_bytes(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def scratch_bytes(pid, store):
    """Bytes allocated to the scratch files under `store` that the daemon holds open: staging
    and spill files, head images published or not, and those a save is freeing behind it
    (unlinked files du cannot see); each file once. (Before 2026-12-06, late: only the unlinked
    ones, which left out the published head images.)"""
    return open_file_blocks(pid, [os.path.join(store, d) + os.sep for d in ("staging", "heads")])


class Sampler(threading.Thread):
    """Samples every 50 ms the daemon's RSS (anonymous and file-backed), its unlinked scratch
    files in the store (scratch_bytes) and the free space of the store's disk (which other
    writers to the disk move too): maxima (least free space) since the last reset() and over
    the sampler's life."""

    def __init__(self, pid, store):
        super().__init__(daemon=True)
        self.pid, self.disk = pid, os.path.realpath(store)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.whole = {}
        self.reset()

    def reset(self):
        with self.lock:
            self.free0 = free_bytes(self.disk)
            self.win = {}

    def _take(self, d, key, value, fn=max):
        d[key] = fn(d[key], value) if key in d else value

    def run(self):
        while not self.stop.is_set():
            try:
                s = proc_status(self.pid)
                free = free_bytes(self.disk)
                scratch = scratch_bytes(self.pid, self.disk)
            except (FileNotFoundError, ProcessLookupError):
                return
            with self.lock:
                for d in (self.win, self.whole):
                    self._take(d, "rss_anon", s.get("RssAnon", 0))
                    self._take(d, "rss_file", s.get("RssFile", 0))
                    self._take(d, "rss", s.get("VmRSS", 0))
                    self._take(d, "scratch", scratch)
                self._take(self.win, "free_min", free, min)
            self.stop.wait(0.05)

    def window(self):
        with self.lock:
            w = dict(self.win)
            free0 = self.free0
        out = {f"sampled_peak_{k}": w.get(k, 0) for k in ("rss", "rss_anon", "rss_file",
                                                            "scratch")}
        out["disk_used_peak"] = max(0, free0 - w.get("free_min", free0))
        return out

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.join()


def ckptctl_stat(ckptctl, path):
    info = stat_json(ckptctl, path)
    info.pop("tensors", None)  # per-tensor detail: not needed here, large
    return info


def heads_status(ckptctl, mnt):
    """The daemon's head-image counters (`ckptctl status`): how many saves freed their base's
    image behind them, and how many found it being published or open and kept it whole."""
    h = status_json(ckptctl, mnt).get("heads", {})
    return {k: h.get(k, 0) for k in ("retirements", "retire_refused")}


def streams_status(ckptctl, mnt):
    """The daemon's stream counters (`ckptctl status`): saves streamed, tensor bytes coded and
    kept in the cache as the next bases, saves that could not keep theirs whole."""
    st = status_json(ckptctl, mnt).get("streams", {})
    return {k: st.get(k, 0) for k in ("used", "coded_bytes", "kept_bytes", "not_kept")}


def du(path):
    """(apparent bytes, allocated bytes) of a directory tree: du -sb and du -sB1."""
    def one(flag):
        out = subprocess.run(["du", "-s", flag, path], check=True, capture_output=True, text=True)
        return int(out.stdout.split()[0])
    return one("-b"), one("-B1")


def du_breakdown(path):
    """{top-level entry: (apparent, allocated)}: objects, journal, staging, and whatever else the
    store holds (heads, ...)."""
    return {e: du(os.path.join(path, e)) for e in sorted(os.listdir(path))}


def prefault_for(size_bytes, cap):
    """fs_speed.prefault for a checkpoint of size_bytes (touches 1.5x that), capped so that it
    cannot drive the machine out of memory: returns the bytes touched."""
    mib = max(1, int(size_bytes // MiB))
    mib = min(mib, max(1, int(cap * 2 // 3 // MiB)))
    prefault(mib)
    return mib * MiB * 3 // 2


def mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def median(xs):
    return statistics.median(xs) if xs else float("nan")


# ---------------------------------------------------------------------------------------------
# State dicts of one size


def run_size(size_gib, args, cfg, work):
    d = os.path.join(work, f"size_{size_gib:g}GiB")
    plain, store, mnt = (os.path.join(d, x) for x in ("plain", "store", "mnt"))
    os.makedirs(os.path.join(plain, "run"))
    t = time.perf_counter()
    state = TrainingState(int(size_gib * GiB), seed=int(size_gib * 1000) + 1)
    r = {"size_gib": size_gib, "layout": state.describe(),
         "build_s": time.perf_counter() - t, "versions": [], "loads": []}
    refs = {}  # version -> snapshot (the newest, the one before, the oldest of the interval)
    kept = []  # plain versions on disk
    anchor = 1
    logical_total = 0
    print(f"\n[{size_gib:g} GiB] {r['layout']} (built in {r['build_s']:.1f} s)", flush=True)
    with mounted(args.ckptfs, store, mnt, cfg["opts"]) as proc, \
            Sampler(proc.pid, store) as sampler:
        r["daemon_start_rss"] = peak_rss(proc.pid)
        os.makedirs(os.path.join(mnt, "run"))
        for k in range(1, args.versions + 1):
            v = {"version": k}
            if k > 1:
                t = time.perf_counter()
                state.advance()
                v["generate_s"] = time.perf_counter() - t
            name = os.path.join("run", ckpt_name(args.layout, k))
            for side in ("mount", "plain") if k % 2 else ("plain", "mount"):
                if side == "mount":
                    reset_peak_rss(proc.pid)
                    sampler.reset()
                    v["mount_save_s"], v["mount_save_fsync_s"] = save_fsync(
                        state.sd, os.path.join(mnt, name), args.layout)
                    v["daemon_peak_rss"] = peak_rss(proc.pid)
                    v.update(sampler.window())
                    v["stat"] = ckptctl_stat(args.ckptctl, os.path.join(mnt, name))
                else:
                    v["plain_save_s"], v["plain_save_fsync_s"] = save_fsync(
                        state.sd, os.path.join(plain, name), args.layout)
                    v["logical_bytes"] = os.path.getsize(os.path.join(plain, name))
            logical_total += v["logical_bytes"]
            v["kind"] = v["stat"].get("kind", "?")
            if v["kind"] == "keyframe":
                anchor = k
            if k in (anchor, args.versions - 1, args.versions):
                refs[k] = snapshot(state.sd)
            refs = {j: s for j, s in refs.items() if j in (anchor, k - 1, k)}
            kept.append(k)
            for j in [j for j in kept if j not in (anchor, k, args.versions - 1)]:
                remove_version(os.path.join(plain, "run"), args.layout, j)
                kept.remove(j)
            r["versions"].append(v)
            print(f"  v{k} {v['kind']:8s} stored {v['stat'].get('stored_bytes', 0) / MiB:9.1f} MiB"
                  f" of {v['logical_bytes'] / MiB:.1f}; save+fsync mount "
                  f"{v['mount_save_fsync_s']:.2f} s, plain {v['plain_save_fsync_s']:.2f} s; "
                  f"daemon peak RSS {v['daemon_peak_rss'] / GiB:.2f} GiB", flush=True)
        r["plain_kept_versions"] = list(kept)
        r["plain_on_disk"] = du(plain)
        r["saves_daemon_peak_rss"] = max([r["daemon_start_rss"]] +
                                         [v["daemon_peak_rss"] for v in r["versions"]])
        r["saves_sampled_peak_rss_anon"] = sampler.whole.get("rss_anon", 0)
        r["heads"] = heads_status(args.ckptctl, mnt)
        unmount_from = time.perf_counter()
    r["unmount_s"] = time.perf_counter() - unmount_from
    del state
    gc.collect()
    r["logical_total_bytes"] = logical_total
    r["store_bytes"] = du(store)
    r["store_breakdown"] = du_breakdown(store)
    r["newest"], r["oldest"] = args.versions, anchor
    r["whichs"] = ["newest", "oldest"]
    # The version before the head: the keyframe and every delta up to it are decoded.
    r["prev"] = args.versions - 1 if args.versions - 1 > anchor else None
    if r["prev"]:
        r["whichs"].append("prev")

    loads = [(side, which) for which in r["whichs"] for side in ("plain", "mount")]
    for i in range(args.repeats):
        k = i % len(loads)
        for side, which in loads[k:] + loads[:k]:
            version = r[which]
            name = os.path.join("run", ckpt_name(args.layout, version))
            label = f"{size_gib:g} GiB, repeat {i}, {side} v{version}"
            size = r["versions"][version - 1]["logical_bytes"]
            rec = {"repeat": i, "side": side, "which": which, "version": version}
            drop_caches()
            if side == "plain":
                rec["prefault_bytes"] = prefault_for(size, mem_available() - 2 * GiB)
                t = time.perf_counter()
                sd = load(os.path.join(plain, name), args.layout)
                rec["load_s"] = time.perf_counter() - t
            else:
                with mounted(args.ckptfs, store, mnt, cfg["opts"]) as proc, \
                        Sampler(proc.pid, store) as sampler:
                    rec["prefault_bytes"] = prefault_for(size, mem_available() - 2 * GiB)
                    cpu0 = cpu_seconds(proc.pid)
                    t = time.perf_counter()
                    sd = load(os.path.join(mnt, name), args.layout)
                    rec["load_s"] = time.perf_counter() - t
                    rec["daemon_cpu_s"] = cpu_seconds(proc.pid) - cpu0
                    rec["daemon_peak_rss"] = peak_rss(proc.pid)
                    rec.update(sampler.window())
            rec["check"] = check(sd, refs[version], label, refs.get(version - 1))
            del sd
            gc.collect()
            r["loads"].append(rec)
            print(f"  load {which} (v{version}) {side:5s} {rec['load_s']:.2f} s"
                  + (f", daemon cpu {rec['daemon_cpu_s']:.2f} s, peak RSS "
                     f"{rec['daemon_peak_rss'] / GiB:.2f} GiB" if side == "mount" else "")
                  + f"; max err {rec['check']['max_rel_err']:.2g} of range", flush=True)
    summarise_size(r, cfg)
    return r


def summarise_size(r, cfg):
    vs = r["versions"]
    deltas = vs[1:]
    s = {"v1": {x: vs[0][f"{x}_save_fsync_s"] for x in ("mount", "plain")}}
    s["v1"]["ratio"] = s["v1"]["mount"] / s["v1"]["plain"]
    s["deltas"] = {
        "n": len(deltas),
        "kinds": [v["kind"] for v in deltas],
        "mount": median([v["mount_save_fsync_s"] for v in deltas]),
        "plain": median([v["plain_save_fsync_s"] for v in deltas]),
        "mount_returned": median([v["mount_save_s"] for v in deltas]),
        "plain_returned": median([v["plain_save_s"] for v in deltas]),
        "median_of_ratios": median([v["mount_save_fsync_s"] / v["plain_save_fsync_s"]
                                    for v in deltas]),
    }
    s["deltas"]["ratio_of_medians"] = s["deltas"]["mount"] / s["deltas"]["plain"]
    for which in r["whichs"]:
        ls = [x for x in r["loads"] if x["which"] == which]
        m = {x["repeat"]: x["load_s"] for x in ls if x["side"] == "mount"}
        p = {x["repeat"]: x["load_s"] for x in ls if x["side"] == "plain"}
        s[which] = {"version": r[which], "n": len(m), "mount": median(list(m.values())),
                    "plain": median(list(p.values())),
                    "median_of_ratios": median([m[i] / p[i] for i in m]),
                    "daemon_cpu_s": median([x["daemon_cpu_s"] for x in ls if x["side"] == "mount"]),
                    "max_rel_err": max(x["check"]["max_rel_err"] for x in ls
                                       if x["side"] == "mount"),
                    "exp_avg_sq_off_2x": max(x["check"]["exp_avg_sq_off_2x"] for x in ls
                                             if x["side"] == "mount"),
                    "max_err_vs_change": max((x["check"]["max_err_vs_change"] or 0) for x in ls
                                             if x["side"] == "mount"),
                    "plain_max_rel_err": max(x["check"]["max_rel_err"] for x in ls
                                             if x["side"] == "plain")}
        s[which]["ratio_of_medians"] = s[which]["mount"] / s[which]["plain"]
    loads_rss = max([x["daemon_peak_rss"] for x in r["loads"] if x["side"] == "mount"], default=0)
    s["rss"] = {"saves": r["saves_daemon_peak_rss"], "loads": loads_rss,
                "whole": max(r["saves_daemon_peak_rss"], loads_rss),
                "saves_sampled_anon": r["saves_sampled_peak_rss_anon"],
                "loads_sampled_anon": max([x["sampled_peak_rss_anon"] for x in r["loads"]
                                           if x["side"] == "mount"], default=0),
                "budget": cfg["budget"]}
    s["rss"]["within_budget"] = s["rss"]["whole"] <= cfg["budget"]
    s["disk_used_peak_saves"] = max(v["disk_used_peak"] for v in vs)
    s["scratch_peak_saves"] = max(v["sampled_peak_scratch"] for v in vs)
    s["ratio"] = r["logical_total_bytes"] / max(r["store_bytes"][1], 1)
    r["summary"] = s


def print_size(r, cfg):
    s = r["summary"]
    n = len(r["versions"])
    print(f"\n== {r['size_gib']:g} GiB training state, {n} versions: mount vs plain directory "
          f"(-o {cfg['opts']}) ==")
    print(f"   {r['layout']}")
    print("   kinds: " + ", ".join(f"v{v['version']} {v['kind']}" for v in r["versions"]))
    rows = [("save+fsync v1 (keyframe), s", s["v1"]["mount"], s["v1"]["plain"],
             s["v1"]["ratio"], ""),
            (f"save+fsync deltas, median of {s['deltas']['n']}, s", s["deltas"]["mount"],
             s["deltas"]["plain"], s["deltas"]["ratio_of_medians"],
             f"median of ratios {s['deltas']['median_of_ratios']:.2f}"),
            ("  torch.save returned (deltas), s", s["deltas"]["mount_returned"],
             s["deltas"]["plain_returned"],
             s["deltas"]["mount_returned"] / s["deltas"]["plain_returned"], "")]
    for which in r["whichs"]:
        w = s[which]
        rows.append((f"load {which} (v{w['version']}) after remount, median of {w['n']}, s",
                     w["mount"], w["plain"], w["ratio_of_medians"],
                     f"median of ratios {w['median_of_ratios']:.2f}, daemon cpu "
                     f"{w['daemon_cpu_s']:.2f} s"))
    width = max(len(x[0]) for x in rows) + 2
    print(f"   {'':{width}s}{'mount':>9s}{'plain':>9s}{'mount/plain':>13s}")
    for label, m, p, ratio, note in rows:
        print(f"   {label:{width}s}{m:9.2f}{p:9.2f}{ratio:13.2f}   {note}")
    rss = s["rss"]
    print(f"   daemon peak RSS (VmHWM): saves {rss['saves'] / GiB:.2f} GiB, loads "
          f"{rss['loads'] / GiB:.2f} GiB, whole {rss['whole'] / GiB:.2f} GiB; budget cache + "
          f"buffer + 512 MiB = {rss['budget'] / GiB:.2f} GiB: "
          + ("within" if rss["within_budget"] else "OVER"))
    print(f"   sampled peak anonymous RSS: saves {rss['saves_sampled_anon'] / GiB:.2f} GiB, "
          f"loads {rss['loads_sampled_anon'] / GiB:.2f} GiB; scratch files (staging, head "
          f"images) at the peak of a save {s['scratch_peak_saves'] / GiB:.2f} GiB (disk space used "
          f"{s['disk_used_peak_saves'] / GiB:.2f} GiB)")
    if r.get("heads"):
        print(f"   saves that freed their base's head image behind them: "
              f"{r['heads']['retirements']}, kept it whole (being published, or open): "
              f"{r['heads']['retire_refused']}")
    app, alloc = r["store_bytes"]
    parts = ", ".join(f"{e} {b[1] / MiB:.1f}" for e, b in r["store_breakdown"].items())
    print(f"   store: {alloc / MiB:.1f} MiB allocated ({app / MiB:.1f} apparent; MiB: {parts}) "
          f"for {r['logical_total_bytes'] / MiB:.1f} MiB of {n} versions: {s['ratio']:.1f}x; "
          f"plain dir on disk {r['plain_on_disk'][1] / MiB:.1f} MiB "
          f"(versions {r['plain_kept_versions']} kept)")
    print("   per version stored MiB: " + ", ".join(
        f"v{v['version']} {v['stat'].get('stored_bytes', 0) / MiB:.1f}" for v in r["versions"]))
    plain_err = max(s["newest"]["plain_max_rel_err"], s["oldest"]["plain_max_rel_err"])
    print(f"   check (sampled elements): max error of a mount load {s['newest']['max_rel_err']:.2g}"
          f" (newest), {s['oldest']['max_rel_err']:.2g} (oldest) of the tensor's range "
          f"(tolerance {TOLERANCE}, exp_avg {FIRST_MOMENT_TOLERANCE}; plain {plain_err:.2g}); "
          f"newest: {s['newest']['max_err_vs_change']:.2f} of the tensor's largest change since "
          f"the previous version, exp_avg_sq elements off by > 2x: "
          f"{s['newest']['exp_avg_sq_off_2x']}", flush=True)


# ---------------------------------------------------------------------------------------------
# Concurrent writers


def side_order(step):
    return ("mount", "plain") if step % 2 else ("plain", "mount")


def restore_order(round_):
    return ("mount", "plain") if round_ % 2 == 0 else ("plain", "mount")


def rank_path(dirs, side, rank, step, layout):
    return os.path.join(dirs[side], f"ckpt_rank{rank}", ckpt_name(layout, step, rank))


def writer_process(rank, ranks, shard_bytes, steps, restores, dirs, barrier, results, layout):
    """One rank of `ranks`: builds its own state, then per step and side waits for the release
    and saves ckpt_rank{rank}/step_{step}.pt (or the DCP shard) with fsync. Then, `restores`
    times per side (restore_order), touches fresh memory as the other load benchmarks do
    (prefault_for, its share of what the machine has free), waits for the release and loads its
    newest version, as every rank does after a failure; the load is checked against the state
    it saved (check()) once every rank has loaded (the next barrier), so that checks do not
    take CPU from ranks still loading."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the parent stops the ranks
        torch.set_num_threads(1)
        state = TrainingState(shard_bytes, seed=7000 + rank)
        for step in range(1, steps + 1):
            if step > 1:
                state.advance()
            for side in side_order(step):
                path = rank_path(dirs, side, rank, step, layout)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                barrier.wait(BARRIER_TIMEOUT)
                start = time.monotonic()
                returned, total = save_fsync(state.sd, path, layout)
                results.put({"rank": rank, "step": step, "side": side, "start": start,
                             "end": time.monotonic(), "save_s": returned, "save_fsync_s": total,
                             "bytes": os.path.getsize(path)})
        ref = snapshot(state.sd)
        del state  # the rank's memory holds one state at a time, as a restarted rank's does
        gc.collect()
        for round_ in range(restores):
            for side in restore_order(round_):
                path = rank_path(dirs, side, rank, steps, layout)
                prefault_for(shard_bytes, (mem_available() - 2 * GiB) / ranks)
                barrier.wait(BARRIER_TIMEOUT)
                start = time.monotonic()
                sd = load(path, layout)
                end = time.monotonic()
                results.put({"rank": rank, "round": round_, "side": side, "start": start,
                             "end": end, "load_s": end - start})
                barrier.wait(BARRIER_TIMEOUT)  # every rank has loaded: now the checks
                checked = check(sd, ref, f"rank {rank} restore from {side}")
                del sd
                gc.collect()
                results.put({"rank": rank, "round": round_, "side": side, "check": checked})
    except BaseException:  # noqa: B902 - reported to the parent, which stops the run
        results.put({"rank": rank, "error": traceback.format_exc()})
        barrier.abort()
        sys.exit(1)


def collect(results, n, procs, barrier):
    """n results from the writers; raises if one failed or died."""
    got = []
    while len(got) < n:
        try:
            x = results.get(timeout=1.0)
        except Exception:  # queue.Empty
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead:
                barrier.abort()
                raise RuntimeError(f"writer process exited with status {dead[0].exitcode}")
            continue
        if "error" in x:
            raise RuntimeError(f"writer rank {x['rank']} failed:\n{x['error']}")
        got.append(x)
    return got


def release_ranks(args, barrier, results, procs):
    """Passes the barrier with the ranks and collects one result from each, by rank: (results,
    wall seconds from the release to the last rank's end). A rank that failed before the
    barrier has its error raised, not the broken barrier's."""
    try:
        barrier.wait(BARRIER_TIMEOUT)
    except threading.BrokenBarrierError:
        collect(results, args.writers, procs, barrier)  # raises the rank's error if it sent one
        raise
    release = time.monotonic()
    got = sorted(collect(results, args.writers, procs, barrier), key=lambda x: x["rank"])
    if "end" not in got[0]:
        return got, 0.0
    return got, max(x["end"] for x in got) - min([release] + [x["start"] for x in got])


def machine_cpu():
    """(busy, iowait, total) jiffies of all CPUs since boot (/proc/stat's first line: user,
    nice, system, idle, iowait, irq, softirq, steal; guest time is inside user already)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    idle, iowait = v[3], v[4]
    return sum(v) - idle - iowait, iowait, sum(v)


def writers_step(step, side, args, proc, sampler, barrier, results, procs, plain):
    """Releases the ranks for one step on one side and waits for every rank's fsync. Records,
    besides the wall time, what bound it: the share of the machine's CPU time busy and waiting
    for I/O over the step, and for the mount the daemon's CPU seconds and disk bytes."""
    if side == "mount":
        reset_peak_rss(proc.pid)
        sampler.reset()
        cpu0, io0 = cpu_seconds(proc.pid), proc_io(proc.pid)
    m0 = machine_cpu()
    got, wall = release_ranks(args, barrier, results, procs)
    m1 = machine_cpu()
    total = max(1, m1[2] - m0[2])
    rec = {"step": step, "side": side, "ranks": got, "wall_s": wall,
           "bytes": sum(x["bytes"] for x in got),
           "cpu_busy": (m1[0] - m0[0]) / total, "cpu_iowait": (m1[1] - m0[1]) / total}
    if side == "mount":
        rec["daemon_peak_rss"] = peak_rss(proc.pid)
        rec["daemon_cpu_s"] = cpu_seconds(proc.pid) - cpu0
        io1 = proc_io(proc.pid)
        rec["daemon_read"] = io1["read_bytes"] - io0["read_bytes"]
        rec["daemon_written"] = io1["write_bytes"] - io0["write_bytes"]
        rec.update(sampler.window())
    elif step > 2 and not args.writer_keep:  # the plain side keeps two versions per rank
        for rank in range(args.writers):
            remove_version(os.path.join(plain, f"ckpt_rank{rank}"), args.layout, step - 2, rank)
    print(f"  step {step} {side:5s} {rec['wall_s']:.2f} s, CPU busy {rec['cpu_busy']:.0%}, "
          f"iowait {rec['cpu_iowait']:.0%}"
          + (f", daemon CPU {rec['daemon_cpu_s']:.1f} s, read "
             f"{rec['daemon_read'] / GiB:.2f} GiB, wrote {rec['daemon_written'] / GiB:.2f} GiB, "
             f"peak RSS {rec['daemon_peak_rss'] / GiB:.2f} GiB" if side == "mount" else ""),
          flush=True)
    return rec


def rotate_writers(step, args, proc, store, mnt, plain, io_start):
    """--writer-keep K: every rank's versions beyond its newest K go on both sides (DCP: the
    step directory, as a rotation of step_N/ directories removes it; torch: the file), then,
    once the daemon has looked at the deletions and done its rewrites, the store's bytes
    (objects, head images, journal: du of the store) against the rotated plain directory's, and
    the bytes the daemon has written to the disk since the first step."""
    if step > args.writer_keep:
        for side_dir in (mnt, plain):
            for rank in range(args.writers):
                remove_version(os.path.join(side_dir, f"ckpt_rank{rank}"), args.layout,
                               step - args.writer_keep, rank)
    t = time.perf_counter()
    status = settle_rotation(args.ckptctl, mnt, store, deadline_s=900, watched=store)
    heads = os.path.join(store, "heads")  # none with heads=off
    rot = status["rotation"]
    rec = {"step": step, "settle_s": time.perf_counter() - t, "store_bytes": du(store)[1],
           "heads_bytes": du(heads)[1] if os.path.isdir(heads) else 0, "plain_bytes": du(plain)[1],
           "rewrites": rot["rewrites"], "rewrite_written_bytes": rot["written_bytes"],
           "rewrite_freed_bytes": rot["freed_bytes"],
           "daemon_disk_written": proc_io(proc.pid)["write_bytes"] - io_start}
    print(f"  step {step} rotated to {min(step, args.writer_keep)} per rank: store "
          f"{rec['store_bytes'] / GiB:.2f} GiB (head images {rec['heads_bytes'] / GiB:.2f}) = "
          f"{rec['store_bytes'] / max(rec['plain_bytes'], 1):.2f}x the plain directory's "
          f"{rec['plain_bytes'] / GiB:.2f} GiB; rewrites {rec['rewrites']} (wrote "
          f"{rec['rewrite_written_bytes'] / GiB:.2f}, freed {rec['rewrite_freed_bytes'] / GiB:.2f}"
          f" GiB); settled in {rec['settle_s']:.1f} s", flush=True)
    return rec


def run_writers(args, cfg, work):
    d = os.path.join(work, "writers")
    plain, store, mnt = (os.path.join(d, x) for x in ("plain", "store", "mnt"))
    os.makedirs(plain)
    shard = int(args.shard_gib * GiB)
    ctx = multiprocessing.get_context("spawn")  # no fork of a process that ran torch threads
    barrier = ctx.Barrier(args.writers + 1)
    results = ctx.Queue()
    r = {"writers": args.writers, "shard_gib": args.shard_gib, "steps": []}
    procs = []
    print(f"\n[writers] {args.writers} ranks x {args.shard_gib:g} GiB, {args.writer_steps} steps",
          flush=True)
    with mounted(args.ckptfs, store, mnt, cfg["opts"]) as proc, \
            Sampler(proc.pid, store) as sampler:
        r["daemon_start_rss"] = peak_rss(proc.pid)
        dirs = {"mount": mnt, "plain": plain}
        watcher_stop = threading.Event()

        def watch():  # a rank killed (OOM, say) would leave the others waiting at the barrier
            while not watcher_stop.wait(1.0):
                if any(p.exitcode not in (None, 0) for p in procs):
                    barrier.abort()
                    return
        try:
            for rank in range(args.writers):
                p = ctx.Process(target=writer_process, daemon=True,
                                args=(rank, args.writers, shard, args.writer_steps, args.repeats,
                                      dirs, barrier, results, args.layout))
                p.start()
                procs.append(p)
            threading.Thread(target=watch, daemon=True).start()
            r["stat"], r["rotation"] = {}, []
            io_start = proc_io(proc.pid)["write_bytes"]
            for step in range(1, args.writer_steps + 1):
                for side in side_order(step):
                    r["steps"].append(writers_step(step, side, args, proc, sampler, barrier,
                                                   results, procs, plain))
                # Each new version's record, before a rotation can remove it.
                for rank in range(args.writers):
                    r["stat"][f"{rank}/{step}"] = ckptctl_stat(
                        args.ckptctl,
                        os.path.join(mnt, f"ckpt_rank{rank}", ckpt_name(args.layout, step, rank)))
                if args.writer_keep:
                    r["rotation"].append(rotate_writers(step, args, proc, store, mnt, plain,
                                                        io_start))
            r["sampled_peak_rss_anon"] = sampler.whole.get("rss_anon", 0)
            r["heads"] = heads_status(args.ckptctl, mnt)
            r["streams"] = streams_status(args.ckptctl, mnt)
            r["store_bytes"] = du(store)
            r["store_breakdown"] = du_breakdown(store)
        except BaseException:
            stop_ranks(procs, watcher_stop)
            raise
    # Every rank restores its newest version at once, as after a failure: from a fresh daemon
    # each time (a remount, the page cache dropped) and from the plain directory.
    r["restores"] = []
    try:
        for round_ in range(args.repeats):
            for side in restore_order(round_):
                r["restores"].append(restore_step(round_, side, args, cfg, store, mnt, barrier,
                                                  results, procs, watcher_stop))
        for p in procs:
            p.join(60)
    finally:
        stop_ranks(procs, watcher_stop)
    summarise_writers(r, args, cfg)
    return r


def stop_ranks(procs, watcher_stop):
    """Before an unmount: a rank still writing or reading would keep the mount busy."""
    watcher_stop.set()
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(5)
        if p.is_alive():
            p.kill()
            p.join()


def restore_step(round_, side, args, cfg, store, mnt, barrier, results, procs, watcher_stop):
    """Releases the ranks to load their newest version from one side and waits for every
    load, then for their checks: the mount side from a daemon started for it, the page cache
    dropped on both."""
    def release():
        drop_caches()
        got, wall = release_ranks(args, barrier, results, procs)
        checks, _ = release_ranks(args, barrier, results, procs)
        for x, c in zip(got, checks):
            x["check"] = c["check"]
        return {"round": round_, "side": side, "ranks": got, "wall_s": wall}
    if side == "mount":
        with mounted(args.ckptfs, store, mnt, cfg["opts"]) as proc:
            try:
                cpu0 = cpu_seconds(proc.pid)
                rec = release()
                rec["daemon_cpu_s"] = cpu_seconds(proc.pid) - cpu0
                rec["daemon_peak_rss"] = peak_rss(proc.pid)
            except BaseException:
                stop_ranks(procs, watcher_stop)  # before the unmount: ranks may be reading
                raise
    else:
        rec = release()
    print(f"  restore {round_ + 1} {side:5s} {rec['wall_s']:.2f} s"
          + (f", daemon peak RSS {rec['daemon_peak_rss'] / GiB:.2f} GiB, daemon CPU "
             f"{rec['daemon_cpu_s']:.1f} s" if side == "mount" else ""), flush=True)
    return rec


def summarise_writers(r, args, cfg):
    mount = [x for x in r["steps"] if x["side"] == "mount"]
    plain = {x["step"]: x for x in r["steps"] if x["side"] == "plain"}
    s = {"per_step": [{"step": m["step"], "mount_s": m["wall_s"],
                       "plain_s": plain[m["step"]]["wall_s"],
                       "ratio": m["wall_s"] / plain[m["step"]]["wall_s"],
                       "daemon_peak_rss": m["daemon_peak_rss"],
                       "scratch_peak": m["sampled_peak_scratch"],
                       "disk_used_peak": m["disk_used_peak"],
                       "daemon_cpu_s": m["daemon_cpu_s"],
                       "daemon_read": m["daemon_read"], "daemon_written": m["daemon_written"],
                       "cpu_busy": m["cpu_busy"], "cpu_iowait": m["cpu_iowait"],
                       "plain_cpu_busy": plain[m["step"]]["cpu_busy"],
                       "plain_cpu_iowait": plain[m["step"]]["cpu_iowait"]} for m in mount]}
    s["daemon_peak_rss"] = max([r["daemon_start_rss"]] + [m["daemon_peak_rss"] for m in mount])
    s["budget"] = cfg["budget"]
    s["within_budget"] = s["daemon_peak_rss"] <= cfg["budget"]
    later, deltas, own_base, wrong = 0, 0, 0, []
    for rank in range(args.writers):
        for step in range(2, args.writer_steps + 1):
            info = r["stat"][f"{rank}/{step}"]
            prev = r["stat"][f"{rank}/{step - 1}"]
            later += 1
            if info.get("kind") == "delta":
                deltas += 1
                if info.get("base") == prev.get("version"):
                    own_base += 1
                else:
                    wrong.append(f"rank {rank} step {step}: base {info.get('base')}, own "
                                 f"previous {prev.get('version')}")
            else:
                wrong.append(f"rank {rank} step {step}: {info.get('kind')}")
    s.update({"later_versions": later, "deltas": deltas, "delta_on_own_previous": own_base,
              "all_deltas": later == own_base, "not_deltas_or_wrong_base": wrong})
    s["logical_bytes"] = sum(x["bytes"] for x in mount)
    s["ratio"] = s["logical_bytes"] / max(r["store_bytes"][1], 1)
    if r.get("rotation"):
        rot = r["rotation"]
        late = [x for x in rot if x["step"] > args.writer_keep]
        s["rotation"] = {
            "keep": args.writer_keep,
            "store_over_plain": [x["store_bytes"] / max(x["plain_bytes"], 1) for x in rot],
            "store_over_plain_after_keep": [x["store_bytes"] / max(x["plain_bytes"], 1)
                                            for x in late],
            "daemon_disk_written": rot[-1]["daemon_disk_written"],
            "disk_written_over_plain": rot[-1]["daemon_disk_written"] / max(s["logical_bytes"], 1),
            "rewrites": rot[-1]["rewrites"],
            "rewrite_written_bytes": rot[-1]["rewrite_written_bytes"],
            "rewrite_freed_bytes": rot[-1]["rewrite_freed_bytes"]}
    restores = {(x["round"], x["side"]): x for x in r.get("restores", [])}
    rounds = sorted(k for k, side in restores if side == "mount" and (k, "plain") in restores)
    s["restores"] = [{"round": k, "mount_s": restores[(k, "mount")]["wall_s"],
                      "plain_s": restores[(k, "plain")]["wall_s"],
                      "ratio": restores[(k, "mount")]["wall_s"] / restores[(k, "plain")]["wall_s"],
                      "daemon_peak_rss": restores[(k, "mount")]["daemon_peak_rss"],
                      "daemon_cpu_s": restores[(k, "mount")].get("daemon_cpu_s", 0.0),
                      "max_rel_err": max(x["check"]["max_rel_err"]
                                         for x in restores[(k, "mount")]["ranks"])}
                     for k in rounds]
    if s["restores"]:
        s["restore_ratio_median"] = median([x["ratio"] for x in s["restores"]])
        s["restore_peak_rss"] = max(x["daemon_peak_rss"] for x in s["restores"])
        s["restore_within_budget"] = s["restore_peak_rss"] <= cfg["budget"]
    r["summary"] = s


def print_writers(r, cfg):
    s = r["summary"]
    print(f"\n== {r['writers']} concurrent writers x {r['shard_gib']:g} GiB, save+fsync, "
          f"wall time from the barrier's release to the last fsync (-o {cfg['opts']}) ==")
    print(f"   {'step':6s}{'mount s':>9s}{'plain s':>9s}{'mount/plain':>13s}"
          f"{'daemon peak RSS':>17s}{'scratch peak':>14s}")
    for x in s["per_step"]:
        print(f"   {x['step']:<6d}{x['mount_s']:9.2f}{x['plain_s']:9.2f}{x['ratio']:13.2f}"
              f"{x['daemon_peak_rss'] / GiB:13.2f} GiB{x['scratch_peak'] / GiB:10.2f} GiB")
    print("   what bound each step: the machine's CPU time busy and in iowait over the step, the "
          "daemon's CPU and disk bytes")
    print(f"   {'step':6s}{'mount busy/iowait':>19s}{'plain busy/iowait':>19s}{'daemon CPU':>12s}"
          f"{'daemon read':>13s}{'daemon wrote':>14s}")
    for x in s["per_step"]:
        print(f"   {x['step']:<6d}{x['cpu_busy']:>12.0%} /{x['cpu_iowait']:>4.0%}"
              f"{x['plain_cpu_busy']:>12.0%} /{x['plain_cpu_iowait']:>4.0%}"
              f"{x['daemon_cpu_s']:10.1f} s{x['daemon_read'] / GiB:9.2f} GiB"
              f"{x['daemon_written'] / GiB:10.2f} GiB")
    print(f"   daemon peak RSS {s['daemon_peak_rss'] / GiB:.2f} GiB (sampled anonymous "
          f"{r['sampled_peak_rss_anon'] / GiB:.2f} GiB); budget {s['budget'] / GiB:.2f} GiB: "
          + ("within" if s["within_budget"] else "OVER"))
    print(f"   versions after each rank's first: {s['deltas']}/{s['later_versions']} deltas, "
          f"{s['delta_on_own_previous']}/{s['later_versions']} on their own rank's previous "
          f"version" + ("" if s["all_deltas"]
                        else ": " + "; ".join(s["not_deltas_or_wrong_base"][:8])))
    if r.get("heads"):
        print(f"   saves that freed their base's head image behind them: "
              f"{r['heads']['retirements']}, kept it whole (being published, or open): "
              f"{r['heads']['retire_refused']}")
    if r.get("streams"):
        st = r["streams"]
        print(f"   streams: {st['used']} saves, coded {st['coded_bytes'] / GiB:.2f} GiB, kept "
              f"{st['kept_bytes'] / GiB:.2f} GiB in the cache as the next bases; "
              f"{st['not_kept']} saves not kept whole")
    app, alloc = r["store_bytes"]
    if s.get("rotation"):
        rot = s["rotation"]
        after = rot["store_over_plain_after_keep"]
        print(f"   rotation, {rot['keep']} kept per rank: store / rotated plain directory after "
              f"each step " + ", ".join(f"{x:.2f}" for x in rot["store_over_plain"])
              + (f" (from step {rot['keep'] + 1}: {min(after):.2f}-{max(after):.2f}x)"
                 if after else ""))
        print(f"   rewrites {rot['rewrites']}: wrote {rot['rewrite_written_bytes'] / GiB:.2f} GiB, "
              f"freed {rot['rewrite_freed_bytes'] / GiB:.2f} GiB; the daemon wrote "
              f"{rot['daemon_disk_written'] / GiB:.2f} GiB to the disk in all, "
              f"{rot['disk_written_over_plain']:.2f}x the {s['logical_bytes'] / GiB:.2f} GiB "
              f"the ranks saved")
    else:
        print(f"   store: {alloc / MiB:.1f} MiB allocated ({app / MiB:.1f} apparent) for "
              f"{s['logical_bytes'] / MiB:.1f} MiB written: {s['ratio']:.1f}x", flush=True)
    if not s["restores"]:
        return
    print(f"\n== the {r['writers']} ranks restore their newest version at once: wall time from the "
          f"release to the last load, a fresh daemon and the page cache dropped ==")
    print(f"   {'round':6s}{'mount s':>9s}{'plain s':>9s}{'mount/plain':>13s}"
          f"{'daemon peak RSS':>17s}{'daemon CPU':>12s}{'max error':>11s}")
    for x in s["restores"]:
        print(f"   {x['round'] + 1:<6d}{x['mount_s']:9.2f}{x['plain_s']:9.2f}{x['ratio']:13.2f}"
              f"{x['daemon_peak_rss'] / GiB:13.2f} GiB{x['daemon_cpu_s']:10.1f} s"
              f"{x['max_rel_err']:11.2e}")
    print(f"   median mount/plain {s['restore_ratio_median']:.2f}; daemon peak RSS "
          f"{s['restore_peak_rss'] / GiB:.2f} GiB, budget {s['budget'] / GiB:.2f} GiB: "
          + ("within" if s["restore_within_budget"] else "OVER")
          + "; max error: share of the tensor's range (check())", flush=True)


# ---------------------------------------------------------------------------------------------
# Setup


def parse_size(text):
    """The daemon's SIZE syntax: a number with an optional K, M, G or T suffix (powers of 1024)."""
    m = re.fullmatch(r"([0-9.]+)\s*([KMGT]?)(I?B)?", text.strip().upper())
    if not m:
        raise ValueError(f"invalid size {text!r} (examples: 512M, 2G)")
    return int(float(m.group(1)) * 1024 ** " KMGT".index(m.group(2) or " "))


def daemon_defaults(binary):
    """cache= and buffer= defaults from `ckptfs --help` (2G and 1G when it does not say)."""
    out = subprocess.run([binary, "--help"], capture_output=True, text=True).stdout
    found = {}
    for key, fallback in (("cache", "2G"), ("buffer", "1G")):
        # "(default RAM/8, from 256M to 2G: 2G here)" names the value this machine gets.
        m = re.search(rf"-o {key}=SIZE.*?\(default [^)]*?(\d+[KMGT]?) here\)", out, re.S) or \
            re.search(rf"-o {key}=SIZE.*?\(default ([^)]+)\)", out, re.S)
        found[key] = m.group(1).strip() if m else fallback
    return found


def machine_info(args):
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        ram = int(f.readline().split()[1]) * 1024
    fstype = subprocess.run(["findmnt", "-n", "-o", "FSTYPE", "--target", args.dir],
                            capture_output=True, text=True).stdout.strip() or "?"
    version = subprocess.run([args.ckptfs, "--version"], capture_output=True,
                             text=True).stdout.strip()
    commit = subprocess.run(["git", "-C", os.path.dirname(os.path.abspath(args.ckptfs)),
                             "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    return {"command": shlex.join([sys.executable] + sys.argv),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "kernel": f"{platform.system()} {platform.release()} {platform.version()}",
            "cpu": cpu, "cpus": os.cpu_count(), "ram_bytes": ram,
            "base_dir": args.dir, "base_fstype": fstype, "ckptfs": os.path.abspath(args.ckptfs),
            "ckptfs_version": version, "ckptfs_commit": commit, "torch": torch.__version__,
            "loadavg_start": os.getloadavg()}


def print_header(h, cfg):
    print(f"command: {h['command']}")
    print(f"date:    {h['date']}")
    print(f"kernel:  {h['kernel']}")
    print(f"cpu:     {h['cpu']} x {h['cpus']}; RAM {h['ram_bytes'] / GiB:.1f} GiB; "
          f"load average {' '.join(f'{x:.2f}' for x in h['loadavg_start'])}")
    print(f"disk:    {h['base_dir']} ({h['base_fstype']})")
    print(f"ckptfs:  {h['ckptfs']} ({h['ckptfs_version'] or '?'}, commit "
          f"{h['ckptfs_commit'] or '?'}); torch {h['torch']}")
    print(f"mount:   -o {cfg['opts']}; memory budget cache + buffer + 512 MiB = "
          f"{cfg['budget'] / GiB:.2f} GiB", flush=True)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ckptfs", help="the daemon binary, e.g. build/bin/ckptfs")
    ap.add_argument("--ckptctl", help="default: ckptctl next to CKPTFS")
    ap.add_argument("--dir", default="/var/tmp", help="base directory (a real disk)")
    ap.add_argument("--opts", default="", help="more -o options for the mount, e.g. bits=4")
    ap.add_argument("--cache", help="-o cache= (default: the daemon's)")
    ap.add_argument("--buffer", help="-o buffer= (default: the daemon's)")
    ap.add_argument("--sizes", help="GiB, comma-separated (default 1,4,12)")
    ap.add_argument("--versions", type=int, help="versions per size (default 6)")
    ap.add_argument("--repeats", type=int, help="loads per case (default 3)")
    ap.add_argument("--writers", type=int, help="concurrent writer processes (default 8)")
    ap.add_argument("--shard-gib", type=float, help="GiB per writer (default 1)")
    ap.add_argument("--writer-steps", type=int, help="steps of the writers (default 3)")
    ap.add_argument("--writer-keep", type=int, default=0, metavar="K",
                    help="rotate: after each step, every rank's versions beyond its newest K "
                    "go on both sides, and the store is measured against the rotated plain "
                    "directory (default 0: the mount keeps every version)")
    ap.add_argument("--layout", choices=("torch", "dcp"), default="torch",
                    help="torch: one torch.save file per version (default); dcp: a DCP shard "
                    "per version and rank (step_K/__R_0.distcp, .metadata beside it)")
    ap.add_argument("--skip-sizes", action="store_true")
    ap.add_argument("--skip-writers", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the directories")
    ap.add_argument("--json", metavar="PATH", help="write every measurement to PATH")
    ap.add_argument("--quick", action="store_true",
                    help="0.25 GiB, 3 versions, 2 writers x 128 MiB, 1 repeat (smoke test)")
    args = ap.parse_args()
    defaults = ({"sizes": "0.25", "versions": 3, "repeats": 1, "writers": 2, "shard_gib": 0.125,
                 "writer_steps": 3} if args.quick else
                {"sizes": "1,4,12", "versions": 6, "repeats": 3, "writers": 8, "shard_gib": 1.0,
                 "writer_steps": 3})
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    args.size_list = [float(x) for x in args.sizes.split(",") if x.strip()]
    args.ckptctl = args.ckptctl or os.path.join(os.path.dirname(os.path.abspath(args.ckptfs)),
                                                "ckptctl")
    if args.versions < 2 or args.repeats < 1 or args.writers < 1 or args.writer_steps < 2:
        ap.error("need --versions >= 2, --repeats >= 1, --writers >= 1, --writer-steps >= 2")
    if args.writer_keep < 0:
        ap.error("--writer-keep must be at least 1 (0: no rotation)")
    if any(s <= 0 for s in args.size_list) or args.shard_gib <= 0:
        ap.error("sizes must be positive")
    if re.search(r"(^|,)\s*(cache|buffer)=", args.opts):
        ap.error("give cache= and buffer= as --cache/--buffer (the budget check needs them)")
    for f in (args.ckptfs, args.ckptctl):
        if not os.access(f, os.X_OK):
            ap.error(f"{f} is not an executable")
    return args


def preflight(args, cfg):
    """Refuses (exit 1, with the reason) when not root, without FUSE, or short of disk or RAM."""
    problems = []
    if os.geteuid() != 0:
        problems.append("needs root (drop_caches and FUSE mounts): run it with sudo")
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        problems.append("/dev/fuse is not available")
    sizes = [] if args.skip_sizes else args.size_list
    shards = 0 if args.skip_writers else args.writers * args.shard_gib
    # A size: three plain versions, and a store of about twice the size at 6 versions (keyframe,
    # deltas, head image). Measured at 12 GiB: 24.6 GiB plain (two versions), 24.8 GiB store.
    # Each size's directory and the writers' go before the next starts, unless --keep.
    if args.keep:
        need_disk = (5 * sum(sizes) + 3 * shards) * GiB
    else:
        need_disk = max(5 * max(sizes, default=0), 3 * shards) * GiB
    free = free_bytes(args.dir)
    if need_disk > free:
        problems.append(f"needs about {need_disk / GiB:.1f} GiB free under {args.dir} (5x the "
                        f"largest size or 3x the writers' shards), has {free / GiB:.1f} GiB")
    with open("/proc/meminfo") as f:
        ram = int(f.readline().split()[1]) * 1024
    need_ram = max(max(sizes, default=0), shards) * GiB + cfg["cache"] + cfg["buffer"] + GiB
    if need_ram > ram:
        problems.append(f"needs about {need_ram / GiB:.1f} GiB of RAM (the largest state or all "
                        f"shards, plus cache + buffer + 1 GiB), has {ram / GiB:.1f} GiB")
    if problems:
        print("fs_scale.py: " + "; ".join(problems), file=sys.stderr)
        sys.exit(1)


def unmount_all_under(path):
    """Detaches any mount left under `path` (so that rmtree cannot walk into a live mount)."""
    path = os.path.abspath(path)
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split()[4] for line in f]
    for m in sorted(mounts, reverse=True):
        if m.startswith(path + os.sep):
            subprocess.run(["fusermount3", "-uz", m], check=False, stderr=subprocess.DEVNULL)


def tail_logs(work):
    for root, _, files in os.walk(work):
        for f in files:
            if f.endswith(".daemon.log"):
                with open(os.path.join(root, f), errors="replace") as log:
                    lines = log.readlines()[-15:]
                print(f"--- last lines of {os.path.join(root, f)}:\n" + "".join(lines),
                      file=sys.stderr)


def main():
    args = parse_args()
    defaults = daemon_defaults(args.ckptfs)
    cache = args.cache or defaults["cache"]
    buffer = args.buffer or defaults["buffer"]
    cfg = {"opts": ",".join(x for x in (f"cache={cache}", f"buffer={buffer}", args.opts) if x),
           "cache": parse_size(cache), "buffer": parse_size(buffer)}
    cfg["budget"] = cfg["cache"] + cfg["buffer"] + SLACK
    preflight(args, cfg)
    # The test library's watchdog (meant for ctest) would kill a long benchmark: give it the
    # time this run may take (60 s per GiB moved, at least 30 min).
    moved = 0 if args.skip_sizes else sum(args.size_list) * (2 * args.versions + 4 * args.repeats)
    moved += 0 if args.skip_writers else 2 * args.writers * args.shard_gib * (args.writer_steps
                                                                              + args.repeats)
    os.environ.setdefault("CKPTFS_TEST_DEADLINE", str(int(1800 + 60 * moved)))
    Interrupts.install()
    torch.set_num_threads(1)

    header = machine_info(args)
    print_header(header, cfg)
    print(f"layout: {args.layout}", flush=True)
    config = {k: getattr(args, k) for k in (
        "sizes", "versions", "repeats", "writers", "shard_gib", "writer_steps", "writer_keep",
        "skip_sizes", "skip_writers", "quick", "ckptctl", "layout")}
    config.update(cfg, extra_opts=args.opts, tolerance=TOLERANCE)
    out = {"header": header, "config": config, "sizes": [], "writers": None}

    def dump():
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1, default=str)

    work = tempfile.mkdtemp(prefix="ckptfs-scale-", dir=args.dir)
    status = 0
    try:
        if not args.skip_sizes:
            for size in args.size_list:
                r = run_size(size, args, cfg, work)
                out["sizes"].append(r)
                dump()
                if not args.keep:
                    shutil.rmtree(os.path.join(work, f"size_{size:g}GiB"))
                    os.sync()  # the space freed is counted once the journal commits
        if not args.skip_writers:
            out["writers"] = run_writers(args, cfg, work)
            dump()
        header["loadavg_end"] = os.getloadavg()
        dump()
        print("\n" + "=" * 100)
        print_header(header, cfg)
        for r in out["sizes"]:
            print_size(r, cfg)
        if out["writers"]:
            print_writers(out["writers"], cfg)
        print(f"\nload average at the end: {' '.join(f'{x:.2f}' for x in header['loadavg_end'])}")
        if args.json:
            print(f"raw measurements: {args.json}")
    except VerifyError as e:
        print(f"fs_scale.py: CHECK FAILED: {e}", file=sys.stderr)
        tail_logs(work)
        status = 1
    except KeyboardInterrupt:
        print("fs_scale.py: interrupted; cleaning up", file=sys.stderr)
        status = 128 + (Interrupts.received or signal.SIGINT)
    except Exception:
        traceback.print_exc()
        tail_logs(work)
        status = 1
    finally:
        unmount_all_under(work)
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    sys.exit(status)


if __name__ == "__main__":
    main()
