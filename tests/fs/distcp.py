#!/usr/bin/python3
"""torch.distributed.checkpoint shards through a real mount (issue 15).

torch 1.13 here cannot run DCP itself, so this writes DCP's exact layout as FileSystemWriter does
(reference/scale.md §2): per rank one `step_N/__R_0.distcp` holding the rank's byte items raw,
then each tensor (largest first, as with several writer threads) as its own `torch.save(tensor,
f)` into the same file object;
`.metadata` (DCP's Metadata pickle: each item's fqn and chunk -> file, offset, length; pickled
through stand-ins of torch's dataclasses, dcp_metadata.py) written as `.metadata.tmp`, fsync'ed
and renamed. Four ranks write at once (threads released by a barrier), over 6 steps of a small
MLP trained with AdamW on sklearn's digits, every parameter and both Adam moments sharded by
rows. Reading is DCP's: slice the shard by the metadata and torch.load each slice.

Checks:
  - every slice loads; byte items and .metadata read back exact; shapes and dtypes equal;
  - step 1 is a keyframe per rank, steps 2-6 deltas, one lineage per rank (stable over the
    steps, different between ranks; steps 4-6 are written under a random temporary directory
    name and renamed, step 6 without fsync so that the rename overtakes the storing, and still
    continue their ranks' lineages), format "distcp";
  - every float element within the closed-loop bound of its delta (|read - saved| <= |saved -
    previous read|, docs/codec.md), exp_avg_sq within 2x; small tensors and integers exact;
  - from step 2 on, `ckptctl stat` gives each coded tensor of a shard the name the .metadata of
    the step before gave it, so that Adam's v gets ratio_bits as in a torch.save file; step 2
    codes every v as a frame of its own rounded to moment_bits (the unnamed first keyframe kept
    12 bits), and the later deltas keep v at those bits: at the
    defaults, against the same tensors in one torch.save per rank, the deltas' coded tensors but
    v within 5%, v within 1.5x (that frame costs more than a delta once; unnamed, its 3 ratio
    bits would cost more), the rest of the delta shards
    within 45% (an archive per tensor, whose records the metadata holds compressed), the whole
    run within 80% (the first keyframe, unnamed, also rounds Adam's m where the files' codes it
    as values);
  - hostile shards are stored without error: one cut in the middle of an archive, one with
    garbage between two archives, and a .metadata whose items lie about offsets; their bytes outside
    float payloads read back exact, and every intact archive still loads;
  - all of it again after a remount.

Usage: distcp.py CKPTFS_BINARY    (as root; Debian's /usr/bin/python3)
"""
import io
import os
import pickle
import random
import subprocess
import sys
import tempfile
import threading

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dcp_metadata  # noqa: E402
from ckptfs_testlib import (MIN_TENSOR, MOMENT_BITS, beyond_value, chain_bits,  # noqa: E402
                            closed_loop_bound, daemon_log, has_mantissa_bits, info,
                            keyframe_within, mounted, require_fuse, stat_json)
from digits_lib import adamw_digits  # noqa: E402

RANKS, STEPS = 4, 6
TEMP_STEPS = (4, 5, 6)  # written under a random temporary directory name, then renamed
UNSYNCED = (6,)  # ...without fsync: renamed while the shards are still being stored
# A real Metadata whose items lie: offsets past the end of the file, another file's name.
LYING_METADATA = pickle.dumps(dcp_metadata.make(
    [("x", (0,), "cut.distcp", 10**12, 100), ("y", None, "missing.distcp", 0, 5)],
    {"x": (torch.float32, (25,))}))


def train_states(steps=STEPS, classes=12):
    """Yields, per step, the full state: {fqn: tensor} of weights and AdamW's moments."""
    for model, opt, _ in adamw_digits((512, 256), classes, steps):
        state = {}
        for name, p in model.named_parameters():
            state[f"model.{name}"] = p.detach().clone()
            s = opt.state[p]
            state[f"optim.{name}.exp_avg"] = s["exp_avg"].clone()
            state[f"optim.{name}.exp_avg_sq"] = s["exp_avg_sq"].clone()
        yield state


def shard(state, rank):
    """This rank's rows of every tensor."""
    return {k: v.chunk(RANKS, dim=0)[rank].clone() for k, v in state.items()}


