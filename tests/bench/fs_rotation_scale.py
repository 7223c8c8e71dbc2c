#!/usr/bin/python3
"""Checkpoint rotation at the sizes users have (issues 13 and 16): Hugging Face Trainer's
save_total_limit with multi-GiB checkpoints, through ckptfs mounts and into a plain directory on
the same disk, side by side in one run.

Each save is one training step of fs_scale.py's state (--gib of fp32 weights, Adam's exp_avg
and exp_avg_sq, many small tensors) written as `checkpoint-N/model.pt` (the weights) and
`checkpoint-N/optimizer.pt` (Adam's state and the step), each torch.save'd, flushed and fsync'ed;
then every directory beyond the newest --keep is removed (shutil.rmtree, as the Trainer rotates),
in each mount and in the plain directory. Each --config is its own mount and store (all mounted
for the whole run; the sides take turns going first). After each save, once the daemon has looked
at the deletions and finished its rewrites (`ckptctl status`: nothing pending, the store's size
steady), per config:
  - save+fsync seconds of the two files, against the plain directory's;
  - the store's bytes on disk (du of the whole store directory: objects, head images, journal)
    and of its head images, against the rotated plain directory's bytes (ratio plain / store;
    issue 16's target: store <= 0.4x plain from the 4th save on);
  - rewrites (a kept delta rewritten as a keyframe so that the deleted versions below it can go),
    bytes they wrote and freed (at most 1/reclaim= of it, by design);
  - bytes written to the store: the new versions' stored bytes, the rewrites', and head images
    (a full-size image of each new version that gets one); and what the daemon wrote to the
    disk in all (/proc/PID/io write_bytes: also the staging file, which holds what does not fit
    in buffer= until the commit, and becomes the head image where there is one);
  - the daemon's peak RSS (VmHWM, reset before the save) over the save and its rotation work,
    against its budget (cache + buffer + 512 MiB).
At the end, after a remount and drop_caches, torch.load of the newest and the oldest kept
checkpoint from each mount and from the plain directory (timed, and checked against what was
saved with fs_scale.check's tolerances).

Usage: fs_rotation_scale.py CKPTFS_BINARY [OTHER_BINARY ...] [--gib 2] [--saves 12] [--keep 3]
                            [--config "" --config heads=off ...] [--dir /var/tmp] [--json PATH]
--config: mount options of one mount, comma-separated ("" for the defaults); give it once per
mount (default: the defaults and heads=off, both at cache=512M,buffer=256M). With several
binaries (builds to compare, each with its ckptctl beside it) every config is mounted with each.
Needs root (FUSE, drop_caches), free disk under --dir of about (2 + 2 per config) x --keep x
--gib, and RAM for the state plus the daemons' budgets. Run by /usr/bin/python3 (torch 1.13).
"""
import argparse
import contextlib
import gc
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "fs"))
import fs_scale  # noqa: E402
from ckptfs_testlib import (mounted, peak_rss, reset_peak_rss, rotate_checkpoints,  # noqa: E402
                            settle_rotation)
from fs_speed import drop_caches  # noqa: E402
from scale_lib import proc_io  # noqa: E402

GiB = 2**30
MiB = 2**20
FILES = ("model.pt", "optimizer.pt")
DEFAULT_CONFIGS = ["cache=512M,buffer=256M", "cache=512M,buffer=256M,heads=off"]


def split(sd):
    """The Trainer's two files: the weights, and the optimizer's state with the step."""
    return {"model.pt": {"model": sd["model"]},
            "optimizer.pt": {"optimizer": sd["optimizer"], "step": sd["step"]}}


def save_checkpoint(sd, root, step):
    """Both files of checkpoint-<step>, each saved and fsync'ed: seconds in all."""
    seconds = 0.0
    for name, part in split(sd).items():
        seconds += fs_scale.save_fsync(part, os.path.join(root, f"checkpoint-{step}", name))[1]
    return seconds


def load_checkpoint(root, step):
    loaded = {}
    for name in FILES:
        loaded.update(fs_scale.load(os.path.join(root, f"checkpoint-{step}", name)))
    return loaded


def disk_writes(pid):
    """Bytes a process has caused to be written to storage (/proc/PID/io write_bytes)."""
    return proc_io(pid)["write_bytes"]


