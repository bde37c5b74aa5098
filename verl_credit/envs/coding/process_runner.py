"""Run one process under a deadline and an output budget, reading its output and channel pipes.

The process runs in its own session. Its merged stdout/stderr is kept up to a byte budget (head
and tail halves; the middle is dropped and counted). A jailed command's first process is the
reaper (:mod:`.reaper`): the runner holds the write end of its *lifeline* pipe and closes it at the
deadline, when the watchdog reports a reason to stop (the workspace went over its disk quota), or
when the run ends; the reaper then kills the command's whole tree. A trusted host process has no
lifeline: its process group is killed.
"""

from __future__ import annotations

import fcntl
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RunOutcome", "high_pipe", "run_with_limits"]

_REAPER_GRACE_S = 5.0
"""How long the reaper gets to kill the tree after the lifeline closed (then its group is killed)."""


@dataclass(frozen=True)
class RunOutcome:
    """What :func:`run_with_limits` saw (``exit_code`` None: killed at the deadline or stopped)."""

    exit_code: int | None
    output: str
    timed_out: bool
    dropped: int
    seconds: float
    channel: bytes | None
    channel_overflow: bool
    stopped: str | None = None  # the watchdog's reason to stop the run early


def high_pipe() -> tuple[int, int]:
    """A close-on-exec pipe whose fds are >= 100 (the jail scripts use fds 3..99 for themselves)."""
    low = os.pipe()
    try:
        return fcntl.fcntl(low[0], fcntl.F_DUPFD_CLOEXEC, 100), fcntl.fcntl(low[1], fcntl.F_DUPFD_CLOEXEC, 100)
    finally:
        os.close(low[0])
        os.close(low[1])


def run_with_limits(
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
    lifeline_fd: int | None = None,
    watchdog: Callable[[], str | None] | None = None,
    watchdog_interval_s: float = 0.25,
) -> RunOutcome:
    """Run ``argv``; read its merged output under the budget; stop it at the deadline.

    Args:
        close_after_start: the child's ends of pipes (closed here once it started).
        lifeline_fd: the trainer's end of the reaper's lifeline (owned by this call: closed at the
            end); None for a host process (its process group is killed instead).
        watchdog: called every ``watchdog_interval_s`` while the process runs; a returned reason
            stops the run (:attr:`RunOutcome.stopped`).
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
    except BaseException:
        if lifeline_fd is not None:
            os.close(lifeline_fd)
        raise
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
    stopped: str | None = None
    exited_at: float | None = None
    next_check = start + watchdog_interval_s
    try:
        while open_fds:
            now = time.monotonic()
            if now >= deadline:
                timed_out = process.poll() is None
                break
            if watchdog is not None and now >= next_check:
                next_check = now + watchdog_interval_s
                stopped = watchdog()
                if stopped is not None:
                    break
            if exited_at is None and process.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > 0.5:
                break  # the process is gone but something still holds a pipe
            wait = min(0.1, deadline - now)
            if watchdog is not None:
                wait = min(wait, max(0.0, next_check - now))
            events = selector.select(timeout=wait)
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
        if not timed_out and stopped is None and process.poll() is None:
            # Output closed before the process exited (GNU tools close stdout at exit, or the command
            # ran ``exec >&-``): let it finish inside its time limit; killing now would turn an
            # ordinary exit into SIGKILL on a loaded machine.
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
        if lifeline_fd is not None:
            os.close(lifeline_fd)  # the reaper kills the command's whole tree and exits
            try:
                process.wait(timeout=_REAPER_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
        _kill_group(process)
        process.stdout.close()
        process.wait()
    seconds = time.monotonic() - start
    text = head.decode("utf-8", errors="replace")
    if dropped:
        text += f"\n[... {dropped} bytes of output omitted ...]\n"
    text += tail.decode("utf-8", errors="replace")
    exit_code = None if timed_out or stopped is not None else process.returncode
    return RunOutcome(
        exit_code,
        text,
        timed_out,
        dropped,
        seconds,
        bytes(channel) if channel_fd is not None else None,
        overflow,
        stopped,
    )


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
