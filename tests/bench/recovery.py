#!/usr/bin/python3
"""Recovery-quality benchmark (issue 6): is a lossy checkpoint worth its size?

A lossy checkpoint is only worth its size if training resumed from it ends where it would have.
This benchmark trains small models on real data that needs no download, saves checkpoints with
torch.save through a real ckptfs mount (one fresh store per codec setting), restores them with
torch.load from the mount, and measures what LC-Checkpoint (ICML 2020) measures:

  compression  logical bytes written / bytes of the store's objects over the whole run
               (keyframes included), and stored bits per float parameter of the delta
               versions (stored_bytes of the xattr user.ckptfs.info, every float of the
               checkpoint counted: weights and optimizer state);
  rework       a failure-free run is saved through the mount; at several failure points t
               the last checkpoint c <= t is loaded from the mount, training resumes, and the
               iterations until the training loss is back at or below the failure-free loss
               at t are counted (capped). The lossless setting through the same mount is the
               exact-checkpoint baseline (and must match the count computed without a mount);
  accuracy     a run that fails 10 times spread over training (after i/11 of it), each time
               restoring the last checkpoint from the mount and redoing the iterations since:
               its final test accuracy (matrix factorisation: test MSE) against the
               failure-free run's; and the same with the 10 failures in the first tenth of
               the run (i/100; checkpoints every iteration), where Adam's second moment is
               still growing from zero.

Every setting runs with a checkpoint every iteration (as the paper) and every k iterations,
for every workload and seed. Optimizer state is either coded like the weights
(optimizer=lossy) or kept exact (optimizer=exact); only the Adam MLP and the momentum LeNet
have any.

Workloads (sklearn's bundled digits, stratified 70/30 train/test split; synthetic MF; the
learning rate decays to 0 along a cosine over each run):
  lr        multinomial logistic regression, plain SGD; the 8x8 digits are upsampled to 28x28
            (MNIST's size, as in the paper): at 8x8 the 640-float weight is under the 4 KiB
            size below which ckptfs stores tensors exactly, and nothing would be compressed
  lenet5    LeNet-5 (conv 6@5x5, pool, conv 16@5x5, pool, 120, 84, 10) on 28x28, SGD with
            momentum 0.9
  mlp-adam  MLP 64-256-256-10 on the 8x8 features, Adam
  mf        matrix factorisation (rank 16) of a synthetic rank-8 2000x1000 rating matrix with
            Gaussian noise, 10% observed, plain minibatch SGD; metric: test MSE

Decision rule (the issue's): a setting qualifies if, for every workload and both checkpoint
frequencies (and the early restores), the mean final test accuracy over seeds after 10
restores is at most 0.2 percentage points below the failure-free run's (MF: test MSE at most
1% above); among the qualifying settings the one with the best geometric-mean whole-run
compression ratio over all workload x frequency cells is selected. The full mode then tries
other keyframe intervals for the best setting (or, if none qualifies, for the closest lossy
one) and selects again.

Seeds: every setting runs on 2 screening seeds; the settings within 3x the limit everywhere
(against the failure-free run or the control) get 3 more (full mode), and so does the noise
control: a lossless mount whose restored floats
are multiplied by 1 +- 2^-20, which shows how far 10 restarts move the final metric by chaos
alone (one test digit is 0.19 pp).

Training is deterministic (fixed seeds, one torch thread, data order a function of the
iteration number, so a resumed run sees the batches the failure-free run saw). Each checkpoint
is fsync'ed after torch.save, so versions are committed in order (see docs/benchmarks.md).

Usage:
  recovery.py CKPTFS [--quick] [--write-docs] [--json FILE] [--seeds N] [--confirm-seeds N]
              [--workloads lr,lenet5,...] [--settings NAME,...] [--no-keyframe-sweep]
  recovery.py CKPTFS --from-json FILE [--write-docs]    # render a saved run again
  --quick       CI smoke (< 5 min): mlp-adam and lr, three settings (lossless, paper b=3, the
                daemon's defaults), fewer iterations; checks that can fail (below)
  --write-docs  rewrite the section between <!-- recovery:begin --> and <!-- recovery:end -->
                in docs/benchmarks.md with the tables, the command line, machine and date
  Full mode takes about 25-30 minutes on 2 cores; it must run as root (a FUSE mount).

Checks (both modes; exit status 1 when one fails): the lossless setting reads back every
restored checkpoint bit-exactly, its rework equals the count computed without a mount and its
final model after 10 restores is bit-identical to the failure-free run's; every lossy setting
stores less than lossless and every paper-mode delta costs at least 1 bit per element of its
coded tensors (the Huffman floor); the ratio is taken from real store bytes, which must agree
with the sum of the versions' stored_bytes; the daemon's defaults compress a whole run at least
5x (optimizer state included) and end within 2 percentage points (MF: 10%) of the failure-free
run, also after the early restores.
Exit status 77: no FUSE here (skipped); 2: usage.
"""
import argparse
import copy
import datetime
import io
import json
import math
import os
import platform
import re
import shlex
import shutil
import signal
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "fs"))
import ckptfs_testlib as testlib  # noqa: E402

SMALL_TENSOR_BYTES = 256  # the mount's default -o min_tensor: smaller float tensors are exact
ACCURACY_PP = 0.2  # allowed loss of test accuracy, percentage points
MF_LOSS_PCT = 1.0  # allowed rise of the MF test MSE, percent
RESTORES = 10

# --------------------------------------------------------------------------------------------
# Data and workloads


def digits_split():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    return train_test_split(x, y, test_size=0.3, random_state=0, stratify=y)


class DataOrder:
    """Minibatch indices as a function of the iteration number (1-based): epochs of a seeded
    permutation, so a run resumed at iteration c sees the batches the failure-free run saw."""

    def __init__(self, n, batch, seed):
        self.n, self.batch = n, batch
        self.rng = np.random.default_rng(seed)
        self.order = np.empty(0, dtype=np.int64)

    def batch_at(self, it):
        end = it * self.batch
        while len(self.order) < end:
            self.order = np.concatenate([self.order, self.rng.permutation(self.n)])
        return torch.from_numpy(self.order[end - self.batch:end])


class Workload:
    """One model and its data. Subclasses define build/train_step/train_loss/test_metric."""

    name = ""
    metric = ""  # "accuracy %" (higher is better) or "test MSE" (lower is better)
    iterations = 0
    every_k = 10
    batch = 0
    base_lr = 0.0

    def order(self, seed):
        return DataOrder(self.n_train, self.batch, 1000 + seed)

    def set_lr(self, opt, it):
        """Cosine decay from base_lr to 0 over the run, a function of the iteration only (no
        scheduler state to checkpoint); iterations past the end keep the last rate."""
        it = min(it, self.iterations)
        lr = self.base_lr * 0.5 * (1 + math.cos(math.pi * (it - 1) / self.iterations))
        for group in opt.param_groups:
            group["lr"] = lr

    def degradation(self, reference, value):
        """How much worse `value` is than `reference`, in the unit of the criterion (pp of
        accuracy, or percent of test MSE); negative when better."""
        if self.metric == "test MSE":
            return (value - reference) / reference * 100.0
        return reference - value

    def limit(self):
        return MF_LOSS_PCT if self.metric == "test MSE" else ACCURACY_PP


