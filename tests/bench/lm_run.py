#!/usr/bin/python3
"""A transformer language model trained through a mount (issue 16, item 1): whole-run ratio,
rotation, fidelity and the final validation loss after restores, over seeds, with a noise control.

Workload: a character-level decoder-only transformer (3 layers, d=128, 4 heads, context 64,
651 k parameters; with AdamW's two moments a checkpoint is 7.8 MB) trained on real English text
that ships in Debian: Perl's documentation (package perl-doc, the 207 .pod files of
/usr/share/perl/5.36.0/pod in name order, 8.8 MB, 188 distinct bytes; the last 10% is the
validation text). AdamW (betas 0.9/0.95, weight decay 0.1), linear warmup over the first 5% of
the steps then a cosine to zero, gradient norm clipped at 1.0, batch 32, 480 steps; training is
deterministic (one torch thread, the batch of step s a function of the seed and s), so a resumed
run sees the batches the failure-free run saw. Every 12 steps the run saves an HF Trainer style
directory `checkpoint-N/` (pytorch_model.bin, optimizer.pt, scheduler.pt, rng_state.pth,
trainer_state.json), each file torch.save'd and fsync'ed. The bigram baseline (counts on the
training text, add-one) is 3.02 nats per character on the validation text; the failure-free runs
end near 2.3.

For each seed:
  reference    the failure-free run without a mount: validation loss at the end, a probe loss
               (a fixed batch of training text) at every checkpoint and failure point, and every
               checkpoint's state;
  ratio        for each setting, the reference's checkpoints saved through a fresh mount, every
               version kept: logical bytes / bytes of STORE/objects (+ STORE/heads: head images
               count), where the bytes go (keyframes, deltas by tensor class, fixed parts, from
               `ckptctl stat --json`), and the relative L2 error of every restored tensor against
               what was saved, by class (weights, exp_avg, exp_avg_sq), read back with torch.load;
  rotation     (first seed) the same saves with save_total_limit=3: after each save the oldest
               directories beyond three go with shutil.rmtree, here and in a plain directory on
               the same disk; rotated plain bytes / store bytes after each save, once the daemon
               has done its rotation work;
  restores     for each setting, a run that fails 6 times, twice early (after 5% and 10% of the
               steps) and four times spread (30/50/70/90%), each time half a checkpoint interval
               after a save: the last checkpoint is loaded from the mount, training resumes from
               it. Reported: the final validation loss against the reference's (relative), and
               the rework: steps until the probe loss is back at the reference's probe loss at
               the failure point (capped at 3 checkpoint intervals);
  control      the same restores from a lossless mount whose restored floats are multiplied by
               1 +- 2^-20: how far six restarts move the final loss by chaos alone.

Decision rule (the issue's): a setting is within the accuracy limit when its final validation
loss, averaged over seeds, is within 1% of the reference's (and the spread of the control says
whether 1% is resolved). The ratio is the geometric mean over seeds.

Usage (as root; Debian's /usr/bin/python3; perl-doc installed):
  lm_run.py CKPTFS [--quick] [--seeds N] [--jobs J] [--settings S1 S2 ...] [--json FILE]
            [--plot PNG_PREFIX]
  --settings   mount option strings, one per setting ("" = the defaults), default:
               "" "ratio_bits=2" "keyframe_bits=8" "keyframe_interval=40"
               "ratio_bits=2,keyframe_bits=8,keyframe_interval=40"
  --quick      a CI smoke (about a minute): a smaller model, 60 steps, one seed, the defaults and
               the control; the checks below still apply
  --jobs       seeds run in parallel processes (default 2: one per core)
Checks (exit 1): lossless restores (the control before its perturbation) are bit-exact; every
lossy setting stores less than a lossless store of the same saves and at least 4x less than the
logical bytes; the stored bytes agree with the sum of the versions' stored_bytes (within a
block an object file); every version of a lossy setting reads back with finite tensors.
Exit 77: no FUSE or no perl-doc.
"""
import argparse
import copy
import glob
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fs"))
from ckptfs_testlib import (daemon_log, du, flat_tensors, info, mounted, require_fuse,  # noqa: E402
                            rotate_checkpoints, settle_rotation)

