"""Run one shell command jailed to a sandbox directory, with a time and an output limit.

Two modes (``mode="auto"`` picks the first that works on this machine; the choice is reported in
every :class:`JailResult`):

``namespace`` -- Linux namespaces via ``unshare --user --map-root-user --net --mount --pid``:

* **filesystem**: every mount is remounted read-only in a private mount namespace; the sandbox
  directory is bind-mounted back read-write; ``/tmp`` is a fresh private tmpfs (writes there are
  contained and vanish with the command); ``hide_paths`` (the shipped task data with its hidden
  tests) are covered by an empty read-only tmpfs. Reads elsewhere are allowed (Python and its
  libraries must load).
* **network**: a new network namespace with no interfaces up -- no network at all.
* **processes**: a new PID namespace; when the command's shell exits or is killed, the kernel
  kills every process left in it (no background survivors).
* **privileges**: the command runs with an empty capability bounding set and ``no_new_privs``
  (``setpriv``), so it cannot undo the read-only remounts or mount anything.
* **limits**: wall time (the whole process group is SIGKILLed at the deadline), captured output
  (head and tail kept, the middle dropped and counted), file size (``ulimit -f``), address space
  (``ulimit -v``), process count (a per-run pids cgroup with ``pids.max``, both modes, where
  :func:`pids_cgroup_root` finds a writable pids cgroup; otherwise none -- ``ulimit -u`` does not
  bind host root).
* **user**: when this process is root, the command runs as the unprivileged host user
  :data:`JAIL_UID`:`JAIL_GID` (``nobody:nogroup``, no supplementary groups): the user namespace maps
  root and that user each to itself (:data:`_MAPPED_LAUNCH`; the mount setup runs as the
  namespace's root), then ``setpriv`` drops to it. File access is checked against that host id, so
  root-only files (``/etc/shadow``, ``/root``) are unreadable and what the command creates is owned
  by it. The sandbox root must be writable by it: the coding sandbox hands the trees it creates to
  the jail user (:func:`give_to_jail`; a direct :func:`run_jailed` caller does the same). A
  directory the jail user cannot traverse on the way to the Python installation or the sandbox root
  (a pyenv Python under ``/root``, mode 700) is covered by an empty tmpfs holding only those
  directories, bound back (:func:`jail_covers`). When this process is not root, the namespace maps
  its own uid to root inside: the command's file accesses are checked as that (already
  unprivileged) host uid, and no id is dropped (one id is all a user namespace can map without
  ``newuidmap``).

  Setup fails closed: if any mount cannot be made read-only the command is not run.

``fallback`` -- no namespaces (``unshare`` missing or forbidden). A plain subprocess in the sandbox
with a scrubbed environment (``HOME`` = sandbox, ``TMPDIR`` = a per-sandbox temp dir, proxies set
to a dead port), the same time/output/file-size limits, and a *lexical* pre-check that rejects
commands naming ``..`` or absolute paths outside the sandbox. This is a guard against accidents,
not a security boundary: a command that builds a path at run time (``$(...)``, ``python -c``)
can still write anywhere the user can, open sockets, or leave ``setsid`` processes behind. It runs
as this process's user (root stays root: a dropped user could not reach a Python installation
under ``/root`` without the namespace mode's bind mounts).

Neither mode is a defence against a hostile kernel exploit; the namespace mode is a reasonable
training sandbox for a policy that was never meant to attack it.
"""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import selectors
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

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
    "namespace_jail_available",
    "pids_cgroup_root",
    "resolve_jail_mode",
    "run_host",
    "run_jailed",
    "scrubbed_environment",
]

_LOG = logging.getLogger(__name__)
JAIL_MODES = ("auto", "namespace", "fallback")
_SETUP_FAILED = "verl-credit-jail: setup failed:"