def write_shard(path, byte_items, tensors, sync=True):
    """FileSystemWriter's layout: byte items raw, then torch.save per tensor, largest first.
    sync=False: closed without fsync (DCP's sync_files=False), so it is stored in the background."""
    meta = {}
    with open(path, "wb") as f:
        for name, data in byte_items:
            meta[name] = (f.tell(), len(data))
            f.write(data)
        for name, t in sorted(tensors.items(), key=lambda kv: -kv[1].numel()):
            off = f.tell()
            torch.save(t, f)
            meta[name] = (off, f.tell() - off)
        f.flush()
        if sync:
            os.fsync(f.fileno())
    return meta


def write_step(root, step, state, temp=False, sync=True):
    """temp: written under a random temporary directory name and renamed to step_N at the end
    (as checkpoint managers that publish a step atomically do); sync=False: the shards are not
    fsync'ed, so the rename usually overtakes their storing."""
    final = d = f"{root}/step_{step}"
    if temp:
        d = f"{root}/.tmp{os.urandom(4).hex()}"
    os.makedirs(d, exist_ok=True)
    metas, barrier, errors = [None] * RANKS, threading.Barrier(RANKS), []

    def rank_main(r):
        try:
            barrier.wait()
            rng = random.Random(step * RANKS + r).randbytes(700)  # as a dataloader's state
            items = [(f"rank{r}.train_state", pickle.dumps({"step": step, "rank": r, "rng": rng}))]
            metas[r] = write_shard(f"{d}/__{r}_0.distcp", items, shard(state, r), sync)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(RANKS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    metadata = {(r, k): (f"__{r}_0.distcp", off, n) for r in range(RANKS)
                for k, (off, n) in metas[r].items()}
    rows = {k: v.shape[0] // RANKS for k, v in state.items()}
    items = [(k, None if k.endswith("train_state") else (r * rows[k],) + (0,) * (state[k].dim() - 1),
              file, off, n) for (r, k), (file, off, n) in metadata.items()]
    sizes = {k: (v.dtype, tuple(v.shape)) for k, v in state.items()}
    with open(f"{d}/.metadata.tmp", "wb") as f:
        pickle.dump(dcp_metadata.make(items, sizes), f)
        f.flush()
        os.fsync(f.fileno())
    os.rename(f"{d}/.metadata.tmp", f"{d}/.metadata")
    if temp:
        os.rename(d, final)
    if not sync:  # wait for the shards to be stored (under whichever name they have by then)
        for r in range(RANKS):
            with open(f"{final}/__{r}_0.distcp", "rb") as f:
                os.fsync(f.fileno())
    return metadata


def load_metadata(d):
    """{(rank, fqn): (file, offset, length)} of a step's .metadata (the rank from the file name)."""
    with open(f"{d}/.metadata", "rb") as f:
        items = dcp_metadata.items(pickle.load(f))
    return {(int(file.split("_")[2]), key.fqn): (file, off, n)
            for key, (file, off, n) in items.items()}


def read_step(d):
    """DCP's reader: slices by the metadata; {(rank, item): tensor or bytes}."""
    metadata = load_metadata(d)
    out = {}
    for (r, k), (file, off, n) in metadata.items():
        with open(f"{d}/{file}", "rb") as f:
            f.seek(off)
            b = f.read(n)
        assert len(b) == n, (d, file, k)
        out[(r, k)] = b if k.endswith("train_state") else torch.load(io.BytesIO(b))
    return out


def check_step(label, saved, read, prev_read, kind, modes):
    """modes: {(rank, fqn): tensor mode} of the shards' versions (shard_stat)."""
    for key, want in saved.items():
        got = read[key]
        if isinstance(want, bytes):
            assert got == want, f"{label}: byte item {key} differs"
            continue
        assert got.dtype == want.dtype and got.shape == want.shape, f"{label}: {key}"
        small = want.numel() * want.element_size() < MIN_TENSOR
        if small or not want.is_floating_point():
            assert torch.equal(got, want), f"{label}: {key} must be exact ({kind})"
            continue
        if kind != "delta" and "intra" in modes.get(key, ""):  # as its previous head coded it
            bad = beyond_value(got, want)
            assert bad == 0, f"{label}: {key}: {bad} elements further than |u| (keyframe)"
            continue
        if kind != "delta":  # a keyframe: rounded (-o keyframe_bits, default 12)
            assert keyframe_within(got, want), f"{label}: {key}: keyframe off by > 2^-13"
            continue
        if modes[key] == "rounded":  # a delta's frame of its own: v re-keyed to moment_bits
            assert keyframe_within(got, want, chain_bits(key[1])), \
                f"{label}: {key}: its own frame off by > 2^-{chain_bits(key[1]) + 1}"
            continue
        err = (got.double() - want.double()).abs()
        bound = closed_loop_bound(want, prev_read[key], modes[key])
        bad = int((err > bound).sum())
        assert bad == 0, f"{label}: {key}: {bad} elements outside the closed-loop bound"
        if key[1].endswith("exp_avg_sq"):
            nz = want > 0
            far = int(((got[nz] < want[nz] / 2) | (got[nz] > want[nz] * 2)).sum())
            assert far == 0, f"{label}: {key}: {far} elements off by more than 2x"


def stored(path):
    return info(path)["stored_bytes"]


def hostile(mnt, step_dir, plain_dir):
    """A cut shard, garbage between archives, a lying .metadata: stored, nothing fails."""
    with open(f"{step_dir}/__0_0.distcp", "rb") as f:
        data = f.read()
    meta = archive_offsets(step_dir, 0)
    cut = data[:meta[1][0] + meta[1][1] // 2]  # in the middle of the second archive
    garbage = data[:meta[1][0]] + os.urandom(3000) + data[meta[1][0]:]
    os.makedirs(f"{mnt}/hostile", exist_ok=True)
    for name, b in (("cut.distcp", cut), ("garbage.distcp", garbage)):
        with open(f"{mnt}/hostile/{name}", "wb") as f:
            f.write(b)
            f.flush()
            os.fsync(f.fileno())
        with open(f"{plain_dir}/{name}", "wb") as f:
            f.write(b)
    with open(f"{mnt}/hostile/.metadata", "wb") as f:
        f.write(LYING_METADATA)
    check_hostile(mnt, plain_dir, meta)


def shard_stat(ctl, step_dir, rank):
    """{(rank, fqn): (tensor mode, the state-dict name stat gives it)} of a rank's shard: stat
    names its tensors by archive, item<k>/data/0 for the k-th archive in the file
    (codec/format/distcp_archives.hpp), and by state_name when it knows it."""
    keys = sorted((off, k) for (r, k), (_, off, n) in load_metadata(step_dir).items()
                  if r == rank and not k.endswith("train_state"))
    tensors = {t["name"]: t for t in stat_json(ctl, f"{step_dir}/__{rank}_0.distcp")["tensors"]}
    return {(rank, k): (tensors[f"item{i}/data/0"]["mode"],
                        tensors[f"item{i}/data/0"].get("state_name"))
            for i, (_, k) in enumerate(keys)
            if f"item{i}/data/0" in tensors}  # stat lists the coded tensors, not small exact ones


def coded_bytes(ctl, path):
    """Stored bytes of the version's coded tensors (not its zip framing, pickles, small ones):
    (Adam's v, every other tensor), v by the name stat gives (a shard's from its .metadata)."""
    v = other = 0
    for t in stat_json(ctl, path)["tensors"]:
        if t.get("state_name", t["name"]).endswith("exp_avg_sq"):
            v += t["stored_bytes"]
        else:
            other += t["stored_bytes"]
    return v, other


def archive_offsets(step_dir, rank):
    """(offset, length) of each torch archive of a rank's shard, in file order, from .metadata."""
    return sorted((off, n) for (r, k), (_, off, n) in load_metadata(step_dir).items()
                  if r == rank and not k.endswith("train_state"))


def check_hostile(mnt, plain_dir, meta):
    """meta: the archives of the shard the hostile files were made from."""
    with open(f"{mnt}/hostile/cut.distcp", "rb") as f:
        got = f.read()
    with open(f"{plain_dir}/cut.distcp", "rb") as f:
        want = f.read()
    assert len(got) == len(want)
    # The first archive (intact) still loads; everything from the cut archive on is exact.
    first = torch.load(io.BytesIO(got[meta[0][0]:meta[0][0] + meta[0][1]]))
    assert first.shape == torch.load(io.BytesIO(want[meta[0][0]:sum(meta[0])])).shape
    assert got[meta[1][0]:] == want[meta[1][0]:], "the cut archive's bytes changed"
    with open(f"{mnt}/hostile/garbage.distcp", "rb") as f:
        got = f.read()
    with open(f"{plain_dir}/garbage.distcp", "rb") as f:
        want = f.read()
    assert len(got) == len(want)
    shifted = [(off + (3000 if i else 0), n) for i, (off, n) in enumerate(meta)]
    for off, n in shifted:
        torch.load(io.BytesIO(got[off:off + n]))  # every archive still loads
    assert got[meta[1][0]:meta[1][0] + 3000] == want[meta[1][0]:meta[1][0] + 3000]
    with open(f"{mnt}/hostile/.metadata", "rb") as f:
        assert f.read() == LYING_METADATA


def main():
    require_fuse()
    binary = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="ckptfs-distcp-", dir="/var/tmp") as work:
        store, mnt, plain = f"{work}/store", f"{work}/mnt", f"{work}/plain"
        os.makedirs(mnt)
        os.makedirs(plain)
        saved, reads, lineages = [], [], {}
        # Per step: stored bytes of the shards and of the torch.save files; and of their coded
        # tensors alone.
        dcp_bytes, single_bytes, dcp_coded, single_coded = [], [], [], []
        dcp_v, single_v = [], []  # coded bytes of Adam's v alone (in the coded ones too)
        intra = set()  # (rank, fqn) coded as values (intra) in some delta
        ctl = os.path.join(os.path.dirname(os.path.abspath(binary)), "ckptctl")
        # The defaults: a shard's tensors are named from step 2 on (by the .metadata of the step
        # before), so that its Adam v gets ratio_bits=1 as the torch.save files' does.
        with mounted(binary, store, mnt):
            for step, state in enumerate(train_states(), start=1):
                write_step(mnt, step, state, temp=step in TEMP_STEPS, sync=step not in UNSYNCED)
                write_step(plain, step, state)
                # The same tensors as one torch.save per rank: the compression reference.
                for per_step in (single_bytes, dcp_bytes, single_coded, dcp_coded, dcp_v, single_v):
                    per_step.append(0)
                for r in range(RANKS):
                    os.makedirs(f"{mnt}/single/rank_{r}", exist_ok=True)
                    p = f"{mnt}/single/rank_{r}/step_{step}.pt"
                    with open(p, "wb") as f:
                        torch.save(shard(state, r), f)
                        f.flush()
                        os.fsync(f.fileno())
                    single_bytes[-1] += stored(p)
                    v, other = coded_bytes(ctl, p)
                    single_coded[-1] += v + other
                    single_v[-1] += v
                want = read_step(f"{plain}/step_{step}")
                read = read_step(f"{mnt}/step_{step}")
                kind = "keyframe" if step == 1 else "delta"
                stats = {}
                for r in range(RANKS):
                    stats.update(shard_stat(ctl, f"{mnt}/step_{step}", r))
                modes = {k: mode for k, (mode, _) in stats.items()}
                # Named from the .metadata of the step before: every coded tensor of a delta.
                named = {k: name for k, (_, name) in stats.items() if name}
                if step > 1:
                    assert named == {k: k[1] for k in stats}, (step, named, list(stats))
                else:
                    assert not named, named
                check_step(f"step {step}", want, read, reads[-1] if reads else None, kind, modes)
                # The unnamed first keyframe kept 12 bits in v: the first delta that names it
                # starts v's own frame at moment_bits (every v "rounded", nothing else), and
                # the deltas after it keep those bits (docs/codec.md, "Second moments").
                rekeyed = {k for k, m in modes.items() if m == "rounded" and kind == "delta"}
                v_keys = {k for k in modes if k[1].endswith("exp_avg_sq")}
                assert rekeyed == (v_keys if step == 2 else set()), (step, rekeyed)
                if step > 1:
                    for k in v_keys:
                        assert has_mantissa_bits(read[k], MOMENT_BITS), (step, k)
                intra |= {k for k, m in modes.items() if kind == "delta" and "intra" in m}
                saved.append(want)
                reads.append(read)
                for r in range(RANKS):
                    i = info(f"{mnt}/step_{step}/__{r}_0.distcp")
                    assert i["format"] == "distcp", i
                    assert i["kind"] == kind, (step, r, i)
                    lineages.setdefault(r, i["lineage"])
                    assert i["lineage"] == lineages[r], f"rank {r} left its lineage at {step}"
                    dcp_bytes[-1] += i["stored_bytes"]
                    v, other = coded_bytes(ctl, f"{mnt}/step_{step}/__{r}_0.distcp")
                    dcp_coded[-1] += v + other
                    dcp_v[-1] += v
                with open(f"{mnt}/step_{step}/.metadata", "rb") as a, \
                        open(f"{plain}/step_{step}/.metadata", "rb") as b:
                    assert a.read() == b.read()
            assert len(set(lineages.values())) == RANKS, lineages
            # AdamW's first moment, nearly new at every step saved, is coded as its values.
            assert any(k.endswith("exp_avg") for _, k in intra), f"no exp_avg intra: {intra}"
            assert not any(k.startswith("model.") for _, k in intra), f"a weight intra: {intra}"
            # `ckptctl ls` shows each step's shards together (one line per step directory).
            out = subprocess.run([ctl, "ls", mnt], check=True, capture_output=True,
                                 text=True).stdout
            assert "sharded saves" in out, out
            for step in range(1, STEPS + 1):
                row = [line.split() for line in out.splitlines()
                       if line.split()[:1] == [f"step_{step}"]]
                assert row and row[0][1] == str(RANKS), (step, out)
            hostile(mnt, f"{plain}/step_1", plain)
        for label, a, b in (("all steps", sum(dcp_bytes), sum(single_bytes)),
                            ("deltas (steps 2-6)", sum(dcp_bytes[1:]), sum(single_bytes[1:])),
                            ("deltas' coded tensors", sum(dcp_coded[1:]), sum(single_coded[1:])),
                            ("deltas' coded v", sum(dcp_v[1:]), sum(single_v[1:])),
                            ("deltas' coded tensors but v", sum(dcp_coded[1:]) - sum(dcp_v[1:]),
                             sum(single_coded[1:]) - sum(single_v[1:]))):
            print(f"distcp: {label}: shards stored {a} bytes, the same tensors as torch.save "
                  f"files {b} (shards / files {a / b:.3f})")
        # The tensors: named, a delta's v gets ratio_bits as in the files (unnamed, at 3 bits
        # and on equal chains, the coded tensors cost 1.2x). But step 1's keyframe has no names
        # yet, so its v keeps keyframe_bits (12), not moment_bits (2); step 2 starts v's own
        # frame at moment_bits, which costs more than a delta once: v's deltas cost more than
        # the files' (1.38x measured; 1.46x when the 12 bits stayed through the interval), the
        # other tensors the same as theirs.
        assert sum(dcp_coded[1:]) - sum(dcp_v[1:]) <= 1.05 * (
            sum(single_coded[1:]) - sum(single_v[1:])), \
            "DCP shards' coded tensors but v take >5% more than the same in torch.save files"
        assert sum(dcp_v[1:]) <= 1.5 * sum(single_v[1:]), \
            "DCP shards' v deltas take >1.5x the files' (named: the re-keyed frame, 1.38x; " \
            "unnamed deltas would also take 3 ratio bits, not 1)"
        # The rest of the shards: one torch.save archive per tensor, each with its zip records
        # and pickle, where a file holds one; in the version's metadata, compressed together,
        # they cost about what the files' do (1.09x measured; several times that when each
        # archive's records were coded alone). Since a delta's metadata is compressed against
        # its base's exact bytes (content format 4) both shrank, a file's by 31% and a shard's
        # by 16% (its metadata names more than its archives' records repeat): 1.33x measured.
        # Over the run the first keyframe adds: unnamed, its v keeps keyframe_bits and its m is
        # rounded to them, where the files' keyframe codes m as values by its name (1.66x over
        # these six steps, one of them that keyframe; 1.61x before format 4).
        fixed = sum(dcp_bytes[1:]) - sum(dcp_coded[1:])
        assert fixed <= 1.45 * (sum(single_bytes[1:]) - sum(single_coded[1:])), \
            f"DCP shards' fixed costs grew: {fixed} bytes"
        assert sum(dcp_bytes) <= 1.8 * sum(single_bytes), "DCP shards take >80% more than files"
        with mounted(binary, store, mnt):
            for step in range(1, STEPS + 1):
                again = read_step(f"{mnt}/step_{step}")
                for key, v in reads[step - 1].items():
                    if isinstance(v, bytes):
                        assert again[key] == v
                    else:
                        assert torch.equal(again[key], v), f"step {step} {key} changed"
            check_hostile(mnt, plain, archive_offsets(f"{plain}/step_1", 0))
        with open(daemon_log(store)) as f:
            errors = [line for line in f if " error:" in line]
        assert not errors, errors[:10]
    print("distcp: ok")


if __name__ == "__main__":
    main()
