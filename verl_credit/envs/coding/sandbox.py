"""One coding-task episode: a temporary git repository, its tools, and the hidden-test reward.

Directory layout of one sandbox (``tempfile.mkdtemp``)::

    <tmp>/repo      the agent's repository (git, one commit of the task's files) -- the only place the
                    tools can write; the cwd and HOME of ``bash`` and ``run_tests``
    <tmp>/tmp       TMPDIR of jailed commands in the fallback jail mode
    <tmp>/eval      rebuilt for every reward: the agent's sources + the task's original tests and
                    pytest config (the hidden tests stay outside, in a private directory)
    <tmp>/host.git  where the trainer's own repository of the task's commit is built, then read into
                    memory and removed (:mod:`.host_git`): ``git_diff`` never reads the agent's
                    ``.git``, nor anything a jailed command could have written
    <tmp>/home      an empty ``HOME`` for the trainer's git while that repository is built

``repo``, ``tmp`` and ``eval`` are size-limited tmpfs mounts where this process may mount
(:mod:`.workspace`; ``workspace="directory"`` or an unprivileged trainer: plain directories with a
watchdog), so the disk quota holds during a call and during the reward's test runs.

Reward: the agent's tree is copied (regular files only) without ``tests/``, ``conftest.py`` files
and pytest config files (those come from the task, so editing tests or adding a ``conftest.py``
earns nothing). The task's visible tests run on it in the jail (counts only). The hidden tests run
in a trainer-side pytest process that never imports the agent's code: its imports of the agent's
packages are proxies to a jailed agent server (:mod:`.hidden_tests`, :mod:`.remote_objects`), so
the code under test can answer calls but cannot touch the verdict, which comes back over a pipe
held by the trainer (:mod:`.reward_channel`); a channel that shows tampering scores zero and is
recorded in :attr:`TestReport.integrity`. ``binary`` reward is 1.0 iff every hidden test passes (a
collection error counts as a failure); ``fraction`` is the share of hidden tests that pass.

The trainer's side never trusts the tree: the file tools, ``snapshot``/``restore``, the quota and
the reward resolve paths one component at a time against directory descriptors (:mod:`.beneath`:
no symlink is followed out of the root, however the tree changes), only open *regular* files
(``O_NOFOLLOW|O_NONBLOCK`` + ``fstat``: FIFOs, sockets and devices are skipped, never opened), walk
iteratively to at most :data:`~verl_credit.envs.coding.beneath.MAX_DEPTH` levels (deeper
directories are deleted after each call) and keep undecodable file names as surrogate escapes
(shown as ``\\xNN``). Every public method holds one lock: a sandbox runs one tool call, reward or
restore at a time, so no file tool ever runs while its ``bash`` does. ``search`` runs its regular
expression in a child process killed after ``SandboxLimits.tool_timeout_s``.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
import logging
import math
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import verl_credit.envs.coding.beneath as beneath
from verl_credit.config_rules import MAX_SECONDS
from verl_credit.envs.base import ToolResult
from verl_credit.envs.coding.hidden_tests import HiddenRun, run_hidden_tests
from verl_credit.envs.coding.host_git import HostGit
from verl_credit.envs.coding.jail import JailResult, give_to_jail, jail_user, resolve_jail_mode, run_jailed
from verl_credit.envs.coding.paths import SandboxPathError, display_path, resolve_sandbox_path
from verl_credit.envs.coding.reward_channel import RUNNER_SOURCE, new_nonce, parse_channel
from verl_credit.envs.coding.task_spec import TASKS_DIR, CodingTask, load_task
from verl_credit.envs.coding.tools import ToolArgumentError, check_arguments
from verl_credit.envs.coding.workspace import (
    mount_size_limited,
    quota_violation,
    size_limited_mounts_available,
    unmount,
)

__all__ = ["REWARD_MODES", "WORKSPACE_MODES", "CodingSandbox", "SandboxLimits", "SandboxState", "TestReport"]

_LOG = logging.getLogger(__name__)
REWARD_MODES = ("binary", "fraction")
WORKSPACE_MODES = ("auto", "tmpfs", "directory")
_SKIP_DIRS = (".git", "__pycache__", ".pytest_cache")
_PROTECTED_TOP = {"tests", "pytest.ini", "pyproject.toml", "setup.cfg", "tox.ini"}
_SEARCH_FILE_BYTES = 4 * 1024 * 1024  # larger files are searched in their first 4 MiB only
_SEARCH_TOTAL_BYTES = 64 * 1024 * 1024  # a search reads at most this much in all
_SEARCH_LINE_CHARS = 1000  # a matching line is shown up to this many characters
_EVAL_EXTRA_BYTES = 16 * 1024 * 1024  # the evaluation tree's room beyond the workspace quota
# Host pytest plugins (hypothesis, asyncio, ...) stay out of task test runs: hermetic and ~5x faster.
_JAIL_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "verl-credit",
    "GIT_AUTHOR_EMAIL": "sandbox@verl-credit.invalid",
    "GIT_COMMITTER_NAME": "verl-credit",
    "GIT_COMMITTER_EMAIL": "sandbox@verl-credit.invalid",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+0000",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+0000",
}


@dataclass(frozen=True)
class SandboxLimits:
    """Per-call limits of the sandbox tools."""

    bash_timeout_s: float = 10.0
    """Wall-clock limit of a ``bash`` call (the ``timeout`` argument can only lower it)."""
    test_timeout_s: float = 60.0
    """Wall-clock limit of ``run_tests`` and of the hidden-test reward run."""
    max_output_bytes: int = 16_384
    """Captured output of ``bash``/``run_tests`` (head and tail kept)."""
    max_read_bytes: int = 65_536
    """Largest ``read_file`` result."""
    max_search_matches: int = 200
    """Matching lines printed by ``search``."""
    max_diff_chars: int = 8_000
    """Unified diff shown in an edit/write result."""
    tool_timeout_s: float = 10.0
    """Wall-clock limit of ``search`` (its regular expression runs in a child process)."""
    max_processes: int = 256
    """Processes + threads a jailed command may have at once (pids cgroup, where available)."""
    max_workspace_bytes: int = 256 * 1024 * 1024
    """Disk the workspace may use: the size of its tmpfs (writes past it fail with ``ENOSPC``), or,
    without one, a watchdog during each call and the deletion of the largest files after it; the
    evaluation tree gets 16 MiB more (``ulimit -f`` caps each file at 64 MiB meanwhile)."""
    max_workspace_inodes: int = 100_000
    """Files and directories the workspace tmpfs may hold (tmpfs workspaces only)."""
    max_jail_memory_bytes: int = 4 * 1024 * 1024 * 1024
    """Memory of all processes of one jailed command together (a cgroup, where available)."""

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if item.name.endswith("_s"):
                if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                    raise ValueError(f"SandboxLimits.{item.name} must be a finite number of seconds, got {value!r}")
                if not 0 < value <= MAX_SECONDS:
                    raise ValueError(
                        f"SandboxLimits.{item.name} must be in (0, {MAX_SECONDS:g}] seconds, got {value!r} "
                        "(a longer one is no limit at all)"
                    )
                continue
            largest = _LIMIT_MAXIMA[item.name]
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= largest:
                raise ValueError(
                    f"SandboxLimits.{item.name} must be an integer in [1, {largest}], got {value!r} "
                    "(a larger one is no limit at all)"
                )


#: the largest value of each count or size in :class:`SandboxLimits`: beyond these a limit no longer
#: protects the node (a pid cgroup past the kernel's ``pid_max``, a quota past any disk)
_LIMIT_MAXIMA = {
    "max_output_bytes": 1 << 30,
    "max_read_bytes": 1 << 30,
    "max_search_matches": 1_000_000,
    "max_diff_chars": 1 << 30,
    "max_processes": 1 << 22,
    "max_workspace_bytes": 1 << 40,
    "max_workspace_inodes": 1 << 32,
    "max_jail_memory_bytes": 1 << 40,
}


@dataclass(frozen=True)
class TestReport:
    """Outcome of one pytest run over visible and hidden tests (from pytest's JUnit XML)."""

    hidden_passed: int
    hidden_total: int
    visible_passed: int
    visible_total: int
    output: str = ""
    integrity: str | None = None
    """Why the run's verdict was not trusted (tampering, a cut-short run); None when it was."""

    @property
    def hidden_all_pass(self) -> bool:
        return self.hidden_total > 0 and self.hidden_passed == self.hidden_total

    @property
    def visible_all_pass(self) -> bool:
        return self.visible_total > 0 and self.visible_passed == self.visible_total


@dataclass(frozen=True)
class SandboxState:
    """A restorable picture of an episode: working-tree files and which paths the agent has read."""

    files: tuple[tuple[str, bytes], ...]
    known_paths: frozenset[str] = field(default_factory=frozenset)

    @property
    def digest(self) -> str:
        return _digest_files(self.files)


def _locked(method: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``method`` holding the sandbox's lock (one operation at a time per sandbox)."""

    @functools.wraps(method)
    def wrapper(self: CodingSandbox, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return wrapper


class CodingSandbox:
    """A bug-fix task checked out in a fresh temporary git repository, with jailed tools.

    Args:
        task: a :class:`CodingTask`, a shipped task name, or a task directory.
        jail: ``auto`` | ``namespace`` | ``fallback`` (see :mod:`verl_credit.envs.coding.jail`).
        limits: per-call limits.
        reward_mode: ``binary`` (all hidden tests pass -> 1.0) or ``fraction``.
        require_read_before_edit: ``edit_file``/``write_file`` on an existing file the agent has not
            read (or written) in this episode is refused, as in Claude Code's Edit tool.
        base_dir: where the temporary directory is created (default: the system temp dir).
        workspace: ``auto`` (size-limited tmpfs mounts where this process may mount, else plain
            directories), ``tmpfs`` (fail when they cannot be mounted) or ``directory``.
    """

    def __init__(
        self,
        task: CodingTask | str | Path,
        *,
        jail: str = "auto",
        limits: SandboxLimits | None = None,
        reward_mode: str = "binary",
        require_read_before_edit: bool = True,
        base_dir: str | Path | None = None,
        workspace: str = "auto",
    ) -> None:
        if reward_mode not in REWARD_MODES:
            raise ValueError(f"reward_mode must be one of {REWARD_MODES}, got {reward_mode!r}")
        if workspace not in WORKSPACE_MODES:
            raise ValueError(f"workspace must be one of {WORKSPACE_MODES}, got {workspace!r}")
        self.task = task if isinstance(task, CodingTask) else load_task(task)
        self.jail_mode = resolve_jail_mode(jail)
        self.limits = limits or SandboxLimits()
        self.reward_mode = reward_mode
        self.require_read_before_edit = require_read_before_edit
        self.size_limited = workspace == "tmpfs" or (workspace == "auto" and size_limited_mounts_available())
        #: who jailed commands run as, when not this process (files the tools create are given to it)
        self._jail_owner = jail_user(self.jail_mode)
        self._lock = threading.RLock()
        self._tmp = Path(os.path.realpath(tempfile.mkdtemp(prefix=f"vc-coding-{self.task.name}-", dir=base_dir)))
        self.root = self._tmp / "repo"
        self._fallback_tmp = self._tmp / "tmp"
        self._eval_dir = self._tmp / "eval"
        self._known_paths: set[str] = set()
        self._report_cache: dict[str, TestReport] = {}
        self._hide = [TASKS_DIR, self.task.directory]
        self._mounts: list[str] = []
        self._fds: dict[str, int] = {}
        self._release = weakref.finalize(self, _release_sandbox, self._tmp, self._mounts, self._fds)
        try:
            for directory, size in (
                (self.root, self.limits.max_workspace_bytes),
                (self._fallback_tmp, self.limits.max_workspace_bytes),
                (self._eval_dir, self.limits.max_workspace_bytes + _EVAL_EXTRA_BYTES),
            ):
                directory.mkdir()
                if self.size_limited:
                    mount_size_limited(str(directory), size, self.limits.max_workspace_inodes)
                    self._mounts.append(str(directory))
            (self._tmp / "home").mkdir()
            _copy_task_tree(self.task.repo_dir, self.root)
            self._git = HostGit(self._tmp / "host.git", self.root, self._tmp / "home", _GIT_ENV)
            self._git.init_commit(f"task {self.task.name}")
            self._git.copy_to(self.root / ".git")  # the agent's own repository (it may rewrite it)
            # the jail user (nobody, when this process is root) must write the repository; nothing
            # jailed has run in it yet, so every path in it is one this sandbox made
            give_to_jail(self.root, self.jail_mode)
            give_to_jail(self._fallback_tmp, self.jail_mode)
            self._fds["root"] = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            self._fds["tmp"] = os.open(self._fallback_tmp, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            self._fds["eval"] = os.open(self._eval_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except BaseException:
            self._release()
            raise

    # ------------------------------------------------------------------ lifecycle

    @_locked
    def close(self) -> None:
        """Delete the sandbox directory (whatever the agent left in it) and its mounts."""
        self._release()

    @property
    def closed(self) -> bool:
        return not self._release.alive

    def __enter__(self) -> CodingSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ dispatch

    @_locked
    def call(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        """Execute one tool call; bad names/arguments, refused paths and file-system errors come
        back as error results (their text always encodable as UTF-8)."""
        self._require_open()
        try:
            checked = check_arguments(name, arguments)
            result = getattr(self, f"_tool_{name}")(**checked)
        except (ToolArgumentError, SandboxPathError) as exc:
            result = ToolResult(f"Error: {exc}", is_error=True)
        except beneath.NotRegularError:
            result = ToolResult("Error: the path is not a regular file", is_error=True)
        except OSError as exc:
            result = ToolResult(f"Error: {name} failed: {os.strerror(exc.errno) if exc.errno else exc}", is_error=True)
        return ToolResult(beneath.printable(result.content), result.is_error)

    # ------------------------------------------------------------------ tools (IG)

    def _resolve(self, path: object, *, for_write: bool = False) -> beneath.Resolved:
        return resolve_sandbox_path(self._fds["root"], str(self.root), path, for_write=for_write)

    def _tool_read_file(self, path: str, start_line: int | None = None, end_line: int | None = None) -> ToolResult:
        with self._resolve(path) as target:
            rel = display_path(target)
            if target.is_dir:
                return ToolResult(f"Error: {rel} is a directory; use list_dir", is_error=True)
            if not target.exists:
                return ToolResult(f"Error: no such file: {rel}", is_error=True)
            try:
                data = beneath.read_regular(target.parent_fd, target.name, self.limits.max_read_bytes + 1)
            except beneath.NotRegularError:
                return ToolResult(f"Error: {rel} is not a regular file", is_error=True)
            except OSError:
                return ToolResult(f"Error: no such file: {rel}", is_error=True)
            known = target.rel_text
        text = data.decode("utf-8", errors="replace")
        truncated = len(text) > self.limits.max_read_bytes
        text = text[: self.limits.max_read_bytes]
        if start_line is not None or end_line is not None:
            lines = text.splitlines(keepends=True)
            first = max(1, start_line or 1)
            last = min(len(lines), end_line or len(lines))
            text = "".join(lines[first - 1 : last])
        self._known_paths.add(known)
        if truncated:
            text += f"\n[... file truncated at {self.limits.max_read_bytes} bytes ...]\n"
        return ToolResult(text)

    def _tool_search(self, pattern: str, path: str = ".") -> ToolResult:
        try:
            re.compile(pattern)
        except (re.error, RecursionError, OverflowError) as exc:
            return ToolResult(f"Error: invalid regular expression {pattern!r}: {exc}", is_error=True)
        names, texts, skipped = self._search_texts(path)
        if names is None:
            return ToolResult(f"Error: no such file or directory: {path}", is_error=True)
        request = {"pattern": pattern, "texts": texts, "max_matches": self.limits.max_search_matches}
        request["max_line"] = _SEARCH_LINE_CHARS
        try:
            completed = subprocess.run(
                [sys.executable, "-I", "-S", "-c", _SEARCH_SOURCE],
                input=json.dumps(request).encode(),
                capture_output=True,
                timeout=self.limits.tool_timeout_s,
                env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"},
                check=False,
            )
        except subprocess.TimeoutExpired:
            limit = self.limits.tool_timeout_s
            return ToolResult(
                f"Error: search timed out after {limit:g} s (killed); simplify the regular expression", is_error=True
            )
        try:
            found = json.loads(completed.stdout)
        except ValueError:
            return ToolResult(
                f"Error: search failed: {completed.stderr.decode(errors='replace')[-500:]}", is_error=True
            )
        matches = [f"{names[i]}:{number}:{line}" for i, number, line in found["matches"]]
        total = found["total"]
        note = ""
        if skipped:
            note = f"\n[... {skipped} files not searched: over the {_SEARCH_TOTAL_BYTES}-byte budget ...]"
        if not matches:
            return ToolResult(f"No matches for {pattern!r}.{note}")
        if total > len(matches):
            matches.append(f"[... {total - len(matches)} more matches ...]")
        return ToolResult("\n".join(matches) + note)

    def _search_texts(self, path: str) -> tuple[list[str] | None, list[str], int]:
        """The UTF-8 texts of the regular files under ``path`` (names shown, texts, files skipped);
        read here, race-free, so the search child never opens a path."""
        names: list[str] = []
        texts: list[str] = []
        budget, skipped = _SEARCH_TOTAL_BYTES, 0

        def take(parent_fd: int, name: str, shown: str) -> None:
            nonlocal budget, skipped
            try:
                data = beneath.read_regular(parent_fd, name, min(_SEARCH_FILE_BYTES, max(budget, 0)))
            except OSError:
                return
            if budget <= 0:
                skipped += 1
                return
            budget -= len(data)
            try:
                texts.append(data.decode("utf-8"))
            except UnicodeDecodeError:
                return
            names.append(shown)

        with self._resolve(path) as base:
            if not base.exists:
                return None, [], 0
            if not base.is_dir:
                if base.is_regular:
                    take(base.parent_fd, base.name, display_path(base))
                return names, texts, skipped
            prefix = base.rel
            top = beneath.open_directory(base)
        try:
            for parent_fd, entry in beneath.walk(top, skip_dirs=_SKIP_DIRS):
                if stat.S_ISREG(entry.mode):
                    take(parent_fd, entry.name, beneath.printable("/".join((*prefix, *entry.rel))))
        finally:
            os.close(top)
        return names, texts, skipped

    def _tool_list_dir(self, path: str = ".") -> ToolResult:
        with self._resolve(path) as target:
            if not target.is_dir:
                return ToolResult(f"Error: not a directory: {path}", is_error=True)
            fd = beneath.open_directory(target)
        try:
            with os.scandir(fd) as listing:
                entries = sorted(
                    f"{entry.name}/" if entry.is_dir(follow_symlinks=False) else entry.name
                    for entry in listing
                    if entry.name not in _SKIP_DIRS
                )
        finally:
            os.close(fd)
        return ToolResult("\n".join(entries) if entries else "(empty directory)")

    # ------------------------------------------------------------------ tools (AE)

    def _tool_edit_file(self, path: str, old: str, new: str, replace_all: bool = False) -> ToolResult:
        with self._resolve(path, for_write=True) as target:
            rel = display_path(target)
            if not target.is_regular:
                return ToolResult(f"Error: no such file: {rel} (use write_file to create files)", is_error=True)
            refusal = self._check_known(target.rel_text)
            if refusal:
                return refusal
            if old == "":
                return ToolResult("Error: `old` must not be empty", is_error=True)
            if old == new:
                return ToolResult("Error: `old` and `new` are identical; nothing to change", is_error=True)
            try:
                fd = beneath.open_regular(target.parent_fd, target.name, os.O_RDWR)
            except beneath.NotRegularError:
                return ToolResult(f"Error: {rel} is not a regular file", is_error=True)
        try:
            try:
                before = beneath.read_fd(fd).decode("utf-8")
            except UnicodeDecodeError:
                return ToolResult(f"Error: {rel} is not UTF-8 text", is_error=True)
            count = before.count(old)
            if count == 0:
                return ToolResult(f"Error: `old` text not found in {rel}", is_error=True)
            if count > 1 and not replace_all:
                return ToolResult(
                    f"Error: `old` text occurs {count} times in {rel}; add surrounding context or set replace_all",
                    is_error=True,
                )
            after = before.replace(old, new) if replace_all else before.replace(old, new, 1)
            beneath.replace_contents(fd, after.encode("utf-8"))
        finally:
            os.close(fd)
        replaced = count if replace_all else 1
        plural = "s" if replaced > 1 else ""
        return ToolResult(f"Edited {rel} ({replaced} replacement{plural}).\n{self._diff(rel, before, after)}")

    def _tool_write_file(self, path: str, content: str) -> ToolResult:
        target = self._resolve(path, for_write=True)
        try:
            rel = display_path(target)
            if target.is_dir:
                return ToolResult(f"Error: {rel} is a directory", is_error=True)
            if target.exists and not target.is_regular:
                return ToolResult(f"Error: {rel} is not a regular file", is_error=True)
            existed = target.is_regular
            if existed:
                refusal = self._check_known(target.rel_text)
                if refusal:
                    return refusal
            try:
                before = beneath.read_regular(target.parent_fd, target.name).decode("utf-8", errors="replace")
            except FileNotFoundError:
                before = ""
            if target.missing:
                try:
                    target = beneath.make_directories(target, self._jail_owner)
                except beneath.BeneathError as exc:
                    return ToolResult(f"Error: path {rel!r}: {exc}", is_error=True)
            beneath.write_regular(target.parent_fd, target.name, content.encode("utf-8"), self._jail_owner)
            known = target.rel_text
        except beneath.NotRegularError:
            return ToolResult(f"Error: {rel} is not a regular file", is_error=True)
        finally:
            target.close()
        self._known_paths.add(known)
        verb = "Modified" if existed else "Created"
        return ToolResult(f"{verb} {rel} ({len(content)} characters).\n{self._diff(rel, before, content, existed)}")

    # ------------------------------------------------------------------ tools (RV and shell)

    def _tool_run_tests(self, path: str | None = None) -> ToolResult:
        selection = ""
        if path is not None:
            with self._resolve(path) as target:
                if not target.exists:
                    return ToolResult(f"Error: no such test file or directory: {path}", is_error=True)
                selection = " " + shlex.quote(target.rel_text)
        command = f"{shlex.quote(sys.executable)} -I -B -m pytest -q --tb=short -p no:cacheprovider{selection}"
        result = self._run_in_workspace(command, self.limits.test_timeout_s)
        notes = self._tidy_workspace()
        if result.timed_out:
            limit = self.limits.test_timeout_s
            return ToolResult(f"Tests timed out after {limit:g} s.\n{result.output}{notes}", is_error=True)
        if result.stopped is not None:
            return ToolResult(f"Tests stopped: {result.stopped} (killed).\n{result.output}{notes}", is_error=True)
        return ToolResult(f"pytest exit code {result.exit_code}\n{result.output}{notes}", is_error=bool(notes))

    def _tool_bash(self, command: str, timeout: float | None = None) -> ToolResult:
        if "\x00" in command:
            return ToolResult("Error: bash: the command contains a NUL byte", is_error=True)
        limit = self.limits.bash_timeout_s
        if timeout is not None:
            limit = min(max(float(timeout), 0.1), limit)
        result = self._run_in_workspace(command, limit)
        if result.rejected is not None:
            return ToolResult(f"Error: {result.output}", is_error=True)
        notes = self._tidy_workspace()
        if result.timed_out:
            return ToolResult(f"Command timed out after {limit:g} s (killed).\n{result.output}{notes}", is_error=True)
        if result.stopped is not None:
            return ToolResult(f"Command stopped: {result.stopped} (killed).\n{result.output}{notes}", is_error=True)
        return ToolResult(f"exit code {result.exit_code}\n{result.output}{notes}", is_error=bool(notes))

    # ------------------------------------------------------------------ reward

    @_locked
    def evaluate(self) -> TestReport:
        """Run visible + hidden tests on the agent's current sources (cached per working-tree state)."""
        self._require_open()
        digest = self._snapshot().digest
        cached = self._report_cache.get(digest)
        if cached is not None:
            return cached
        incomplete = self._build_eval_tree()
        eval_limit = self.limits.max_workspace_bytes + _EVAL_EXTRA_BYTES
        watchdog = None if self.size_limited else self._quota_watchdog([self._fds["eval"]], eval_limit)
        run = functools.partial(self._run, root=self._eval_dir, watchdog=watchdog)
        # visible tests: the task's own tests on the agent's sources, in the jail (not the reward)
        command = (
            f"{shlex.quote(sys.executable)} -I -B -c {shlex.quote(RUNNER_SOURCE)} "
            "-q --tb=line -p no:cacheprovider -p no:junitxml --rootdir=. tests"
        )
        nonce = new_nonce()
        visible = run(command, timeout_s=self.limits.test_timeout_s, channel_input=nonce.encode())
        # hidden tests (the reward): a trainer-side pytest that calls the agent's code in the jail
        hidden = run_hidden_tests(
            self.task.hidden_test_files(),
            self._eval_dir,
            functools.partial(run, timeout_s=self.limits.test_timeout_s),
            timeout_s=self.limits.test_timeout_s,
            max_output_bytes=self.limits.max_output_bytes,
            host_env=_JAIL_ENV,
            task_tree=self.task.repo_dir,
        )
        report = self._read_report(visible, nonce, hidden, incomplete)
        self._report_cache[digest] = report
        return report

    @_locked
    def reward(self) -> float:
        """Hidden-test outcome: ``binary`` 1.0/0.0 or the ``fraction`` of hidden tests passed."""
        report = self.evaluate()
        if self.reward_mode == "binary":
            return 1.0 if report.hidden_all_pass else 0.0
        return report.hidden_passed / report.hidden_total if report.hidden_total else 0.0

    # ------------------------------------------------------------------ state

    @_locked
    def snapshot(self) -> SandboxState:
        """Working-tree files (without ``.git`` and caches) and the paths the agent knows."""
        self._require_open()
        return self._snapshot()

    def _snapshot(self) -> SandboxState:
        files: list[tuple[str, bytes]] = []
        for parent_fd, entry in beneath.walk(self._fds["root"], skip_dirs=_SKIP_DIRS):
            if not stat.S_ISREG(entry.mode):
                continue
            try:
                files.append((entry.rel_text, beneath.read_regular(parent_fd, entry.name)))
            except OSError:  # no longer a regular file
                continue
        return SandboxState(tuple(files), frozenset(self._known_paths))

    @_locked
    def restore(self, state: SandboxState) -> None:
        """Make the working tree and the read set equal to ``state`` (``.git`` is left alone).
        Everything that is not a regular file of the state (FIFOs, sockets, devices, symlinks) goes."""
        self._require_open()
        root_fd = self._fds["root"]
        wanted = dict(state.files)
        unwanted = [
            entry.rel
            for _, entry in beneath.walk(root_fd, skip_dirs=_SKIP_DIRS)
            if entry.rel_text not in wanted or not stat.S_ISREG(entry.mode)
        ]
        for rel in unwanted:
            self._remove(root_fd, rel)
        for rel_text, content in wanted.items():
            rel = rel_text.split("/")
            parent = beneath.open_parent(root_fd, rel[:-1], create=True, owner=self._jail_owner)
            try:
                try:
                    same = beneath.read_regular(parent, rel[-1]) == content
                except FileNotFoundError:
                    same = False
                if not same:
                    beneath.write_regular(parent, rel[-1], content, self._jail_owner)
            finally:
                os.close(parent)
        self._known_paths = set(state.known_paths)

    @_locked
    def git_diff(self) -> str:
        """``git diff`` of the working tree against the task's commit (by the trainer's own git
        directory: nothing the agent wrote into ``.git`` is read, :mod:`.host_git`)."""
        self._require_open()
        return self._git.diff()

    # ------------------------------------------------------------------ helpers

    def _require_open(self) -> None:
        if self.closed:
            raise RuntimeError("the coding sandbox is closed")

    def _run(
        self,
        command: str,
        root: Path,
        timeout_s: float,
        channel_input: bytes | None = None,
        child_fds: Mapping[str, int] | None = None,
        watchdog: Callable[[], str | None] | None = None,
    ) -> JailResult:
        return run_jailed(
            command,
            root,
            timeout_s=timeout_s,
            max_output_bytes=self.limits.max_output_bytes,
            mode=self.jail_mode,
            hide_paths=self._hide,
            fallback_tmpdir=self._fallback_tmp,
            env_extra=_JAIL_ENV,
            channel_input=channel_input,
            max_processes=self.limits.max_processes,
            child_fds=child_fds,
            max_jail_memory_bytes=self.limits.max_jail_memory_bytes,
            watchdog=watchdog,
        )

    def _run_in_workspace(self, command: str, timeout_s: float) -> JailResult:
        """``command`` in the repository, with the quota watchdog when the workspace is not size-limited."""
        tops = [self._fds["root"], self._fds["tmp"]]
        watchdog = None if self.size_limited else self._quota_watchdog(tops, self.limits.max_workspace_bytes)
        return self._run(command, self.root, timeout_s, watchdog=watchdog)

    @staticmethod
    def _quota_watchdog(tops: list[int], limit: int) -> Callable[[], str | None]:
        def over_quota() -> str | None:
            return quota_violation(tops, limit)

        return over_quota

    def _tidy_workspace(self) -> str:
        """After a jailed call: delete directories nested deeper than the walks go, then the largest
        files until the workspace fits its quota. Returns the note for the tool result."""
        notes = []
        for key, base in (("root", ""), ("tmp", "$TMPDIR/")):
            too_deep: list[tuple[str, ...]] = []
            for _ in beneath.walk(self._fds[key], too_deep=too_deep):
                pass
            for rel in too_deep:
                self._remove(self._fds[key], rel)
            if too_deep:
                shown = ", ".join(beneath.printable(base + "/".join(rel[:3])) + "/..." for rel in too_deep[:3])
                notes.append(f"directories nested deeper than {beneath.MAX_DEPTH} levels were deleted: {shown}")
        removed = self._enforce_quota()
        limit = self.limits.max_workspace_bytes
        if removed:
            notes.append(f"disk quota of {limit} bytes exceeded: deleted {', '.join(removed)}")
        elif self.size_limited and _nearly_full(self._fds["root"]):
            notes.append(f"disk quota of {limit} bytes reached: writes past it failed (No space left on device)")
        return "".join(f"\n[{note}]\n" for note in notes)

    def _enforce_quota(self) -> list[str]:
        """Delete the largest files of the workspace until it uses at most ``max_workspace_bytes``."""
        sizes: list[tuple[int, str, tuple[str, ...]]] = []
        for key in ("root", "tmp"):
            for _, entry in beneath.walk(self._fds[key]):
                sizes.append((entry.size, key, entry.rel))
        used = sum(size for size, _, _ in sizes)
        removed: list[str] = []
        for size, key, rel in sorted(sizes, key=lambda item: item[0], reverse=True):
            if used <= self.limits.max_workspace_bytes:
                break
            try:
                self._remove(self._fds[key], rel)
            except OSError:
                continue
            used -= size
            removed.append(beneath.printable(("" if key == "root" else "$TMPDIR/") + "/".join(rel)))
        return removed

    @staticmethod
    def _remove(top_fd: int, rel: tuple[str, ...] | list[str]) -> None:
        parent = beneath.open_parent(top_fd, rel[:-1])
        try:
            beneath.remove_entry(parent, rel[-1])
        finally:
            os.close(parent)

    def _check_known(self, rel: str) -> ToolResult | None:
        if self.require_read_before_edit and rel not in self._known_paths:
            return ToolResult(
                f"Error: {beneath.printable(rel)} has not been read yet; read it before editing it", is_error=True
            )
        return None

    def _diff(self, rel: str, before: str, after: str, existed: bool = True) -> str:
        diff = "".join(
            difflib.unified_diff(
                before.splitlines(keepends=True),
                after.splitlines(keepends=True),
                fromfile=f"a/{rel}" if existed else "/dev/null",
                tofile=f"b/{rel}",
            )
        )
        if len(diff) > self.limits.max_diff_chars:
            diff = diff[: self.limits.max_diff_chars] + "\n[... diff truncated ...]\n"
        return diff or "(no textual change)"

    def _build_eval_tree(self) -> str | None:
        """Fill the evaluation tree; returns why it is incomplete (a full disk), or None."""
        eval_fd = self._fds["eval"]
        beneath.clear_directory(eval_fd)
        problem = None
        for parent_fd, entry in beneath.walk(self._fds["root"], skip_dirs=_SKIP_DIRS):
            if not stat.S_ISREG(entry.mode) or entry.rel[0] in _PROTECTED_TOP or entry.name == "conftest.py":
                continue
            try:
                data = beneath.read_regular(parent_fd, entry.name)
            except OSError:  # no longer a regular file
                continue
            try:
                destination = beneath.open_parent(eval_fd, entry.rel[:-1], create=True)
                try:
                    beneath.write_regular(destination, entry.name, data)
                finally:
                    os.close(destination)
            except OSError as exc:
                problem = f"{beneath.printable(entry.rel_text)}: {os.strerror(exc.errno) if exc.errno else exc}"
                break
        for name in _PROTECTED_TOP:
            original = self.task.repo_dir / name
            if original.is_dir():
                shutil.copytree(original, self._eval_dir / name, ignore=shutil.ignore_patterns(*_SKIP_DIRS))
            elif original.is_file():
                shutil.copyfile(original, self._eval_dir / name)
        (self._eval_dir / "tests").mkdir(exist_ok=True)
        give_to_jail(self._eval_dir, self.jail_mode)  # made just now by this process (regular files, dirs)
        return problem

    def _read_report(self, visible: JailResult, nonce: str, hidden: HiddenRun, incomplete: str | None) -> TestReport:
        seen = parse_channel(visible.channel, nonce, [], overflow=visible.channel_overflow)
        visible_passed, visible_total = seen.visible if seen.problem is None and not visible.timed_out else (0, 0)
        problem = hidden.verdict.problem
        if hidden.timed_out:
            problem = f"the hidden-test run timed out after {self.limits.test_timeout_s:g} s"
        hidden_passed, hidden_total = hidden.verdict.hidden if problem is None else (0, 0)
        hidden_total = max(hidden_total, 1)  # a run that collected nothing hidden is a failure
        output = f"{visible.output}\n{hidden.output}"
        if incomplete is not None:
            output += f"\n[evaluation tree incomplete: {incomplete}]\n"
        if problem is not None:
            output += f"\n[reward not trusted: {problem}]\n"
        return TestReport(hidden_passed, hidden_total, visible_passed, visible_total, output, problem)


def _nearly_full(directory_fd: int) -> bool:
    """The file system of ``directory_fd`` has less than 1 MiB (or 1% of its inodes) left."""
    info = os.fstatvfs(directory_fd)
    return info.f_bavail * info.f_frsize < (1 << 20) or info.f_favail * 100 < info.f_files


def _copy_task_tree(source: Path, destination: Path) -> None:
    """Copy the task's repository (trusted files) into the (existing, empty) ``destination``."""
    for entry in sorted(source.iterdir()):
        if entry.name in _SKIP_DIRS:
            continue
        target = destination / entry.name
        if entry.is_dir():
            shutil.copytree(entry, target, ignore=shutil.ignore_patterns(*_SKIP_DIRS))
        else:
            shutil.copyfile(entry, target)


def _release_sandbox(tmp: Path, mounts: list[str], fds: dict[str, int]) -> None:
    """Close the sandbox's descriptors, detach its mounts and delete its directory (any depth)."""
    for fd in fds.values():
        try:
            os.close(fd)
        except OSError:
            pass
    fds.clear()
    for mount in reversed(mounts):
        unmount(mount)
    mounts.clear()
    try:
        parent = os.open(tmp.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            beneath.remove_entry(parent, tmp.name)
        finally:
            os.close(parent)
    except OSError as exc:
        _LOG.warning("coding sandbox: could not delete %s completely: %s", tmp, exc)
        shutil.rmtree(tmp, ignore_errors=True)


# The ``search`` worker: reads a JSON request on stdin, prints {"matches": [[i, line_no, text]], "total": n}.
_SEARCH_SOURCE = r"""
import json, re, sys
req = json.loads(sys.stdin.buffer.read())
regex = re.compile(req["pattern"])
matches, total = [], 0
for index, text in enumerate(req["texts"]):
    for number, line in enumerate(text.splitlines(), start=1):
        if regex.search(line):
            total += 1
            if len(matches) < req["max_matches"]:
                matches.append([index, number, line[: req["max_line"]]])
sys.stdout.write(json.dumps({"matches": matches, "total": total}))
"""


def _digest_files(files: tuple[tuple[str, bytes], ...]) -> str:
    digest = hashlib.sha256()
    for rel, content in files:
        digest.update(os.fsencode(rel) + b"\x00" + hashlib.sha256(content).digest())
    return digest.hexdigest()
