#!/usr/bin/python3
"""The transformer of lm_run.py saved as DCP shards and as HF-style torch.save files, in one mount.

Trains lm_run.py's language model once (seed 0; a checkpoint every 12 steps, 40 in all, AdamW) and writes
every checkpoint twice into one mount at the given options: as `run/checkpoint-N/`
(`pytorch_model.bin`, `optimizer.pt`, ... as lm_run.py writes them) and as
`dcp/step_N/__R_0.distcp` for R ranks plus `.metadata`, the byte layout torch's FileSystemWriter
writes (tests/fs/distcp.py; torch 1.13 here has no DCP): each rank holds its rows of every
tensor with at least R rows (rank 0 the rest), byte items first, then one torch.save archive per
tensor, largest first; `.metadata` is the Metadata pickle (tests/fs/dcp_metadata.py). The
state-dict names are `model.<param>` and `optimizer.state.<index>.<exp_avg|exp_avg_sq|step>`.

Reports, for each layout, the whole run's logical and stored bytes of the checkpoint's tensor
files (the torch.save files of the model and the optimizer against the shards; versions'
stored bytes, which leave out head images), the ratio, and the shards' size over the files'.
Run it with two builds to see what a change does to one layout against the other.

--by-class STEP,...: for those steps, where each layout's stored bytes go (`ckptctl stat`):
weights, exp_avg, exp_avg_sq, and everything but the tensors' frames ("fixed"); a shard's
tensors by the state-dict names stat gives them ("?" before a .metadata named them).

Usage: dcp_lm.py CKPTFS_BINARY [--ranks 2] [--opts o=v,...] [--cache SNAPSHOTS.pt] [--json F]
                 [--by-class STEP,...]
(as root; Debian's /usr/bin/python3). --cache: the reference run's snapshots, trained and
saved there when missing (about 300 MB).
"""
import argparse
import io
import json
import os
import pickle
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "fs"))
import dcp_metadata  # noqa: E402
import lm_run  # noqa: E402
from ckptfs_testlib import info, mounted, require_fuse, stat_json  # noqa: E402

TENSOR_FILES = ("pytorch_model.bin", "optimizer.pt")


def flat_state(state):
    """{fqn: tensor or bytes} of one checkpoint, as DCP's flattening names it."""
    out = {f"model.{k}": v for k, v in state["pytorch_model.bin"].items()}
    opt = state["optimizer.pt"]
    for idx, s in opt["state"].items():
        for k, v in s.items():
            out[f"optimizer.state.{idx}.{k}"] = v
    out["optimizer.param_groups"] = pickle.dumps(opt["param_groups"])
    out["lr_scheduler"] = pickle.dumps(state["scheduler.pt"])
    out["rng"] = state["rng_state.pth"]["cpu"]
    return out