# $1 root  $2 command  $3 file-size limit (KiB)  $4 address-space limit (KiB)
# $5 ':'-separated directories to keep visible read-only (the Python installation) under /tmp or a cover
# $6 ':'-separated directories to cover with an empty tmpfs (not traversable by the jail user)
# $7 "uid:gid" to run the command as (host root only: see _MAPPED_LAUNCH), or "" (as mapped root)
# $8.. paths to hide
_NAMESPACE_SCRIPT = r"""
set -u
fail() { echo "verl-credit-jail: setup failed: $*" >&2; exit 125; }
ROOT="$1"; CMD="$2"; FSIZE="$3"; VMEM="$4"; KEEP="$5"; COVER="$6"; AS="$7"; shift 7
exec 3<"$ROOT" || fail "cannot open $ROOT"
KEEP_FDS=()
IFS=':' read -r -a KEEP_DIRS <<< "$KEEP"
IFS=':' read -r -a COVER_DIRS <<< "$COVER"
for keep in "${KEEP_DIRS[@]}"; do
  exec {fd}<"$keep" || fail "cannot open $keep"
  KEEP_FDS+=("$fd")
done
mount --make-rprivate / || fail "make-rprivate"
while read -r _ _ _ _ mp _; do
  printf -v mp "%b" "$mp"
  mount -o remount,bind,ro "$mp" 2>/dev/null || fail "cannot make $mp read-only"
done < /proc/self/mountinfo
mount -t tmpfs -o size=256m,mode=1777 tmpfs /tmp || fail "private /tmp"
for cover in "${COVER_DIRS[@]}"; do
  mount -t tmpfs -o size=1m,mode=755 tmpfs "$cover" || fail "cover $cover"
done
for i in "${!KEEP_DIRS[@]}"; do
  keep="${KEEP_DIRS[$i]}"; fd="${KEEP_FDS[$i]}"
  mkdir -p "$keep" || fail "mkdir $keep"
  mount --no-canonicalize --bind "/proc/self/fd/$fd" "$keep" || fail "bind $keep"
  mount -o remount,bind,ro "$keep" || fail "make $keep read-only"
  exec {fd}<&-
done
mkdir -p "$ROOT" || fail "mkdir $ROOT"
mount --no-canonicalize --bind /proc/self/fd/3 "$ROOT" || fail "bind $ROOT"
mount -o remount,bind,rw "$ROOT" || fail "make $ROOT writable"
exec 3<&-
for hidden in "$@"; do
  [ -d "$hidden" ] || continue
  mount -t tmpfs -o ro,size=4k,mode=555 tmpfs "$hidden" || fail "hide $hidden"
done
cd "$ROOT" || fail "cd $ROOT"
ulimit -f "$FSIZE" || fail "ulimit -f"
ulimit -v "$VMEM" || fail "ulimit -v"
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
_MAPPED_LAUNCH = r"""
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

# $1 root  $2 command  $3 file-size limit (KiB)  $4 address-space limit (KiB)
_FALLBACK_SCRIPT = r"""
cd "$1" || exit 125
ulimit -f "$3"; ulimit -v "$4"
exec bash -c "$2"
"""

