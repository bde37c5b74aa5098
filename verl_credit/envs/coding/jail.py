"""Run one shell command jailed to a sandbox directory, with time, output, process, memory and
disk limits. What each mode guarantees, and what it does not, is in ``docs/sandbox.md``.

Two modes (``mode="auto"`` picks the first that works on this machine; the choice is reported in
every :class:`JailResult`):

``namespace`` -- Linux namespaces via ``unshare --user --net --mount --pid``
(:mod:`.namespace` builds the view):

* **filesystem**: an allow-list view: the system directories read-only, the Python installation
  read-only, the sandbox root read-write, a private ``/tmp`` and ``/dev``; every other top-level
  directory (a project checkout, home directories, ``/run``, ``/var``) is an empty tmpfs, and the
  task data with its hidden tests and any installed copy of this package are hidden.
* **network**: a new network namespace with no interfaces up -- no network, and no abstract unix
  socket of the host.
* **processes**: a new PID namespace: killing its init (the command's shell) kills everything in it.
* **privileges**: an empty capability bounding set and ``no_new_privs`` (``setpriv``); when this
  process is root, the command runs as the unprivileged host user :data:`JAIL_UID`:
  :data:`JAIL_GID` (``nobody:nogroup``): the user namespace maps root and that user each to
  itself, the namespace's root makes the mounts, then ``setpriv`` drops to it. The sandbox root
  must be writable by it (:func:`give_to_jail`). When this process is not root, the namespace maps
  its own (already unprivileged) uid to root inside.

  Setup fails closed: if any mount cannot be made the command is not run (:class:`JailSetupError`).

``fallback`` -- no namespaces (``unshare`` missing or forbidden). A plain subprocess in the sandbox
with a scrubbed environment (``HOME`` = sandbox, ``TMPDIR`` = a per-sandbox temp dir, proxies set
to a dead port) and a *lexical* pre-check that rejects commands naming ``..`` or absolute paths
outside the sandbox. This is a guard against accidents, not a security boundary: a command that
builds a path at run time (``$(...)``, ``python -c``) can still read and write anywhere this
process's user can and use the network. It runs as this process's user.

Both modes (every jailed command starts under :mod:`.reaper`):

* **no survivors**: the reaper is a child subreaper holding the command's whole tree; at the
  deadline, when the command ends, or when the trainer dies, it kills all of it, ``setsid`` or not;
* **no unix sockets**: a seccomp filter makes ``socket(AF_UNIX, ...)`` fail (x86-64, aarch64);
* **limits**: wall time; captured output (head and tail kept); file size (``ulimit -f``); address
  space per process (``ulimit -v``); processes and memory of the whole jail (a per-run cgroup with
  ``pids.max`` and a memory limit, :mod:`.cgroups`, where this machine has a writable hierarchy);
  an optional *watchdog* (the sandbox's disk quota) checked every 0.25 s while the command runs.

Neither mode is a defence against a kernel exploit.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from verl_credit.envs.coding.cgroups import cgroup_support, new_run_cgroup
from verl_credit.envs.coding.namespace import (
    JAIL_GID,
    JAIL_UID,
    SETUP_FAILED,
    JailSetupError,
    jail_covers,
    jail_user,
    namespace_argv,
    project_copies,
    python_dirs_under_tmp,
)
from verl_credit.envs.coding.process_runner import high_pipe, run_with_limits

__all__ = [
    "FALLBACK_COUNT",
    "JAIL_GID",
    "JAIL_MODES",
    "JAIL_UID",
    "JailResult",
    "JailSetupError",
    "check_command_paths",
    "fallback_count",
    "give_to_jail",
    "high_pipe",
    "jail_covers",
    "jail_user",
    "memory_cgroup_root",
    "namespace_jail_available",
    "pids_cgroup_root",
    "python_dirs_under_tmp",
    "resolve_jail_mode",
    "run_host",
    "run_jailed",
    "scrubbed_environment",
]

_LOG = logging.getLogger(__name__)
JAIL_MODES = ("auto", "namespace", "fallback")
_REAPER_SOURCE = (Path(__file__).with_name("reaper.py")).read_text(encoding="utf-8")

# $1 root  $2 command  $3 file-size limit (KiB)  $4 address-space limit (KiB)
_FALLBACK_SCRIPT = r"""
cd "$1" || exit 125
ulimit -f "$3"; ulimit -v "$4"
exec bash -c "$2"
"""

_STD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_DEAD_PROXY = "http://127.0.0.1:9"
_ALLOWED_ABSOLUTE = ("/dev/null", "/dev/stdin", "/dev/stdout", "/dev/stderr", "/dev/zero", "/dev/urandom")
_DEFAULT_JAIL_MEMORY = 4 * 1024 * 1024 * 1024


@dataclass(frozen=True)
class JailResult:
    """Outcome of one jailed command.

    ``exit_code`` is None when the command was killed at its time limit, stopped by the watchdog
    or rejected before running.
    """

    exit_code: int | None
    output: str
    timed_out: bool
    truncated_bytes: int
    seconds: float
    mode: str
    rejected: str | None = None  # why the fallback pre-check refused to run the command
    channel: bytes | None = None  # what the command wrote to ``$VC_CHANNEL_OUT`` (``channel_input`` runs)
    channel_overflow: bool = False  # the command wrote more than ``max_channel_bytes`` there
    stopped: str | None = None  # why the watchdog stopped the command (e.g. over the disk quota)
    oom_kills: int = 0  # processes killed at the jail's memory limit

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def scrubbed_environment(home: Path, tmpdir: Path | str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The whole environment of a jailed command: nothing is inherited from the host process."""
    python_bin = os.path.dirname(sys.executable)
    env = {
        "PATH": f"{python_bin}:{_STD_PATH}",
        "HOME": str(home),
        "TMPDIR": str(tmpdir),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TERM": "dumb",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
        "PYTHONUNBUFFERED": "1",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_TERMINAL_PROMPT": "0",
        "PIP_NO_INDEX": "1",
    }
    for name in ("http_proxy", "https_proxy", "ftp_proxy", "all_proxy"):
        env[name] = env[name.upper()] = _DEAD_PROXY
    env["no_proxy"] = env["NO_PROXY"] = ""
    env.update(extra or {})
    return env


