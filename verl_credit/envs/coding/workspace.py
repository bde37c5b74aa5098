"""Size-limited directories for a sandbox's workspace: the disk quota holds *during* a call.

Where this process may mount (root with ``CAP_SYS_ADMIN``), each directory jailed code writes --
the repository, the evaluation tree, the fallback mode's ``TMPDIR`` -- is its own tmpfs with
``size=`` and ``nr_inodes=``: the kernel refuses the write that would go over (``ENOSPC``), so one
call can never fill the host disk first and be cleaned up after. tmpfs lives in memory (and swap):
a sandbox holds at most its quota there, only what its files really use.

Elsewhere the directories are plain; the quota is then enforced by a *watchdog*: the jail checks
the tree's size every 0.25 s during the call (:func:`quota_violation`) and stops the command when it
is over, or when it nests directories deeper than the check can count; the sandbox deletes the
largest files after the call. Between two checks a fast writer can go past the quota by what it
writes in 0.25 s (plus the 64 MiB per-file limit).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import logging
import os
import tempfile
from collections.abc import Sequence

from verl_credit.envs.coding.beneath import MAX_DEPTH, walk

__all__ = ["mount_size_limited", "quota_violation", "size_limited_mounts_available", "unmount"]

_LOG = logging.getLogger(__name__)
_MS_NOSUID = 0x2
_MS_NODEV = 0x4
_MNT_DETACH = 0x2


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def mount_size_limited(path: str, size_bytes: int, max_inodes: int, mode: int = 0o755) -> None:
    """Mount a tmpfs of ``size_bytes`` and ``max_inodes`` on the empty directory ``path``.

    Raises:
        OSError: the mount was refused (no ``CAP_SYS_ADMIN``, a seccomp policy, ...).
    """
    options = f"size={max(4096, size_bytes)},nr_inodes={max(16, max_inodes)},mode={mode:o}".encode()
    result = _libc().mount(b"tmpfs", os.fsencode(path), b"tmpfs", _MS_NOSUID | _MS_NODEV, options)
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"cannot mount a size-limited tmpfs on {path}: {os.strerror(code)}")


def unmount(path: str) -> None:
    """Detach the mount on ``path`` (lazily: a process still inside cannot keep it from going)."""
    if _libc().umount2(os.fsencode(path), _MNT_DETACH) != 0:
        code = ctypes.get_errno()
        if code not in (errno.EINVAL, errno.ENOENT):  # not a mount point (any more)
            _LOG.warning("coding sandbox: cannot unmount %s: %s", path, os.strerror(code))


@functools.lru_cache(maxsize=1)
def size_limited_mounts_available() -> bool:
    """True when this process can mount size-limited tmpfs directories (probed once)."""
    if os.geteuid() != 0:
        return False
    probe = tempfile.mkdtemp(prefix="vc-quota-probe-")
    try:
        mount_size_limited(probe, 1 << 20, 64)
    except OSError:
        os.rmdir(probe)
        return False
    try:
        with open(os.path.join(probe, "big"), "wb") as handle:
            handle.write(b"\0" * (2 << 20))
        limited = False
    except OSError as exc:
        limited = exc.errno == errno.ENOSPC
    finally:
        unmount(probe)
        os.rmdir(probe)
    return limited


def quota_violation(directories: Sequence[int], limit: int) -> str | None:
    """Why the files under the directory descriptors break the disk quota, or None when they do not:
    more than ``limit`` bytes (the walk stops as soon as the total is over), or directories nested
    deeper than :data:`~verl_credit.envs.coding.beneath.MAX_DEPTH` levels, below which the walk
    cannot count (an unbounded walk would need one open descriptor per level)."""
    used = 0
    too_deep: list[tuple[str, ...]] = []
    for top in directories:
        for _, entry in walk(top, too_deep=too_deep):
            used += entry.size
            if used > limit:
                return f"the workspace went over its disk quota of {limit} bytes"
        if too_deep:
            return f"the workspace nests directories deeper than {MAX_DEPTH} levels, which the disk quota cannot count"
    return None
