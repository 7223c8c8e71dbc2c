#!/usr/bin/python3
"""Lossy keyframes code as values what the head before them coded as values (docs/codec.md,
"Intra slabs", item 4), and a lineage's first keyframe codes Adam's m so by its name, through a
real mount.

An MLP trained with AdamW on sklearn's digits saves {"model", "optimizer"} with torch.save every
20 steps, 7 times, through a mount with -o keyframe_interval=3 (keyframes at saves 1, 4 and 7).
Checked after each save with `ckptctl stat` and torch.load:
  - save 1 (no head before it): Adam's exp_avg coded as values by its name (mode intra), every
    other float tensor rounded to 12 bits (mode rounded);
  - a keyframe after a head (saves 4 and 7): every tensor the head coded as values (mode intra:
    Adam's exp_avg once it is nearly new at every save) is coded so again, within |u| of what
    was saved and in under 6 bits per element (rounding costs over 12); every other float
    tensor rounded (within 2^-13); at least one such tensor occurs;
  - only exp_avg tensors are ever coded as values, each within |u|;
  - after a remount, every version reads back byte for byte as before;
  - with -o intra=off, the keyframes (the first included) round every tensor; with
    -o keyframe_bits=0 they keep every tensor exact (intra deltas or not).
Usage: keyframe_values.py CKPTFS CKPTCTL   (as root; /usr/bin/python3; exit 77 without FUSE)
"""
import hashlib
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckptfs_testlib import (beyond_value, chain_bits, flat_tensors, keyframe_within, mounted,  # noqa: E402
                            require_fuse, stat_json)
from digits_lib import adamw_digits  # noqa: E402

SAVES = 7


def run(binary, ctl, work, opts, intra, exact_keyframes=False):
    label = "-".join(opts) or "defaults"
    store, mnt = f"{work}/{label}-store", f"{work}/{label}-mnt"
    digests, prev_modes, seen = {}, {}, set()
    with mounted(binary, store, mnt, "keyframe_interval=3", *opts):
        for k, (model, opt, _) in enumerate(adamw_digits((256, 128), 10, SAVES)):
            path = f"{mnt}/ckpt_{k}.pt"
            state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
            with open(path, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
            info = stat_json(ctl, path)
            want, got = flat_tensors(state), flat_tensors(torch.load(path))
            kind = info["kind"]
            assert kind == ("keyframe" if k % 3 == 0 else "delta"), (k, kind)
            for t in info["tensors"]:
                name, mode = t["name"], t["mode"]
                u, r = want[name], got[name]
                seen.add((kind, name, mode))
                if kind == "keyframe" and exact_keyframes:  # keyframe_bits=0: exact, always
                    assert mode == "lossless" and torch.equal(r, u), (k, name, mode)
                    continue
                if kind == "keyframe":
                    # As the head before it coded the tensor: values (intra) or rounded; with no
                    # head (save 1), by the name: Adam's m as values.
                    if k == 0:
                        expect = "intra" if intra and name.endswith("exp_avg") else "rounded"
                    else:
                        expect = "intra" if prev_modes.get(name) == "intra" else "rounded"
                    assert mode == expect, (k, name, mode, expect)
                if mode == "intra":
                    assert intra, (k, name, "intra with -o intra=off")
                    assert name.endswith("exp_avg"), (k, name, "only Adam's m is new each time")
                    bad = beyond_value(r, u)
                    assert bad == 0, f"save {k}: {name}: {bad} elements further than |u|"
                    # Far smaller than a rounded keyframe's 12 bits and more (tensors of a few
                    # hundred elements are mostly a frame's fixed cost either way).
                    if kind == "keyframe" and t["elements"] >= 1024:
                        assert t["stored_bytes"] * 8 < 6 * t["elements"], (k, name, t)
                elif kind == "keyframe":
                    assert keyframe_within(r, u, chain_bits(name)), f"save {k}: {name}: keyframe off"
                prev_modes[name] = mode
            with open(path, "rb") as f:
                digests[path] = hashlib.sha256(f.read()).hexdigest()
    # The feature was exercised: with intra on, some exp_avg coded as values in a keyframe.
    assert not intra or exact_keyframes or any(
        kind == "keyframe" and mode == "intra" for kind, _, mode in seen), seen
    with mounted(binary, store, mnt, "keyframe_interval=3", *opts):
        for path, h in digests.items():
            with open(path, "rb") as f:
                assert hashlib.sha256(f.read()).hexdigest() == h, f"{path} changed after remount"


def main():
    require_fuse()
    binary, ctl = sys.argv[1], sys.argv[2]
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory(prefix="ckptfs-kfvalues-", dir="/var/tmp") as work:
        run(binary, ctl, work, (), True)
        run(binary, ctl, work, ("intra=off",), False)
        run(binary, ctl, work, ("keyframe_bits=0",), True, exact_keyframes=True)
    print(f"keyframe_values: ok ({SAVES} saves, keyframes every 3: intra on, off, exact keyframes)")


if __name__ == "__main__":
    main()