def give_to_jail(path: Path | str, mode: str) -> None:
    """Make a directory tree *this process created* (and no jailed command has run in yet) the jail
    user's (:func:`jail_user`), so that jailed commands can write it; nothing when the jail runs as
    this process. Symlinks are changed themselves, never followed."""
    owner = jail_user(mode)
    if owner is None:
        return
    os.chown(path, *owner, follow_symlinks=False)
    if os.path.islink(path) or not os.path.isdir(path):
        return
    for directory, dirnames, filenames in os.walk(path):
        for name in (*dirnames, *filenames):
            os.chown(os.path.join(directory, name), *owner, follow_symlinks=False)


def pids_cgroup_root() -> str | None:
    """Where per-run cgroups with ``pids.max`` are made, or None (no process-count limit here)."""
    return cgroup_support().pids_base


def memory_cgroup_root() -> str | None:
    """Where per-run cgroups with a memory limit are made, or None (no whole-jail memory limit here)."""
    return cgroup_support().memory_base


@functools.lru_cache(maxsize=1)
def namespace_jail_available() -> bool:
    """True when the full namespace jail can be set up here (probed once per process)."""
    if shutil.which("unshare") is None or shutil.which("setpriv") is None:
        return False
    outside = Path(f"/usr/.vc-jail-probe-{os.getpid()}")  # must stay unwritable inside the jail
    owner = jail_user("namespace")
    check = f"touch inside && ! mkdir {outside} 2>/dev/null"
    if owner is not None:
        check += f' && [ "$(id -u):$(id -g)" = {owner[0]}:{owner[1]} ]'
    try:
        with tempfile.TemporaryDirectory(prefix="vc-jail-probe-") as tmp:
            real_tmp = os.path.realpath(tmp)
            give_to_jail(real_tmp, "namespace")
            completed = subprocess.run(
                namespace_argv(real_tmp, check, "65536", "4194304", ()),
                capture_output=True,
                timeout=60,  # a loaded machine (the setup is ~50 short processes)
                env=scrubbed_environment(Path(real_tmp), "/tmp"),
            )
            wrote_inside = os.path.exists(os.path.join(real_tmp, "inside"))
    except (OSError, subprocess.SubprocessError, JailSetupError):
        return False
    escaped = outside.exists()
    if escaped:
        outside.rmdir()
    return completed.returncode == 0 and wrote_inside and not escaped


