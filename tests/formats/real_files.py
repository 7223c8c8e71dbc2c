#!/usr/bin/python3
"""Real-file tests of the format recognisers and served-file assembly (issue 3).

Run by ctest with Debian's /usr/bin/python3 (torch 1.13, numpy). Modes:
  corpus DIR                 write small real checkpoints (also the fuzzers' seed corpus)
  roundtrip DIR TOOL CKPTCTL replace every candidate payload, then check with the real loaders
  zip64 DIR TOOL             the same for one torch file over 4 GiB (skipped when short of space)
"""
import io, json, os, shutil, struct, subprocess, sys, zipfile

import numpy as np
import torch


def pattern(n, seed=3):
    j = torch.arange(n, dtype=torch.int64)
    return ((j * 7 + seed) % 251 - 125).to(torch.float32)


FLOATS = (torch.float32, torch.float16, torch.bfloat16)


# ---------------------------------------------------------------------------------------------
# corpus
def write_safetensors(path, tensors, metadata=None):
    """A writer following huggingface/safetensors tensor.rs: dtype-descending then name order,
    header padded with spaces to a multiple of 8."""
    codes = {np.float32: "F32", np.float16: "F16", np.int64: "I64", np.float64: "F64",
             np.int32: "I32", np.uint8: "U8", np.bool_: "BOOL"}
    items = sorted(tensors.items(), key=lambda kv: (-kv[1].dtype.itemsize, kv[0]))
    header, blobs, at = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, a in items:
        raw = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": codes[a.dtype.type], "shape": list(a.shape),
                        "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_safetensors(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        b, e = v["data_offsets"]
        dt = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "F64": np.float64,
              "I32": np.int32, "U8": np.uint8, "BOOL": np.bool_}[v["dtype"]]
        out[k] = np.frombuffer(data[8 + n + b:8 + n + e], dtype=dt).reshape(v["shape"])
    return out


def make_corpus(d):
    os.makedirs(d, exist_ok=True)
    torch.manual_seed(0)
    np.random.seed(0)
    # state dict: every float dtype, int64 buffer, 0-element, view, tied weight, non-contiguous
    w = torch.randn(64, 48)
    sd = {
        "w": w, "w_view": w[10:20], "w_tied": w, "w_t": w.t(),
        "h": torch.randn(300).half(), "b": torch.randn(100, 64).bfloat16(),
        "d": torch.randn(40).double(), "idx": torch.arange(50), "empty": torch.empty(0),
        "empty_h": torch.empty(0, 3, dtype=torch.float16), "mask": torch.rand(30) > 0.5,
        "i32": torch.arange(7, dtype=torch.int32), "col": torch.randn(20, 30)[:, 3],
    }
    torch.save(sd, f"{d}/state_dict.pt")
    # many storages: keys 0..13, written as 0, 1, 10, 11, ..., 2, ...
    torch.save({f"layer{i}": torch.randn(32 + i) for i in range(14)}, f"{d}/many.pt")
    # a model with its whole optimizer state, nested in dicts and lists
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32),
                            torch.nn.Linear(32, 4))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    for _ in range(2):
        opt.zero_grad()
        m(torch.randn(8, 16)).pow(2).sum().backward()
        opt.step()
    ck = {"model": m.state_dict(), "optimizer": opt.state_dict(), "step": 2,
          "extra": [torch.randn(5), {"deep": [torch.randn(3, 3).half(), (torch.ones(2),)]}]}
    torch.save(ck, f"{d}/train.pt")
    torch.save(ck, f"{d}/train_p4.pt", pickle_protocol=4)
    torch.save(ck, f"{d}/train_p5.pt", pickle_protocol=5)
    buf = io.BytesIO()  # file-like target: "archive/" prefix
    torch.save(sd, buf)
    open(f"{d}/filelike.pt", "wb").write(buf.getvalue())
    torch.save(m, f"{d}/module.pt")  # a whole pickled nn.Module
    # numpy
    np.save(f"{d}/c.npy", np.random.randn(30, 40).astype(np.float32))
    np.save(f"{d}/f.npy", np.asfortranarray(np.random.randn(30, 40).astype(np.float16)))
    np.save(f"{d}/i.npy", np.arange(100, dtype=np.int64))
    for v in ((2, 0), (3, 0)):
        with open(f"{d}/v{v[0]}.npy", "wb") as f:
            np.lib.format.write_array(f, np.random.randn(17, 5).astype(np.float32), version=v)
    np.savez(f"{d}/stored.npz", a=np.random.randn(100, 10).astype(np.float32),
             h=np.random.randn(50).astype(np.float16), n=np.arange(10),
             f=np.asfortranarray(np.random.randn(6, 7).astype(np.float32)))
    np.savez_compressed(f"{d}/deflated.npz", a=np.random.randn(100).astype(np.float32))
    write_safetensors(f"{d}/model.safetensors",
                      {"a": np.random.randn(20, 30).astype(np.float32),
                       "b": np.random.randn(64).astype(np.float16),
                       "ids": np.arange(9, dtype=np.int64), "z": np.zeros((0,), np.float32)},
                      {"format": "pt"})
    # torch.distributed.checkpoint shards, written as FileSystemWriter does: byte items raw,
    # then torch.save of each tensor into the same file object, largest first; the (offset,
    # length) of every archive goes to dcp_meta/NAME.json (what .metadata would say).
    os.makedirs(f"{d}/dcp_meta", exist_ok=True)
    shard = {"w": torch.randn(96, 64), "m": torch.randn(96, 64) * 1e-3, "h": torch.randn(500).half(),
             "b": torch.randn(10), "step": torch.tensor(7)}
    for name, items in (("bytes_first.distcp", [b"\x80\x04state" + bytes(range(256)) * 3]),
                        ("tensors_only.distcp", [])):
        archives = []
        with open(f"{d}/{name}", "wb") as f:
            for b in items:
                f.write(b)
            for _, t in sorted(shard.items(), key=lambda kv: -kv[1].numel()):
                at = f.tell()
                torch.save(t, f)
                archives.append((at, f.tell() - at))
        with open(f"{d}/dcp_meta/{name}.json", "w") as f:
            json.dump(archives, f)
    # Seed corpora for the fuzzers, one directory per target.
    seeds = os.path.join(d, "seeds")
    for sub in ("torch_zip", "pickle", "safetensors", "npy", "distcp"):
        os.makedirs(os.path.join(seeds, sub), exist_ok=True)
    for name in os.listdir(d):
        p = os.path.join(d, name)
        if not os.path.isfile(p):
            continue
        ext = os.path.splitext(name)[1]
        sub = {".pt": "torch_zip", ".npz": "torch_zip", ".safetensors": "safetensors",
               ".npy": "npy", ".distcp": "distcp"}[ext]
        shutil.copyfile(p, os.path.join(seeds, sub, name))
        if ext == ".pt":
            with zipfile.ZipFile(p) as z:
                pkl = [n for n in z.namelist() if n.endswith("/data.pkl")][0]
                open(os.path.join(seeds, "pickle", name + ".pkl"), "wb").write(z.read(pkl))


