"""Shared by the mount tests and benchmarks: a mount that is always unmounted, and small helpers.

Run under Debian's /usr/bin/python3 (torch, numpy)."""
import atexit
import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

# Mount points and daemons alive right now: unmounted and killed at interpreter exit even when a
# test dies in a way that skips `finally` (sys.exit from a signal handler, an exception in
# teardown). A leaked mount breaks the next run.
_live = {}


@atexit.register
def _cleanup_live():
    for mnt, proc in list(_live.items()):
        subprocess.run(["fusermount3", "-uz", mnt], check=False, stderr=subprocess.DEVNULL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    _live.clear()


def _abort_connection(mnt):
    """Aborts the FUSE connection of `mnt` (releases clients blocked on a hung daemon). Finds
    the device in mountinfo: a stat of a hung mount would hang too."""
    if not os.path.isdir("/sys/fs/fuse/connections") or not os.listdir("/sys/fs/fuse/connections"):
        subprocess.run(["mount", "-t", "fusectl", "none", "/sys/fs/fuse/connections"],
                       check=False, stderr=subprocess.DEVNULL)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[4] == os.path.abspath(mnt):
                minor = fields[2].split(":")[1]
                try:
                    with open(f"/sys/fs/fuse/connections/{minor}/abort", "w") as a:
                        a.write("1\n")
                except OSError:
                    pass


def _watchdog_fire(seconds):
    """A test that hangs must fail by itself before ctest kills it (SIGKILL skips every cleanup
    and leaks the mount): record where each daemon is stuck, abort, unmount, exit non-zero."""
    print(f"WATCHDOG: test still running after {seconds} s; dumping daemon stacks and aborting",
          flush=True)
    for mnt, proc in list(_live.items()):
        if proc.poll() is None:
            with open(daemon_log(proc.args[1]), "ab") as log:
                try:
                    subprocess.run(["gdb", "-p", str(proc.pid), "-batch", "-ex",
                                    "thread apply all bt 20"], stdout=log,
                                   stderr=subprocess.STDOUT, check=False, timeout=60)
                except (OSError, subprocess.TimeoutExpired) as e:
                    log.write(f"no stacks: {e}\n".encode())
            with open(daemon_log(proc.args[1]), errors="replace") as f:
                print(f.read()[-20000:], flush=True)
        _abort_connection(mnt)
        if proc.poll() is None:
            proc.kill()
        subprocess.run(["fusermount3", "-uz", mnt], check=False, stderr=subprocess.DEVNULL)
    os._exit(1)


_watchdog = None


def _arm_watchdog():
    """Once per test process; CKPTFS_TEST_DEADLINE seconds (default 250, below ctest's 300)."""
    global _watchdog
    if _watchdog is None:
        seconds = float(os.environ.get("CKPTFS_TEST_DEADLINE", "250"))
        _watchdog = threading.Timer(seconds, _watchdog_fire, args=(seconds,))
        _watchdog.daemon = True
        _watchdog.start()


def log_errors(store, since=0):
    """The daemon's error lines in its log from byte offset `since` on."""
    try:
        with open(daemon_log(store), errors="replace") as f:
            f.seek(since)
            return [line.rstrip("\n") for line in f if " error: " in line]
    except FileNotFoundError:
        return []


@contextlib.contextmanager
def mounted(binary, store, mnt, *opts, timeout=20, errors_ok=False):
    """Runs `ckptfs STORE MNT -f [-o OPTS]` for the duration of the block; always unmounts and
    reaps the daemon, also when the block raises. Yields the daemon's Popen. When the block
    ends normally, the daemon must have logged no error line while it ran (routine work logs at
    info): a test that makes errors happen (damage, a full disk) says so with errors_ok=True."""
    log = daemon_log(store)
    since = os.path.getsize(log) if os.path.exists(log) else 0
    proc = start(binary, store, mnt, *opts)
    clean = False
    try:
        wait_mounted(mnt, proc, timeout)
        yield proc
        clean = True
    finally:
        if os.path.ismount(mnt):
            if subprocess.run(["fusermount3", "-u", mnt], check=False).returncode != 0:
                subprocess.run(["fusermount3", "-uz", mnt], check=False)  # busy: detach
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if os.path.ismount(mnt):
            subprocess.run(["fusermount3", "-uz", mnt], check=False)
        _live.pop(mnt, None)
    if clean and not errors_ok:
        errors = log_errors(store, since)
        assert not errors, f"the daemon logged errors on {store}: " + "\n".join(errors[:5])


SKIP = 77  # ctest SKIP_RETURN_CODE of the mount tests


def require_fuse():
    """Exits with SKIP (and the reason) where no mount is possible: no /dev/fuse, or not root."""
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        print("SKIPPED: /dev/fuse is not available")
        sys.exit(SKIP)
    if os.geteuid() != 0:
        print("SKIPPED: the mount tests run as root")
        sys.exit(SKIP)


def start(binary, store, mnt, *opts):
    """Starts `ckptfs STORE MNT -f` without waiting; its output goes to STORE.daemon.log (a pipe
    nobody reads would fill up and stall the daemon). Registered for cleanup at exit."""
    require_fuse()
    _arm_watchdog()
    os.makedirs(store, exist_ok=True)
    os.makedirs(mnt, exist_ok=True)
    args = [binary, store, mnt, "-f"] + (["-o", ",".join(opts)] if opts else [])
    with open(daemon_log(store), "ab") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    _live[mnt] = proc
    return proc


def daemon_log(store):
    return os.path.normpath(store) + ".daemon.log"


def wait_mounted(mnt, proc, timeout=20):
    """Waits until `mnt` is a mount point served by `proc` (a Popen)."""
    deadline = time.time() + timeout
    while not os.path.ismount(mnt):
        if proc.poll() is not None:
            with open(daemon_log(proc.args[1]), errors="replace") as f:
                raise RuntimeError("ckptfs exited: " + f.read())
        if time.time() > deadline:
            raise RuntimeError(f"ckptfs did not mount within {timeout} s")
        time.sleep(0.05)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def info(path):
    """The daemon's view of a file (user.ckptfs.info): version, kind, lineage, stored bytes..."""
    return json.loads(os.getxattr(path, "user.ckptfs.info"))


def du(path):
    """Bytes allocated under `path` (what the store really costs on disk)."""
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
            except FileNotFoundError:  # the daemon removed it (gc) after the listing
                pass
    return total


def peak_rss(pid):
    """VmHWM of a process, in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def reset_peak_rss(pid):
    """Resets VmHWM to the current RSS (Linux clear_refs), to measure the peak of one phase."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5\n")


