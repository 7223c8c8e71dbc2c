#!/usr/bin/python3
"""DeepSpeed ZeRO files and sharded safetensors through a real mount (issue 15).

  - DeepSpeed ZeRO-1/2 names and contents, as its engine saves them: per data-parallel rank
    `global_stepN/zero_pp_rank_R_mp_rank_00_optim_states.pt`, a torch.save of the optimizer
    state over flat 1-D fp32 partitions (master weights `single_partition_of_fp32_groups`, Adam's
    `exp_avg` and `exp_avg_sq` per group, `step`), plus `mp_rank_00_model_states.pt` with the
    module weights; 4 ranks saving at once, 4 steps of an MLP trained with Adam on sklearn's
    digits;
  - sharded safetensors as transformers writes them (`model-0000K-of-00004.safetensors` and
    `model.safetensors.index.json`, written by the project's test writer), 4 steps;
Checks: every file reads back (torch.load / the safetensors reader) with equal names, shapes and
dtypes and within the closed-loop bound; one lineage per rank and per shard file (stable over the
steps, never shared); every version after the first of its lineage is a delta; the index and
the model-states file exact where they hold no large floats.

Usage: sharded.py CKPTFS_BINARY    (as root; Debian's /usr/bin/python3)
"""
import json
import os
import sys
import tempfile
import threading

import numpy as np
import torch
from sklearn.datasets import load_digits

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, os.path.join(here, "..", "formats"))
from ckptfs_testlib import MIN_TENSOR, daemon_log, flat_tensors, info, keyframe_read_ok, mounted, require_fuse  # noqa: E402
from real_files import read_safetensors, write_safetensors  # noqa: E402

RANKS, STEPS = 4, 4


def training():
    """Per step: the model's flat fp32 parameters and Adam's moments over them."""
    torch.manual_seed(1)
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x, dtype=torch.float32) / 16
    y = torch.tensor(y)
    model = torch.nn.Sequential(torch.nn.Linear(64, 384), torch.nn.ReLU(),
                                torch.nn.Linear(384, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(STEPS):
        for _ in range(15):
            idx = torch.randint(0, len(x), (128,))
            loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        params = list(model.parameters())
        flat = torch.cat([p.detach().reshape(-1) for p in params])
        m = torch.cat([opt.state[p]["exp_avg"].reshape(-1) for p in params])
        v = torch.cat([opt.state[p]["exp_avg_sq"].reshape(-1) for p in params])
        yield step + 1, model.state_dict(), flat, m, v


def zero_files(root, step, state, flat, m, v):
    """DeepSpeed's files for one step, the ranks saving at once."""
    d = f"{root}/global_step{step}"
    os.makedirs(d, exist_ok=True)
    n = (flat.numel() + RANKS - 1) // RANKS
    barrier = threading.Barrier(RANKS)

    def rank(r):
        part = slice(r * n, min((r + 1) * n, flat.numel()))
        optim = {"optimizer_state_dict": {
            "state": {0: {"step": torch.tensor(float(step * 15)), "exp_avg": m[part].clone(),
                          "exp_avg_sq": v[part].clone()}},
            "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "params": [0]}],
            "single_partition_of_fp32_groups": [flat[part].clone()]},
            "ds_config": {"zero_optimization": {"stage": 2}}, "ds_version": "0.14.0"}
        barrier.wait()
        with open(f"{d}/zero_pp_rank_{r}_mp_rank_00_optim_states.pt", "wb") as f:
            torch.save(optim, f)
            f.flush()
            os.fsync(f.fileno())

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(RANKS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with open(f"{d}/mp_rank_00_model_states.pt", "wb") as f:
        torch.save({"module": state, "global_steps": step}, f)
        f.flush()
        os.fsync(f.fileno())


def safetensors_files(root, step, state):
    d = f"{root}/hf/checkpoint-{step * 100}"
    os.makedirs(d, exist_ok=True)
    names = sorted(state)
    shards = [names[i::4] for i in range(4)]
    weight_map = {}
    for k, group in enumerate(shards, start=1):
        fname = f"model-{k:05d}-of-00004.safetensors"
        # Large enough to be coded: each shard gets a slice of the weights and a bias.
        tensors = {name: state[name].numpy() for name in group}
        tensors[f"extra.{k}"] = state["0.weight"].numpy()[:, k * 10:(k + 1) * 10].copy()
        write_safetensors(f"{d}/{fname}", tensors, {"format": "pt"})
        for name in tensors:
            weight_map[name] = fname
    with open(f"{d}/model.safetensors.index.json", "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f)


def closed_loop(label, want, got, prev):
    assert got.dtype == want.dtype and got.shape == want.shape, label
    if want.numel() * want.element_size() < MIN_TENSOR or not want.is_floating_point():
        assert torch.equal(got, want), f"{label} must be exact"
        return
    if prev is None:  # a keyframe: rounded (-o keyframe_bits, default 12), Adam's m as values
        assert keyframe_read_ok(got, want, label), f"{label}: keyframe off"
        return
    err = (got.double() - want.double()).abs()
    bound = (want.double() - prev.double()).abs()
    assert int((err > bound).sum()) == 0, f"{label}: elements outside the closed-loop bound"


def main():
    require_fuse()
    binary = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="ckptfs-sharded-", dir="/var/tmp") as work:
        store, mnt, plain = f"{work}/store", f"{work}/mnt", f"{work}/plain"
        os.makedirs(mnt)
        lineages, prev = {}, {}
        with mounted(binary, store, mnt):
            for step, state, flat, m, v in training():
                for root in (mnt, plain):
                    zero_files(root, step, state, flat, m, v)
                    safetensors_files(root, step, state)
                files = [f"global_step{step}/zero_pp_rank_{r}_mp_rank_00_optim_states.pt"
                         for r in range(RANKS)]
                files += [f"hf/checkpoint-{step * 100}/model-{k:05d}-of-00004.safetensors"
                          for k in range(1, 5)]
                for rel in files:
                    i = info(f"{mnt}/{rel}")
                    key = os.path.basename(rel)  # the rank's or shard's file name
                    first = key not in lineages
                    lineages.setdefault(key, i["lineage"])
                    assert i["lineage"] == lineages[key], f"{rel} left its lineage"
                    assert i["kind"] == ("keyframe" if first else "delta"), (rel, i)
                    if rel.endswith(".pt"):
                        got = flat_tensors(torch.load(f"{mnt}/{rel}"))
                        want = flat_tensors(torch.load(f"{plain}/{rel}"))
                    else:
                        got = {k: torch.from_numpy(a.copy())
                               for k, a in read_safetensors(f"{mnt}/{rel}").items()}
                        want = {k: torch.from_numpy(a.copy())
                                for k, a in read_safetensors(f"{plain}/{rel}").items()}
                    assert got.keys() == want.keys(), rel
                    for name in want:
                        closed_loop(f"{rel}:{name}", want[name], got[name],
                                    prev.get((key, name)))
                        prev[(key, name)] = got[name]
                idx = f"hf/checkpoint-{step * 100}/model.safetensors.index.json"
                with open(f"{mnt}/{idx}") as a, open(f"{plain}/{idx}") as b:
                    assert a.read() == b.read()
            assert len(set(lineages.values())) == len(lineages), lineages
        with open(daemon_log(store)) as f:
            errors = [line for line in f if " error:" in line]
        assert not errors, errors[:10]
    print(f"sharded: {len(lineages)} lineages (4 ZeRO ranks, 4 safetensors shards) over "
          f"{STEPS} steps: ok")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