class Classifier(Workload):
    metric = "accuracy %"

    def __init__(self, xtr, ytr, xte, yte, eval_n):
        self.xtr, self.ytr = torch.from_numpy(xtr), torch.from_numpy(ytr)
        self.xte, self.yte = torch.from_numpy(xte), torch.from_numpy(yte)
        self.n_train = len(self.xtr)
        # Training loss (for the rework count) on a fixed subset of the training set.
        g = np.random.default_rng(7)
        self.eval_idx = torch.from_numpy(np.sort(g.permutation(self.n_train)[:eval_n]))

    def train_step(self, model, opt, it, order):
        idx = order.batch_at(it)
        self.set_lr(opt, it)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(self.xtr[idx]), self.ytr[idx]).backward()
        opt.step()

    @torch.no_grad()
    def train_loss(self, model):
        idx = self.eval_idx
        return F.cross_entropy(model(self.xtr[idx]), self.ytr[idx]).item()

    @torch.no_grad()
    def test_metric(self, model):
        pred = model(self.xte).argmax(1)
        return (pred == self.yte).double().mean().item() * 100.0


def upsample(x, size):
    t = torch.from_numpy(x).reshape(-1, 1, 8, 8)
    return F.interpolate(t, size=(size, size), mode="bilinear", align_corners=False).numpy()


class LogisticRegression(Classifier):
    name = "lr"
    base_lr = 0.2

    def __init__(self, split, quick):
        xtr, xte, ytr, yte = split
        super().__init__(upsample(xtr, 28).reshape(len(xtr), -1), ytr,
                         upsample(xte, 28).reshape(len(xte), -1), yte, eval_n=len(xtr))
        self.iterations, self.batch, self.every_k = (100, 64, 5) if quick else (300, 64, 10)
        self.description = ("multinomial logistic regression 784-10 on digits upsampled to "
                            f"28x28, SGD lr {self.base_lr}, batch {self.batch}")

    def build(self, seed):
        torch.manual_seed(seed)
        model = torch.nn.Linear(28 * 28, 10)
        return model, torch.optim.SGD(model.parameters(), lr=self.base_lr)


class LeNet5(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 6, 5, padding=2)
        self.conv2 = torch.nn.Conv2d(6, 16, 5)
        self.fc1 = torch.nn.Linear(16 * 5 * 5, 120)
        self.fc2 = torch.nn.Linear(120, 84)
        self.fc3 = torch.nn.Linear(84, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc3(F.relu(self.fc2(x)))


class LeNetWorkload(Classifier):
    """lr 0.03 and 300 iterations: at lr 0.05 (200 iterations) the run was chaotic enough that
    the noise control (restores perturbed by 2^-20) lost up to 17 pp of final accuracy."""
    name = "lenet5"
    base_lr = 0.03

    def __init__(self, split, quick):
        xtr, xte, ytr, yte = split
        super().__init__(upsample(xtr, 28), ytr, upsample(xte, 28), yte, eval_n=256)
        self.iterations, self.batch, self.every_k = (60, 32, 5) if quick else (300, 32, 10)
        self.description = ("LeNet-5 on digits upsampled to 28x28, SGD lr "
                            f"{self.base_lr} momentum 0.9, batch {self.batch}")

    def build(self, seed):
        torch.manual_seed(seed)
        model = LeNet5()
        return model, torch.optim.SGD(model.parameters(), lr=self.base_lr, momentum=0.9)


class MlpAdam(Classifier):
    name = "mlp-adam"
    base_lr = 1e-3

    def __init__(self, split, quick):
        xtr, xte, ytr, yte = split
        super().__init__(xtr, ytr, xte, yte, eval_n=len(xtr))
        self.iterations, self.batch, self.every_k = (100, 64, 5) if quick else (300, 64, 10)
        self.description = (f"MLP 64-256-256-10 on the 8x8 digits, Adam lr {self.base_lr}, "
                            f"batch {self.batch}")

    def build(self, seed):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                    torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                    torch.nn.Linear(256, 10))
        return model, torch.optim.Adam(model.parameters(), lr=self.base_lr)


class Factorisation(torch.nn.Module):
    def __init__(self, users, items, rank):
        super().__init__()
        self.users = torch.nn.Parameter(torch.randn(users, rank) * 0.1)
        self.items = torch.nn.Parameter(torch.randn(items, rank) * 0.1)

    def forward(self, u, i):
        return (self.users[u] * self.items[i]).sum(1)


class MatrixFactorisation(Workload):
    name = "mf"
    metric = "test MSE"
    USERS, ITEMS, TRUE_RANK, RANK, OBSERVED, NOISE, L2 = 2000, 1000, 8, 16, 0.1, 0.3, 0.02
    base_lr = 0.2

    def __init__(self, quick):
        g = np.random.default_rng(12345)
        a = g.standard_normal((self.USERS, self.TRUE_RANK)) / self.TRUE_RANK ** 0.25
        b = g.standard_normal((self.ITEMS, self.TRUE_RANK)) / self.TRUE_RANK ** 0.25
        n = int(self.USERS * self.ITEMS * self.OBSERVED)
        cells = g.choice(self.USERS * self.ITEMS, size=n, replace=False)
        u, i = cells // self.ITEMS, cells % self.ITEMS
        r = (a[u] * b[i]).sum(1) + self.NOISE * g.standard_normal(n)
        test = g.random(n) < 0.1
        as_t = lambda v, m, dt: torch.from_numpy(v[m].astype(dt))  # noqa: E731
        self.u_tr, self.i_tr, self.r_tr = (as_t(u, ~test, np.int64), as_t(i, ~test, np.int64),
                                           as_t(r, ~test, np.float32))
        self.u_te, self.i_te, self.r_te = (as_t(u, test, np.int64), as_t(i, test, np.int64),
                                           as_t(r, test, np.float32))
        self.n_train = len(self.r_tr)
        self.iterations, self.batch, self.every_k = (100, 2048, 5) if quick else (300, 2048, 10)
        self.description = (f"rank-{self.RANK} factorisation of a rank-{self.TRUE_RANK} "
                            f"{self.USERS}x{self.ITEMS} matrix + N(0, {self.NOISE}^2) noise, "
                            f"{self.OBSERVED:.0%} observed ({self.n_train} train / "
                            f"{len(self.r_te)} test ratings), SGD lr {self.base_lr} on the "
                            f"summed squared error + L2 {self.L2}, batch {self.batch}")

    def build(self, seed):
        torch.manual_seed(seed)
        model = Factorisation(self.USERS, self.ITEMS, self.RANK)
        return model, torch.optim.SGD(model.parameters(), lr=self.base_lr)

    def train_step(self, model, opt, it, order):
        idx = order.batch_at(it)
        u, i = self.u_tr[idx], self.i_tr[idx]
        self.set_lr(opt, it)
        opt.zero_grad(set_to_none=True)
        err = model(u, i) - self.r_tr[idx]
        reg = model.users[u].pow(2).sum() + model.items[i].pow(2).sum()
        (0.5 * err.pow(2).sum() + 0.5 * self.L2 * reg).backward()
        opt.step()

    @torch.no_grad()
    def train_loss(self, model):
        return (model(self.u_tr, self.i_tr) - self.r_tr).pow(2).mean().item()

    @torch.no_grad()
    def test_metric(self, model):
        return (model(self.u_te, self.i_te) - self.r_te).pow(2).mean().item()


def make_workloads(names, quick):
    split = digits_split()
    every = {"lr": lambda: LogisticRegression(split, quick),
             "lenet5": lambda: LeNetWorkload(split, quick),
             "mlp-adam": lambda: MlpAdam(split, quick),
             "mf": lambda: MatrixFactorisation(quick)}
    return [every[n]() for n in names]


WORKLOADS = ("lr", "lenet5", "mlp-adam", "mf")

# --------------------------------------------------------------------------------------------
# Codec settings (mount options)


