"""Per-run cgroups of jailed commands: a process-count and a memory limit for the whole jail.

``ulimit`` limits are per process (``-v``) or do not bind root (``-u``): three processes of 1.5 GB
each fit under a 4 GiB address-space limit, and a fork bomb run as root is not stopped. A cgroup
counts the whole jail. :func:`new_run_cgroup` makes one child cgroup per run, with ``pids.max``
and a memory limit (v2 ``memory.max`` with ``memory.swap.max = 0``; v1 ``memory.limit_in_bytes``
and, where swap is accounted, ``memory.memsw.limit_in_bytes``), for each controller that a
writable hierarchy offers (cgroup v2, or the v1 ``pids`` and ``memory`` hierarchies). The jail's
first process joins them before it starts the command (:mod:`.reaper`), so everything the command
starts is counted; when the run ends, what is left in them is killed and they are removed.

Where no hierarchy is writable (an unprivileged trainer without delegation, a container without
cgroup access) the limit is absent: :func:`cgroup_support` says which limits this machine has.
"""

from __future__ import annotations

import functools
import os
import signal
import time
import uuid
from dataclasses import dataclass

__all__ = ["CgroupSupport", "RunCgroup", "cgroup_support", "new_run_cgroup"]

_PROC_MOUNTINFO = "/proc/self/mountinfo"
_PROC_CGROUP = "/proc/self/cgroup"


@dataclass(frozen=True)
class CgroupSupport:
    """Directories under which per-run cgroups with each limit can be made (None: no such limit)."""

    pids_base: str | None
    memory_base: str | None
    memory_v2: bool = False

    def describe(self) -> str:
        parts = [f"pids: {self.pids_base or 'unavailable'}", f"memory: {self.memory_base or 'unavailable'}"]
        return ", ".join(parts)


@dataclass
class RunCgroup:
    """The cgroup directories of one run (one per hierarchy) and what they limit."""

    directories: tuple[str, ...]
    memory_directory: str | None
    memory_v2: bool
    memory_limit: int | None

    def oom_kills(self) -> int:
        """Processes the kernel killed for the memory limit during the run."""
        if self.memory_directory is None:
            return 0
        name = "memory.events" if self.memory_v2 else "memory.oom_control"
        try:
            with open(os.path.join(self.memory_directory, name)) as handle:
                for line in handle:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def remove(self) -> None:
        """Kill what is left in the run's cgroups (escapees of the reaper) and remove them."""
        for directory in self.directories:
            _remove(directory)


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """(mount point, root inside the hierarchy, fstype, super options) of every cgroup mount."""
    found = []
    try:
        with open(_PROC_MOUNTINFO) as handle:
            for line in handle:
                fields = line.split()
                separator = fields.index("-")
                fstype = fields[separator + 1]
                if fstype in ("cgroup", "cgroup2"):
                    options = set(fields[separator + 3].split(",")) if len(fields) > separator + 3 else set()
                    found.append((fields[4].replace("\\040", " "), fields[3], fstype, options))
    except (OSError, ValueError):
        pass
    return found


def _own_paths() -> dict[str, str]:
    """This process's cgroup path per v1 controller, and under ``""`` its v2 path."""
    paths: dict[str, str] = {}
    try:
        with open(_PROC_CGROUP) as handle:
            for line in handle:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                for controller in controllers.split(",") if controllers else [""]:
                    paths[controller] = path
    except (OSError, ValueError):
        pass
    return paths


def _candidates(mount_point: str, mount_root: str, own: str | None) -> list[str]:
    """This process's own cgroup (so the run stays inside its limits) first, then the mount's root."""
    bases = []
    if own is not None and (own == mount_root or own.startswith(mount_root.rstrip("/") + "/")):
        bases.append(os.path.join(mount_point, os.path.relpath(own, mount_root)))
    bases.append(mount_point)
    return [os.path.normpath(b) for b in dict.fromkeys(bases)]


