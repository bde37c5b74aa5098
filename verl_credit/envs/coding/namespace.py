"""The namespace jail's view of the machine: what a jailed command sees, and the argv that builds it.

The command runs in new user, mount, PID and network namespaces (``unshare``). Its mount namespace
is built by :data:`NAMESPACE_SCRIPT` from an *allow-list*, not a deny-list:

* every mount is made read-only; ``/tmp`` is a fresh private tmpfs;
* of the top-level directories only :data:`VISIBLE_TOP_LEVEL` stay (the system: ``/usr``,
  ``/etc``, ``/lib*``, ``/bin``, ...); every other one (``/home``, ``/root``, ``/work``, ``/opt``,
  ``/srv``, ``/var``, ``/run``, ``/mnt``, ``/sys``, ...) is covered by an empty tmpfs, so no project
  checkout, its ``.git``, a home directory's caches or a host socket directory is there;
* the Python installation (venv and base prefix) and the sandbox root are bound back into those
  covers (read-only; the root read-write), and nothing else of them;
* ``/dev`` is a fresh tmpfs with only ``null``, ``zero``, ``full``, ``random``, ``urandom`` bound
  in, a private ``/dev/shm`` and the ``fd``/``stdin``/``stdout``/``stderr`` links: no host device
  (a GPU), no socket (``/dev/log``);
* the task data with its hidden tests, and any installed copy of this package (a non-editable
  install in ``site-packages``, :func:`project_copies`), are covered by empty read-only tmpfs.

Setup fails closed: if a mount cannot be made, the command is not run. Just before the command
starts, the script writes one byte to the *ready* descriptor (a pipe held by the trainer) and
closes it: a setup failure is an exit code 125 *without* that byte, so a command that prints the
setup-failure text and exits 125 is an ordinary command result, not a :class:`JailSetupError`.
"""

from __future__ import annotations

import functools
import os
import stat
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "JAIL_GID",
    "JAIL_UID",
    "NAMESPACE_SCRIPT",
    "SETUP_FAILED",
    "VISIBLE_TOP_LEVEL",
    "JailSetupError",
    "jail_covers",
    "jail_user",
    "namespace_argv",
    "project_copies",
    "python_dirs",
    "python_dirs_under_tmp",
    "top_level_covers",
]