def kill9(proc, mnt):
    """kill -9 of a daemon started by start(), then its mount point detached: a crash."""
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    subprocess.run(["fusermount3", "-u", mnt], check=False, stderr=subprocess.DEVNULL)
    if os.path.ismount(mnt):
        subprocess.run(["fusermount3", "-uz", mnt], check=True)
    _live.pop(mnt, None)


KEYFRAME_BITS = 12  # the mount's default -o keyframe_bits (fs/fuse/options.hpp)
# The mount's default -o min_tensor (kDefaultMinTensor): float tensors of fewer bytes are exact.
MIN_TENSOR = 256
# The mount's default -o moment_bits (kDefaultMomentBits): second moments' mantissa bits on a chain.
MOMENT_BITS = 2
SECOND_MOMENTS = ("exp_avg_sq", "max_exp_avg_sq", "square_avg")  # fs::is_second_moment


def chain_bits(name):
    """The mantissa bits a float32 tensor of this name keeps in a lossy keyframe and on its chain
    at the mount's defaults: second moments MOMENT_BITS, everything else KEYFRAME_BITS."""
    return MOMENT_BITS if name.split(".")[-1] in SECOND_MOMENTS else KEYFRAME_BITS


def keyframe_within(got, want, bits=KEYFRAME_BITS):
    """A lossy keyframe's float tensor as read back: every element within 2^-(bits+1) of its
    value (plus half a kept unit for subnormals), NaN exactly where it was (docs/codec.md,
    "Lossy keyframes")."""
    import torch  # the mount tests that use this have torch; others need not import it
    g, w = got.double().reshape(-1), want.double().reshape(-1)
    nan = torch.isnan(w)
    if not torch.equal(torch.isnan(g), nan):
        return False
    g, w = g[~nan], w[~nan]
    return bool(((g - w).abs() <= w.abs() * 2.0 ** -(bits + 1) + 2.0 ** (-126 - bits)).all())


