#!/usr/bin/python3
"""Small checkpoints keep long chains, refreshed (docs/codec.md, "Long chains and refreshes"),
through a real mount.

An MLP trained with AdamW on sklearn's digits (about 600 KB a checkpoint) saves
{"model", "optimizer"} with torch.save every 5 steps, 26 times, each under its own name.
  - At the mount's defaults (keyframe_interval=auto: 1 GiB / 600 KB is past the cap of 1000):
    save 1 is the only keyframe; saves 2-26 are deltas, save 21 included (the 20th delta, a
    keyframe with a fixed interval of 20);
  - every 5th delta is a refresh (`ckptctl stat`: coding.refresh_bits 4), the others are not;
  - the refreshes' weights read back closer than the other deltas' (relative L2, `ckptctl stat`'s
    weights class: under 0.8 of the others' mean), and every delta's weights within the closed
    loop's bound against the version before;
  - after a remount, every version reads back byte for byte as before (decoded from the one
    keyframe through up to 25 deltas);
  - with -o keyframe_interval=20,refresh_interval=off: save 21 is a keyframe and no delta is a
    refresh.
Usage: long_chains.py CKPTFS CKPTCTL   (as root; /usr/bin/python3; exit 77 without FUSE)
"""
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckptfs_testlib import (closed_loop_bound, flat_tensors, mounted, require_fuse,  # noqa: E402
                            sha256, stat_json)
from digits_lib import adamw_digits  # noqa: E402
from scale_lib import save  # noqa: E402

SAVES = 26
REFRESH = 5  # the mount's default -o refresh_interval (kDefaultRefreshInterval)
REFRESH_BITS = 4  # codec::max_bits


def weights_error(info):
    return next(c["rel_error"] for c in info["fidelity"] if c["class"] == "weights")


def defaults(binary, ctl, work):
    store, mnt = f"{work}/defaults-store", f"{work}/defaults-mnt"
    digests, refresh_err, other_err = {}, [], []
    prev = None
    with mounted(binary, store, mnt):
        for k, (model, opt, _) in enumerate(adamw_digits((256, 128), 10, SAVES, steps=5)):
            path = f"{mnt}/ckpt_{k:02d}.pt"
            state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
            save(state, path)
            info = stat_json(ctl, path)
            assert info["kind"] == ("keyframe" if k == 0 else "delta"), (k, info["kind"])
            got = flat_tensors(torch.load(path))
            digests[path] = sha256(path)
            if k:
                refresh = k % REFRESH == 0
                bits = info["coding"].get("refresh_bits", 0)
                assert bits == (REFRESH_BITS if refresh else 0), (k, info["coding"])
                (refresh_err if refresh else other_err).append(weights_error(info))
                modes = {t["name"]: t["mode"] for t in info["tensors"]}
                for name, u in flat_tensors(state["model"], "model").items():
                    if name not in modes or modes[name] == "lossless":
                        continue  # small tensors are exact
                    r = got[name]
                    bound = closed_loop_bound(u, prev[name], modes[name])
                    over = int(((r.double() - u.double()).abs() > bound).sum())
                    assert over == 0, (k, name, modes[name], over)
            prev = got
    assert len(refresh_err) == 5 and len(other_err) == 20, (refresh_err, other_err)
    mean_r, mean_o = sum(refresh_err) / 5, sum(other_err) / 20
    print(f"defaults: 1 keyframe, {SAVES - 1} deltas; weights' error, refreshes {mean_r:.4f}, "
          f"other deltas {mean_o:.4f}")
    assert mean_r < 0.8 * mean_o, (refresh_err, other_err)
    with mounted(binary, store, mnt):
        for path, digest in digests.items():
            assert sha256(path) == digest, path
    print(f"defaults: {len(digests)} versions read back identical after a remount")


def fixed(binary, ctl, work):
    store, mnt = f"{work}/fixed-store", f"{work}/fixed-mnt"
    kinds = []
    with mounted(binary, store, mnt, "keyframe_interval=20,refresh_interval=off"):
        for k, (model, opt, _) in enumerate(adamw_digits((256, 128), 10, 22, steps=5)):
            path = f"{mnt}/ckpt_{k:02d}.pt"
            save({"model": model.state_dict(), "optimizer": opt.state_dict()}, path)
            info = stat_json(ctl, path)
            kinds.append(info["kind"])
            assert "refresh_bits" not in info["coding"], (k, info["coding"])
    assert kinds == ["keyframe"] + ["delta"] * 19 + ["keyframe", "delta"], kinds
    print("keyframe_interval=20,refresh_interval=off: keyframes at saves 1 and 21, no refresh")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    require_fuse()
    binary, ctl = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(dir="/var/tmp") as work:
        defaults(binary, ctl, work)
        fixed(binary, ctl, work)
    print("long_chains: ok")


if __name__ == "__main__":
    main()