class Setting:
    """One codec configuration of the mount. Every knob is passed explicitly, so a row means
    the same whatever the daemon's defaults are; `defaults` passes no option at all.

    `perturb` makes the noise control: a lossless mount, and every restored float multiplied
    by (1 + perturb * (+-1)). A harmless change far below any codec's error, it shows how far
    10 restores move the final test metric by chaos alone (the resolution of the criterion)."""

    def __init__(self, coding="grouped", bits=3, rep="mean", scope="tensor", optimizer="lossy",
                 keyframe_interval=20, lossless=False, defaults=False, perturb=0.0,
                 relative="off", keyframe_bits=0, ratio_bits=0, intra="off", grid=0.0,
                 min_tensor=0, moment_bits=0, intra_buckets=0, refresh_interval=0,
                 weight_error=0.0, grid_error=0.0):
        self.coding, self.bits, self.rep, self.scope = coding, bits, rep, scope
        self.relative, self.intra, self.grid = relative, intra, grid
        self.min_tensor = min_tensor  # bytes; 0: the mount's default
        self.moment_bits = moment_bits  # 0: the mount's default
        self.intra_buckets = intra_buckets  # 0: the mount's default
        # Every N-th delta a refresh (0: none; passed explicitly, so builds from before
        # 2026-11-28, which lack the option, refuse every lossy row).
        self.refresh_interval = refresh_interval
        # The weights' error allowance, in percent (0: off, passed explicitly as refresh is) and
        # its cap (0: the mount's default).
        self.weight_error, self.grid_error = weight_error, grid_error
        # 0: `bits`, as the name says (passed explicitly: the mount's own default is 1)
        self.keyframe_bits, self.ratio_bits = keyframe_bits, ratio_bits
        self.optimizer, self.keyframe_interval = optimizer, keyframe_interval
        self.lossless, self.defaults, self.perturb = lossless or perturb > 0, defaults, perturb

    def options(self):
        if self.defaults:
            return []
        if self.lossless:
            return ["lossless"]
        return [f"coding={self.coding}", f"bits={self.bits}", f"rep={self.rep}",
                f"scope={self.scope}", f"optimizer={self.optimizer}",
                f"relative={self.relative}", f"keyframe_interval={self.keyframe_interval}",
                f"keyframe_bits={self.keyframe_bits}", f"intra={self.intra}",
                f"grid={self.grid or 'off'}", f"ratio_bits={self.ratio_bits or self.bits}"] + (
                    [f"min_tensor={self.min_tensor}"] if self.min_tensor else []) + (
                    [f"moment_bits={self.moment_bits}"] if self.moment_bits else []) + (
                    [f"intra_buckets={self.intra_buckets}"] if self.intra_buckets else []) + (
                    [f"grid_error={self.grid_error:g}"] if self.grid_error else []) + [
                    f"refresh_interval={self.refresh_interval}",
                    f"weight_error={self.weight_error:g}%" if self.weight_error else
                    "weight_error=off"]

    @property
    def name(self):
        if self.defaults:
            return "defaults"
        if self.perturb:
            return "noise-control"
        if self.lossless:
            return "lossless"
        scope = "ckpt" if self.scope == "checkpoint" else "tensor"
        name = f"{self.coding}-b{self.bits}-{self.rep}-{scope}"
        if self.optimizer == "exact":
            name += "-optexact"
        if self.relative == "on":
            name += "-rel"
        if self.keyframe_interval != 20:
            name += f"-K{self.keyframe_interval}"
        if self.keyframe_bits:
            name += f"-kb{self.keyframe_bits}"
        if self.ratio_bits:
            name += f"-rb{self.ratio_bits}"
        if self.intra == "on":
            name += "-intra"
        if self.grid:
            name += f"-grid{self.grid}" if isinstance(self.grid, str) else f"-grid{self.grid:g}"
        if self.min_tensor:
            name += f"-mt{self.min_tensor}"
        if self.moment_bits:
            name += f"-mb{self.moment_bits}"
        if self.intra_buckets:
            name += f"-ib{self.intra_buckets}"
        if self.refresh_interval:
            name += f"-R{self.refresh_interval}"
        if self.weight_error:
            name += f"-we{self.weight_error:g}"
        if self.grid_error:
            name += f"-ge{self.grid_error:g}"
        return name

    def with_keyframe_interval(self, k, refresh_interval=None, weight_error=None,
                               grid_error=None):
        s = copy.copy(self)
        s.keyframe_interval = k
        if refresh_interval is not None:
            s.refresh_interval = refresh_interval
        if weight_error is not None:
            s.weight_error = weight_error
        if grid_error is not None:
            s.grid_error = grid_error
        return s


def settings_matrix(quick):
    """The issue's settings: lossless; paper mode (one Huffman code per symbol, whole-checkpoint
    buckets as in the paper) at b=2,3 with mean and midrange representatives; grouped coding at
    b=2,3 with whole-checkpoint buckets and at b=2,3,4 with per-tensor buckets (b=3 also with
    midrange); optimizer state exact for paper b=3, grouped whole-checkpoint b=3 (the same
    reconstruction as paper b=3, another coder) and grouped per-tensor b=3,4. Plus the noise
    control. (b=1 and grouped b=2 midrange were measured once and lost several points of
    accuracy everywhere; docs/benchmarks.md.)

    Nonnegative tensors (Adam's v) as ratios (relative=on, "-rel"): the grouped settings with
    lossy optimizer state use them, and grouped per-tensor b=3,4 also run without them (the
    paper's differences everywhere), to show what they change. Paper mode is the paper's:
    differences only."""
    if quick:
        return [Setting(lossless=True), Setting("paper", 3, "mean", "checkpoint"),
                Setting(defaults=True)]
    rows = [Setting(lossless=True), Setting(perturb=2.0 ** -20)]
    for bits in (2, 3):
        for rep in ("mean", "midrange"):
            rows.append(Setting("paper", bits, rep, "checkpoint"))
    rows.append(Setting("paper", 3, "mean", "checkpoint", optimizer="exact"))
    for bits in (2, 3):
        rows.append(Setting("grouped", bits, "mean", "checkpoint", relative="on"))
    rows.append(Setting("grouped", 3, "mean", "checkpoint", optimizer="exact"))
    for bits in (2, 3, 4):
        rows.append(Setting("grouped", bits, "mean", "tensor", relative="on"))
    for bits in (3, 4):
        rows.append(Setting("grouped", bits, "mean", "tensor"))
    rows.append(Setting("grouped", 3, "midrange", "tensor", relative="on"))
    # Issue 16: lossy keyframes (float tensors rounded to 8 mantissa bits) and Adam's v with
    # fewer bits, on the defaults.
    for kb in (8, 12):
        rows.append(Setting("grouped", 3, "midrange", "tensor", relative="on", keyframe_bits=kb))
    rows.append(Setting("grouped", 3, "midrange", "tensor", relative="on", keyframe_bits=8,
                        ratio_bits=2))
    # Intra slabs (Adam's m and momentum buffers coded as values when their base predicts them
    # worse than zero), on today's other defaults.
    rows.append(Setting("grouped", 3, "midrange", "tensor", relative="on", keyframe_bits=12,
                        intra="on"))
    # Weights' deltas on a uniform grid (step times the RMS change) instead of the buckets, or
    # per slab whichever is estimated to cost fewer bits at the buckets' error (auto).
    for step in ("auto", 1.0, 1.25):
        rows.append(Setting("grouped", 3, "midrange", "tensor", relative="on", keyframe_bits=12,
                            intra="on", grid=step))
    # Small tensors (biases, norms' scales and their optimizer state) coded too, not exact.
    for mt in (256, 4096):
        rows.append(Setting("grouped", 3, "midrange", "tensor", relative="on", keyframe_bits=12,
                            intra="on", grid="auto", min_tensor=mt))
    # Second moments (Adam's v) with fewer mantissa bits on lossy chains.
    for mb in (6, 12):
        rows.append(Setting("grouped", 3, "midrange", "tensor", relative="on", keyframe_bits=12,
                            intra="on", grid="auto", min_tensor=256, moment_bits=mb))
    # Adam's v with fewer bits (ratio_bits), on those defaults: escapes are coded since
    # 2026-11-27, which made 1 and 2 bits cheaper than 3.
    for rb in (1, 2):
        rows.append(Setting("grouped", 3, "midrange", "tensor", relative="on", keyframe_bits=12,
                            ratio_bits=rb, intra="on", grid="auto", min_tensor=256,
                            moment_bits=6))
    # Keyframes are 28% of the transformer's store since v takes one bit: 10 mantissa bits for
    # them (8 lost 0.37 pp on LeNet-5, 12 did not).
    rows.append(Setting("grouped", 3, "midrange", "tensor", relative="on", keyframe_bits=10,
                        ratio_bits=1, intra="on", grid="auto", min_tensor=256, moment_bits=6))
    # Since v takes one bit in its deltas (up to a factor 2 off), its keyframes' 6 bits (within
    # 2^-7) are more than its chain keeps: 2 and 3 bits. And Adam's m as values with 4 buckets
    # instead of 5 (73% error at 5).
    # (2, 5): the default before Adam's m kept one bucket fewer by default (intra_buckets 0 is
    # 2^bits - 4 for exp_avg since 2026-11-28, 2^bits - 3 for the rest).
    for mb, ib in ((2, 0), (3, 0), (6, 4), (2, 4), (2, 5)):
        rows.append(Setting("grouped", 3, "midrange", "tensor", relative="on", keyframe_bits=12,
                            ratio_bits=1, intra="on", grid="auto", min_tensor=256,
                            moment_bits=mb, intra_buckets=ib))
    # Small checkpoints' keyframes far apart (keyframe_interval=auto: 1000 at these sizes) with
    # every 5th delta a refresh at 4 bits: the defaults since 2026-11-28 (without refreshes MF
    # every 10 iterations lost 1.12% of test MSE).
    rows.append(Setting("grouped", 3, "midrange", "tensor", relative="on", keyframe_bits=12,
                        ratio_bits=1, intra="on", grid="auto", min_tensor=256, moment_bits=2,
                        keyframe_interval="auto", refresh_interval=5))
    # The weights' deltas allowed up to 2.5% of their values' RMS where the buckets leave less,
    # at most twice the buckets' error (weight_error=2.5%, grid_error=4; opt-in: MF every 10
    # iterations went past its limit, docs/benchmarks.md "An error allowance for the weights").
    rows.append(Setting("grouped", 3, "midrange", "tensor", relative="on", keyframe_bits=12,
                        ratio_bits=1, intra="on", grid="auto", min_tensor=256, moment_bits=2,
                        keyframe_interval="auto", refresh_interval=5, weight_error=2.5))
    for bits in (3, 4):
        rows.append(Setting("grouped", bits, "mean", "tensor", optimizer="exact"))
    return rows


