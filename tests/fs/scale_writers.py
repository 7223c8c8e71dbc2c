#!/usr/bin/python3
"""Several ranks save their shards at the same moment (issue 13, DESIGN.md §12): WRITERS
processes, each with its own ~256 MiB training state (tests/fs/scale_lib.py), save
rank{r}/step_{k}.pt for STEPS steps, released together by a barrier before every save
(torch.save into a file object, fsync). Through `-o cache=128M,buffer=128M`, so that the
budget (cache + buffer + 512 MiB = 768 MiB) is well below what the writers hold together
(4 x 256 MiB in flight). Checks:

  - every version after a rank's first is a delta whose base is that rank's own previous version
    (`ckptctl stat --json`: kind, base, version), and each rank's first is a keyframe: one
    lineage per rank;
  - the daemon's peak RSS (VmHWM over the whole run) stays within the budget;
  - every version reads back (torch.load by its writer right after the save, all ranks at once):
    step counters and small tensors exact, a delta within the closed-loop bound on a strided
    sample against what its base read back as (scale_lib.check);
  - after a remount all ranks read at once, each its versions one after another, newest first
    (a restore: the older ones decode through their chains side by side), and each version
    reads as the same bytes as before (sha256), the daemon again within the budget.

With --heads-off --cache-mib N (each rank's state fits in half the cache, all of them do not):
the saves keep their reconstructions in the cache as their bases while that holds; the daemon's
admin socket (`ckptctl status`) must count the saves that could not keep theirs whole
(streams.not_kept, at least one, and the status line saying so), yet some bytes kept
(streams.kept_bytes > 0: they share the cache), and no large save still running once all are
done; the budget and read-back checks above hold as well.

Usage: scale_writers.py CKPTFS CKPTCTL [--writers 4] [--mib 256] [--steps 3]
                        [--heads-off --cache-mib 512]
"""
import argparse
import concurrent.futures
import gc
import multiprocessing
import os
import subprocess
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckptfs_testlib import mounted, peak_rss, sha256, status_json  # noqa: E402
from scale_lib import MiB, TrainingState, check, mib, sample, save, scratch_dir, stat  # noqa: E402

BUFFER = 128 * MiB