def allocated(path):
    return fs_scale.du(path)[1] if os.path.exists(path) else 0


def ctl(ckptctl, *args):
    out = subprocess.run([ckptctl, *args, "--json"], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ckptfs", nargs="+")
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--saves", type=int, default=12)
    ap.add_argument("--keep", type=int, default=3)
    ap.add_argument("--config", action="append", help="mount options of one mount")
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    if a.keep < 1 or a.saves <= a.keep:
        sys.exit("need --saves > --keep >= 1")
    configs = a.config if a.config is not None else DEFAULT_CONFIGS
    os.environ.setdefault("CKPTFS_TEST_DEADLINE", str(int(3600 + 60 * a.saves * a.gib)))
    fs_scale.Interrupts.install()
    work = os.path.join(a.dir, f"ckptfs-rotation-scale-{os.getpid()}")
    os.makedirs(work)
    results = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
               "configs": configs, "saves": []}
    print(f"command: {results['command']}\ndate:    {results['date']}", flush=True)
    try:
        run(a, configs, work, results)
    finally:
        fs_scale.unmount_all_under(work)
        shutil.rmtree(work, ignore_errors=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


def run(a, configs, work, results):
    plain = os.path.join(work, "plain")
    os.makedirs(plain)
    pairs = [(b, c) for b in a.ckptfs for c in configs]
    sides = [{"binary": b, "opts": c, "store": os.path.join(work, f"store{i}"),
              "ckptctl": os.path.join(os.path.dirname(os.path.abspath(b)), "ckptctl"),
              "mnt": os.path.join(work, f"mnt{i}"), "written": 0, "heads_written": 0,
              "disk_written": 0}
             for i, (b, c) in enumerate(pairs)]
    results["sides"] = [{"binary": s["binary"], "opts": s["opts"]} for s in sides]
    for i, s in enumerate(sides):
        print(f"[{i}] {s['binary']} {s['opts'] or 'defaults'}", flush=True)
    for s in sides:
        os.makedirs(s["mnt"])
    state = fs_scale.TrainingState(int(a.gib * GiB), seed=17)
    print(f"state: {state.describe()}", flush=True)
    refs = {}
    plain_written = 0
    with contextlib.ExitStack() as stack:
        for s in sides:
            opts = [o for o in s["opts"].split(",") if o]
            s["proc"] = stack.enter_context(mounted(s["binary"], s["store"], s["mnt"], *opts))
            s["io_start"] = disk_writes(s["proc"].pid)
        for step in range(1, a.saves + 1):
            if step > 1:
                state.advance()
            refs[step] = fs_scale.snapshot(state.sd)
            row = {"save": step, "configs": []}
            order = list(range(len(sides) + 1))
            k = step % len(order)
            for i in order[k:] + order[:k]:
                if i == len(sides):
                    row["plain_save_s"] = save_checkpoint(state.sd, plain, step)
                    continue
                s = sides[i]
                reset_peak_rss(s["proc"].pid)
                s["save_s"] = save_checkpoint(state.sd, s["mnt"], step)
            for name in FILES:
                plain_written += os.path.getsize(os.path.join(plain, f"checkpoint-{step}", name))
            kept = [int(d.split("-")[1]) for d in rotate_checkpoints(plain, a.keep)]
            refs = {j: r for j, r in refs.items() if j in kept}
            plain_bytes = allocated(plain)
            row["plain_bytes"] = plain_bytes
            line = [f"save {step:2d}: plain {row['plain_save_s']:5.1f} s, {plain_bytes / GiB:.2f} GiB"]
            for i, s in enumerate(sides):
                if [int(d.split("-")[1]) for d in rotate_checkpoints(s["mnt"], a.keep)] != kept:
                    raise RuntimeError(f"{s['mnt']}: kept other checkpoints than the plain side")
                # The whole store watched: a new head image is published by then too.
                t = time.perf_counter()
                status = settle_rotation(s["ckptctl"], s["mnt"], s["store"], deadline_s=900,
                                         watched=s["store"])
                waited = time.perf_counter() - t
                # After the settle: a new version's head image is published by then.
                new = [ctl(s["ckptctl"], "stat", os.path.join(s["mnt"], f"checkpoint-{step}", n))
                       for n in FILES]
                s["written"] += sum(x["stored_bytes"] for x in new)
                s["heads_written"] += sum(x.get("head_bytes", 0) for x in new)
                s["disk_written"] = disk_writes(s["proc"].pid) - s["io_start"]
                rot = status["rotation"]
                c = {"opts": s["opts"], "save_s": s["save_s"], "kinds": [x["kind"] for x in new],
                     "store_bytes": allocated(s["store"]),
                     "heads_bytes": allocated(os.path.join(s["store"], "heads")),
                     "settle_s": waited, "rewrites": rot["rewrites"],
                     "rewrite_written_bytes": rot["written_bytes"],
                     "rewrite_freed_bytes": rot["freed_bytes"],
                     "written_bytes": s["written"] + rot["written_bytes"],
                     "heads_written_bytes": s["heads_written"],
                     "disk_written_bytes": s["disk_written"],
                     "peak_rss": peak_rss(s["proc"].pid),
                     "budget": status["budget"]["bound_bytes"]}
                c["ratio"] = plain_bytes / c["store_bytes"]
                row["configs"].append(c)
                line.append(
                    f"[{i}] {c['save_s']:5.1f} s ({c['save_s'] / row['plain_save_s']:.2f}x) "
                    f"{'/'.join(k[0] for k in c['kinds'])}, store {c['store_bytes'] / GiB:.2f} GiB "
                    f"(heads {c['heads_bytes'] / GiB:.2f}) = {c['store_bytes'] / plain_bytes:.2f}x "
                    f"plain, rewrites {c['rewrites']}, peak RSS {c['peak_rss'] / GiB:.2f}"
                    f"/{c['budget'] / GiB:.2f} GiB")
            results["saves"].append(row)
            print("; ".join(line), flush=True)
        results["plain_written_bytes"] = plain_written
        for i, s in enumerate(sides):
            last = results["saves"][-1]["configs"][i]
            rw, fr = last["rewrite_written_bytes"], last["rewrite_freed_bytes"]
            print(f"[{i}] {s['opts'] or 'defaults'}: written to the store "
                  f"{last['written_bytes'] / GiB:.2f} GiB of objects (rewrites {rw / GiB:.2f} GiB, "
                  f"freeing {fr / GiB:.2f}) + {last['heads_written_bytes'] / GiB:.2f} GiB of head "
                  f"images, against {plain_written / GiB:.2f} GiB to plain: "
                  f"{last['written_bytes'] / plain_written:.2f}x, with images "
                  f"{(last['written_bytes'] + last['heads_written_bytes']) / plain_written:.2f}x; "
                  f"the daemon wrote {last['disk_written_bytes'] / GiB:.2f} GiB to the disk in all "
                  f"({last['disk_written_bytes'] / plain_written:.2f}x)", flush=True)
    del state
    gc.collect()
    loads(a, sides, plain, kept, refs, results)


def loads(a, sides, plain, kept, refs, results):
    """The newest and the oldest kept checkpoint after a remount and drop_caches."""
    results["loads"] = []
    for step in (kept[-1], kept[0]):
        drop_caches()
        t = time.perf_counter()
        got = load_checkpoint(plain, step)
        plain_s = time.perf_counter() - t
        del got
        gc.collect()
        line = [f"load checkpoint-{step}: plain {plain_s:.2f} s"]
        for i, s in enumerate(sides):
            opts = [o for o in s["opts"].split(",") if o]
            with mounted(s["binary"], s["store"], s["mnt"], *opts):
                drop_caches()
                t = time.perf_counter()
                got = load_checkpoint(s["mnt"], step)
                seconds = time.perf_counter() - t
            check = fs_scale.check(got, refs[step], f"[{i}] checkpoint-{step}")
            del got
            gc.collect()
            results["loads"].append({"config": i, "step": step, "s": seconds, "plain_s": plain_s,
                                     "max_rel_err": check["max_rel_err"]})
            line.append(f"[{i}] {seconds:.2f} s ({seconds / plain_s:.2f}x), max error "
                        f"{check['max_rel_err']:.2g} of range")
        print("; ".join(line), flush=True)


if __name__ == "__main__":
    main()
