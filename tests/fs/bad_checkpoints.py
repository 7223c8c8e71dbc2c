#!/usr/bin/python3
"""Files that look like checkpoints but are not (issue 4, "bad input"), through a real mount:
a garbage file named .pt, torch files truncated at several points, safetensors files whose
header lies (length beyond the file, offsets past the end, overlapping tensors), and a torch
file with a damaged central directory. Each one must be written without error, stored exact
(`ckptctl stat` says so) and read back byte for byte, also after remount. A real npy file next
to them is recognised (so the test would notice a recogniser that gave up on everything).

Usage: bad_checkpoints.py CKPTFS CKPTCTL   (as root; Debian's /usr/bin/python3)
"""
import io
import json
import os
import random
import shutil
import struct
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckptfs_testlib import mounted, sha256, stat_json  # noqa: E402


def torch_bytes():
    g = torch.Generator().manual_seed(3)
    buf = io.BytesIO()
    torch.save({"w": torch.randn(4096, generator=g), "b": torch.randn(64, generator=g)}, buf)
    return buf.getvalue()


def safetensors(header, payload):
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + payload


def cases():
    rnd = random.Random(7)
    good = torch_bytes()
    out = {"garbage.pt": bytes(rnd.getrandbits(8) for _ in range(100000))}
    for cut in (10, 100, len(good) // 3, len(good) // 2, len(good) - 30, len(good) - 1):
        out[f"truncated_{cut}.pt"] = good[:cut]
    payload = np.arange(8192, dtype=np.float32).tobytes()
    t = {"dtype": "F32", "shape": [8192], "data_offsets": [0, len(payload)]}
    lie = safetensors({"a": t}, payload)
    out["len_beyond_file.safetensors"] = struct.pack("<Q", 1 << 40) + lie[8:]
    out["offsets_past_end.safetensors"] = safetensors(
        {"a": dict(t, data_offsets=[0, 4 * len(payload)])}, payload)
    out["overlapping.safetensors"] = safetensors(
        {"a": t, "b": dict(t, data_offsets=[4, len(payload) + 4])}, payload + bytes(4))
    # Damaged end records (classic and zip64; torch writes both): the directory offset points
    # past the end, so the zip cannot be walked.
    bad = bytearray(good)
    eocd = good.rfind(b"PK\x05\x06")
    bad[eocd + 16:eocd + 20] = struct.pack("<I", len(good) * 2)
    z64 = good.rfind(b"PK\x06\x06")
    assert z64 >= 0, "torch.save writes a zip64 end record"
    bad[z64 + 48:z64 + 56] = struct.pack("<Q", len(good) * 2)
    out["bad_directory.pt"] = bytes(bad)
    return out


def main():
    ckptfs, ckptctl = sys.argv[1], sys.argv[2]
    if not os.path.exists("/dev/fuse") or os.geteuid() != 0:
        print("skipped: needs /dev/fuse and root")
        sys.exit(77)
    work = tempfile.mkdtemp(prefix="ckptfs-bad-")
    store, mnt = os.path.join(work, "store"), os.path.join(work, "mnt")
    files = cases()
    try:
        with mounted(ckptfs, store, mnt):
            for name, data in files.items():
                with open(os.path.join(mnt, name), "wb") as f:
                    f.write(data)
            npy = np.random.default_rng(1).standard_normal(50000).astype(np.float32)
            np.save(os.path.join(mnt, "real.npy"), npy)
            for name, data in files.items():
                p = os.path.join(mnt, name)
                with open(p, "rb") as f:
                    assert f.read() == data, f"{name}: content differs"
                info = stat_json(ckptctl, p)
                assert info["kind"] == "exact", f"{name}: stored as {info['kind']}, want exact"
            info = stat_json(ckptctl, os.path.join(mnt, "real.npy"))
            assert info["format"] == "npy" and info["kind"] == "keyframe", info
            # A keyframe: rounded to 12 mantissa bits by default (-o keyframe_bits).
            got = np.load(os.path.join(mnt, "real.npy")).astype(np.float64)
            assert np.all(np.abs(got - npy) <= np.abs(npy.astype(np.float64)) * 2.0 ** -13)
            # Reads at odd offsets and sizes agree with the whole file.
            p = os.path.join(mnt, "garbage.pt")
            with open(p, "rb") as f:
                for off, n in ((0, 1), (4095, 3), (65535, 70000), (99999, 10)):
                    f.seek(off)
                    assert f.read(n) == files["garbage.pt"][off:off + n]
            sums = {name: sha256(os.path.join(mnt, name)) for name in files}
        with mounted(ckptfs, store, mnt):
            for name in files:
                assert sha256(os.path.join(mnt, name)) == sums[name], f"{name} changed after remount"
        print(f"bad_checkpoints: ok ({len(files)} malformed files stored exact)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
