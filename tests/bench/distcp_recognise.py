#!/usr/bin/python3
"""How much of a large torch.distributed.checkpoint shard the recogniser reads (issue 15's
"recognising a 4 GiB shard reads < 1 MiB"): writes one shard the way FileSystemWriter does
(5000 bytes of byte items, then torch.save of each tensor, largest first: one 4.25 GiB fp32
tensor, which needs zip64 data descriptors, and two of 128 MiB) and runs `ckptctl inspect --json`
on it, which counts the bytes the recogniser read.

Usage: distcp_recognise.py CKPTCTL [--dir BASE]    (needs 4.6 GiB free under BASE, /var/tmp)
"""
import argparse
import json
import os
import pickle
import subprocess
import tempfile

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("ckptctl")
    ap.add_argument("--dir", default="/var/tmp")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ckptfs-distcp-bench-", dir=args.dir) as d:
        path = f"{d}/__0_0.distcp"
        tensors = {"huge": torch.ones(1140850688), "a": torch.full((32 << 20,), 0.5),
                   "b": torch.full((32 << 20,), 0.25)}
        with open(path, "wb") as f:
            f.write(pickle.dumps({"step": 1, "blob": os.urandom(5000)}))
            for _, t in sorted(tensors.items(), key=lambda kv: -kv[1].numel()):
                torch.save(t, f)
        out = json.loads(subprocess.run([args.ckptctl, "inspect", "--json", path], check=True,
                                        capture_output=True, text=True).stdout)
        size = os.path.getsize(path)
    assert out["format"] == "distcp" and len(out["tensors"]) == 3, out["note"]
    print(f"shard {size / 2**30:.2f} GiB, {len(out['tensors'])} archives recognised "
          f"({out['note']}); recogniser read {out['bytes_read']} bytes "
          f"({out['bytes_read'] / size * 100:.4f}% of the file)")


if __name__ == "__main__":
    main()
