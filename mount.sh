#!/usr/bin/env bash
# The main command: build ckptfs (installing missing packages when run as root) and mount a store.
#   ./mount.sh [STORE [MOUNTPOINT]] [-o OPTIONS]   mount (defaults: ./ckpt-store at ./ckpt)
#   ./mount.sh -u MOUNTPOINT                       unmount; returns once the daemon has exited
#   ./mount.sh --help
# Exit status: 0 done, 1 failure (with the daemon's own message), 2 usage error.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
binary="$here/build/bin/ckptfs"
mount_timeout=${CKPTFS_MOUNT_TIMEOUT:-60}     # seconds until the mount must answer
unmount_timeout=${CKPTFS_UNMOUNT_TIMEOUT:-3600}  # seconds for pending files at unmount

usage() {
  cat <<USAGE
usage: ./mount.sh [STORE [MOUNTPOINT]] [-o OPTIONS]
       ./mount.sh -u MOUNTPOINT
       ./mount.sh --help

Builds ckptfs if needed (scripts/bootstrap.sh; installs missing Debian packages when run as
root), creates STORE and MOUNTPOINT, starts build/bin/ckptfs in the background and returns once
the mount answers. Defaults: STORE ./ckpt-store, MOUNTPOINT ./ckpt.

  -o OPTIONS   comma-separated: bits=1..4 (default 3), lossless, keyframe_interval=N|auto
               (default auto: 1 GiB / the checkpoint's size, within 20..1000),
               refresh_interval=N|off (default 5), weight_error=PCT|off (default off:
               the weights' error allowance), coding=grouped|paper, rep=midrange|mean,
               scope=tensor|checkpoint,
               optimizer=lossy|exact, relative=on|off (defaults first), cache=SIZE
               (default RAM/8, at most 2G), buffer=SIZE (default RAM/16, at most 1G),
               heads=auto|on|off (default auto), head_min=SIZE (64M), scratch=DIR
               (staging files and head images; default STORE), passthrough=on|off, and
               FUSE options such as allow_other. SIZE takes K/M/G/T suffixes.
               build/bin/ckptfs --help says more.
  -u MOUNTPOINT  unmount: files still being stored are finished first; returns when the
               daemon has exited.

The daemon logs to STORE/ckptfs.log. See docs/filesystem.md.
USAGE
}

die() { echo "mount.sh: $*" >&2; exit 1; }

# The store (fsname) of the ckptfs mounted at $1, from /proc/mounts; empty if none.
store_of() {
  local want=$1 src dst type rest
  while read -r src dst type rest; do
    dst=$(printf '%b' "$dst")
    if [[ "$dst" == "$want" && "$type" == fuse.ckptfs ]]; then printf '%b\n' "$src"; return; fi
  done </proc/mounts
}

unmount() {
  local mnt
  mnt=$(realpath -m -- "$1")
  local store
  store=$(store_of "$mnt")
  [[ -n "$store" ]] || die "$mnt is not a mounted ckptfs"
  local pid=""
  [[ -r "$store/ckptfs.pid" ]] && pid=$(<"$store/ckptfs.pid")
  if ! err=$(fusermount3 -u "$mnt" 2>&1); then
    # A dead daemon leaves "Transport endpoint is not connected": detach it anyway.
    if [[ "$err" == *"not connected"* ]]; then
      fusermount3 -uz "$mnt" || die "cannot unmount $mnt"
    else
      die "cannot unmount $mnt: $err"
    fi
  fi
  if [[ -n "$pid" ]]; then
    local waited=0
    # Exited = gone, or a zombie its (re)parent has not reaped yet.
    while kill -0 "$pid" 2>/dev/null && [[ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]]; do
      if ((waited == 10)); then echo "mount.sh: waiting for ckptfs (pid $pid) to store pending files..." >&2; fi
      if ((waited >= unmount_timeout * 10)); then die "ckptfs (pid $pid) still running after ${unmount_timeout}s"; fi
      sleep 0.1
      waited=$((waited + 1))
    done
  fi
  echo "ckptfs: unmounted $mnt"
}

positional=()
options=()
while (($#)); do
  case "$1" in
    -h | --help) usage; exit 0 ;;
    -u)
      (($# == 2)) || { echo "mount.sh: -u takes exactly one MOUNTPOINT" >&2; usage >&2; exit 2; }
      unmount "$2"
      exit 0
      ;;
    -o)
      (($# >= 2)) || { echo "mount.sh: -o needs OPTIONS" >&2; exit 2; }
      options+=("$2")
      shift 2
      ;;
    -o*) options+=("${1#-o}"); shift ;;
    -*) echo "mount.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
    *) positional+=("$1"); shift ;;
  esac
done
((${#positional[@]} <= 2)) || { echo "mount.sh: too many arguments" >&2; usage >&2; exit 2; }
store=${positional[0]:-./ckpt-store}
mnt=${positional[1]:-./ckpt}

CKPTFS_NO_TEST_PACKAGES=1 "$here/scripts/bootstrap.sh" || die "build failed (see above)"
[[ -x "$binary" ]] || die "$binary was not built"

mkdir -p -- "$store" "$mnt"
store=$(realpath -- "$store")
mnt=$(realpath -- "$mnt")
if mountpoint -q -- "$mnt"; then die "$mnt is already a mount point"; fi

args=("$store" "$mnt")
if ((${#options[@]})); then
  joined=$(IFS=,; echo "${options[*]}")
  args+=(-o "$joined")
fi
# Background mode returns once the mount is up, or with the daemon's error and status.
set +e
"$binary" "${args[@]}"
status=$?
set -e
((status == 0)) || exit "$status"

deadline=$((SECONDS + mount_timeout))
until mountpoint -q -- "$mnt" && stat -- "$mnt" >/dev/null 2>&1; do
  ((SECONDS < deadline)) || die "the mount at $mnt did not answer within ${mount_timeout}s (log: $store/ckptfs.log)"
  sleep 0.1
done
echo "ckptfs: $store is mounted at $mnt"
if [[ $(id -u) -ne 0 && ",${joined:-}," != *",allow_other,"* ]]; then
  # Root mounts are shared (allow_other); an unprivileged one is private unless asked.
  echo "ckptfs: only $(id -un) can use this mount; to share it with other users, add" \
    "user_allow_other to /etc/fuse.conf and mount with -o allow_other"
fi
echo "ckptfs: unmount with: $0 -u $mnt"