def writer(rank, args, mnt, barrier, results):
    """One rank: saves, checks what it reads back, reports (rank, step, info, seconds) or an
    error. The barrier is passed before every save whatever happens, so that a failing rank
    does not leave the others waiting forever."""
    try:
        torch.set_num_threads(1)
        state = TrainingState(args.mib * MiB, params=2, small=4, seed=100 + rank)
        os.makedirs(f"{mnt}/rank{rank}", exist_ok=True)
        prev_read = {}
        for k in range(1, args.steps + 1):
            if k > 1:
                state.step()
            saved = sample(state.state_dict())
            barrier.wait(timeout=300)
            path = f"{mnt}/rank{rank}/step_{k}.pt"
            secs = save(state.state_dict(), path)
            info = stat(args.ckptctl, path)
            loaded = torch.load(path)
            read = sample(loaded)
            del loaded
            gc.collect()
            check(f"rank {rank} step {k}", saved, read, prev_read.get(info["base"]), info["kind"])
            prev_read = {info["version"]: read}
            results.put((rank, k, info, secs, None))
    except BaseException:
        results.put((rank, None, None, None, traceback.format_exc()))
        barrier.abort()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("ckptctl")
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--cache-mib", type=int, default=128)
    ap.add_argument("--heads-off", action="store_true")
    args = ap.parse_args()
    cache = args.cache_mib * MiB
    opts = [f"cache={args.cache_mib}M", f"buffer={BUFFER // MiB}M"]
    if args.heads_off:
        opts.append("heads=off")
    budget = cache + BUFFER + 512 * MiB
    t_start = time.monotonic()
    with scratch_dir("ckptfs-scale-writers-") as work:
        store, mnt = os.path.join(work, "store"), os.path.join(work, "mnt")
        ctx = multiprocessing.get_context("fork")
        procs = []
        try:
            with mounted(args.binary, store, mnt, *opts) as proc:
                barrier = ctx.Barrier(args.writers)
                results = ctx.Queue()
                procs = [ctx.Process(target=writer, args=(r, args, mnt, barrier, results))
                         for r in range(args.writers)]
                for p in procs:
                    p.start()
                infos = {}
                for _ in range(args.writers * args.steps):
                    rank, k, info, secs, err = results.get(timeout=600)
                    assert err is None, f"rank {rank} failed:\n{err}"
                    infos[(rank, k)] = info
                    print(f"rank {rank} step {k}: {info['kind']} (version {info['version']}, base "
                          f"{info['base']}), save+fsync {secs:.1f} s, stored "
                          f"{mib(info['stored_bytes'])}", flush=True)
                for p in procs:
                    p.join(timeout=60)
                    assert p.exitcode == 0, f"a writer exited with {p.exitcode}"
                peak = peak_rss(proc.pid)
                streams = status_json(args.ckptctl, mnt)["streams"]
                status_text = subprocess.run([args.ckptctl, "status", mnt], check=True,
                                             capture_output=True, text=True).stdout
                hashes = {f"{mnt}/rank{r}/step_{k}.pt": None
                          for r in range(args.writers) for k in range(1, args.steps + 1)}
                for path in hashes:
                    hashes[path] = sha256(path)
            for r in range(args.writers):
                assert infos[(r, 1)]["kind"] == "keyframe", (
                    f"rank {r}: first version not a keyframe")
                for k in range(2, args.steps + 1):
                    info, prev = infos[(r, k)], infos[(r, k - 1)]
                    assert info["kind"] == "delta", f"rank {r} step {k}: {info['kind']}"
                    assert info["base"] == prev["version"], (
                        f"rank {r} step {k}: base {info['base']}, not its own previous version "
                        f"{prev['version']}")
            print(f"streams: {streams.get('used')} used, {mib(streams.get('kept_bytes', 0))} "
                  f"kept in the cache, {streams.get('not_kept')} not kept whole, "
                  f"{streams.get('large_saves')} large saves running", flush=True)
            assert streams["large_saves"] == 0, f"large saves still counted when all are done: {streams}"
            if args.heads_off:
                # Together the ranks' reconstructions do not fit in the cache: some save found
                # its base gone and no room for all of its reconstruction beside the others'.
                assert streams["not_kept"] >= 1, f"no save counted as not kept: {streams}"
                # ... yet they shared it: saves whose base was gone kept what had room (stop 50's
                # rule kept nothing at all for every rank here).
                assert streams.get("kept_bytes", 0) > 0, f"no save kept anything: {streams}"
                assert "not kept whole in the cache" in status_text, (
                    f"ckptctl status does not say saves were not kept:\n{status_text}")
            print(f"daemon peak RSS {mib(peak)} (budget {mib(budget)})", flush=True)
            assert peak <= budget, f"daemon peak RSS {mib(peak)} > budget {mib(budget)}"
            # A restore after a failure: all ranks at once, each its versions newest first, from
            # a fresh daemon (the older ones decode through their chains side by side).
            with mounted(args.binary, store, mnt, *opts) as proc:
                def restore(r):
                    return {p: sha256(p) for p in (f"{mnt}/rank{r}/step_{k}.pt"
                                                   for k in range(args.steps, 0, -1))}
                with concurrent.futures.ThreadPoolExecutor(args.writers) as pool:
                    read = {}
                    for got in pool.map(restore, range(args.writers)):
                        read.update(got)
                restore_peak = peak_rss(proc.pid)
            for path, h in hashes.items():
                assert read[path] == h, f"{path} reads differently after remount"
            print(f"restore of every version by all ranks at once: daemon peak RSS "
                  f"{mib(restore_peak)}", flush=True)
            assert restore_peak <= budget, (
                f"daemon peak RSS {mib(restore_peak)} > budget {mib(budget)} while restoring")
            print(f"scale_writers: ok ({args.writers} writers x {args.steps} steps x "
                  f"{args.mib} MiB, peak RSS {mib(peak)}, {time.monotonic() - t_start:.0f} s)")
        finally:
            for p in procs:  # a failed run must not leave writers holding the mount busy
                if p.is_alive():
                    p.kill()
                    p.join()


if __name__ == "__main__":
    main()