def rank_items(flat, ranks, r):
    """(byte items, {fqn: (chunk offsets, tensor)}) rank r writes."""
    byte_items, tensors = [], {}
    for k, v in flat.items():
        if isinstance(v, bytes):
            if r == 0:
                byte_items.append((k, v))
        elif v.dim() >= 1 and v.shape[0] >= ranks:
            rows = -(-v.shape[0] // ranks)  # torch.chunk's split
            part = v.chunk(ranks, dim=0)
            if r < len(part):
                tensors[k] = ((r * rows,) + (0,) * (v.dim() - 1), part[r].clone())
        elif r == 0:
            tensors[k] = ((0,) * v.dim(), v)
    return byte_items, tensors


def write_dcp_step(root, step, flat, ranks):
    d = os.path.join(root, f"step_{step}")
    os.makedirs(d)
    items, sizes = [], {}
    for r in range(ranks):
        byte_items, tensors = rank_items(flat, ranks, r)
        file = f"__{r}_0.distcp"
        with open(os.path.join(d, file), "wb") as f:
            for k, data in byte_items:
                items.append((k, None, file, f.tell(), len(data)))
                f.write(data)
            for k, (chunk, t) in sorted(tensors.items(), key=lambda kv: -kv[1][1].numel()):
                off = f.tell()
                torch.save(t, f)
                items.append((k, chunk, file, off, f.tell() - off))
                sizes[k] = (t.dtype, tuple(flat[k].shape))
            f.flush()
            os.fsync(f.fileno())
    with open(os.path.join(d, ".metadata.tmp"), "wb") as f:
        pickle.dump(dcp_metadata.make(items, sizes), f)
        f.flush()
        os.fsync(f.fileno())
    os.rename(os.path.join(d, ".metadata.tmp"), os.path.join(d, ".metadata"))


def read_dcp_step(d):
    """{fqn: tensor or bytes} read back as DCP's reader does (slices of the shards)."""
    with open(os.path.join(d, ".metadata"), "rb") as f:
        items = dcp_metadata.items(pickle.load(f))
    out = {}
    for key, (file, off, n) in items.items():
        with open(os.path.join(d, file), "rb") as f:
            f.seek(off)
            b = f.read(n)
        out[(key.fqn, key.offset)] = b if key.offset is None else torch.load(io.BytesIO(b))
    return out


def by_class(ctl, paths, positional):
    """{class: stored bytes} over the versions at `paths`."""
    out = {}
    for path in paths:
        s = stat_json(ctl, path)
        frames = 0
        for t in s["tensors"]:
            name = t.get("state_name", "?") if positional else t["name"]
            c = "?" if name == "?" else lm_run.tensor_class(name)
            out[c] = out.get(c, 0) + t["stored_bytes"]
            frames += t["stored_bytes"]
        out["fixed"] = out.get("fixed", 0) + s["stored_bytes"] - frames
    return out


def snapshots(cache):
    if cache and os.path.exists(cache):
        return torch.load(cache)
    job = lm_run.Job(lm_run.Corpus(), lm_run.FULL, 0)
    snaps = lm_run.Reference(job).snapshots
    if cache:
        torch.save(snaps, cache)
    return snaps


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("binary")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--opts", default="")
    p.add_argument("--cache")
    p.add_argument("--json")
    p.add_argument("--by-class", default="")
    args = p.parse_args()
    ctl = os.path.join(os.path.dirname(os.path.abspath(args.binary)), "ckptctl")
    require_fuse()
    torch.set_num_threads(1)
    snaps = snapshots(args.cache)
    res = {"files": {"logical": 0, "stored": 0}, "dcp": {"logical": 0, "stored": 0},
           "dcp_kinds": {}, "checkpoints": len(snaps), "ranks": args.ranks, "opts": args.opts}
    with tempfile.TemporaryDirectory(prefix="ckptfs-dcp-lm-", dir="/var/tmp") as work:
        store, mnt = os.path.join(work, "store"), os.path.join(work, "mnt")
        os.makedirs(mnt)
        opts = tuple(o for o in args.opts.split(",") if o)
        with mounted(args.binary, store, mnt, *opts):
            for step, state in sorted(snaps.items()):
                lm_run.write_checkpoint(os.path.join(mnt, "run"), step, state)
                write_dcp_step(os.path.join(mnt, "dcp"), step, flat_state(state), args.ranks)
            for step in sorted(snaps):
                for name in TENSOR_FILES:
                    path = os.path.join(mnt, "run", f"checkpoint-{step}", name)
                    res["files"]["logical"] += os.path.getsize(path)
                    res["files"]["stored"] += info(path)["stored_bytes"]
                for r in range(args.ranks):
                    path = os.path.join(mnt, "dcp", f"step_{step}", f"__{r}_0.distcp")
                    res["dcp"]["logical"] += os.path.getsize(path)
                    i = info(path)
                    res["dcp"]["stored"] += i["stored_bytes"]
                    res["dcp_kinds"][i["kind"]] = res["dcp_kinds"].get(i["kind"], 0) + 1
            res["by_class"] = {}
            for step in (int(s) for s in args.by_class.split(",") if s):
                files = by_class(ctl, [os.path.join(mnt, "run", f"checkpoint-{step}", n)
                                       for n in TENSOR_FILES], False)
                shards = by_class(ctl, [os.path.join(mnt, "dcp", f"step_{step}", f"__{r}_0.distcp")
                                        for r in range(args.ranks)], True)
                res["by_class"][step] = {"files": files, "dcp": shards}
                print(f"step {step}: files {files}; shards {shards}")
            # The last step reads back as DCP reads it, every tensor with its shape.
            last = max(snaps)
            back = read_dcp_step(os.path.join(mnt, "dcp", f"step_{last}"))
            flat = flat_state(snaps[last])
            for (fqn, chunk), v in back.items():
                if chunk is not None:
                    assert v.dtype == flat[fqn].dtype, fqn
    for layout in ("files", "dcp"):
        r = res[layout]
        r["ratio"] = r["logical"] / r["stored"]
        print(f"{layout:5s}: logical {r['logical'] / 2**20:.1f} MiB, stored "
              f"{r['stored'] / 2**20:.2f} MiB, ratio {r['ratio']:.2f}x")
    res["dcp_over_files"] = res["dcp"]["stored"] / res["files"]["stored"]
    print(f"shards stored / files stored: {res['dcp_over_files']:.3f}; shard kinds "
          f"{res['dcp_kinds']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