KEYFRAME_SWEEP = (10, 50, 1000)
CONFIRM_FACTOR = 3.0  # screening: settings within 3x the limit get the confirmation seeds

# --------------------------------------------------------------------------------------------
# Checkpoints


def state_of(model, opt, it):
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "iteration": it}


def snapshot(model, opt, it):
    """A deep copy of the checkpoint state (the failure-free run's checkpoint at `it`)."""
    return copy.deepcopy(state_of(model, opt, it))


def restore(workload, seed, state, setting, it):
    """A fresh model and optimizer with the checkpoint's state, as a restarted job builds
    (the noise control perturbs the state first)."""
    if setting.perturb:
        g = torch.Generator().manual_seed(seed * 100003 + it)
        for t in testlib.flat_tensors(state).values():
            if t.is_floating_point():
                sign = torch.randint(0, 2, t.shape, generator=g).to(t.dtype) * 2 - 1
                t.mul_(1 + setting.perturb * sign)
    model, opt = workload.build(seed)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    return model, opt


def bit_identical(a, b):
    ta, tb = testlib.flat_tensors(a), testlib.flat_tensors(b)
    return ta.keys() == tb.keys() and all(
        ta[k].dtype == tb[k].dtype and ta[k].shape == tb[k].shape and
        torch.equal(raw_bytes(ta[k]), raw_bytes(tb[k])) for k in ta)


def raw_bytes(t):
    """The tensor's bytes (bit-exact comparison: -0.0 differs from 0.0, NaN equals itself)."""
    return t.detach().reshape(-1).contiguous().view(torch.uint8)


OPTIMIZER_BUFFERS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer")


def float_counts(state):
    """(every float element, elements ckptfs codes lossily with optimizer=lossy, same with
    optimizer=exact): tensors under SMALL_TENSOR_BYTES are stored exact."""
    total = coded = coded_no_opt = 0
    for name, t in testlib.flat_tensors(state).items():
        if not t.is_floating_point():
            continue
        total += t.numel()
        if t.numel() * t.element_size() >= SMALL_TENSOR_BYTES:
            coded += t.numel()
            if not (name.startswith("optimizer.") or name.split(".")[-1] in OPTIMIZER_BUFFERS):
                coded_no_opt += t.numel()
    return total, coded, coded_no_opt


def save(state, path):
    """torch.save, then fsync: the version is committed before the next one is written."""
    torch.save(state, path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ckpt_path(mnt, it):
    return os.path.join(mnt, "run", f"step_{it}.pt")


def info(path):
    return json.loads(os.getxattr(path, "user.ckptfs.info"))


def objects_bytes(store):
    d = os.path.join(store, "objects")
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))

# --------------------------------------------------------------------------------------------
# Runs


class Reference:
    """The failure-free run of one workload and seed, without a mount: the training loss after
    every iteration, every checkpoint state, the final test metric and model."""

    def __init__(self, w, seed):
        model, opt = w.build(seed)
        order = w.order(seed)
        self.losses = [w.train_loss(model)]
        self.snapshots = {}
        for it in range(1, w.iterations + 1):
            w.train_step(model, opt, it, order)
            self.losses.append(w.train_loss(model))
            self.snapshots[it] = snapshot(model, opt, it)
        self.final_metric = w.test_metric(model)
        self.final_model = copy.deepcopy(model.state_dict())
        self.floats, self.coded, self.coded_no_opt = float_counts(self.snapshots[1])
        buf_sizes = []
        for it in (1, w.iterations):
            b = io.BytesIO()
            torch.save(self.snapshots[it], b)
            buf_sizes.append(len(b.getvalue()))
        self.checkpoint_bytes = max(buf_sizes)

    def exact_rework(self, t, c):
        """Iterations an exact restore at c needs to reach the loss of iteration t (replaying
        the failure-free run: no mount needed)."""
        return next(n for n in range(t - c + 1) if self.losses[c + n] <= self.losses[t])