def _probe(base: str, control: str) -> bool:
    """A child of ``base`` can be made and has the control file ``control``."""
    probe = os.path.join(base, f"vc-jail-probe-{os.getpid()}-{uuid.uuid4().hex[:6]}")
    try:
        os.mkdir(probe)
    except OSError:
        return False
    try:
        return os.path.exists(os.path.join(probe, control))
    finally:
        try:
            os.rmdir(probe)
        except OSError:
            pass


@functools.lru_cache(maxsize=1)
def cgroup_support() -> CgroupSupport:
    """Where this machine lets this process make limited per-run cgroups (probed once)."""
    own = _own_paths()
    pids_base = memory_base = None
    memory_v2 = False
    for mount_point, mount_root, fstype, options in _mounts():
        if fstype == "cgroup2":
            for base in _candidates(mount_point, mount_root, own.get("")):
                if pids_base is None and _probe(base, "pids.max"):
                    pids_base = base
                if memory_base is None and _probe(base, "memory.max"):
                    memory_base, memory_v2 = base, True
        elif "pids" in options and pids_base is None:
            bases = _candidates(mount_point, mount_root, own.get("pids"))
            pids_base = next((b for b in bases if _probe(b, "pids.max")), None)
        elif "memory" in options and memory_base is None:
            bases = _candidates(mount_point, mount_root, own.get("memory"))
            memory_base = next((b for b in bases if _probe(b, "memory.limit_in_bytes")), None)
    return CgroupSupport(pids_base, memory_base, memory_v2)


def new_run_cgroup(max_processes: int, max_memory_bytes: int | None) -> RunCgroup | None:
    """Cgroups for one run with ``pids.max = max_processes`` and the memory limit (None: none);
    None when this machine has neither limit. A limit that cannot be set is left out."""
    support = cgroup_support()
    name = f"vc-jail-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    directories: list[str] = []
    memory_directory: str | None = None
    try:
        if support.memory_v2 and support.pids_base == support.memory_base:
            path = _make(support.memory_base, name)
            directories.append(path)
            _write(path, "pids.max", str(max(1, max_processes)))
            if max_memory_bytes is not None:
                _limit_memory_v2(path, max_memory_bytes)
                memory_directory = path
        else:
            if support.pids_base is not None:
                path = _make(support.pids_base, name)
                directories.append(path)
                _write(path, "pids.max", str(max(1, max_processes)))
            if support.memory_base is not None and max_memory_bytes is not None:
                path = _make(support.memory_base, name)
                directories.append(path)
                if support.memory_v2:
                    _limit_memory_v2(path, max_memory_bytes)
                else:
                    _write(path, "memory.limit_in_bytes", str(max_memory_bytes))
                    if os.path.exists(os.path.join(path, "memory.memsw.limit_in_bytes")):
                        _write(path, "memory.memsw.limit_in_bytes", str(max_memory_bytes))
                memory_directory = path
    except OSError:
        for path in directories:
            _remove(path)
        return None
    if not directories:
        return None
    return RunCgroup(tuple(directories), memory_directory, support.memory_v2, max_memory_bytes)


def _make(base: str, name: str) -> str:
    path = os.path.join(base, name)
    os.mkdir(path)
    return path


def _write(directory: str, name: str, value: str) -> None:
    with open(os.path.join(directory, name), "w") as handle:
        handle.write(value)


def _limit_memory_v2(path: str, limit: int) -> None:
    _write(path, "memory.max", str(limit))
    for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
        if os.path.exists(os.path.join(path, name)):
            _write(path, name, value)


def _remove(path: str) -> None:
    kill_file = os.path.join(path, "cgroup.kill")
    if os.path.exists(kill_file):
        try:
            _write(path, "cgroup.kill", "1")
        except OSError:
            pass
    for _ in range(40):
        try:
            with open(os.path.join(path, "cgroup.procs")) as handle:
                pids = [int(line) for line in handle if line.strip()]
        except OSError:
            pids = []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)
