#!/usr/bin/python3
"""A DeepSpeed ZeRO optimizer partition of several GB through a mount (issue 15).

DeepSpeed's `zero_pp_rank_R_mp_rank_00_optim_states.pt` is dominated by three flat 1-D fp32
tensors per parameter group (master weights, Adam's exp_avg and exp_avg_sq), each as large as
the rank's share of the model. This writes one such file of `--gib` GiB per tensor (three
tensors), as DeepSpeed's engine does (torch.save of the optimizer state dict), for two steps
(the second an Adam-like update of the first), and measures per step: the time of the write and of the fsync
(when the daemon encodes), the daemon's CPU time in each divided by its wall time (how many cores
it kept busy: one flat tensor is cut into slabs and each slab's blocks are coded in parallel), the version's kind
and stored bytes, and the daemon's peak RSS against its budget. Beside it, the same file saved
to a plain directory on the same disk.

Usage: deepspeed_partition.py CKPTFS_BINARY [--gib 1.0] [--dir /var/tmp] [--opts cache=..]
(as root; Debian's /usr/bin/python3)
"""
import argparse
import json
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fs"))
from ckptfs_testlib import mounted, peak_rss  # noqa: E402
from scale_lib import cpu_seconds  # noqa: E402


def state(n, step):
    g = torch.Generator().manual_seed(7)
    w = torch.randn(n, generator=g) * 0.02
    m = torch.randn(n, generator=g) * 1e-3
    v = torch.rand(n, generator=g) * 1e-6
    for _ in range(step):
        grad = torch.randn(n, generator=g) * 1e-3
        m.mul_(0.9).add_(grad, alpha=0.1)
        v.mul_(0.999).addcmul_(grad, grad, value=0.001)
        w.add_(m / (v.sqrt() + 1e-8), alpha=-1e-4)
    return {"optimizer_state_dict": {
        "state": {0: {"step": torch.tensor(float(step)), "exp_avg": m, "exp_avg_sq": v}},
        "param_groups": [{"lr": 1e-4, "betas": (0.9, 0.999), "eps": 1e-8, "params": [0]}]},
        "single_partition_of_fp32_groups": [w], "zero_stage": 2, "partition_count": 8,
        "ds_version": "0.14.0"}


def save(path, obj, pid=None):
    """Seconds of the write and of the fsync; with a daemon pid, the cores it kept busy in each
    (its CPU seconds over the phase's wall time)."""
    cpu = (lambda: cpu_seconds(pid)) if pid else (lambda: 0.0)
    t0, c0 = time.monotonic(), cpu()
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        t1, c1 = time.monotonic(), cpu()
        os.fsync(f.fileno())  # the daemon encodes the file now
        t2, c2 = time.monotonic(), cpu()
    return t1 - t0, t2 - t1, (c1 - c0) / (t1 - t0), (c2 - c1) / max(t2 - t1, 1e-9)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("binary")
    ap.add_argument("--gib", type=float, default=1.0, help="GiB per flat tensor (3 per file)")
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--opts", default="")
    a = ap.parse_args()
    n = int(a.gib * (1 << 30) / 4)
    opts = (a.opts,) if a.opts else ()
    rows = []
    with tempfile.TemporaryDirectory(prefix="ckptfs-ds-", dir=a.dir) as work:
        store, mnt, plain = f"{work}/store", f"{work}/mnt", f"{work}/plain"
        os.makedirs(plain)
        with mounted(a.binary, store, mnt, *opts) as proc:
            for step in (1, 2):
                obj = state(n, step)
                name = "zero_pp_rank_0_mp_rank_00_optim_states.pt"
                for d in (f"{mnt}/global_step{step}", f"{plain}/global_step{step}"):
                    os.makedirs(d)
                os.sync()
                pw, pf, _, _ = save(f"{plain}/global_step{step}/{name}", obj)
                w, f, wcores, fcores = save(f"{mnt}/global_step{step}/{name}", obj, proc.pid)
                i = json.loads(os.getxattr(f"{mnt}/global_step{step}/{name}", "user.ckptfs.info"))
                rows.append({"step": step, "write_s": round(w, 2), "fsync_s": round(f, 2),
                             "plain_write_s": round(pw, 2), "plain_fsync_s": round(pf, 2),
                             "write_cores": round(wcores, 2), "fsync_cores": round(fcores, 2),
                             "kind": i["kind"], "logical": i["logical_bytes"],
                             "stored": i["stored_bytes"]})
                print(json.dumps(rows[-1]), flush=True)
                del obj
            rss = peak_rss(proc.pid)
    print(json.dumps({"gib_per_tensor": a.gib, "peak_rss_bytes": rss, "steps": rows}))


if __name__ == "__main__":
    main()
