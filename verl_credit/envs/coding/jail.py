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
  (``ulimit -v``).

  Setup fails closed: if any mount cannot be made read-only the command is not run.

``fallback`` -- no namespaces (``unshare`` missing or forbidden). A plain subprocess in the sandbox
with a scrubbed environment (``HOME`` = sandbox, ``TMPDIR`` = a per-sandbox temp dir, proxies set
to a dead port), the same time/output/file-size limits, and a *lexical* pre-check that rejects
commands naming ``..`` or absolute paths outside the sandbox. This is a guard against accidents,
not a security boundary: a command that builds a path at run time (``$(...)``, ``python -c``)
can still write anywhere the user can, open sockets, or leave ``setsid`` processes behind.

Neither mode is a defence against a hostile kernel exploit; the namespace mode is a reasonable
training sandbox for a policy that was never meant to attack it.
"""

from __future__ import annotations

import functools
import os
import selectors
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "JAIL_MODES",
    "JailResult",
    "JailSetupError",
    "check_command_paths",
    "namespace_jail_available",
    "resolve_jail_mode",
    "run_jailed",
    "scrubbed_environment",
]

JAIL_MODES = ("auto", "namespace", "fallback")
_SETUP_FAILED = "verl-credit-jail: setup failed:"

# $1 root  $2 command  $3 file-size limit (KiB)  $4 address-space limit (KiB)
# $5 ':'-separated directories under /tmp to keep visible read-only (the Python installation)
# $6.. paths to hide
_NAMESPACE_SCRIPT = r"""
set -u
fail() { echo "verl-credit-jail: setup failed: $*" >&2; exit 125; }
ROOT="$1"; CMD="$2"; FSIZE="$3"; VMEM="$4"; KEEP="$5"; shift 5
exec 3<"$ROOT" || fail "cannot open $ROOT"
KEEP_FDS=()
IFS=':' read -r -a KEEP_DIRS <<< "$KEEP"
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
exec setpriv --bounding-set=-all --inh-caps=-all --no-new-privs -- bash -c "$CMD"
"""

# $1 root  $2 command  $3 file-size limit (KiB)  $4 address-space limit (KiB)
_FALLBACK_SCRIPT = r"""
cd "$1" || exit 125
ulimit -f "$3"; ulimit -v "$4"
exec bash -c "$2"
"""

_UNSHARE_ARGS = ("--user", "--map-root-user", "--net", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc")
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


@functools.lru_cache(maxsize=1)
def namespace_jail_available() -> bool:
    """True when the full namespace jail can be set up here (probed once per process)."""
    if shutil.which("unshare") is None or shutil.which("setpriv") is None:
        return False
    outside = Path(f"/usr/.vc-jail-probe-{os.getpid()}")  # must stay unwritable inside the jail
    try:
        with tempfile.TemporaryDirectory(prefix="vc-jail-probe-") as tmp:
            real_tmp = os.path.realpath(tmp)
            completed = subprocess.run(
                [
                    "unshare",
                    *_UNSHARE_ARGS,
                    "bash",
                    "-c",
                    _NAMESPACE_SCRIPT,
                    "jail",
                    real_tmp,
                    f"touch inside && ! mkdir {outside} 2>/dev/null",
                    "65536",
                    "4194304",
                    ":".join(python_dirs_under_tmp()),
                ],
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


def resolve_jail_mode(mode: str) -> str:
    """``auto`` -> ``namespace`` when available, else ``fallback``; ``namespace`` must be available."""
    if mode not in JAIL_MODES:
        raise ValueError(f"jail mode must be one of {JAIL_MODES}, got {mode!r}")
    if mode == "auto":
        return "namespace" if namespace_jail_available() else "fallback"
    if mode == "namespace" and not namespace_jail_available():
        raise JailSetupError("jail mode 'namespace' requested but unshare/setpriv namespaces are not usable here")
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

    Raises:
        JailSetupError: the namespace jail could not be set up (nothing was run).
    """
    resolved_mode = resolve_jail_mode(mode)
    real_root = Path(os.path.realpath(root))
    if not real_root.is_dir():
        raise FileNotFoundError(f"sandbox root {real_root} does not exist")
    fsize_kib = str(max(1, max_file_bytes // 1024))
    vmem_kib = str(max(1, max_memory_bytes // 1024))
    if resolved_mode == "namespace":
        hidden = [str(p) for p in hide_paths if not _is_within(real_root, Path(os.path.realpath(p)))]
        argv = [
            "unshare",
            *_UNSHARE_ARGS,
            "bash",
            "-c",
            _NAMESPACE_SCRIPT,
            "jail",
            str(real_root),
            command,
            fsize_kib,
            vmem_kib,
            ":".join(python_dirs_under_tmp()),
            *hidden,
        ]
        env = scrubbed_environment(real_root, "/tmp", env_extra)
    else:
        reason = check_command_paths(command, real_root)
        if reason is not None:
            return JailResult(None, f"command rejected by the sandbox: {reason}", False, 0, 0.0, resolved_mode, reason)
        argv = ["bash", "-c", _FALLBACK_SCRIPT, "jail", str(real_root), command, fsize_kib, vmem_kib]
        env = scrubbed_environment(real_root, fallback_tmpdir or real_root, env_extra)
    exit_code, output, timed_out, dropped, seconds = _run_with_limits(argv, env, real_root, timeout_s, max_output_bytes)
    if resolved_mode == "namespace" and exit_code == 125 and _SETUP_FAILED in output:
        raise JailSetupError(output.strip().splitlines()[-1])
    return JailResult(exit_code, output, timed_out, dropped, seconds, resolved_mode)


def _is_within(parent: Path, child: Path) -> bool:
    """True when ``parent`` lies inside ``child`` (hiding ``child`` would hide the sandbox)."""
    return os.path.commonpath([str(parent), str(child)]) == str(child)


def _run_with_limits(
    argv: list[str], env: dict[str, str], cwd: Path, timeout_s: float, max_output_bytes: int
) -> tuple[int | None, str, bool, int, float]:
    """Run ``argv`` in its own session; read merged output under a byte budget; kill at the deadline.

    Returns ``(exit_code or None if killed, output text, timed_out, dropped bytes, seconds)``.
    """
    head_budget = max_output_bytes // 2
    tail_budget = max_output_bytes - head_budget
    head = bytearray()
    tail = bytearray()
    dropped = 0
    start = time.monotonic()
    deadline = start + timeout_s
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    assert process.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    timed_out = False
    exited_at: float | None = None
    try:
        while True:
            now = time.monotonic()
            if now >= deadline:
                timed_out = process.poll() is None
                break
            if exited_at is None and process.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > 0.5:
                break  # the shell is gone but something still holds the pipe (fallback background job)
            events = selector.select(timeout=min(0.1, deadline - now))
            if not events:
                continue
            chunk = os.read(process.stdout.fileno(), 65536)
            if not chunk:
                break
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
        _kill_group(process)
        process.stdout.close()
        process.wait()
    seconds = time.monotonic() - start
    text = head.decode("utf-8", errors="replace")
    if dropped:
        text += f"\n[... {dropped} bytes of output omitted ...]\n"
    text += tail.decode("utf-8", errors="replace")
    exit_code = None if timed_out else process.returncode
    return exit_code, text, timed_out, dropped, seconds


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
