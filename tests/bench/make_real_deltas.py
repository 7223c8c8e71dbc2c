#!/usr/bin/python3
"""Write pairs of consecutive real checkpoints for `ckptctl bench codec --data DIR`.

Trains a small MLP on sklearn's bundled digits (no download) with Debian's torch, once with Adam
and once with SGD + momentum, and saves the full float state (weights, then optimizer state) of
two checkpoints `gap` iterations apart, flattened to little-endian fp32:

  DIR/<name>.json       {"name", "prev", "cur", "tensors": [{"name", "numel"}...]}
  DIR/<name>.prev.f32   the earlier checkpoint (plays the previous reconstruction)
  DIR/<name>.cur.f32    the later one

Run with Debian's interpreter: /usr/bin/python3 tests/bench/make_real_deltas.py DIR
"""
import argparse
import json
import os

import numpy as np
import torch
from sklearn.datasets import load_digits


def float_state(model, opt):
    """Every float tensor of a checkpoint {model, optimizer} in state-dict order."""
    out = []
    for name, t in model.state_dict().items():
        if t.is_floating_point():
            out.append((name, t.detach().clone()))
    for pid, st in opt.state_dict()["state"].items():
        for key, t in st.items():
            if torch.is_tensor(t) and t.is_floating_point() and t.numel() > 1:
                out.append((f"optimizer.{pid}.{key}", t.detach().clone()))
    return out


def train(opt_name, steps, gap, hidden, seed):
    torch.manual_seed(seed)
    x, y = load_digits(return_X_y=True)
    x = torch.tensor((x / 16.0).astype(np.float32))
    y = torch.tensor(y)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, 10))
    if opt_name == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(seed)
    prev = None
    for step in range(1, steps + gap + 1):
        idx = torch.randint(0, len(x), (64,), generator=gen)
        opt.zero_grad()
        loss = loss_fn(model(x[idx]), y[idx])
        loss.backward()
        opt.step()
        if step == steps:
            prev = float_state(model, opt)
    return prev, float_state(model, opt), float(loss)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--steps", type=int, default=300, help="iterations before the first checkpoint")
    ap.add_argument("--gap", type=int, default=1, help="iterations between the two checkpoints")
    ap.add_argument("--hidden", type=int, default=1024, help="hidden width (1024: 1.1 M params)")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    torch.set_num_threads(2)
    for opt_name in ("adam", "sgd"):
        prev, cur, loss = train(opt_name, args.steps, args.gap, args.hidden, seed=1)
        name = f"{opt_name}-gap{args.gap}"
        meta = {"name": name, "prev": f"{name}.prev.f32", "cur": f"{name}.cur.f32",
                "optimizer": opt_name, "steps": args.steps, "gap": args.gap, "loss": loss,
                "tensors": [{"name": n, "numel": t.numel()} for n, t in cur]}
        for key, state in (("prev", prev), ("cur", cur)):
            flat = np.concatenate([t.reshape(-1).numpy().astype("<f4") for _, t in state])
            flat.tofile(os.path.join(args.dir, meta[key]))
        with open(os.path.join(args.dir, f"{name}.json"), "w") as f:
            json.dump(meta, f, indent=1)
        total = sum(t.numel() for _, t in cur)
        print(f"{name}: {len(cur)} tensors, {total} floats, loss {loss:.4f}")


if __name__ == "__main__":
    main()