CORPUS = "/usr/share/perl/5.36.0/pod"
KEEP = 3
PERTURB = 2.0 ** -20
DEFAULT_SETTINGS = ["", "ratio_bits=2", "keyframe_bits=8", "keyframe_interval=40",
                    "ratio_bits=2,keyframe_bits=8,keyframe_interval=40"]
FULL = dict(d=128, layers=3, heads=4, ctx=64, batch=32, steps=480, every=12, lr=3e-3)
QUICK = dict(d=96, layers=2, heads=4, ctx=32, batch=16, steps=60, every=6, lr=3e-3)
FAILURES = (0.05, 0.10, 0.30, 0.50, 0.70, 0.90)

# --------------------------------------------------------------------------------------------
# Corpus and model


class Corpus:
    def __init__(self):
        files = sorted(glob.glob(os.path.join(CORPUS, "*.pod")))
        if not files:
            print(f"lm_run: no corpus at {CORPUS} (apt-get install perl-doc)", file=sys.stderr)
            sys.exit(77)
        data = b"".join(open(f, "rb").read() for f in files)
        self.bytes = len(data)
        vocab = sorted(set(data))
        self.vocab = len(vocab)
        lut = torch.zeros(256, dtype=torch.long)
        for i, c in enumerate(vocab):
            lut[c] = i
        tokens = lut[torch.frombuffer(bytearray(data), dtype=torch.uint8).long()]
        split = int(len(tokens) * 0.9)
        self.train, self.val = tokens[:split], tokens[split:]

    def bigram_val_loss(self):
        v = self.vocab
        counts = torch.ones(v, v)
        counts.index_put_((self.train[:-1], self.train[1:]), torch.ones(len(self.train) - 1),
                          accumulate=True)
        logp = (counts / counts.sum(1, keepdim=True)).log()
        return -logp[self.val[:-1], self.val[1:]].mean().item()


