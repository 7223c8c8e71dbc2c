#!/usr/bin/python3
"""What error to expect per class of tensors (issue 16 item 5): a real training run saved through
a mount, and `ckptctl stat`'s relative L2 error of every delta version against what was written,
per class (weights, Adam's exp_avg, exp_avg_sq), for each --bits setting.

The run: an MLP (64-384-256-10, 0.12 M parameters) trained with AdamW (lr 1e-3, weight decay
0.01, batches of 128) on sklearn's digits; every 20 steps the model and the optimizer state are
saved as one file, `{"model": ..., "optimizer": ...}` (torch.save, fsync), 30 saves. Each
version's error is its own (the closed loop codes each delta against its base's
reconstruction), so the medians over the deltas are what a restore of any version shows.

Usage: fidelity.py CKPTFS [--bits 2,3,4] [--saves 30] [--opts O1,O2] [--json PATH]
(as root; /usr/bin/python3)
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fs"))
from ckptfs_testlib import mounted, stat_json  # noqa: E402
from digits_lib import adamw_digits  # noqa: E402


def run(binary, ctl, work, bits, saves, opts):
    store, mnt = f"{work}/b{bits}-store", f"{work}/b{bits}-mnt"
    per_class = {}
    with mounted(binary, store, mnt, f"bits={bits}", *opts):
        for k, (model, opt, _) in enumerate(adamw_digits((384, 256), 10, saves)):
            path = f"{mnt}/ckpt_{k:03d}.pt"
            with open(path, "wb") as f:
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, f)
                f.flush()
                os.fsync(f.fileno())
            info = stat_json(ctl, path)
            if info.get("kind") != "delta":  # lossy keyframes have an error too (rounding)
                continue
            for c in info.get("fidelity", []):
                per_class.setdefault(c["class"], []).append(c["rel_error"])
    return per_class


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ckptfs")
    ap.add_argument("--ckptctl", default=None)
    ap.add_argument("--bits", default="2,3,4")
    ap.add_argument("--saves", type=int, default=30)
    ap.add_argument("--json", default=None)
    ap.add_argument("--opts", default="", help="more -o options for every mount, e.g. intra=off")
    a = ap.parse_args()
    ctl = a.ckptctl or os.path.join(os.path.dirname(a.ckptfs), "ckptctl")
    out = {}
    with tempfile.TemporaryDirectory(prefix="ckptfs-fidelity-", dir="/var/tmp") as work:
        for bits in [int(b) for b in a.bits.split(",")]:
            out[bits] = run(a.ckptfs, ctl, work, bits, a.saves,
                            [o for o in a.opts.split(",") if o])
    print(f"relative L2 error of the delta versions against what was written "
          f"({a.saves} saves, keyframes excluded): median (min..max) per class")
    print(f"{'bits':>4}  " + "  ".join(f"{c:>26}" for c in ("weights", "exp_avg", "exp_avg_sq")))
    for bits, per_class in out.items():
        cells = []
        for c in ("weights", "exp_avg", "exp_avg_sq"):
            v = per_class.get(c, [])
            cells.append(f"{statistics.median(v):7.3%} ({min(v):.3%}..{max(v):.3%})" if v else "-")
        print(f"{bits:>4}  " + "  ".join(f"{s:>26}" for s in cells))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