# ---------------------------------------------------------------------------------------------
# round trip
def walk(obj, path=""):
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from walk(v, f"{path}.{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from walk(v, f"{path}.{i}")


def storage_tensor(t):
    s = t.storage()
    return torch.tensor([], dtype=t.dtype).set_(s)


def check_torch(orig_path, new_path):
    a = torch.load(orig_path)
    b = torch.load(new_path)
    if isinstance(a, torch.nn.Module):
        a, b = a.state_dict(keep_vars=False), b.state_dict(keep_vars=False)
    ta, tb = dict(walk(a)), dict(walk(b))
    assert ta.keys() == tb.keys(), "tensor set changed"
    for k in ta:
        x, y = ta[k], tb[k]
        assert x.dtype == y.dtype and x.shape == y.shape and x.stride() == y.stride(), k
        if x.dtype in FLOATS and x.storage().size() > 0:
            full = storage_tensor(y)
            want = pattern(full.numel()).to(x.dtype)
            assert torch.equal(full, want), f"{k}: storage does not hold the new values"
            assert not torch.equal(storage_tensor(x), full), f"{k}: values did not change"
        else:
            assert torch.equal(x, y), f"{k}: exact tensor changed"
    # storage sharing (views, tied weights) is preserved exactly
    for k1 in ta:
        for k2 in ta:
            same_a = ta[k1].storage().data_ptr() == ta[k2].storage().data_ptr() and ta[k1].numel() and ta[k2].numel()
            same_b = tb[k1].storage().data_ptr() == tb[k2].storage().data_ptr() and tb[k1].numel() and tb[k2].numel()
            assert bool(same_a) == bool(same_b), f"sharing of {k1} and {k2} changed"
    with zipfile.ZipFile(new_path) as z:
        assert z.testzip() is None, "bad CRC in served zip"


def check_np_array(x, y, name):
    assert x.dtype == y.dtype and x.shape == y.shape, name
    assert x.flags.f_contiguous == y.flags.f_contiguous, name
    if x.dtype in (np.float32, np.float16) and x.size:
        mem = np.frombuffer(y.tobytes(order="A"), dtype=y.dtype)
        want = pattern(mem.size).numpy().astype(x.dtype)
        assert np.array_equal(mem, want), f"{name}: new values not served"
    else:
        assert np.array_equal(x, y), f"{name}: exact array changed"


def roundtrip(d, tool, ckptctl):
    out = os.path.join(d, "served")
    os.makedirs(out, exist_ok=True)
    expect_format = {".pt": "torch_zip", ".npy": "npy", ".npz": "npz",
                     ".safetensors": "safetensors", ".distcp": "distcp"}
    failures = 0
    for name in sorted(os.listdir(d)):
        src = os.path.join(d, name)
        if not os.path.isfile(src):
            continue
        ext = os.path.splitext(name)[1]
        try:
            info = json.loads(subprocess.run([ckptctl, "inspect", "--json", src], check=True,
                                             capture_output=True, text=True).stdout)
            fmt = expect_format[ext]
            assert info["format"] == fmt, f"format {info['format']} != {fmt}: {info['note']}"
            assert info["bytes_read"] < 64 * 1024 or info["bytes_read"] < info["file_size"] / 4
            if name == "deflated.npz":
                assert not info["tensors"], "deflated member recognised"
                print(f"ok   {name} (deflated: opaque)")
                continue
            dst = os.path.join(out, name)
            subprocess.run([tool, "replace", src, dst, "--seed", "3", "--min-bytes", "0"],
                           check=True, capture_output=True)
            assert os.path.getsize(dst) == os.path.getsize(src), "size changed"
            if ext == ".pt":
                check_torch(src, dst)
            elif ext == ".distcp":
                # Every archive, sliced as DCP's reader slices it, has valid CRCs and loads with
                # its shape and dtype; the byte items before the first are untouched.
                with open(os.path.join(d, "dcp_meta", name + ".json")) as f:
                    archives = json.load(f)
                a, b = open(src, "rb").read(), open(dst, "rb").read()
                assert a[:archives[0][0]] == b[:archives[0][0]], "byte items changed"
                assert len(info["tensors"]) == len(archives), "an archive was not recognised"
                for at, n in archives:
                    with zipfile.ZipFile(io.BytesIO(b[at:at + n])) as z:
                        assert z.testzip() is None, "bad CRC in a served archive"
                    x, y = torch.load(io.BytesIO(a[at:at + n])), torch.load(io.BytesIO(b[at:at + n]))
                    assert x.shape == y.shape and x.dtype == y.dtype
            elif ext == ".npy":
                check_np_array(np.load(src), np.load(dst), name)
            elif ext == ".npz":
                with zipfile.ZipFile(dst) as z:
                    assert z.testzip() is None, "bad CRC in served npz"
                a, b = np.load(src), np.load(dst)
                assert sorted(a.files) == sorted(b.files)
                for k in a.files:
                    check_np_array(a[k], b[k], f"{name}:{k}")
            elif ext == ".safetensors":
                a, b = read_safetensors(src), read_safetensors(dst)
                for k in a:
                    check_np_array(a[k], b[k], f"{name}:{k}")
            print(f"ok   {name}: {len(info['tensors'])} tensors, "
                  f"{sum(t['compress'] for t in info['tensors'])} compressible")
        except Exception as e:  # report every file, then fail
            failures += 1
            print(f"FAIL {name}: {type(e).__name__}: {e}")
    return failures


def zip64(d, tool):
    os.makedirs(d, exist_ok=True)
    need = 2 * 4_500_000_000 + 1_000_000_000
    free = shutil.disk_usage(d).free
    if free < need or os.environ.get("CKPTFS_SKIP_ZIP64"):
        print(f"SKIP zip64: {free / 1e9:.1f} GB free, need {need / 1e9:.1f} GB "
              f"(or CKPTFS_SKIP_ZIP64 set)")
        return 0
    os.makedirs(d, exist_ok=True)
    src, dst = os.path.join(d, "big.pt"), os.path.join(d, "big_served.pt")
    try:
        big = torch.empty(1_100_000_000, dtype=torch.float32)  # 4.4 GB payload
        big[:1000] = torch.randn(1000)
        small = torch.randn(1000)
        torch.save({"big": big, "after": small, "ids": torch.arange(5)}, src)
        del big
        subprocess.run([tool, "replace", src, dst, "--seed", "3", "--min-bytes", "0"], check=True)
        os.unlink(src)
        with zipfile.ZipFile(dst) as z:
            infos = {i.filename: i for i in z.infolist()}
            assert max(i.file_size for i in infos.values()) > 2**32
            assert z.testzip() is None, "bad CRC"
        b = torch.load(dst)
        n = b["big"].numel()
        for lo in (0, n // 2, n - 1000):
            j = torch.arange(lo, lo + 1000, dtype=torch.int64)
            want = ((j * 7 + 3) % 251 - 125).to(torch.float32)
            assert torch.equal(b["big"][lo:lo + 1000], want), f"big[{lo}:] wrong"
        assert torch.equal(b["after"], pattern(1000)), "record after 4 GiB wrong"
        assert torch.equal(b["ids"], torch.arange(5))
        print("ok   zip64: 4.4 GB torch file round trip")
        return 0
    finally:
        for p in (src, dst):
            if os.path.exists(p):
                os.unlink(p)


if __name__ == "__main__":
    mode, d = sys.argv[1], sys.argv[2]
    if mode == "corpus":
        make_corpus(d)
        sys.exit(0)
    if mode == "roundtrip":
        sys.exit(1 if roundtrip(d, sys.argv[3], sys.argv[4]) else 0)
    if mode == "zip64":
        sys.exit(1 if zip64(d, sys.argv[3]) else 0)
    sys.exit(2)