def has_mantissa_bits(t, bits=KEYFRAME_BITS):
    """Every finite element of a float32 tensor has at most `bits` mantissa bits: what a lossy
    keyframe, and a delta on its chain, read back as (docs/codec.md, "Lossy keyframes")."""
    import torch
    x = t.detach().contiguous().reshape(-1).view(torch.int32)
    finite = (x & 0x7F800000) != 0x7F800000
    low = (1 << (23 - bits)) - 1
    return bool(((x & low)[finite] == 0).all())


def flat_tensors(obj, prefix=""):
    """name -> tensor for every tensor in a nested checkpoint object (dicts, lists, tuples),
    names joined with dots."""
    import torch
    if torch.is_tensor(obj):
        return {prefix: obj}
    out = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(flat_tensors(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(flat_tensors(v, f"{prefix}.{i}" if prefix else str(i)))
    return out



def stat_json(ckptctl, path):
    """`ckptctl stat --json` of the version at `path`, parsed."""
    out = subprocess.run([ckptctl, "stat", "--json", path], check=True, capture_output=True)
    return json.loads(out.stdout)


def status_json(ckptctl, mnt):
    """`ckptctl status --json` of the daemon serving `mnt`, parsed."""
    out = subprocess.run([ckptctl, "status", "--json", mnt], check=True, capture_output=True)
    return json.loads(out.stdout)


def tensor_modes(ckptctl, path):
    """name -> how the version at `path` coded each tensor (`ckptctl stat --json`): delta,
    ratio, intra, lossless or rounded."""
    return {t["name"]: t["mode"] for t in stat_json(ckptctl, path)["tensors"]}


def is_first_moment(name):
    """Adam's exp_avg by the key's last component: what a lossy keyframe with no head before it
    codes as its values (docs/codec.md, "Intra slabs", item 4)."""
    return name.split(".")[-1] == "exp_avg"


def keyframe_read_ok(got, want, name):
    """A keyframe's float tensor as read back at the mount's defaults, where no `ckptctl stat`
    mode says more: a first moment within |u| (coded as values, or rounded, which is within that
    too), every other tensor rounded to its chain's bits (keyframe_within)."""
    if is_first_moment(name):
        return beyond_value(got, want) == 0
    return keyframe_within(got, want, chain_bits(name))


def beyond_value(got, u):
    """How many elements read back further from their value than zero is: the bound of a
    tensor coded as its values (intra) in a keyframe."""
    return int(((got.double() - u.double()).abs() > u.double().abs()).sum())


def closed_loop_bound(u, base_read, mode):
    """Per element, how far a delta version may read back from what was saved (docs/codec.md,
    "Guarantees"): |u - base_read| (the closed loop against what its base read back as); a
    tensor with intra slabs (mode "intra" or "ratio+intra": coded as its values, as Adam's m is)
    is within |u| there and within |u - base_read| in any slab coded against its base."""
    bound = (u.double() - base_read.double()).abs()
    return bound.maximum(u.double().abs()) if "intra" in mode else bound


def rotate_checkpoints(root, keep, prefix="checkpoint-"):
    """Trainer._rotate_checkpoints: the oldest directories `<prefix><step>` beyond the newest
    `keep` go; returns the kept ones' names."""
    dirs = sorted((d for d in os.listdir(root) if d.startswith(prefix)),
                  key=lambda d: int(d[len(prefix):]))
    for d in dirs[:-keep]:
        shutil.rmtree(os.path.join(root, d))
    return dirs[-keep:]


def settle_rotation(ctl, mnt, store, deadline_s=60, watched=None):
    """Waits until the daemon has looked at the deletions and done its rewrites: nothing pending
    and the bytes under `watched` (default STORE/objects) the same twice in a row (the unrefs
    come after the journal sync, 1 s; the rewriter looks once a second). Returns the status."""
    watched = watched or os.path.join(store, "objects")
    deadline = time.monotonic() + deadline_s
    last = None
    while time.monotonic() < deadline:
        time.sleep(1.2)
        s = status_json(ctl, mnt)
        now = du(watched)
        if not s["rotation"]["pending"] and now == last:
            return s
        last = now
    raise AssertionError(f"the daemon did not settle its rotation work in {deadline_s} s")
