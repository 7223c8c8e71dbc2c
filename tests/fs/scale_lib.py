"""Shared by the scale tests (issue 13, tests/fs/scale_*.py): large training states built in
place and advanced by one Adam-like step at a time (never two copies in memory), strided samples
of what was saved and of what read back, and the codec's closed-loop check on them.

Run under Debian's /usr/bin/python3 (torch 1.13)."""
import contextlib
import io
import os
import shutil
import stat as stat_mod
import tempfile
import time

import torch

# streaming.py imports flat_tensors from here, the scale tests stat.
from ckptfs_testlib import MIN_TENSOR, flat_tensors, keyframe_read_ok  # noqa: F401
from ckptfs_testlib import stat_json as stat  # noqa: F401

MiB = 1 << 20
GiB = 1 << 30
SMALL = MIN_TENSOR  # bytes: float tensors below this are stored exact (the mount's default)
SAMPLE = 1 << 16  # elements sampled per large tensor
CHUNK = 1 << 22  # elements per in-place update (16 MiB of fp32 temporaries)


class TrainingState:
    """`params` large fp32 weight matrices with Adam's exp_avg and exp_avg_sq each, making
    `total_bytes` together, plus `small` biases (with their Adam state, 1024 elements each), an
    Adam `step` tensor per parameter and an int step counter: the shape of a real
    model + optimizer state_dict. step() is one training step, in place, a chunk at a time:
    g ~ N(0, 1e-3), m = 0.9 m + 0.1 g, v = 0.999 v + 0.001 g^2, w -= 1e-4 m / (sqrt(v) + 1e-8)."""

    def __init__(self, total_bytes, params=4, small=8, seed=0):
        self.gen = torch.Generator().manual_seed(seed)
        numel = total_bytes // (3 * 4 * params)
        cols = 4096
        rows = max(1, numel // cols)
        self.step_count = 0
        self.weights, self.m, self.v = {}, {}, {}
        shapes = [(f"layer{i}.weight", (rows, cols)) for i in range(params)]
        shapes += [(f"layer{i}.bias", (1024,)) for i in range(small)]
        for name, shape in shapes:
            w = torch.empty(shape)
            m = torch.empty(shape)
            v = torch.empty(shape)
            for a, b in self._chunks(w):
                w.view(-1)[a:b].normal_(0.0, 0.02, generator=self.gen)
                m.view(-1)[a:b].normal_(0.0, 1e-3, generator=self.gen)
                v.view(-1)[a:b].normal_(0.0, 1e-3, generator=self.gen).square_()
            self.weights[name], self.m[name], self.v[name] = w, m, v
        self.adam_steps = {name: torch.tensor(0.0) for name in self.weights}

    @staticmethod
    def _chunks(t):
        n = t.numel()
        for a in range(0, n, CHUNK):
            yield a, min(n, a + CHUNK)

    def step(self):
        self.step_count += 1
        for name, w in self.weights.items():
            m, v = self.m[name].view(-1), self.v[name].view(-1)
            wf = w.view(-1)
            for a, b in self._chunks(w):
                g = torch.empty(b - a).normal_(0.0, 1e-3, generator=self.gen)
                m[a:b].mul_(0.9).add_(g, alpha=0.1)
                v[a:b].mul_(0.999).addcmul_(g, g, value=0.001)
                wf[a:b].addcdiv_(m[a:b], v[a:b].sqrt().add_(1e-8), value=-1e-4)
            self.adam_steps[name] += 1

    def state_dict(self):
        names = list(self.weights)
        return {
            "model": dict(self.weights),
            "optimizer": {
                "state": {i: {"step": self.adam_steps[n], "exp_avg": self.m[n],
                              "exp_avg_sq": self.v[n]} for i, n in enumerate(names)},
                "param_groups": [{"lr": 1e-4, "betas": (0.9, 0.999), "eps": 1e-8,
                                  "weight_decay": 0, "amsgrad": False,
                                  "params": list(range(len(names)))}],
            },
            "step": self.step_count,
        }

    def nbytes(self):
        return sum(t.numel() * t.element_size() for t in flat_tensors(self.state_dict()).values())


def _index(name, numel):
    """The fixed strided sample of one tensor: every stride-th element from a name-dependent
    offset (so that the sample is not always each row's first column), the last one too."""
    if numel <= SAMPLE:
        return None  # all of it
    stride = numel // SAMPLE
    start = sum(name.encode()) % stride
    return torch.cat([torch.arange(start, numel, stride), torch.tensor([numel - 1])])


def sample(state):
    """name -> (dtype, shape, sampled values) of every tensor of a checkpoint object; ints and
    the step counter as they are."""
    out = {}
    for name, t in flat_tensors(state).items():
        idx = _index(name, t.numel())
        flat = t.reshape(-1)
        out[name] = (t.dtype, tuple(t.shape), (flat if idx is None else flat[idx]).clone())
    if isinstance(state, dict) and "step" in state:
        out["#step"] = state["step"]
    return out


def check(label, saved, read, base_read, kind):
    """Checks a version's samples as read back (`read`) against what was saved (`saved`):
    names, dtypes and shapes equal; the step counter, integer tensors, small tensors and every
    tensor of a keyframe within 2^-13 (-o keyframe_bits=12, the default; Adam's exp_avg, coded as
    values in a lineage's first keyframe, within |u|); in a delta every sampled float element satisfies the closed-loop
    bound |read - saved| <= |saved - base_read|, where base_read is what the version it was
    coded against reads back as (docs/codec.md "Guarantees"); Adam's exp_avg_sq (ratio-coded)
    within a factor 2 of its value. Returns the largest error as a share of the largest change."""
    assert saved.keys() == read.keys(), f"{label}: tensor names differ"
    assert saved.get("#step") == read.get("#step"), f"{label}: step counter differs"
    worst = 0.0
    for name, item in saved.items():
        if name == "#step":
            continue
        dtype, shape, u = item
        rdtype, rshape, got = read[name]
        assert (rdtype, rshape) == (dtype, shape), f"{label}: {name}: dtype/shape differ"
        small = torch.Size(shape).numel() * u.element_size() < SMALL
        if not u.is_floating_point() or small:
            assert torch.equal(got, u), f"{label}: {name} must be exact ({kind})"
            continue
        if kind != "delta":  # a keyframe: rounded to 12 mantissa bits (-o keyframe_bits), m as values
            assert keyframe_read_ok(got, u, name), f"{label}: {name}: keyframe off"
            continue
        assert base_read is not None, f"{label}: delta without its base's read-back"
        err = (got.double() - u.double()).abs()
        bound = (u.double() - base_read[name][2].double()).abs()
        bad = int((err > bound).sum())
        assert bad == 0, f"{label}: {name}: {bad} sampled elements moved away from their target"
        if bound.max() > 0:
            worst = max(worst, float(err.max() / bound.max()))
        if name.endswith("exp_avg_sq"):
            far = int(((got < u / 2) | (got > u * 2)).sum())
            assert far == 0, f"{label}: {name}: {far} sampled elements off by more than 2x"
    return worst


def write_dcp(f, state, byte_item, clone=False):
    """A torch.distributed.checkpoint shard as FileSystemWriter writes it into the open file `f`
    (reference/scale.md §2): the byte items (here one, torch.save of `byte_item`, an object
    without tensors), then every tensor of `state` as its own torch.save, smallest first (DCP's
    loader's order on GPU). clone: each tensor saved from a copy of its own (DCP's writer does
    so for views of a larger storage). Returns DCP's metadata: name -> (offset, length), the
    byte item under "#byte_item"."""
    item = io.BytesIO()
    torch.save(byte_item, item)
    meta = {"#byte_item": (f.tell(), len(item.getvalue()))}
    f.write(item.getvalue())
    for name, t in sorted(flat_tensors(state).items(),
                          key=lambda kv: kv[1].numel() * kv[1].element_size()):
        off = f.tell()
        torch.save(t.clone() if clone else t, f)
        meta[name] = (off, f.tell() - off)
    return meta


def read_dcp(path, meta):
    """DCP's reader: each item's slice of the shard read and torch.load'ed, one at a time; name ->
    tensor (byte items, named "#...", left out)."""
    out = {}
    with open(path, "rb") as f:
        for name, (off, length) in meta.items():
            if name.startswith("#"):
                continue
            f.seek(off)
            out[name] = torch.load(io.BytesIO(f.read(length)))
    return out


def save(state, path):
    """torch.save into a file object, flush, fsync (the commit: it returns once the version is
    stored), close. Returns the seconds it took."""
    t0 = time.monotonic()
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    return time.monotonic() - t0


def rss(pid):
    """VmRSS of a process, in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def cpu_seconds(pid):
    """utime + stime of a process (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_io(pid):
    """A process's I/O counters so far (/proc/PID/io: rchar and wchar, the bytes through its
    read/write system calls; read_bytes and write_bytes, what it caused the disk to move)."""
    with open(f"/proc/{pid}/io") as f:
        return {k: int(v) for k, v in (line.split(": ") for line in f.read().splitlines() if line)}


def open_file_blocks(pid, prefixes):
    """Disk bytes allocated to the regular files process `pid` has open whose paths start with
    one of `prefixes` (unlinked ones too, which du cannot see: staging files, a dropped or
    retired head image), each file once."""
    total, seen = 0, set()
    d = f"/proc/{pid}/fd"
    for fd in os.listdir(d):
        try:
            if not os.readlink(f"{d}/{fd}").startswith(tuple(prefixes)):
                continue
            st = os.stat(f"{d}/{fd}")
        except OSError:  # closed meanwhile
            continue
        if stat_mod.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    return total


def tmp_objects(store):
    """STORE/objects/*.obj.tmp: objects being written (a commit's, a stream's, a rewrite's)."""
    return [n for n in os.listdir(f"{store}/objects") if n.endswith(".obj.tmp")]


def writing_object(store):
    """True while an object is being written (a non-empty *.obj.tmp)."""
    for n in tmp_objects(store):
        try:
            if os.path.getsize(f"{store}/objects/{n}") > 0:
                return True
        except FileNotFoundError:  # committed (renamed) meanwhile
            pass
    return False


def heads_of(scratch):
    """The files in SCRATCH/heads (SCRATCH is the store unless -o scratch= named another)."""
    d = os.path.join(scratch, "heads")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def wait_published(scratch, version, timeout=60):
    """Waits until the head image of `version` is on disk (SCRATCH/heads/<version>-<checksum>
    .head): until then it holds its write buffer's memory, which the next save would add to."""
    prefix = f"{version:016x}-"
    deadline = time.monotonic() + timeout
    while not any(n.startswith(prefix) and n.endswith(".head") for n in heads_of(scratch)):
        assert time.monotonic() < deadline, \
            f"head image of version {version} not published: {heads_of(scratch)}"
        time.sleep(0.02)


def mib(n):
    return f"{n / MiB:.0f} MiB"


@contextlib.contextmanager
def scratch_dir(prefix):
    """A temporary directory for one test's stores and mount points, removed afterwards
    (kept, and its path printed, when KEEP is set in the environment)."""
    path = tempfile.mkdtemp(prefix=prefix)
    try:
        yield path
    finally:
        if os.environ.get("KEEP"):
            print("kept", path)
        else:
            shutil.rmtree(path, ignore_errors=True)