class Block(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc, self.out = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x, mask):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2)
                   for z in self.qkv(self.ln1(x)).split(d, 2))
        a = ((q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1]) + mask).softmax(-1)
        x = x + self.proj((a @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.out(torch.nn.functional.gelu(self.fc(self.ln2(x))))


class LanguageModel(torch.nn.Module):
    def __init__(self, vocab, d, layers, heads, ctx):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Parameter(torch.randn(ctx, d) * 0.02)
        self.blocks = torch.nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab)
        self.register_buffer("mask", torch.triu(torch.full((ctx, ctx), float("-inf")), 1),
                             persistent=False)

    def forward(self, x):
        t = x.shape[1]
        h = self.tok(x) + self.pos[:t]
        for b in self.blocks:
            h = b(h, self.mask[:t, :t])
        return self.head(self.ln(h))


class Job:
    """One seed's training: model, optimizer and schedule built the same way every time."""

    def __init__(self, corpus, cfg, seed):
        self.c, self.cfg, self.seed = corpus, cfg, seed
        self.val_x, self.val_y = self.windows(corpus.val, 256, 7)
        self.probe_x, self.probe_y = self.windows(corpus.train, 64, 8)

    def windows(self, tokens, n, salt):
        g = torch.Generator().manual_seed(self.seed * 1000 + salt)
        ctx = self.cfg["ctx"]
        ix = torch.randint(0, len(tokens) - ctx - 1, (n,), generator=g)
        return (torch.stack([tokens[i:i + ctx] for i in ix]),
                torch.stack([tokens[i + 1:i + ctx + 1] for i in ix]))

    def build(self):
        cfg = self.cfg
        torch.manual_seed(self.seed)
        model = LanguageModel(self.c.vocab, cfg["d"], cfg["layers"], cfg["heads"], cfg["ctx"])
        opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], betas=(0.9, 0.95),
                                weight_decay=0.1)
        steps, warm = cfg["steps"], max(1, cfg["steps"] // 20)

        def schedule(s):
            return min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps)))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
        return model, opt, sched

    def step(self, model, opt, sched, step):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        ctx, b = self.cfg["ctx"], self.cfg["batch"]
        ix = torch.randint(0, len(self.c.train) - ctx - 1, (b,), generator=g)
        x = torch.stack([self.c.train[i:i + ctx] for i in ix])
        y = torch.stack([self.c.train[i + 1:i + ctx + 1] for i in ix])
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()

    @torch.no_grad()
    def loss(self, model, x, y):
        return torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()

    def val_loss(self, model):
        return self.loss(model, self.val_x, self.val_y)

    def probe_loss(self, model):
        return self.loss(model, self.probe_x, self.probe_y)

    def failures(self):
        """(failure step t, last checkpoint c): half an interval of work lost each time."""
        every, steps = self.cfg["every"], self.cfg["steps"]
        out = []
        for f in FAILURES:
            c = max(every, int(round(f * steps / every)) * every)
            out.append((c + every // 2, c))
        return out

# --------------------------------------------------------------------------------------------
# Checkpoints (HF Trainer's layout)


FILES = ("pytorch_model.bin", "optimizer.pt", "scheduler.pt", "rng_state.pth")


def state_of(model, opt, sched, step):
    return {"pytorch_model.bin": model.state_dict(), "optimizer.pt": opt.state_dict(),
            "scheduler.pt": sched.state_dict(), "rng_state.pth": {"cpu": torch.get_rng_state()},
            "trainer_state.json": {"global_step": step}}


def write_checkpoint(root, step, state):
    d = os.path.join(root, f"checkpoint-{step}")
    os.makedirs(d)
    for name, obj in state.items():
        with open(os.path.join(d, name), "wb") as f:
            if name.endswith(".json"):
                f.write(json.dumps(obj).encode())
            else:
                torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())


def read_checkpoint(root, step):
    d = os.path.join(root, f"checkpoint-{step}")
    return {name: torch.load(os.path.join(d, name), map_location="cpu") for name in FILES}


def tensor_class(name):
    last = name.rsplit(".", 1)[-1]
    return last if last in ("exp_avg", "exp_avg_sq") else (
        "optimizer (other)" if name.startswith("optimizer.pt.") else "weights")


# --------------------------------------------------------------------------------------------
# Runs


class Reference:
    def __init__(self, job):
        model, opt, sched = job.build()
        every, steps = job.cfg["every"], job.cfg["steps"]
        wanted = {t for t, _ in job.failures()}
        self.probe, self.snapshots = {0: job.probe_loss(model)}, {}
        for s in range(1, steps + 1):
            job.step(model, opt, sched, s)
            if s % every == 0:
                self.snapshots[s] = copy.deepcopy(state_of(model, opt, sched, s))
            if s % every == 0 or s in wanted:
                self.probe[s] = job.probe_loss(model)
        self.val = job.val_loss(model)


def ctl_of(binary):
    return os.path.join(os.path.dirname(os.path.abspath(binary)), "ckptctl")


def options(setting):
    return tuple(o for o in setting.split(",") if o)


def store_bytes(store):
    return du(os.path.join(store, "objects")) + (
        du(os.path.join(store, "heads")) if os.path.isdir(os.path.join(store, "heads")) else 0)


def ratio_run(binary, work, setting, ref, checks, label):
    """Every version kept: ratio, where the bytes go, fidelity by class after torch.load."""
    d = tempfile.mkdtemp(dir=work)
    store, mnt = os.path.join(d, "store"), os.path.join(d, "mnt")
    os.makedirs(mnt)
    ctl = ctl_of(binary)
    out = {"logical": 0, "keyframe_bytes": 0, "delta_bytes": 0, "fixed_bytes": 0,
           "class_bytes": {}, "class_floats": {}, "errors": {}, "versions": 0, "keyframes": 0}
    by_versions = 0
    try:
        with mounted(binary, store, mnt, *options(setting)):
            root = os.path.join(mnt, "run")
            os.makedirs(root)
            for step, state in sorted(ref.snapshots.items()):
                write_checkpoint(root, step, state)
            for step, state in sorted(ref.snapshots.items()):
                cdir = os.path.join(root, f"checkpoint-{step}")
                for name in os.listdir(cdir):
                    path = os.path.join(cdir, name)
                    out["logical"] += os.path.getsize(path)
                    v = info(path)
                    by_versions += v["stored_bytes"]
                    if name not in ("pytorch_model.bin", "optimizer.pt"):
                        continue
                    st = json.loads(subprocess.run([ctl, "stat", "--json", path], check=True,
                                                   capture_output=True, text=True).stdout)
                    kind = st.get("kind")
                    if kind == "keyframe":
                        out["keyframe_bytes"] += v["stored_bytes"]
                        out["keyframes"] += 1
                        continue
                    if kind != "delta":
                        continue
                    out["versions"] += 1
                    tb = 0
                    for t in st["tensors"]:
                        cls = tensor_class(f"{name}.{t['name']}")
                        out["class_bytes"][cls] = out["class_bytes"].get(cls, 0) + t[
                            "stored_bytes"]
                        out["class_floats"][cls] = out["class_floats"].get(cls, 0) + t[
                            "elements"]
                        tb += t["stored_bytes"]
                    out["delta_bytes"] += v["stored_bytes"]
                    out["fixed_bytes"] += v["stored_bytes"] - tb
                back = read_checkpoint(root, step)
                for name in ("pytorch_model.bin", "optimizer.pt"):
                    want, got = flat_tensors(state[name], name), flat_tensors(back[name], name)
                    for k, t in want.items():
                        if not t.is_floating_point() or t.numel() < 1024:
                            continue
                        g = got[k]
                        if not torch.isfinite(g).all():
                            checks.append(f"{label}: {k} of step {step} is not finite")
                        err = ((g.double() - t.double()).norm() /
                               max(t.double().norm().item(), 1e-30)).item()
                        out["errors"].setdefault(tensor_class(k), []).append(err)
        out["stored"] = store_bytes(store)
        # Versions report their objects' sizes, the store its allocated blocks: up to a block
        # more per object file (about 200 small ones in a run), and the journal's records.
        objects = len(os.listdir(os.path.join(store, "objects")))
        if abs(out["stored"] - by_versions) > 0.02 * out["stored"] + 4096 * objects + 256 * 1024:
            checks.append(f"{label}: store holds {out['stored']} bytes, versions say "
                          f"{by_versions}")
        with open(daemon_log(store)) as f:
            errors = [line for line in f if " error:" in line]
        if errors:
            checks.append(f"{label}: daemon errors: {errors[:3]}")
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return out


def rotation_run(binary, work, setting, ref):
    """save_total_limit=3: rotated plain / store after each save."""
    d = tempfile.mkdtemp(dir=work)
    store, mnt, plain = (os.path.join(d, x) for x in ("store", "mnt", "plain"))
    os.makedirs(mnt)
    os.makedirs(plain)
    ratios, written = [], []
    new_bytes = plain_written = 0  # stored bytes of each new version; bytes saved to plain
    try:
        with mounted(binary, store, mnt, *options(setting)):
            for step, state in sorted(ref.snapshots.items()):
                write_checkpoint(mnt, step, state)
                write_checkpoint(plain, step, state)
                for name in state:
                    new_bytes += info(f"{mnt}/checkpoint-{step}/{name}")["stored_bytes"]
                    plain_written += os.path.getsize(f"{plain}/checkpoint-{step}/{name}")
                rotate_checkpoints(mnt, KEEP)
                rotate_checkpoints(plain, KEEP)
                s = settle_rotation(ctl_of(binary), mnt, store)
                ratios.append(du(plain) / store_bytes(store))
            written = [s["rotation"]["written_bytes"], s["rotation"]["freed_bytes"]]
    finally:
        shutil.rmtree(d, ignore_errors=True)
    # Bytes written to the store (new versions + rewrites) against what plain was written.
    return {"ratios": ratios, "rewrite_written_freed": written,
            "written_to_store": new_bytes + written[0], "written_to_plain": plain_written}


def restore_run(binary, work, job, ref, setting, perturb, checks, label):
    """Training that fails at job.failures(); each time the last checkpoint comes back from the
    mount. Returns the final validation loss and the rework per failure."""
    d = tempfile.mkdtemp(dir=work)
    store, mnt = os.path.join(d, "store"), os.path.join(d, "mnt")
    os.makedirs(mnt)
    every, steps = job.cfg["every"], job.cfg["steps"]
    pending = job.failures()
    rework, gaps, saved = [], [], {}
    try:
        with mounted(binary, store, mnt, *options(setting)):
            model, opt, sched = job.build()
            s, tracking = 0, None
            while s < steps:
                s += 1
                job.step(model, opt, sched, s)
                if s % every == 0:
                    write_checkpoint(mnt, s, state_of(model, opt, sched, s))
                    if perturb:  # what a lossless restore must give back, bit for bit
                        saved[s] = copy.deepcopy(state_of(model, opt, sched, s))
                if tracking:
                    t, c = tracking
                    if job.probe_loss(model) <= ref.probe[t] or s - c >= 3 * every:
                        rework.append(s - c)
                        tracking = None
                if pending and pending[0][0] == s:
                    if tracking:  # not recovered before the next failure: censored
                        rework.append(s - tracking[1])
                        tracking = None
                    t, c = pending.pop(0)
                    state = read_checkpoint(mnt, c)
                    if perturb:
                        want, got = flat_tensors(saved[c]), flat_tensors(state)
                        if want.keys() != got.keys() or not all(
                                torch.equal(want[k], got[k]) for k in want):
                            checks.append(f"{label}: lossless restore of step {c} not exact")
                        g = torch.Generator().manual_seed(job.seed * 100003 + c)
                        for x in flat_tensors(state).values():
                            if x.is_floating_point():
                                sign = torch.randint(0, 2, x.shape, generator=g).to(x.dtype)
                                x.mul_(1 + perturb * (sign * 2 - 1))
                    model, opt, sched = job.build()
                    model.load_state_dict(state["pytorch_model.bin"])
                    opt.load_state_dict(state["optimizer.pt"])
                    sched.load_state_dict(state["scheduler.pt"])
                    s = c
                    gaps.append(job.probe_loss(model) / ref.probe[c] - 1)
                    if job.probe_loss(model) <= ref.probe[t]:
                        rework.append(0)
                    else:
                        tracking = (t, c)
            if tracking:
                rework.append(steps - tracking[1])
            final = job.val_loss(model)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return {"val": final, "rel": final / ref.val - 1, "rework": rework, "restore_gap": gaps}


def run_seed(args, seed):
    cfg = QUICK if args.quick else FULL
    torch.set_num_threads(1)
    corpus = Corpus()
    job = Job(corpus, cfg, seed)
    t0 = time.time()
    ref = Reference(job)
    out = {"seed": seed, "ref_val": ref.val, "checks": [], "settings": {},
           "ref_seconds": time.time() - t0}
    work = tempfile.mkdtemp(prefix="ckptfs-lm-", dir="/var/tmp")
    try:
        lossless = ratio_run(args.binary, work, "lossless", ref, out["checks"], "lossless")
        out["lossless"] = {"stored": lossless["stored"], "logical": lossless["logical"]}
        out["control"] = restore_run(args.binary, work, job, ref, "lossless", PERTURB,
                                     out["checks"], "control")
        for setting in args.settings:
            label = setting or "defaults"
            r = ratio_run(args.binary, work, setting, ref, out["checks"], label)
            if r["stored"] >= lossless["stored"]:
                out["checks"].append(f"{label}: {r['stored']} bytes, lossless {lossless['stored']}")
            if r["logical"] < 4 * r["stored"]:
                out["checks"].append(f"{label}: only {r['logical'] / r['stored']:.2f}x")
            r["restores"] = restore_run(args.binary, work, job, ref, setting, 0, out["checks"],
                                        label)
            if seed == args.first_seed and not args.quick:
                r["rotation"] = rotation_run(args.binary, work, setting, ref)
            out["settings"][label] = r
            print(f"lm_run: seed {seed} {label}: {r['logical'] / r['stored']:.2f}x, val "
                  f"{r['restores']['val']:.4f} ({100 * r['restores']['rel']:+.2f}%)", file=sys.stderr,
                  flush=True)
        if seed == args.first_seed and not args.quick:
            out["lossless"]["rotation"] = rotation_run(args.binary, work, "lossless", ref)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out["seconds"] = time.time() - t0
    return out

# --------------------------------------------------------------------------------------------
# Report


def gmean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def report(runs, args, corpus_info):
    seeds = [r["seed"] for r in runs]
    labels = list(runs[0]["settings"])
    ref_vals = ", ".join(f"{r['ref_val']:.4f}" for r in runs)
    lossless = gmean([r["lossless"]["logical"] / r["lossless"]["stored"] for r in runs])
    lines = [f"Seeds {seeds}; reference final validation loss {ref_vals} nats/char (bigram "
             f"baseline {corpus_info['bigram']:.3f}); lossless store {lossless:.2f}x.",
             "",
             "| setting | whole-run ratio (gmean) | keyframes % of bytes | delta bits/float: "
             "weights / exp_avg / exp_avg_sq | final val loss vs reference, mean (per seed) | "
             "rework steps, median (max) | rel. L2 error median: weights / exp_avg / "
             "exp_avg_sq |",
             "|---|---|---|---|---|---|---|"]
    ctrl = [r["control"]["rel"] for r in runs]
    per_seed = ", ".join(f"{100 * x:+.3f}" for x in ctrl)
    rw = sum((r["control"]["rework"] for r in runs), [])
    lines.append(f"| control (lossless, restores x(1 +- 2^-20)) | {lossless:.2f} | 100 | - | "
                 f"{100 * sum(ctrl) / len(ctrl):+.3f}% ({per_seed}) | {median(rw):.0f} "
                 f"({max(rw)}) | 0 |")
    summary = {}
    for label in labels:
        rs = [r["settings"][label] for r in runs]
        ratio = gmean([x["logical"] / x["stored"] for x in rs])
        kf = sum(x["keyframe_bytes"] for x in rs) / sum(x["stored"] for x in rs)
        bits = []
        for cls in ("weights", "exp_avg", "exp_avg_sq"):
            b = sum(x["class_bytes"].get(cls, 0) for x in rs)
            f = sum(x["class_floats"].get(cls, 0) for x in rs)
            bits.append(f"{8 * b / f:.2f}" if f else "-")
        rel = [x["restores"]["rel"] for x in rs]
        rw = sum((x["restores"]["rework"] for x in rs), [])
        errs = []
        for cls in ("weights", "exp_avg", "exp_avg_sq"):
            e = sum((x["errors"].get(cls, []) for x in rs), [])
            errs.append(f"{100 * median(e):.2f}%" if e else "-")
        summary[label] = (ratio, sum(rel) / len(rel))
        per_seed = ", ".join(f"{100 * x:+.3f}" for x in rel)
        lines.append(f"| {label or 'defaults'} | {ratio:.2f} | {100 * kf:.0f} | "
                     f"{' / '.join(bits)} | {100 * sum(rel) / len(rel):+.3f}% ({per_seed}) | "
                     f"{median(rw):.0f} ({max(rw)}) | {' / '.join(errs)} |")
    rot = [(label or "defaults", runs[0]["settings"][label].get("rotation")) for label in labels]
    rot.append(("lossless", runs[0]["lossless"].get("rotation")))
    rot = [(l, x) for l, x in rot if x]
    if rot:
        n = len(rot[0][1]["ratios"])
        lines += ["", f"Rotation (save_total_limit={KEEP}, seed {runs[0]['seed']}): rotated plain "
                  "directory / store after each save (every 4th save shown; min from the 4th "
                  "save on):", "",
                  "| setting | " + " | ".join(str(i + 1) for i in range(0, n, 4)) +
                  " | min | written / plain written |",
                  "|---|" + "---|" * (len(range(0, n, 4)) + 2)]
        for label, x in rot:
            w = (f"{x['written_to_store'] / x['written_to_plain']:.2f}"
                 if x.get("written_to_plain") else "-")
            lines.append(f"| {label} | " + " | ".join(f"{x['ratios'][i]:.2f}"
                                                      for i in range(0, n, 4)) +
                         f" | {min(x['ratios'][KEEP:]):.2f} | {w} |")
    return "\n".join(lines), summary


def plot(runs, prefix):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels = list(runs[0]["settings"])
    fig, ax = plt.subplots(figsize=(6, 4))
    for label in labels:
        rs = [r["settings"][label] for r in runs]
        xs = [x["logical"] / x["stored"] for x in rs]
        ys = [100 * x["restores"]["rel"] for x in rs]
        ax.scatter(xs, ys, label=label or "defaults")
    ctrl = [100 * r["control"]["rel"] for r in runs]
    ax.scatter([r["lossless"]["logical"] / r["lossless"]["stored"] for r in runs], ctrl,
               marker="x", color="k", label="control (lossless + 2^-20 noise)")
    ax.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("whole-run compression ratio (every version kept)")
    ax.set_ylabel("final validation loss vs failure-free run, %")
    ax.set_title("char-level transformer on perl-doc, 6 restores per run")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(f"{prefix}_ratio_loss.png", dpi=110)
    fig, ax = plt.subplots(figsize=(6, 4))
    for label in labels + ["lossless"]:
        x = (runs[0]["lossless"] if label == "lossless" else runs[0]["settings"][label]).get(
            "rotation")
        if x:
            ax.plot(range(1, len(x["ratios"]) + 1), x["ratios"], label=label or "defaults")
    ax.axhline(2.5, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("save")
    ax.set_ylabel("rotated plain directory / store")
    ax.set_title(f"rotation, save_total_limit={KEEP}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(f"{prefix}_rotation.png", dpi=110)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("binary")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--settings", nargs="*", default=None)
    p.add_argument("--json")
    p.add_argument("--plot")
    p.add_argument("--seed-worker", type=int, help=argparse.SUPPRESS)
    p.add_argument("--first-seed", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.settings is None:
        a.settings = [""] if a.quick else DEFAULT_SETTINGS
    if a.quick:
        a.seeds = 1
    return a


def main():
    args = parse_args()
    if args.seed_worker is not None:
        result = run_seed(args, args.seed_worker)
        with open(args.json, "w") as f:
            json.dump(result, f)
        return 0
    require_fuse()
    # The mount library's watchdog ends a hung run; give it the mode's whole budget.
    os.environ.setdefault("CKPTFS_TEST_DEADLINE", "560" if args.quick else "14400")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unmount on the way out
    corpus = Corpus()
    corpus_info = {"bytes": corpus.bytes, "vocab": corpus.vocab,
                   "bigram": corpus.bigram_val_loss()}
    print(f"lm_run: corpus {corpus.bytes} bytes, {corpus.vocab} symbols, bigram validation loss "
          f"{corpus_info['bigram']:.3f}", flush=True)
    seeds = list(range(args.seeds))
    base = [sys.executable, os.path.abspath(__file__), args.binary, "--first-seed", "0",
            "--settings", *args.settings] + (["--quick"] if args.quick else [])
    runs, running = [], []
    with tempfile.TemporaryDirectory() as tmp:
        while seeds or running:
            while seeds and len(running) < args.jobs:
                s = seeds.pop(0)
                path = os.path.join(tmp, f"{s}.json")
                running.append((subprocess.Popen(
                    base + ["--seed-worker", str(s), "--json", path]), path))
            proc, path = running.pop(0)
            if proc.wait() != 0:
                print(f"lm_run: a seed's worker failed ({proc.returncode})", file=sys.stderr)
                return 1
            with open(path) as g:
                runs.append(json.load(g))
    runs.sort(key=lambda r: r["seed"])
    text, _ = report(runs, args, corpus_info)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"corpus": corpus_info, "runs": runs, "settings": args.settings,
                       "quick": args.quick}, f)
    if args.plot:
        plot(runs, args.plot)
    checks = sum((r["checks"] for r in runs), [])
    for r in runs:
        if r["ref_val"] >= corpus_info["bigram"] and not args.quick:
            checks.append(f"seed {r['seed']}: final loss {r['ref_val']:.3f} not below bigram")
    for c in checks:
        print(f"lm_run: FAILED: {c}", file=sys.stderr)
    return 1 if checks else 0


if __name__ == "__main__":
    sys.exit(main())