_UNSHARE_ARGS = ("--user", "--map-root-user", "--net", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc")
_UNSHARE_INNER_ARGS = ("--net", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc")  # after _MAPPED_LAUNCH
#: the unprivileged host user and group a namespace-jailed command runs as when this process is root
JAIL_UID = 65534
JAIL_GID = 65534
_STD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_DEAD_PROXY = "http://127.0.0.1:9"
_ALLOWED_ABSOLUTE = ("/dev/null", "/dev/stdin", "/dev/stdout", "/dev/stderr", "/dev/zero", "/dev/urandom")


class JailSetupError(RuntimeError):
    """The namespace jail could not be set up; nothing was run."""


@dataclass(frozen=True)
class JailResult:
    """Outcome of one jailed command.

    ``exit_code`` is None when the command was killed at its time limit or rejected before running.
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


@functools.lru_cache(maxsize=1)
def python_dirs_under_tmp() -> tuple[str, ...]:
    """Directories of this Python installation (venv and base prefix) that lie under ``/tmp``.

    The jail mounts a private tmpfs on ``/tmp``; these are bound back read-only so that the
    sandbox's ``python``/``pytest`` still exist when the project (and its venv) lives in ``/tmp``.
    """
    dirs = {
        os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable)))
    }
    under_tmp = sorted(d for d in dirs if d == "/tmp" or d.startswith("/tmp/"))
    if "/tmp" in under_tmp or any(":" in d for d in under_tmp):
        raise JailSetupError(f"cannot keep the Python installation visible in the jail: {under_tmp}")
    # a directory inside another kept one is covered by it
    return tuple(d for d in under_tmp if not any(d != o and d.startswith(o + "/") for o in under_tmp))


def jail_user(mode: str) -> tuple[int, int] | None:
    """``(uid, gid)`` the commands of a resolved jail ``mode`` run as when that is not this
    process's own user: :data:`JAIL_UID`/:data:`JAIL_GID` in the namespace mode when this process
    is root; otherwise None (the fallback mode runs as this process; a non-root process's namespace
    jail maps its own, already unprivileged, uid to root inside)."""
    if mode == "namespace" and os.geteuid() == 0:
        return JAIL_UID, JAIL_GID
    return None


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


def _python_dirs() -> set[str]:
    return {
        os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable)))
    }


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
    return tuple(sorted(c for c in covers if not any(c != o and c.startswith(o + "/") for o in covers)))


def _kept_python_dirs(covers: Sequence[str]) -> tuple[str, ...]:
    """The Python installation's directories under ``/tmp`` or a cover (bound back read-only)."""
    kept = set(python_dirs_under_tmp())
    for directory in _python_dirs():
        if any(directory == c or directory.startswith(c + "/") for c in covers):
            kept.add(directory)
    if any(":" in d for d in kept):
        raise JailSetupError(f"cannot keep the Python installation visible in the jail: {sorted(kept)}")
    return tuple(sorted(d for d in kept if not any(d != o and d.startswith(o + "/") for o in kept)))


def _namespace_argv(root: str, command: str, fsize_kib: str, vmem_kib: str, hidden: Sequence[str]) -> list[str]:
    """The argv of one namespace-jailed command (see the module docstring)."""
    owner = jail_user("namespace")
    covers = jail_covers([*_python_dirs(), root], owner)
    script = [_NAMESPACE_SCRIPT, "jail", root, command, fsize_kib, vmem_kib]
    script += [":".join(_kept_python_dirs(covers)), ":".join(covers), f"{owner[0]}:{owner[1]}" if owner else ""]
    if owner is None:
        return ["unshare", *_UNSHARE_ARGS, "bash", "-c", *script, *hidden]
    launch = ["bash", "-c", _MAPPED_LAUNCH, "launch", str(owner[0]), str(owner[1])]
    return [*launch, "unshare", *_UNSHARE_INNER_ARGS, "bash", "-c", *script, *hidden]


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
                _namespace_argv(real_tmp, check, "65536", "4194304", ()),
                capture_output=True,
                timeout=20,
                env=scrubbed_environment(Path(real_tmp), "/tmp"),
            )
            wrote_inside = os.path.exists(os.path.join(real_tmp, "inside"))
    except (OSError, subprocess.SubprocessError):
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
) -> JailResult:
    """Run ``bash -c command`` with cwd ``root`` inside the jail (see the module docstring).

    Args:
        command: a bash command line.
        root: the only writable directory (must exist).
        timeout_s: wall-clock limit; the whole process tree is killed at the deadline.
        max_output_bytes: stdout+stderr bytes kept (head and tail halves); the rest is counted.
        max_file_bytes: largest file the command may write (``ulimit -f``).
        max_memory_bytes: address-space limit (``ulimit -v``).
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
        max_processes: tasks (processes + threads) the command may have at once, enforced with a
            pids cgroup per run when :func:`pids_cgroup_root` finds one (``ulimit -u`` does not
            bind root, and the jail's processes are host root); a fork bomb then fails with
            ``EAGAIN`` instead of filling the machine until the deadline.
        child_fds: environment variable name -> file descriptor (>= 100, see :func:`high_pipe`) to
            hand to the command, e.g. one end of a pipe to a process outside the jail. The fds
            belong to this call from then on: they are closed here once the command has started
            (or failed to), so that only the command holds them.

    Raises:
        JailSetupError: the namespace jail could not be set up (nothing was run).
    """
    try:
        resolved_mode = resolve_jail_mode(mode)
        real_root = Path(os.path.realpath(root))
        if not real_root.is_dir():
            raise FileNotFoundError(f"sandbox root {real_root} does not exist")
    except BaseException:
        _close_all(child_fds)
        raise
    fsize_kib = str(max(1, max_file_bytes // 1024))
    vmem_kib = str(max(1, max_memory_bytes // 1024))
    if resolved_mode == "namespace":
        hidden = [str(p) for p in hide_paths if not _is_within(real_root, Path(os.path.realpath(p)))]
        try:
            argv = _namespace_argv(str(real_root), command, fsize_kib, vmem_kib, hidden)
        except BaseException:
            _close_all(child_fds)
            raise
        env = scrubbed_environment(real_root, "/tmp", env_extra)
    else:
        reason = check_command_paths(command, real_root)
        if reason is not None:
            _close_all(child_fds)
            return JailResult(None, f"command rejected by the sandbox: {reason}", False, 0, 0.0, resolved_mode, reason)
        argv = ["bash", "-c", _FALLBACK_SCRIPT, "jail", str(real_root), command, fsize_kib, vmem_kib]
        env = scrubbed_environment(real_root, fallback_tmpdir or real_root, env_extra)
    cgroup = _new_pids_cgroup(max_processes)
    if cgroup is not None:
        argv = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', cgroup, *argv]
    try:
        return _run_argv(
            argv,
            env,
            real_root,
            timeout_s,
            max_output_bytes,
            resolved_mode,
            channel_input,
            max_channel_bytes,
            child_fds,
        )
    finally:
        if cgroup is not None:
            _remove_cgroup(cgroup)


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
    return _run_argv(
        list(argv),
        dict(env),
        Path(cwd),
        timeout_s,
        max_output_bytes,
        "host",
        channel_input,
        max_channel_bytes,
        child_fds,
    )


def _run_argv(
    argv: list[str],
    env: dict[str, str],
    real_root: Path,
    timeout_s: float,
    max_output_bytes: int,
    resolved_mode: str,
    channel_input: bytes | None,
    max_channel_bytes: int,
    child_fds: Mapping[str, int] | None = None,
) -> JailResult:
    handed = dict(child_fds or {})
    env = {**env, **{name: str(fd) for name, fd in handed.items()}}
    if channel_input is None:
        exit_code, output, timed_out, dropped, seconds, _ = _run_with_limits(
            argv,
            env,
            real_root,
            timeout_s,
            max_output_bytes,
            pass_fds=tuple(handed.values()),
            close_after_start=tuple(handed.values()),
        )
        channel: bytes | None = None
        overflow = False
    else:
        child_in = parent_out = parent_in = child_out = -1
        child_fds_owned = True
        try:
            if len(channel_input) > 60_000:  # one pipe buffer: written before the child starts
                raise ValueError("channel_input must be at most 60000 bytes")
            child_in, parent_out = high_pipe()
            parent_in, child_out = high_pipe()
            os.write(parent_out, channel_input)
            os.close(parent_out)
            parent_out = -1
            child_fds_owned = False  # _run_with_limits closes them once the child has started
            env = {**env, "VC_CHANNEL_IN": str(child_in), "VC_CHANNEL_OUT": str(child_out)}
            exit_code, output, timed_out, dropped, seconds, extra = _run_with_limits(
                argv,
                env,
                real_root,
                timeout_s,
                max_output_bytes,
                pass_fds=(child_in, child_out, *handed.values()),
                channel_fd=parent_in,
                max_channel_bytes=max_channel_bytes,
                close_after_start=(child_in, child_out, *handed.values()),
            )
            handed = {}
            channel, overflow = extra
        finally:
            owned = (child_in, child_out, *handed.values()) if child_fds_owned else ()
            for fd in (parent_in, parent_out, *owned):
                if fd >= 0:
                    os.close(fd)
    if resolved_mode == "namespace" and exit_code == 125 and _SETUP_FAILED in output:
        raise JailSetupError(output.strip().splitlines()[-1])
    return JailResult(exit_code, output, timed_out, dropped, seconds, resolved_mode, None, channel, overflow)


@functools.lru_cache(maxsize=1)
def pids_cgroup_root() -> str | None:
    """A cgroup directory (v1 ``pids`` or v2 with the pids controller) where per-run children with a
    ``pids.max`` can be made, or None (then :func:`run_jailed` has no process-count limit)."""
    for base in ("/sys/fs/cgroup/pids", "/sys/fs/cgroup"):
        probe = os.path.join(base, f"vc-jail-probe-{os.getpid()}")
        try:
            os.mkdir(probe)
        except OSError:
            continue
        try:
            if os.path.exists(os.path.join(probe, "pids.max")):
                return base
        finally:
            os.rmdir(probe)
    return None


def _new_pids_cgroup(max_processes: int) -> str | None:
    base = pids_cgroup_root()
    if base is None:
        return None
    path = os.path.join(base, f"vc-jail-{os.getpid()}-{uuid.uuid4().hex[:12]}")
    try:
        os.mkdir(path)
        with open(os.path.join(path, "pids.max"), "w") as handle:
            handle.write(str(max(1, max_processes)))
    except OSError:
        _remove_cgroup(path)
        return None
    return path


def _remove_cgroup(path: str) -> None:
    """Kill what is left in the run's cgroup (fallback-mode escapees) and remove it."""
    for _ in range(20):
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


def _close_all(fds: Mapping[str, int] | None) -> None:
    for fd in (fds or {}).values():
        try:
            os.close(fd)
        except OSError:
            pass


def high_pipe() -> tuple[int, int]:
    """A close-on-exec pipe whose fds are >= 100 (the jail scripts use fds 3..99 for themselves)."""
    low = os.pipe()
    try:
        return fcntl.fcntl(low[0], fcntl.F_DUPFD_CLOEXEC, 100), fcntl.fcntl(low[1], fcntl.F_DUPFD_CLOEXEC, 100)
    finally:
        os.close(low[0])
        os.close(low[1])


def _is_within(parent: Path, child: Path) -> bool:
    """True when ``parent`` lies inside ``child`` (hiding ``child`` would hide the sandbox)."""
    return os.path.commonpath([str(parent), str(child)]) == str(child)


def _run_with_limits(
    argv: list[str],
    env: dict[str, str],
    cwd: Path,
    timeout_s: float,
    max_output_bytes: int,
    *,
    pass_fds: Sequence[int] = (),
    channel_fd: int | None = None,
    max_channel_bytes: int = 0,
    close_after_start: Sequence[int] = (),
) -> tuple[int | None, str, bool, int, float, tuple[bytes | None, bool]]:
    """Run ``argv`` in its own session; read merged output under a byte budget; kill at the deadline.

    Returns ``(exit_code or None if killed, output text, timed_out, dropped bytes, seconds,
    (channel bytes or None, channel overflow))``.
    """
    head_budget = max_output_bytes // 2
    tail_budget = max_output_bytes - head_budget
    head = bytearray()
    tail = bytearray()
    channel = bytearray()
    overflow = False
    dropped = 0
    start = time.monotonic()
    deadline = start + timeout_s
    try:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,
            pass_fds=tuple(pass_fds),
        )
    finally:
        for fd in close_after_start:  # the child's ends: only the child may hold them now
            os.close(fd)
    assert process.stdout is not None
    stdout_fd = process.stdout.fileno()
    selector = selectors.DefaultSelector()
    selector.register(stdout_fd, selectors.EVENT_READ)
    if channel_fd is not None:
        selector.register(channel_fd, selectors.EVENT_READ)
    open_fds = 1 + (channel_fd is not None)
    timed_out = False
    exited_at: float | None = None
    try:
        while open_fds:
            now = time.monotonic()
            if now >= deadline:
                timed_out = process.poll() is None
                break
            if exited_at is None and process.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > 0.5:
                break  # the shell is gone but something still holds a pipe (fallback background job)
            events = selector.select(timeout=min(0.1, deadline - now))
            for key, _ in events:
                fd = key.fd
                chunk = os.read(fd, 65536)
                if not chunk:
                    selector.unregister(fd)
                    open_fds -= 1
                    continue
                if fd == channel_fd:
                    room = max_channel_bytes - len(channel)
                    channel += chunk[:room]
                    overflow = overflow or len(chunk) > room
                    continue
                take = min(len(chunk), head_budget - len(head))
                head += chunk[:take]
                rest = chunk[take:]
                if rest:
                    tail += rest
                    if len(tail) > tail_budget:
                        dropped += len(tail) - tail_budget
                        del tail[: len(tail) - tail_budget]
    finally:
        selector.close()
        if not timed_out and process.poll() is None:
            # Output closed before the shell exited (GNU tools close stdout at exit, or the command
            # ran ``exec >&-``): let it finish inside its time limit; killing now would turn an
            # ordinary exit into SIGKILL on a loaded machine.
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
        _kill_group(process)  # background leftovers of the fallback mode
        process.stdout.close()
        process.wait()
    seconds = time.monotonic() - start
    text = head.decode("utf-8", errors="replace")
    if dropped:
        text += f"\n[... {dropped} bytes of output omitted ...]\n"
    text += tail.decode("utf-8", errors="replace")
    exit_code = None if timed_out else process.returncode
    return exit_code, text, timed_out, dropped, seconds, (bytes(channel) if channel_fd is not None else None, overflow)


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
