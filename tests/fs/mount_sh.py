#!/usr/bin/python3
"""./mount.sh from a fresh directory: default STORE and MOUNTPOINT, a file survives -u and a
remount with options and mounts through mount.fuse3 as fstab does (fuse.ckptfs, ckptfs#STORE), -u returns only once the daemon has exited, bad options exit 2 with the
daemon's message, --help exits 0, -u of something that is not a ckptfs mount exits 1.

Usage: mount_sh.py REPO_ROOT    (as root; builds through scripts/bootstrap.sh if needed)
"""
import atexit
import os
import subprocess
import sys
import tempfile


def run(*args, cwd):
    return subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, timeout=600)


def main():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from ckptfs_testlib import require_fuse
    require_fuse()
    script = os.path.join(os.path.abspath(sys.argv[1]), "mount.sh")
    with tempfile.TemporaryDirectory(prefix="ckptfs-mountsh-") as tmp:
        mnt = os.path.join(tmp, "ckpt")
        atexit.register(lambda: subprocess.run(["fusermount3", "-uz", mnt], check=False,
                                               stderr=subprocess.DEVNULL))
        try:
            r = run(script, cwd=tmp)
            assert r.returncode == 0, r.stdout + r.stderr
            assert os.path.ismount(mnt), "not mounted after mount.sh returned 0"
            assert "-u" in r.stdout and mnt in r.stdout, r.stdout
            with open(os.path.join(mnt, "hello.txt"), "w") as f:
                f.write("hello\n")
            with open(os.path.join(tmp, "ckpt-store", "ckptfs.pid")) as f:
                pid = int(f.read())
            r = run(script, "-u", "ckpt", cwd=tmp)
            assert r.returncode == 0, r.stdout + r.stderr
            assert not os.path.ismount(mnt)
            try:
                with open(f"/proc/{pid}/stat") as f:
                    assert f.read().split()[2] == "Z", "daemon still running after -u"
            except FileNotFoundError:
                pass
            log = open(os.path.join(tmp, "ckpt-store", "ckptfs.log")).read()
            assert "clean exit" in log, log

            r = run(script, "ckpt-store", "ckpt", "-o", "bits=2,keyframe_interval=5", cwd=tmp)
            assert r.returncode == 0, r.stdout + r.stderr
            assert open(os.path.join(mnt, "hello.txt")).read() == "hello\n"
            r = run(script, "-u", mnt, cwd=tmp)
            assert r.returncode == 0, r.stdout + r.stderr

            # fstab conventions: mount.fuse3 runs `ckptfs STORE MNT -o OPTS` from PATH, with
            # the generic mount(8) options and the old `ckptfs#STORE` spelling.
            env = dict(os.environ, PATH=os.path.join(os.path.dirname(script), "build", "bin") +
                       ":" + os.environ["PATH"])
            for source, opts in ((os.path.join(tmp, "ckpt-store"), ["-t", "fuse.ckptfs"]),
                                 ("ckptfs#" + os.path.join(tmp, "ckpt-store"), [])):
                r = subprocess.run(["mount.fuse3", source, mnt] + opts +
                                   ["-o", "bits=2,noauto,nofail,defaults,rw,nosuid,nodev"],
                                   capture_output=True, text=True, env=env, timeout=60)
                assert r.returncode == 0, r.stderr
                assert open(os.path.join(mnt, "hello.txt")).read() == "hello\n"
                r = run(script, "-u", mnt, cwd=tmp)
                assert r.returncode == 0, r.stdout + r.stderr

            r = run(script, "other-store", "other", "-o", "bits=9", cwd=tmp)
            assert r.returncode == 2 and "bits" in r.stderr, (r.returncode, r.stderr)
            assert not os.path.ismount(os.path.join(tmp, "other"))
            r = run(script, "--help", cwd=tmp)
            assert r.returncode == 0 and "mount.sh -u MOUNTPOINT" in r.stdout
            r = run(script, "-u", tmp, cwd=tmp)
            assert r.returncode == 1 and "not a mounted ckptfs" in r.stderr, r.stderr
        finally:
            if os.path.ismount(mnt):
                subprocess.run(["fusermount3", "-uz", mnt], check=False)
    print("mount.sh: up, -u (waits for the daemon), remount with options, refusals")


if __name__ == "__main__":
    main()