_NAMESPACE_HELP = (
    "user namespaces are not usable here (unshare --user/--mount/--pid/--net or setpriv failed). In Docker, "
    "run the container with `--security-opt seccomp=unconfined --security-opt apparmor=unconfined` (or "
    "`--privileged`), and on the host check `sysctl user.max_user_namespaces` (> 0), "
    "`kernel.unprivileged_userns_clone=1` and `kernel.apparmor_restrict_unprivileged_userns=0`"
)
_FALLBACK_WARNED = False
FALLBACK_COUNT = 0
"""How many times ``jail='auto'`` resolved to the non-boundary ``fallback`` mode in this process
(one per sandbox); a trainer should export it as a metric and alert when it is not zero."""


def fallback_count() -> int:
    """:data:`FALLBACK_COUNT` (how often ``auto`` fell back to the non-boundary mode in this process)."""
    return FALLBACK_COUNT


def resolve_jail_mode(mode: str) -> str:
    """``auto`` -> ``namespace`` when available, else ``fallback`` (warned once, counted);
    ``namespace`` must be available (fail closed: :class:`JailSetupError` naming the fix)."""
    global FALLBACK_COUNT, _FALLBACK_WARNED
    if mode not in JAIL_MODES:
        raise ValueError(f"jail mode must be one of {JAIL_MODES}, got {mode!r}")
    if mode == "auto":
        if namespace_jail_available():
            return "namespace"
        FALLBACK_COUNT += 1
        if not _FALLBACK_WARNED:
            _FALLBACK_WARNED = True
            _LOG.warning(
                "coding sandbox: jail='auto' fell back to the 'fallback' mode, which is NOT a security "
                "boundary (agent commands can write anywhere this user can, use the network, read host "
                "files); %s. Use jail='namespace' to fail closed instead. Fallbacks are counted in "
                "verl_credit.envs.coding.jail.FALLBACK_COUNT.",
                _NAMESPACE_HELP,
            )
        return "fallback"
    if mode == "namespace" and not namespace_jail_available():
        raise JailSetupError(f"jail mode 'namespace' requested but {_NAMESPACE_HELP}")
    return mode


def check_command_paths(command: str, root: Path) -> str | None:
    """Lexical pre-check of the fallback mode: the reason to refuse ``command``, or None.

    Refuses ``..`` path components and absolute paths outside ``root`` (except a few device files).
    Heuristic only: paths built at run time are not seen.
    """
    if "\x00" in command:
        return "the command line contains a NUL byte"
    try:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
    except ValueError as exc:
        return f"cannot parse the command line ({exc})"
    real_root = os.path.realpath(root)
    for token in tokens:
        for part in token.replace("=", " ").replace(":", " ").split():
            if ".." in part.split("/"):
                return f"'..' in {part!r} would leave the sandbox"
            if part.startswith("/"):
                if part in _ALLOWED_ABSOLUTE or part == sys.executable:
                    continue
                resolved = os.path.realpath(part)
                if os.path.commonpath([real_root, resolved]) != real_root:
                    return f"absolute path {part!r} is outside the sandbox"
    return None