def failure_points(w, k, fractions):
    """(failure iteration t, last checkpoint c): c a multiple of k near each fraction of the
    run, t = c + k // 2 (half a checkpoint interval of work lost; t = c when k = 1)."""
    out = []
    for f in fractions:
        c = max(k, int(round(f * w.iterations / k)) * k)
        out.append((c + k // 2, c))
    return out


def restore_points(w, early=False):
    """Ten failures (iterations after which the job dies): spread evenly over training
    (i/11 of the run), or all within its first tenth (i/100), where Adam's second moment is
    still growing from zero."""
    parts = 100 if early else RESTORES + 1
    return [max(1, round((i + 1) * w.iterations / parts)) for i in range(RESTORES)]


class Mount:
    """A fresh store and mount point under `work`, removed afterwards."""

    def __init__(self, binary, work, setting):
        self.binary, self.setting = binary, setting
        self.dir = tempfile.mkdtemp(dir=work)
        self.store, self.mnt = os.path.join(self.dir, "store"), os.path.join(self.dir, "mnt")

    def __enter__(self):
        self.ctx = testlib.mounted(self.binary, self.store, self.mnt, *self.setting.options())
        self.ctx.__enter__()
        os.makedirs(os.path.join(self.mnt, "run"))
        return self

    def __exit__(self, *exc):
        return self.ctx.__exit__(*exc)

    def remove(self):
        shutil.rmtree(self.dir, ignore_errors=True)


def run_failure_free(binary, work, w, seed, k, setting, ref, fractions):
    """The failure-free run's checkpoints through the mount (compression), then one failure at
    each failure point restored from the mount (rework)."""
    m = Mount(binary, work, setting)
    try:
        with m:
            logical, versions = 0, []
            for it in range(k, w.iterations + 1, k):
                path = ckpt_path(m.mnt, it)
                save(ref.snapshots[it], path)
                logical += os.path.getsize(path)
            for it in range(k, w.iterations + 1, k):
                versions.append(info(ckpt_path(m.mnt, it)))
            rework = []
            for t, c in failure_points(w, k, fractions):
                t0 = time.perf_counter()
                state = torch.load(ckpt_path(m.mnt, c), map_location="cpu")
                load_s = time.perf_counter() - t0
                exact = bit_identical(state, ref.snapshots[c])
                model, opt = restore(w, seed, state, setting, c)
                order = w.order(seed)
                target, cap = ref.losses[t], (t - c) + 25
                n, loss = 0, w.train_loss(model)
                restored_loss = loss
                while not loss <= target and n < cap:
                    n += 1
                    w.train_step(model, opt, c + n, order)
                    loss = w.train_loss(model)
                rework.append({"t": t, "c": c, "iterations": n, "reached": loss <= target,
                               "exact_iterations": ref.exact_rework(t, c), "bit_exact": exact,
                               "restored_loss": restored_loss, "checkpoint_loss": ref.losses[c],
                               "load_seconds": load_s})
        stored = objects_bytes(m.store)
    finally:
        m.remove()
    deltas = [v for v in versions if v["kind"] == "delta"]
    return {"logical": logical, "stored": stored,
            "stored_by_versions": sum(v["stored_bytes"] for v in versions),
            "versions": len(versions), "keyframes": sum(v["kind"] == "keyframe" for v in versions),
            "deltas": len(deltas), "lineages": len({v["lineage"] for v in versions}),
            "delta_stored": [v["stored_bytes"] for v in deltas],
            "keyframe_stored": [v["stored_bytes"] for v in versions if v["kind"] == "keyframe"],
            "rework": rework}


def fixed_cost(binary, work, w, ref):
    """Stored bytes of a version identical to its base (grouped coding): what every delta
    costs whatever it holds (metadata, zip structure, tensors under 4 KiB, frame headers)."""
    m = Mount(binary, work, Setting())
    try:
        with m:
            for name in ("a", "b"):
                save(ref.snapshots[w.iterations], os.path.join(m.mnt, "run", f"{name}.pt"))
            return info(os.path.join(m.mnt, "run", "b.pt"))["stored_bytes"]
    finally:
        m.remove()


def run_with_restores(binary, work, w, seed, k, setting, early=False):
    """Training that dies 10 times (restore_points); each time the last checkpoint is loaded
    from the mount and the iterations since it are done again. Returns the final test metric
    and model."""
    m = Mount(binary, work, setting)
    try:
        with m:
            model, opt = w.build(seed)
            order = w.order(seed)
            pending = restore_points(w, early)
            it = restores = 0
            while it < w.iterations:
                it += 1
                w.train_step(model, opt, it, order)
                if it % k == 0:
                    save(state_of(model, opt, it), ckpt_path(m.mnt, it))
                if pending and pending[0] == it:
                    pending.pop(0)
                    it -= it % k
                    state = torch.load(ckpt_path(m.mnt, it), map_location="cpu")
                    model, opt = restore(w, seed, state, setting, it)
                    restores += 1
            assert restores == RESTORES
            return w.test_metric(model), copy.deepcopy(model.state_dict())
    finally:
        m.remove()

# --------------------------------------------------------------------------------------------
# Summaries


def mean(xs):
    xs = list(xs)
    return sum(xs) / len(xs) if xs else float("nan")


class Cell:
    """One workload x setting x checkpoint interval, over seeds. `control` are the noise
    control's runs of the same workload and interval (compared seed by seed)."""

    def __init__(self, w, k, runs, control=None):
        self.w, self.k, self.runs = w, k, runs
        self.ratio = sum(r["logical"] for r in runs) / max(1, sum(r["stored"] for r in runs))
        self.delta_bits = mean(b * 8 / r["floats"] for r in runs for b in r["delta_stored"])
        self.keyframes = mean(r["keyframes"] for r in runs)
        self.versions = mean(r["versions"] for r in runs)
        rework = [x for r in runs for x in r["rework"]]
        self.rework = mean(x["iterations"] for x in rework)
        self.exact_rework = mean(x["exact_iterations"] for x in rework)
        self.capped = sum(not x["reached"] for x in rework)
        self.reference = mean(r["ff_metric"] for r in runs)
        self.metric = mean(r["final_metric"] for r in runs)
        self.degradation = self.degrade(self.metric)
        # Restores in the first tenth of the run (checkpoints every iteration only).
        self.early = mean(r["early_metric"] for r in runs) if "early_metric" in runs[0] else None
        self.early_degradation = self.degrade(self.early) if self.early is not None else None
        self.worst = max(d for d in (self.degradation, self.early_degradation) if d is not None)
        self.ok = self.worst <= w.limit() + 1e-9
        # The same against the noise control on the seeds both ran.
        self.vs_control = None
        if control:
            by_seed = {r["seed"]: r for r in control}
            pairs = [(r, by_seed[r["seed"]]) for r in runs if r["seed"] in by_seed]
            ds = []
            for key in ("final_metric", "early_metric"):
                if pairs and key in pairs[0][0]:
                    d = w.degradation(mean(c[key] for _, c in pairs),
                                      mean(r[key] for r, _ in pairs))
                    ds.append(d if math.isfinite(d) else float("inf"))
            self.vs_control = max(ds) if ds else None

    def degrade(self, metric):
        d = self.w.degradation(self.reference, metric)
        return d if math.isfinite(d) else float("inf")

    def delta_text(self, early=False):
        metric, d = (self.early, self.early_degradation) if early else (self.metric,
                                                                         self.degradation)
        if d is None:
            return "–"
        if not math.isfinite(d):
            return "diverged"
        if self.w.metric == "test MSE":
            return f"{d:+.2f}%"
        return f"{metric - self.reference:+.2f}"

    def rework_text(self):
        text = f"{self.rework:.1f}"
        return text + (f" ({self.capped} capped)" if self.capped else "")


class Summary:
    """One setting over every workload and interval."""

    def __init__(self, setting, cells):
        self.setting, self.cells = setting, cells
        self.geo_ratio = math.exp(mean(math.log(c.ratio) for c in cells))
        self.min_ratio = min(c.ratio for c in cells)
        self.worst = max(c.worst / c.w.limit() for c in cells)  # 1.0 = at the limit
        self.qualifies = all(c.ok for c in cells)
        # Noise-aware: against the noise control instead of the bit-exact failure-free run.
        vs = [c.vs_control for c in cells]
        self.vs_control = (max(d / c.w.limit() for d, c in zip(vs, cells))
                           if all(d is not None for d in vs) else None)
        self.qualifies_vs_control = self.vs_control is not None and self.vs_control <= 1 + 1e-9
        self.seeds = min(len(c.runs) for c in cells)
        self.extra_rework = {k: mean(c.rework - c.exact_rework for c in cells if c.k == k)
                             for k in ("1", "k")}

    def worst_text(self, metric, vs_control=False):
        ds = [c.vs_control if vs_control else c.worst for c in self.cells
              if c.w.metric == metric]
        if any(d is None for d in ds):
            return "–"
        if not ds:
            return "–"
        d = max(ds)
        if not math.isfinite(d):
            return "diverged"
        return f"{d:+.2f}%" if metric == "test MSE" else f"{0.0 - d:+.2f}"


class Results:
    def __init__(self):
        self.runs = {}  # (workload name, setting name, k) -> [per-seed run]
        self.settings = {}
        self.workloads = {}
        self.references = {}  # workload name -> [{metric, floats, coded, bytes, fixed_cost}]
        self.checks = []  # failed checks, one message each

    def add(self, w, setting, k, run):
        self.workloads[w.name] = w
        self.settings[setting.name] = setting
        self.runs.setdefault((w.name, setting.name, k), []).append(run)

    def cell(self, wname, sname, k):
        w = self.workloads[wname]
        control = [n for n, s in self.settings.items() if s.perturb]
        return Cell(w, "1" if k == 1 else "k", self.runs[(wname, sname, k)],
                    self.runs.get((wname, control[0], k)) if control else None)

    def cells_of(self, sname):
        return [self.cell(wn, sn, k) for (wn, sn, k) in self.runs if sn == sname]

    def summaries(self):
        return [Summary(self.settings[n], self.cells_of(n)) for n in self.settings]


def select(summaries, vs_control=False):
    """The issue's rule: among settings within the accuracy limit everywhere, the best
    geometric-mean compression. vs_control: the limit taken against the noise control."""
    ok = [s for s in summaries if not s.setting.perturb and (
        s.qualifies_vs_control if vs_control else s.qualifies)]
    return max(ok, key=lambda s: s.geo_ratio) if ok else None

# --------------------------------------------------------------------------------------------
# Report


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def report(results, meta, selection_notes):
    parts = []
    rows = []
    for w in results.workloads.values():
        refs = results.references[w.name]
        metric = mean(r["metric"] for r in refs)
        unit = "%" if w.metric != "test MSE" else ""
        fixed = refs[0]["fixed_cost"]
        rows.append([w.name, w.description, f"{refs[0]['floats']:,}",
                     f"{refs[0]['coded'] / refs[0]['floats']:.1%}",
                     f"{refs[0]['bytes'] / 1024:.1f} KiB",
                     f"{fixed:,} B ({refs[0]['bytes'] / fixed:.0f}x)", w.iterations, w.every_k,
                     f"{w.metric} {metric:.3f}{unit}"])
    parts.append(table(["workload", "model and training", "float elements per checkpoint",
                        f"of them in tensors coded lossily (rest: < {SMALL_TENSOR_BYTES} B, exact)",
                        "checkpoint size", "an unchanged version stores (ceiling of a delta)",
                        "iterations", "k", "failure-free final (mean over seeds)"], rows))
    names = list(results.settings)
    for w in results.workloads.values():
        k = w.every_k
        delta_head = "Δ test MSE" if w.metric == "test MSE" else "Δ accuracy (pp)"
        rows = []
        for n in names:
            if (w.name, n, 1) not in results.runs:
                continue
            c1, ck = results.cell(w.name, n, 1), results.cell(w.name, n, k)
            rows.append([n, f"{c1.ratio:.1f}", f"{ck.ratio:.1f}",
                         f"{c1.delta_bits:.3f}" if c1.runs[0]["deltas"] else "–",
                         f"{ck.delta_bits:.3f}" if ck.runs[0]["deltas"] else "–",
                         f"{c1.keyframes:.0f}/{c1.versions:.0f}", c1.rework_text(),
                         ck.rework_text(), c1.delta_text(), ck.delta_text(),
                         c1.delta_text(early=True), "yes" if c1.ok and ck.ok else "**no**"])
        parts.append(f"**{w.name}** ({w.metric}; every 1 and every {k} iterations)\n\n" + table(
            ["setting", "ratio /1", f"ratio /{k}", "delta bits/param /1", f"/{k}",
             "keyframes /1", "rework /1", f"rework /{k}", f"{delta_head} /1", f"/{k}",
             "early /1", "within limit"], rows))
    rows = []
    for s in results.summaries():
        rows.append([s.setting.name, " ".join(s.setting.options()) or "(none)", s.seeds,
                     f"{s.geo_ratio:.1f}", f"{s.min_ratio:.1f}", f"{s.extra_rework['1']:+.1f}",
                     f"{s.extra_rework['k']:+.1f}", s.worst_text("accuracy %"),
                     s.worst_text("test MSE"), "yes" if s.qualifies else "no",
                     s.worst_text("accuracy %", True), s.worst_text("test MSE", True),
                     "–" if s.vs_control is None else
                     "yes" if s.qualifies_vs_control else "no"])
    parts.append("**All workloads**\n\n" + table(
        ["setting", "mount options", "seeds", "ratio (geo-mean)", "ratio (min)",
         "extra rework /1", "extra rework /k", "worst Δ accuracy (pp)", "worst Δ MF test MSE",
         "within limit", "worst Δ acc. vs control", "worst Δ MF vs control",
         "within limit vs control"], rows))
    parts.append("\n".join(selection_notes))
    head = [f"- Command: `{meta['command']}`",
            f"- Machine: {meta['machine']}",
            f"- Date: {meta['date']}; wall time {meta['minutes']:.1f} min; seeds: "
            f"{meta['seeds']} for every setting, {meta['confirm_seeds']} more for the noise "
            f"control and the settings within {CONFIRM_FACTOR:g}x the limit after those; failures for rework at {meta['fractions']} of each run; "
            f"{RESTORES} restores at i/11 of the run (early: i/100), i = 1..10.",
            "- Columns: ratio = logical bytes written / bytes of STORE/objects over the whole run "
            "(keyframes included); delta bits/param = stored bits per float element of the "
            "delta versions (all floats of the checkpoint counted); keyframes = keyframes / "
            "versions; rework = iterations after the restore until the training loss is back at "
            "the failure-free loss at the failure point (mean over failures and seeds; the "
            "lossless row is the exact-checkpoint baseline; capped = not reached within the "
            "lost iterations + 25); Δ = final test metric after 10 restores minus the "
            "failure-free run's (mean over seeds), MF in percent of test MSE (positive = worse); "
            "early = the same with the 10 restores in the first tenth of the run (i/100, "
            "checkpoints every iteration). /1 = checkpoint every iteration, /k = every k "
            "iterations. A setting is within the limit when all of its Δ are."]
    return "\n".join(head) + "\n\n" + "\n\n".join(parts) + "\n"


def machine():
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30
    return (f"{os.cpu_count()} CPUs ({model}), {mem:.0f} GiB RAM, {platform.system()} "
            f"{platform.release()}, Python {platform.python_version()}, torch {torch.__version__}"
            f", one torch thread")


def write_docs(text):
    path = os.path.join(REPO, "docs", "benchmarks.md")
    with open(path) as f:
        doc = f.read()
    begin, end = "<!-- recovery:begin -->", "<!-- recovery:end -->"
    if begin not in doc or end not in doc:
        doc = doc.rstrip("\n") + f"\n\n## Recovery quality\n\n{begin}\n{end}\n"
    head, rest = doc.split(begin, 1)
    _, tail = rest.split(end, 1)
    with open(path, "w") as f:
        f.write(head + begin + "\n" + text + end + tail)
    print(f"wrote {path}")

# --------------------------------------------------------------------------------------------
# Checks that can fail


def check_run(checks, w, setting, k, seed, ref, run):
    where = f"{w.name} seed {seed} every {k} {setting.name}"
    if run["stored"] != run["stored_by_versions"]:
        checks.append(f"{where}: store objects hold {run['stored']} bytes, the versions' "
                      f"stored_bytes sum to {run['stored_by_versions']}")
    if run["lineages"] != 1:
        checks.append(f"{where}: {run['lineages']} lineages for one run of checkpoints")
    if setting.lossless:
        for x in run["rework"]:
            if not x["bit_exact"]:
                checks.append(f"{where}: checkpoint {x['c']} did not read back bit-exactly")
        if setting.perturb:
            return
        for x in run["rework"]:
            if x["iterations"] != x["exact_iterations"]:
                checks.append(f"{where}: rework after failure at {x['t']} took "
                              f"{x['iterations']} iterations, an exact replay "
                              f"{x['exact_iterations']}")
        for key in ("final_model", "early_model"):
            if key in run and not bit_identical(run[key], ref.final_model):
                checks.append(f"{where}: the model after {RESTORES} restores "
                              f"({key.split('_')[0]}) differs from the failure-free run's")
    if setting.coding == "paper" and not setting.lossless and not setting.defaults:
        coded = ref.coded if setting.optimizer == "lossy" else ref.coded_no_opt
        for b in run["delta_stored"]:
            if b * 8 < coded:
                checks.append(f"{where}: a paper-mode delta of {b} bytes is below 1 bit for "
                              f"each of its {coded} coded elements")
                break


def check_cells(checks, results, quick):
    for (wn, sn, k), runs in results.runs.items():
        lossless = results.runs.get((wn, "lossless", k))
        if results.settings[sn].lossless or not lossless:
            continue
        for seed, (run, exact) in enumerate(zip(runs, lossless)):
            if run["stored"] >= exact["stored"]:
                checks.append(f"{wn} seed {seed} every {k} {sn}: stores {run['stored']} bytes, "
                              f"lossless {exact['stored']}")
    if "defaults" in results.settings:
        for c in results.cells_of("defaults"):
            # The defaults code optimizer state too (Adam's v as ratios), so every workload,
            # with or without optimizer state, must compress.
            floor = 5
            if c.ratio < floor:
                checks.append(f"{c.w.name} every {c.k}: the defaults compress {c.ratio:.1f}x "
                              f"(want >= {floor}x)")
            if not c.worst <= 10 * c.w.limit():
                checks.append(f"{c.w.name} every {c.k}: after {RESTORES} restores the defaults "
                              f"end {c.delta_text()} (early restores: "
                              f"{c.delta_text(early=True)}) from the failure-free run")

# --------------------------------------------------------------------------------------------


def run_workload(binary, work, results, w, settings, seeds, fractions, progress):
    for seed in seeds:
        t0 = time.perf_counter()
        ref = Reference(w, seed)
        progress(f"{w.name} seed {seed}: failure-free run ({time.perf_counter() - t0:.1f} s)")
        results.references.setdefault(w.name, [])
        if len(results.references[w.name]) <= seed:
            results.references[w.name].append(
                {"metric": ref.final_metric, "floats": ref.floats, "coded": ref.coded,
                 "coded_no_opt": ref.coded_no_opt, "bytes": ref.checkpoint_bytes,
                 "fixed_cost": fixed_cost(binary, work, w, ref) if seed == 0 else None})
        for setting in settings:
            for k in (1, w.every_k):
                t0 = time.perf_counter()
                run = run_failure_free(binary, work, w, seed, k, setting, ref, fractions)
                run["final_metric"], run["final_model"] = run_with_restores(
                    binary, work, w, seed, k, setting)
                if k == 1:
                    run["early_metric"], run["early_model"] = run_with_restores(
                        binary, work, w, seed, k, setting, early=True)
                run.update({"seed": seed, "ff_metric": ref.final_metric, "floats": ref.floats,
                            "seconds": time.perf_counter() - t0})
                check_run(results.checks, w, setting, k, seed, ref, run)
                results.add(w, setting, k, run)
                c = Cell(w, "1", [run])
                progress(f"{w.name} seed {seed} every {k:>2} {setting.name}: ratio "
                         f"{c.ratio:.1f}, rework {c.rework:.1f} (exact {c.exact_rework:.1f}), "
                         f"final Δ {c.delta_text()}, early {c.delta_text(early=True)} "
                         f"({run['seconds']:.1f} s)")
        del ref


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("ckptfs", help="the daemon binary (build/bin/ckptfs)")
    p.add_argument("--quick", action="store_true", help="CI smoke mode (< 5 minutes)")
    p.add_argument("--write-docs", action="store_true",
                   help="rewrite the recovery section of docs/benchmarks.md")
    p.add_argument("--json", help="write every measurement to this file")
    p.add_argument("--seeds", type=int,
                   help="screening seeds per workload (default: 1 quick, 2 full)")
    p.add_argument("--confirm-seeds", type=int, default=3,
                   help="full mode: more seeds for the noise control and for the settings "
                        "within 3x the limit after screening (default 3)")
    p.add_argument("--workloads", help=f"comma-separated subset of {','.join(WORKLOADS)}")
    p.add_argument("--settings", help="comma-separated subset of the setting names")
    p.add_argument("--from-json", metavar="FILE",
                   help="render the report (and --write-docs) from a --json file, no measuring")
    p.add_argument("--no-keyframe-sweep", action="store_true",
                   help="full mode: skip the keyframe-interval variations of the selection")
    args = p.parse_args()
    if args.seeds is not None and args.seeds < 1:
        p.error("--seeds must be at least 1")
    if args.confirm_seeds < 0:
        p.error("--confirm-seeds must not be negative")
    names = args.workloads.split(",") if args.workloads else (
        ["mlp-adam", "lr"] if args.quick else list(WORKLOADS))
    if bad := [n for n in names if n not in WORKLOADS]:
        p.error(f"unknown workload {bad}")
    args.workload_names = names
    settings = settings_matrix(args.quick)
    if args.settings:
        wanted = args.settings.split(",")
        # Any row of the matrix at another keyframe interval or with refreshes: its name with
        # "-K<interval>" (a number or "auto") after "-rel", and/or last "-R<refresh_interval>",
        # "-we<weight_error in percent>", "-ge<grid_error>", in that order.
        matrix = list(settings)
        for n in wanted:
            k = re.search(r"-K(\d+|auto)(?=-|$)", n)
            r = re.search(r"-R(\d+)(?=-we|-ge|$)", n)
            w = re.search(r"-we(\d+(?:\.\d+)?)(?=-ge|$)", n)
            g = re.search(r"-ge(\d+(?:\.\d+)?)$", n)
            if g and not w:
                p.error(f"{n}: -ge<factor> caps -we<percent> and needs it")
            if not (k or r or w or g) or n in {s.name for s in settings}:
                continue
            kv = None if not k else k.group(1) if k.group(1) == "auto" else int(k.group(1))
            settings += [v for s in matrix
                         if (v := s.with_keyframe_interval(
                             kv if k else s.keyframe_interval,
                             int(r.group(1)) if r else None,
                             float(w.group(1)) if w else None,
                             float(g.group(1)) if g else None)).name == n][:1]
        if bad := [n for n in wanted if n not in {s.name for s in settings}]:
            p.error(f"unknown setting {bad}; known: {', '.join(s.name for s in settings)}")
        settings = [s for s in settings if s.name in wanted]
    args.setting_list = settings
    return args


def command_line():
    """The command as typed from the repository root (paths inside it made relative)."""
    def rel(a):
        if os.path.exists(a) and os.path.abspath(a).startswith(REPO + os.sep):
            return os.path.relpath(os.path.abspath(a), REPO)
        return a
    return shlex.join(["/usr/bin/python3"] + [rel(a) for a in sys.argv])


def measure(args, results, progress):
    """Runs the settings (screening, confirmation, keyframe sweep) and the checks."""
    screen = list(range(args.seeds or (1 if args.quick else 2)))
    confirm = [] if args.quick else list(range(len(screen), len(screen) + args.confirm_seeds))
    fractions = (0.2, 0.45, 0.7) if args.quick else (0.1, 0.25, 0.4, 0.55, 0.7)
    workloads = make_workloads(args.workload_names, args.quick)
    work = tempfile.mkdtemp(prefix="ckptfs-recovery-")

    def stage(settings):
        """Every setting on the screening seeds; then more seeds for the noise control and
        for the lossy settings within CONFIRM_FACTOR x the limit everywhere, against the
        failure-free run or against the control (the others are out already)."""
        for w in workloads:
            run_workload(args.ckptfs, work, results, w, settings, screen, fractions, progress)
        if not confirm:
            return
        names = {s.name for s in settings}
        again = [s.setting for s in results.summaries() if s.setting.name in names and (
            s.setting.perturb or (not s.setting.lossless and min(
                s.worst, s.vs_control if s.vs_control is not None else s.worst)
                <= CONFIRM_FACTOR))]
        progress(f"more seeds for {', '.join(s.name for s in again) or 'none'}")
        for w in workloads:
            run_workload(args.ckptfs, work, results, w, again, confirm, fractions, progress)

    try:
        stage(args.setting_list)
        if not args.quick and not args.no_keyframe_sweep:
            summaries = results.summaries()
            lossy = [s for s in summaries if not s.setting.lossless]
            base = (select(lossy) or select(lossy, vs_control=True) or
                    (min(lossy, key=lambda s: (-s.seeds, s.worst)) if lossy else None))
            if base:
                progress(f"keyframe sweep around {base.setting.name}")
                stage([base.setting.with_keyframe_interval(k) for k in KEYFRAME_SWEEP
                       if k != base.setting.keyframe_interval])
        check_cells(results.checks, results, args.quick)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"seeds": len(screen), "confirm_seeds": len(confirm),
            "fractions": ", ".join(f"{f:g}" for f in fractions), "quick": args.quick,
            "workloads": args.workload_names}


def save_json(path, results, meta):
    runs = [{"workload": wn, "setting": sn, "every": k,
             **{key: v for key, v in r.items() if not key.endswith("_model")}}
            for (wn, sn, k), rs in results.runs.items() for r in rs]
    with open(path, "w") as f:
        json.dump({"meta": meta, "settings": {n: vars(s) for n, s in results.settings.items()},
                   "references": results.references, "checks": results.checks, "runs": runs},
                  f, indent=1)


def load_json(path):
    """Results saved by --json, to render the report again without measuring."""
    with open(path) as f:
        data = json.load(f)
    meta = data["meta"]
    results = Results()
    workloads = {w.name: w for w in make_workloads(meta["workloads"], meta["quick"])}
    settings = {n: Setting(**{k: v for k, v in a.items() if k != "perturb"},
                           perturb=a["perturb"]) for n, a in data["settings"].items()}
    for r in data["runs"]:
        results.add(workloads[r["workload"]], settings[r["setting"]], r["every"], r)
    results.references = data["references"]
    results.checks = data["checks"]
    return results, meta


def main():
    args = parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unmount on the way out
    if args.from_json:
        results, meta = load_json(args.from_json)
    else:
        testlib.require_fuse()
        # The mount library's watchdog ends a hung run; give it the mode's whole budget.
        os.environ.setdefault("CKPTFS_TEST_DEADLINE", "560" if args.quick else "14400")
        torch.set_num_threads(1)
        start = time.time()
        progress = lambda msg: print(f"[{time.time() - start:7.1f} s] {msg}", flush=True)  # noqa
        results = Results()
        meta = measure(args, results, progress)
        meta.update({"command": command_line(), "machine": machine(),
                     "date": datetime.datetime.now(datetime.timezone.utc).strftime(
                         "%Y-%m-%d %H:%M UTC"), "minutes": (time.time() - start) / 60})
        if args.json:
            save_json(args.json, results, meta)
    text = report(results, meta, [selection_text(results.summaries())])
    print()
    print(text)
    if args.write_docs:
        write_docs(text)
    if results.checks:
        print("CHECKS FAILED:")
        for c in results.checks:
            print("  " + c)
        return 1
    print(f"recovery: ok ({len(results.runs)} cells, all checks passed)")
    return 0


def selection_text(summaries):
    lines = []
    for c in [s for s in summaries if s.setting.perturb]:
        lines.append(f"**Noise control** (`{c.setting.name}`: exact restores with every float "
                     f"multiplied by 1 ± 2^{math.log2(c.setting.perturb):.0f}, {c.seeds} seeds): "
                     "worst Δ "
                     f"accuracy {c.worst_text('accuracy %')} pp, worst Δ MF test MSE "
                     f"{c.worst_text('test MSE')}: {'within' if c.qualifies else 'outside'} the "
                     "limit. Differences of this size come from the chaos of 10 restarts, not "
                     "from a codec.")
    paper = [s for s in summaries if s.setting.coding == "paper" and not s.setting.lossless
             and not s.setting.defaults]
    for vs_control in (False, True):
        if vs_control and not any(s.setting.perturb for s in summaries):
            break
        against = "the noise control" if vs_control else "the failure-free run"
        best = select(summaries, vs_control)
        rule = (f"within {ACCURACY_PP} pp accuracy / {MF_LOSS_PCT}% MF test MSE of {against} "
                "everywhere, best geometric-mean ratio")
        if best is None:
            lines.append(f"**Selection** ({rule}): none.")
            continue
        lines.append(f"**Selection** ({rule}): `{best.setting.name}` "
                     f"(`{' '.join(best.setting.options()) or 'defaults'}`), ratio "
                     f"{best.geo_ratio:.1f}x geo-mean, {best.min_ratio:.1f}x at worst; goal "
                     f">= 30x over a whole run: "
                     + ("met" if best.min_ratio >= 30 else "met on the geometric mean only"
                        if best.geo_ratio >= 30 else "not met") + ".")
        ok = [s for s in paper if (s.qualifies_vs_control if vs_control else s.qualifies)]
        if ok:
            p = max(ok, key=lambda s: s.geo_ratio)
            lines.append(f"- Against the best paper-mode setting within the limit, "
                         f"`{p.setting.name}` ({p.geo_ratio:.1f}x): "
                         f"{best.geo_ratio / p.geo_ratio:.2f}x (goal >= 2x: "
                         f"{'met' if best.geo_ratio >= 2 * p.geo_ratio else 'not met'}).")
        elif paper:
            p = max(paper, key=lambda s: s.geo_ratio)
            lines.append(f"- No paper-mode setting is within the limit; the best paper-mode "
                         f"ratio is `{p.setting.name}`'s {p.geo_ratio:.1f}x (the selection: "
                         f"{best.geo_ratio / p.geo_ratio:.2f}x that).")
    return "\n\n".join(lines).replace(".\n\n- ", ".\n- ")


if __name__ == "__main__":
    sys.exit(main())