SETUP_FAILED = "verl-credit-jail: setup failed:"
#: the unprivileged host user and group a namespace-jailed command runs as when this process is root
JAIL_UID = 65534
JAIL_GID = 65534
VISIBLE_TOP_LEVEL = frozenset({"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "dev", "proc", "tmp"})
"""Top-level directories a jailed command sees (read-only; ``/tmp`` and ``/dev`` private)."""


class JailSetupError(RuntimeError):
    """The namespace jail could not be set up; nothing was run."""


# $1 root  $2 command  $3 file-size limit (KiB)  $4 address-space limit (KiB)
# $5 ':'-separated directories to keep visible read-only (the Python installation) under /tmp or a cover
# $6 ':'-separated directories to cover with an empty tmpfs (not on the allow-list, or not traversable)
# $7 "uid:gid" to run the command as (host root only: see MAPPED_LAUNCH), or "" (as mapped root)
# $8 the ready descriptor ("" for none)  $9.. paths to hide
NAMESPACE_SCRIPT = r"""
set -u
fail() { echo "verl-credit-jail: setup failed: $*" >&2; exit 125; }
# every mount is -n: no /run/mount/utab bookkeeping (it would appear in the covered /run)
ROOT="$1"; CMD="$2"; FSIZE="$3"; VMEM="$4"; KEEP="$5"; COVER="$6"; AS="$7"; READY="$8"; shift 8
exec 3<"$ROOT" || fail "cannot open $ROOT"
KEEP_FDS=()
IFS=':' read -r -a KEEP_DIRS <<< "$KEEP"
IFS=':' read -r -a COVER_DIRS <<< "$COVER"
for keep in "${KEEP_DIRS[@]}"; do
  exec {fd}<"$keep" || fail "cannot open $keep"
  KEEP_FDS+=("$fd")
done
DEV_NAMES=(null zero full random urandom)
DEV_FDS=()
for name in "${DEV_NAMES[@]}"; do
  exec {fd}<"/dev/$name" || fail "cannot open /dev/$name"
  DEV_FDS+=("$fd")
done
mount -n --make-rprivate / || fail "make-rprivate"
while read -r _ _ _ _ mp _; do
  printf -v mp "%b" "$mp"
  mount -n -o remount,bind,ro "$mp" 2>/dev/null || fail "cannot make $mp read-only"
done < /proc/self/mountinfo
mount -n -t tmpfs -o size=256m,mode=1777 tmpfs /tmp || fail "private /tmp"
for cover in "${COVER_DIRS[@]}"; do
  mount -n -t tmpfs -o size=1m,mode=755 tmpfs "$cover" || fail "cover $cover"
done
mount -n -t tmpfs -o size=1m,mode=755 tmpfs /dev || fail "private /dev"
for i in "${!DEV_NAMES[@]}"; do
  node="/dev/${DEV_NAMES[$i]}"; fd="${DEV_FDS[$i]}"
  : > "$node" || fail "mknod $node"
  mount -n --no-canonicalize --bind "/proc/self/fd/$fd" "$node" || fail "bind $node"
  exec {fd}<&-
done
mkdir /dev/shm && mount -n -t tmpfs -o size=64m,mode=1777 tmpfs /dev/shm || fail "private /dev/shm"
ln -s /proc/self/fd /dev/fd && ln -s /proc/self/fd/0 /dev/stdin && ln -s /proc/self/fd/1 /dev/stdout \
  && ln -s /proc/self/fd/2 /dev/stderr || fail "/dev links"
for i in "${!KEEP_DIRS[@]}"; do
  keep="${KEEP_DIRS[$i]}"; fd="${KEEP_FDS[$i]}"
  mkdir -p "$keep" || fail "mkdir $keep"
  mount -n --no-canonicalize --bind "/proc/self/fd/$fd" "$keep" || fail "bind $keep"
  mount -n -o remount,bind,ro "$keep" || fail "make $keep read-only"
  exec {fd}<&-
done
mkdir -p "$ROOT" || fail "mkdir $ROOT"
mount -n --no-canonicalize --bind /proc/self/fd/3 "$ROOT" || fail "bind $ROOT"
mount -n -o remount,bind,rw "$ROOT" || fail "make $ROOT writable"
exec 3<&-
for hidden in "$@"; do
  [ -d "$hidden" ] || continue
  mount -n -t tmpfs -o ro,size=4k,mode=555 tmpfs "$hidden" || fail "hide $hidden"
done
cd "$ROOT" || fail "cd $ROOT"
ulimit -f "$FSIZE" || fail "ulimit -f"
ulimit -v "$VMEM" || fail "ulimit -v"
if [ -n "$READY" ]; then
  printf R >&"$READY" || fail "ready"
  exec {READY}>&-
fi
if [ -n "$AS" ]; then
  exec setpriv --reuid="${AS%:*}" --regid="${AS#*:}" --clear-groups \
    --bounding-set=-all --inh-caps=-all --no-new-privs -- bash -c "$CMD"
fi
exec setpriv --bounding-set=-all --inh-caps=-all --no-new-privs -- bash -c "$CMD"
"""

# Host root only. $1 uid  $2 gid of the jail user  $3.. the command to run in the new user namespace.
# ``unshare --map-root-user`` maps one id (root to root), so the command could only run as root;
# here this (root, outside) process writes a two-line map -- root and the jail user, each to itself
# -- which needs CAP_SETUID/CAP_SETGID outside (no newuidmap). The namespace's root does the mounts
# and the script then drops to the jail user, whose file accesses are checked as that host id.
MAPPED_LAUNCH = r"""
set -u
UMAP="0 0 1
$1 $1 1"
GMAP="0 0 1
$2 $2 1"
shift 2
unshare --user -- bash -c \
  'until read -r _ < /proc/self/uid_map && read -r _ < /proc/self/gid_map; do sleep 0.002; done; exec "$@"' \
  launch "$@" &
child=$!
mine=$(readlink /proc/self/ns/user)
for _ in $(seq 5000); do
  [ "$(readlink "/proc/$child/ns/user" 2>/dev/null)" != "$mine" ] && break
  kill -0 "$child" 2>/dev/null || break
  sleep 0.002
done
# one write(2) per map file (cat, not a shell builtin, which may write line by line)
if ! { cat <<< "$UMAP" > "/proc/$child/uid_map" && cat <<< "$GMAP" > "/proc/$child/gid_map"; } 2>/dev/null; then
  kill -KILL "$child" 2>/dev/null
  echo "verl-credit-jail: setup failed: cannot map the jail user $1:$2 in the user namespace" >&2
  exit 125
fi
wait "$child"
"""

_UNSHARE_ARGS = ("--user", "--map-root-user", "--net", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc")
_UNSHARE_INNER_ARGS = ("--net", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc")  # after MAPPED_LAUNCH


def jail_user(mode: str) -> tuple[int, int] | None:
    """``(uid, gid)`` the commands of a resolved jail ``mode`` run as when that is not this
    process's own user: :data:`JAIL_UID`/:data:`JAIL_GID` in the namespace mode when this process
    is root; otherwise None (the fallback mode runs as this process; a non-root process's namespace
    jail maps its own, already unprivileged, uid to root inside)."""
    if mode == "namespace" and os.geteuid() == 0:
        return JAIL_UID, JAIL_GID
    return None


def python_dirs() -> set[str]:
    """The real directories of this Python installation: venv, base prefix, the executable's."""
    return {
        os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable)))
    }


@functools.lru_cache(maxsize=1)
def python_dirs_under_tmp() -> tuple[str, ...]:
    """Directories of this Python installation (venv and base prefix) that lie under ``/tmp``.

    The jail mounts a private tmpfs on ``/tmp``; these are bound back read-only so that the
    sandbox's ``python``/``pytest`` still exist when the project (and its venv) lives in ``/tmp``.
    """
    under_tmp = sorted(d for d in python_dirs() if d == "/tmp" or d.startswith("/tmp/"))
    if "/tmp" in under_tmp or any(":" in d for d in under_tmp):
        raise JailSetupError(f"cannot keep the Python installation visible in the jail: {under_tmp}")
    # a directory inside another kept one is covered by it
    return tuple(d for d in under_tmp if not any(d != o and d.startswith(o + "/") for o in under_tmp))


def _traversable(path: str, uid: int, gid: int) -> bool:
    info = os.stat(path)
    if info.st_uid == uid:
        return bool(info.st_mode & stat.S_IXUSR)
    if info.st_gid == gid:
        return bool(info.st_mode & stat.S_IXGRP)
    return bool(info.st_mode & stat.S_IXOTH)


def jail_covers(dirs: Sequence[str], owner: tuple[int, int] | None) -> tuple[str, ...]:
    """Directories outside ``/tmp`` the jail covers with an empty tmpfs so that ``owner`` (the jail
    user) can reach ``dirs`` (the Python installation, the sandbox root) through them: for each
    dir, its topmost ancestor that ``owner`` cannot traverse (``/root``, mode 700, holding a pyenv
    Python). Inside the cover only the kept directories are bound back: the rest stays unseen."""
    if owner is None:
        return ()
    covers: set[str] = set()
    for directory in dirs:
        parts = Path(directory).parts
        for end in range(2, len(parts)):  # strict ancestors below /
            ancestor = os.path.join(*parts[:end])
            if ancestor == "/tmp" or ancestor.startswith("/tmp/"):
                break  # /tmp is a fresh tmpfs in the jail anyway
            try:
                if not _traversable(ancestor, *owner):
                    covers.add(ancestor)
                    break
            except OSError:
                break
    if any(":" in c for c in covers):
        raise JailSetupError(f"cannot cover {sorted(covers)} in the jail (':' in a path)")
    return _outermost(covers)


def top_level_covers(root: str = "/") -> tuple[str, ...]:
    """The top-level directories that are not on :data:`VISIBLE_TOP_LEVEL` (symlinks are skipped:
    their targets are top-level entries of their own, or visible system directories)."""
    covers = []
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return ()
    for name in names:
        path = os.path.join(root, name)
        if name in VISIBLE_TOP_LEVEL or ":" in name or os.path.islink(path) or not os.path.isdir(path):
            continue
        covers.append(path)
    return tuple(covers)


def _outermost(paths: set[str] | Sequence[str]) -> tuple[str, ...]:
    """``paths`` without those inside another of them (sorted)."""
    return tuple(sorted(p for p in set(paths) if not any(p != o and p.startswith(o.rstrip("/") + "/") for o in paths)))


def _kept_python_dirs(covers: Sequence[str]) -> tuple[str, ...]:
    """The Python installation's directories under ``/tmp`` or a cover (bound back read-only)."""
    kept = set(python_dirs_under_tmp())
    for directory in python_dirs():
        if any(directory == c or directory.startswith(c + "/") for c in covers):
            kept.add(directory)
    if any(":" in d for d in kept):
        raise JailSetupError(f"cannot keep the Python installation visible in the jail: {sorted(kept)}")
    return _outermost(kept)


@functools.lru_cache(maxsize=1)
def project_copies() -> tuple[str, ...]:
    """Directories holding this package (its tasks with their hidden tests and solutions) that the
    jail could otherwise read: the imported package, and any ``verl_credit`` directory in the
    ``site-packages``/``dist-packages`` of this Python installation (a stale non-editable install
    next to an editable one)."""
    package = Path(__file__).resolve().parents[2]  # verl_credit/envs/coding/namespace.py -> verl_credit
    found = {str(package)}
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    for prefix in {sys.prefix, sys.base_prefix, "/usr", "/usr/local"}:
        for site in (f"lib/{version}/site-packages", f"lib/{version}/dist-packages", "lib/python3/dist-packages"):
            candidate = os.path.join(prefix, site, "verl_credit")
            if os.path.isdir(candidate):
                found.add(os.path.realpath(candidate))
    return tuple(sorted(found))


def namespace_argv(
    root: str, command: str, fsize_kib: str, vmem_kib: str, hidden: Sequence[str], ready_fd: int | None = None
) -> list[str]:
    """The argv of one namespace-jailed command (see the module docstring)."""
    owner = jail_user("namespace")
    covers = _outermost([*top_level_covers(), *jail_covers([*python_dirs(), root], owner)])
    if any(":" in c for c in covers):
        raise JailSetupError(f"cannot cover {sorted(covers)} in the jail (':' in a path)")
    script = [NAMESPACE_SCRIPT, "jail", root, command, fsize_kib, vmem_kib]
    script += [":".join(_kept_python_dirs(covers)), ":".join(covers), f"{owner[0]}:{owner[1]}" if owner else ""]
    script.append("" if ready_fd is None else str(ready_fd))
    if owner is None:
        return ["unshare", *_UNSHARE_ARGS, "bash", "-c", *script, *hidden]
    launch = ["bash", "-c", MAPPED_LAUNCH, "launch", str(owner[0]), str(owner[1])]
    return [*launch, "unshare", *_UNSHARE_INNER_ARGS, "bash", "-c", *script, *hidden]