def _check_seconds(timeout_s: float) -> None:
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not math.isfinite(timeout_s):
        raise ValueError(f"timeout_s must be a finite number of seconds, got {timeout_s!r}")
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")


def run_jailed(
    command: str,
    root: Path,
    *,
    timeout_s: float = 10.0,
    max_output_bytes: int = 16_384,
    max_file_bytes: int = 64 * 1024 * 1024,
    max_memory_bytes: int = 4 * 1024 * 1024 * 1024,
    mode: str = "auto",
    hide_paths: Sequence[Path] = (),
    fallback_tmpdir: Path | None = None,
    env_extra: Mapping[str, str] | None = None,
    channel_input: bytes | None = None,
    max_channel_bytes: int = 4 * 1024 * 1024,
    max_processes: int = 256,
    child_fds: Mapping[str, int] | None = None,
    max_jail_memory_bytes: int | None = _DEFAULT_JAIL_MEMORY,
    watchdog: Callable[[], str | None] | None = None,
) -> JailResult:
    """Run ``bash -c command`` with cwd ``root`` inside the jail (see the module docstring).

    Args:
        command: a bash command line.
        root: the only writable directory (must exist).
        timeout_s: wall-clock limit (finite, > 0); the whole process tree is killed at the deadline.
        max_output_bytes: stdout+stderr bytes kept (head and tail halves); the rest is counted.
        max_file_bytes: largest file the command may write (``ulimit -f``).
        max_memory_bytes: address-space limit of each process (``ulimit -v``).
        mode: ``auto`` | ``namespace`` | ``fallback``.
        hide_paths: directories made invisible (namespace mode only).
        fallback_tmpdir: ``TMPDIR`` in fallback mode (default: ``root``).
        env_extra: extra environment variables.
        channel_input: when given, the command gets two extra pipes held by this process: it reads
            ``channel_input`` from the fd named by ``$VC_CHANNEL_IN`` and what it writes to the fd
            named by ``$VC_CHANNEL_OUT`` comes back as :attr:`JailResult.channel`. No file is
            involved, so nothing the command leaves behind (an ``atexit`` hook, a background
            process) can rewrite what was already sent -- it can only append.
        max_channel_bytes: channel bytes kept; more sets :attr:`JailResult.channel_overflow`.
        max_processes: tasks (processes + threads) the whole jail may have at once (pids cgroup,
            where :func:`pids_cgroup_root` finds one; ``ulimit -u`` does not bind root).
        child_fds: environment variable name -> file descriptor (>= 100, see :func:`high_pipe`) to
            hand to the command, e.g. one end of a pipe to a process outside the jail. The fds
            belong to this call from then on: they are closed here once the command has started
            (or failed to), so that only the command holds them.
        max_jail_memory_bytes: memory of the whole jail (cgroup, where :func:`memory_cgroup_root`
            finds one; None: no such limit). Over it the kernel kills a process of the jail.
        watchdog: called every 0.25 s while the command runs; a returned reason stops it
            (:attr:`JailResult.stopped`).

    Raises:
        JailSetupError: the jail could not be set up (nothing was run).
        ValueError: ``timeout_s`` is not a finite positive number, or ``command`` holds a NUL.
    """
    try:
        _check_seconds(timeout_s)
        if "\x00" in command:
            raise ValueError("the command line contains a NUL byte")
        resolved_mode = resolve_jail_mode(mode)
        real_root = Path(os.path.realpath(root))
        if not real_root.is_dir():
            raise FileNotFoundError(f"sandbox root {real_root} does not exist")
    except BaseException:
        _close_all(child_fds)
        raise
    fsize_kib = str(max(1, max_file_bytes // 1024))
    vmem_kib = str(max(1, max_memory_bytes // 1024))
    ready_read, ready_write = high_pipe()
    try:
        if resolved_mode == "namespace":
            hidden = [
                p
                for p in dict.fromkeys([*(str(p) for p in hide_paths), *project_copies()])
                if not _is_within(real_root, Path(os.path.realpath(p)))
            ]
            argv = namespace_argv(str(real_root), command, fsize_kib, vmem_kib, hidden, ready_fd=ready_write)
            env = scrubbed_environment(real_root, "/tmp", env_extra)
        else:
            reason = check_command_paths(command, real_root)
            if reason is not None:
                _close_all(child_fds)
                return JailResult(
                    None, f"command rejected by the sandbox: {reason}", False, 0, 0.0, resolved_mode, reason
                )
            argv = ["bash", "-c", _FALLBACK_SCRIPT, "jail", str(real_root), command, fsize_kib, vmem_kib]
            env = scrubbed_environment(real_root, fallback_tmpdir or real_root, env_extra)
        cgroup = new_run_cgroup(max_processes, max_jail_memory_bytes)
        handed, child_fds = child_fds, None  # owned by _run_reaped from here on (closed there)
        ready_child, ready_write = ready_write, -1
        try:
            outcome, ready = _run_reaped(
                argv,
                env,
                real_root,
                timeout_s,
                max_output_bytes,
                channel_input,
                max_channel_bytes,
                handed,
                cgroups=cgroup.directories if cgroup is not None else (),
                ready=(ready_read, ready_child),
                announce_ready=resolved_mode != "namespace",
                watchdog=watchdog,
            )
            oom_kills = cgroup.oom_kills() if cgroup is not None else 0
        finally:
            if cgroup is not None:
                cgroup.remove()
    except BaseException:
        _close_all(child_fds)
        raise
    finally:
        for fd in (ready_read, ready_write):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
    if outcome.exit_code == 125 and not ready:
        lines = outcome.output.strip().splitlines()
        raise JailSetupError(lines[-1] if lines else f"{SETUP_FAILED} the jail exited with 125 before the command")
    return JailResult(
        outcome.exit_code,
        outcome.output,
        outcome.timed_out,
        outcome.dropped,
        outcome.seconds,
        resolved_mode,
        None,
        outcome.channel,
        outcome.channel_overflow,
        outcome.stopped,
        oom_kills,
    )


def run_host(
    argv: Sequence[str],
    cwd: Path,
    env: Mapping[str, str],
    *,
    timeout_s: float,
    max_output_bytes: int = 16_384,
    channel_input: bytes | None = None,
    max_channel_bytes: int = 4 * 1024 * 1024,
    child_fds: Mapping[str, int] | None = None,
) -> JailResult:
    """Run a *trusted* command (the trainer's own code, e.g. the hidden-test process) outside the
    jail, with the same deadline, output budget, channel and ``child_fds`` handling as
    :func:`run_jailed`. It gets exactly ``env``; :attr:`JailResult.mode` is ``"host"``."""
    try:
        _check_seconds(timeout_s)
    except ValueError:
        _close_all(child_fds)
        raise
    outcome = _run_with_channel(
        list(argv), dict(env), Path(cwd), timeout_s, max_output_bytes, channel_input, max_channel_bytes, child_fds
    )
    return JailResult(
        outcome.exit_code,
        outcome.output,
        outcome.timed_out,
        outcome.dropped,
        outcome.seconds,
        "host",
        None,
        outcome.channel,
        outcome.channel_overflow,
    )


def _run_reaped(
    argv: list[str],
    env: dict[str, str],
    cwd: Path,
    timeout_s: float,
    max_output_bytes: int,
    channel_input: bytes | None,
    max_channel_bytes: int,
    child_fds: Mapping[str, int] | None,
    *,
    cgroups: Sequence[str],
    ready: tuple[int, int],
    announce_ready: bool,
    watchdog: Callable[[], str | None] | None,
):
    """``argv`` under the reaper (:mod:`.reaper`); returns the outcome and whether the jail's setup
    finished (the ready byte arrived)."""
    ready_read, ready_write = ready
    try:
        if any(":" in group for group in cgroups):
            raise JailSetupError(f"{SETUP_FAILED} cgroup paths must not contain ':': {list(cgroups)}")
        lifeline_read, lifeline_write = high_pipe()
    except BaseException:
        os.close(ready_write)
        _close_all(child_fds)
        raise
    # the namespace launch as root re-gains capabilities by an exec: no_new_privs would stop it
    no_new_privs_ok = announce_ready or jail_user("namespace") is None
    spec = [str(lifeline_read), str(ready_write) if announce_ready else "-", "1", "1" if no_new_privs_ok else "0"]
    reaped = [sys.executable, "-I", "-S", "-c", _REAPER_SOURCE, *spec, ":".join(cgroups), *argv]
    outcome = _run_with_channel(
        reaped,
        env,
        cwd,
        timeout_s,
        max_output_bytes,
        channel_input,
        max_channel_bytes,
        child_fds,
        extra_child_fds=(lifeline_read, ready_write),
        lifeline_fd=lifeline_write,
        watchdog=watchdog,
    )
    os.set_blocking(ready_read, False)
    try:
        was_ready = os.read(ready_read, 1) == b"R"
    except BlockingIOError:
        was_ready = False
    return outcome, was_ready


def _run_with_channel(
    argv: list[str],
    env: dict[str, str],
    cwd: Path,
    timeout_s: float,
    max_output_bytes: int,
    channel_input: bytes | None,
    max_channel_bytes: int,
    child_fds: Mapping[str, int] | None,
    *,
    extra_child_fds: Sequence[int] = (),
    lifeline_fd: int | None = None,
    watchdog: Callable[[], str | None] | None = None,
):
    """:func:`run_with_limits` with the optional channel pipes and the handed fds set up (and
    every child-side fd closed once the child started, or on failure)."""
    handed = dict(child_fds or {})
    env = {**env, **{name: str(fd) for name, fd in handed.items()}}
    child_side = [*handed.values(), *extra_child_fds]
    child_in = parent_out = parent_in = child_out = -1
    started = False
    try:
        if channel_input is not None:
            if len(channel_input) > 60_000:  # one pipe buffer: written before the child starts
                raise ValueError("channel_input must be at most 60000 bytes")
            child_in, parent_out = high_pipe()
            parent_in, child_out = high_pipe()
            os.write(parent_out, channel_input)
            os.close(parent_out)
            parent_out = -1
            env = {**env, "VC_CHANNEL_IN": str(child_in), "VC_CHANNEL_OUT": str(child_out)}
            child_side = [child_in, child_out, *child_side]
        started = True  # run_with_limits closes the child side and the lifeline from here on
        return run_with_limits(
            argv,
            env,
            cwd,
            timeout_s,
            max_output_bytes,
            pass_fds=child_side,
            channel_fd=parent_in if channel_input is not None else None,
            max_channel_bytes=max_channel_bytes,
            close_after_start=child_side,
            lifeline_fd=lifeline_fd,
            watchdog=watchdog,
        )
    finally:
        leftovers = [parent_in, parent_out]
        if not started:
            leftovers += [*child_side, child_in, child_out]
            if lifeline_fd is not None:
                leftovers.append(lifeline_fd)
        for fd in dict.fromkeys(leftovers):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass


def _close_all(fds: Mapping[str, int] | None) -> None:
    for fd in (fds or {}).values():
        try:
            os.close(fd)
        except OSError:
            pass


def _is_within(parent: Path, child: Path) -> bool:
    """True when ``parent`` lies inside ``child`` (hiding ``child`` would hide the sandbox)."""
    return os.path.commonpath([str(parent), str(child)]) == str(child)
