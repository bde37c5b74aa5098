"""One coding-task episode: a temporary git repository, its tools, and the hidden-test reward.

Directory layout of one sandbox (``tempfile.mkdtemp``)::

    <tmp>/repo   the agent's repository (git, one commit of the task's files) -- the only place the
                 tools can write; the cwd and HOME of ``bash`` and ``run_tests``
    <tmp>/tmp    TMPDIR of jailed commands in the fallback jail mode
    <tmp>/eval   rebuilt for every reward: the agent's sources + the task's original tests and
                 pytest config (the hidden tests stay outside, in a private directory)

Reward: the agent's tree is copied (regular files only) without ``tests/``, ``conftest.py`` files
and pytest config files (those come from the task, so editing tests or adding a ``conftest.py``
earns nothing). The task's visible tests run on it in the jail (counts only). The hidden tests run
in a trainer-side pytest process that never imports the agent's code: its imports of the agent's
packages are proxies to a jailed agent server (:mod:`.hidden_tests`, :mod:`.remote_objects`), so
the code under test can answer calls but cannot touch the verdict, which comes back over a pipe
held by the trainer (:mod:`.reward_channel`); a channel that shows tampering scores zero and is
recorded in :attr:`TestReport.integrity`. ``binary`` reward is 1.0 iff every hidden test passes (a
collection error counts as a failure); ``fraction`` is the share of hidden tests that pass.

File tools, ``snapshot``/``restore`` and the reward only open *regular* files (``O_NONBLOCK``,
``O_NOFOLLOW``, then ``fstat``): FIFOs, sockets and devices planted with ``bash`` are skipped, never
opened, so they cannot block the trainer. ``search`` runs its regular expression in a child process
killed after ``SandboxLimits.tool_timeout_s`` (a catastrophic pattern cannot hang the trainer).
"""

from __future__ import annotations

import difflib
import errno
import functools
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_credit.envs.base import ToolResult
from verl_credit.envs.coding.hidden_tests import HiddenRun, run_hidden_tests
from verl_credit.envs.coding.jail import (
    JailResult,
    give_to_jail,
    jail_user,
    resolve_jail_mode,
    run_jailed,
    scrubbed_environment,
)
from verl_credit.envs.coding.paths import SandboxPathError, display_path, resolve_sandbox_path
from verl_credit.envs.coding.reward_channel import RUNNER_SOURCE, new_nonce, parse_channel
from verl_credit.envs.coding.task_spec import TASKS_DIR, CodingTask, load_task
from verl_credit.envs.coding.tools import ToolArgumentError, check_arguments

__all__ = ["REWARD_MODES", "CodingSandbox", "SandboxLimits", "SandboxState", "TestReport"]

REWARD_MODES = ("binary", "fraction")
_SKIP_DIRS = {".git", "__pycache__", ".pytest_cache"}
_PROTECTED_TOP = {"tests", "pytest.ini", "pyproject.toml", "setup.cfg", "tox.ini"}
_SEARCH_FILE_BYTES = 4 * 1024 * 1024  # larger files are searched in their first 4 MiB only
_SEARCH_LINE_CHARS = 1000  # a matching line is shown up to this many characters
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
    """Disk the sandbox directory may use; after a ``bash``/``run_tests`` call that leaves more, the
    largest files are deleted until it fits (``ulimit -f`` caps each file at 64 MiB meanwhile)."""

    def __post_init__(self) -> None:
        for name in ("bash_timeout_s", "test_timeout_s", "tool_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SandboxLimits.{name} must be > 0, got {getattr(self, name)}")
        for name in (
            "max_output_bytes",
            "max_read_bytes",
            "max_search_matches",
            "max_diff_chars",
            "max_processes",
            "max_workspace_bytes",
        ):
            if not getattr(self, name) >= 1:
                raise ValueError(f"SandboxLimits.{name} must be >= 1, got {getattr(self, name)}")


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
    ) -> None:
        if reward_mode not in REWARD_MODES:
            raise ValueError(f"reward_mode must be one of {REWARD_MODES}, got {reward_mode!r}")
        self.task = task if isinstance(task, CodingTask) else load_task(task)
        self.jail_mode = resolve_jail_mode(jail)
        self.limits = limits or SandboxLimits()
        self.reward_mode = reward_mode
        self.require_read_before_edit = require_read_before_edit
        #: who jailed commands run as, when not this process (files the tools create are given to it)
        self._jail_owner = jail_user(self.jail_mode)
        self._tmp = Path(os.path.realpath(tempfile.mkdtemp(prefix=f"vc-coding-{self.task.name}-", dir=base_dir)))
        self.root = self._tmp / "repo"
        self._fallback_tmp = self._tmp / "tmp"
        self._eval_dir = self._tmp / "eval"
        self._known_paths: set[str] = set()
        self._report_cache: dict[str, TestReport] = {}
        self._hide = [TASKS_DIR, self.task.directory]
        try:
            shutil.copytree(self.task.repo_dir, self.root, ignore=shutil.ignore_patterns(*_SKIP_DIRS))
            self._fallback_tmp.mkdir()
            self._git("init", "-q")
            self._git("add", "-A")
            self._git("commit", "-q", "-m", f"task {self.task.name}")
            # the jail user (nobody, when this process is root) must write the repository; nothing
            # jailed has run in it yet, so every path in it is one this sandbox made
            give_to_jail(self.root, self.jail_mode)
        except BaseException:
            shutil.rmtree(self._tmp, ignore_errors=True)
            raise

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Delete the sandbox directory."""
        shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> CodingSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ dispatch

    def call(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        """Execute one tool call; bad names/arguments and refused paths come back as error results."""
        try:
            checked = check_arguments(name, arguments)
            return getattr(self, f"_tool_{name}")(**checked)
        except (ToolArgumentError, SandboxPathError) as exc:
            return ToolResult(f"Error: {exc}", is_error=True)

    # ------------------------------------------------------------------ tools (IG)

    def _tool_read_file(self, path: str, start_line: int | None = None, end_line: int | None = None) -> ToolResult:
        target = resolve_sandbox_path(self.root, path)
        rel = display_path(self.root, target)
        if target.is_dir():
            return ToolResult(f"Error: {rel} is a directory; use list_dir", is_error=True)
        try:
            data = _read_regular(target, self.limits.max_read_bytes + 1)
        except _NotRegular:
            return ToolResult(f"Error: {rel} is not a regular file", is_error=True)
        except OSError:
            return ToolResult(f"Error: no such file: {rel}", is_error=True)
        text = data.decode("utf-8", errors="replace")
        truncated = len(text) > self.limits.max_read_bytes
        text = text[: self.limits.max_read_bytes]
        if start_line is not None or end_line is not None:
            lines = text.splitlines(keepends=True)
            first = max(1, start_line or 1)
            last = min(len(lines), end_line or len(lines))
            text = "".join(lines[first - 1 : last])
        self._known_paths.add(rel)
        if truncated:
            text += f"\n[... file truncated at {self.limits.max_read_bytes} bytes ...]\n"
        return ToolResult(text)

    def _tool_search(self, pattern: str, path: str = ".") -> ToolResult:
        try:
            re.compile(pattern)
        except re.error as exc:
            return ToolResult(f"Error: invalid regular expression {pattern!r}: {exc}", is_error=True)
        base = resolve_sandbox_path(self.root, path)
        if not base.exists():
            return ToolResult(f"Error: no such file or directory: {path}", is_error=True)
        files = self._walk_files(base)
        request = {
            "pattern": pattern,
            "files": [str(f) for f in files],
            "max_matches": self.limits.max_search_matches,
            "max_bytes": _SEARCH_FILE_BYTES,
            "max_line": _SEARCH_LINE_CHARS,
        }
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
        matches = [f"{display_path(self.root, Path(files[i]))}:{number}:{line}" for i, number, line in found["matches"]]
        total = found["total"]
        if not matches:
            return ToolResult(f"No matches for {pattern!r}.")
        if total > len(matches):
            matches.append(f"[... {total - len(matches)} more matches ...]")
        return ToolResult("\n".join(matches))

    def _tool_list_dir(self, path: str = ".") -> ToolResult:
        target = resolve_sandbox_path(self.root, path)
        if not target.is_dir():
            return ToolResult(f"Error: not a directory: {path}", is_error=True)
        entries = sorted(
            f"{entry.name}/" if entry.is_dir() else entry.name
            for entry in target.iterdir()
            if entry.name not in _SKIP_DIRS
        )
        return ToolResult("\n".join(entries) if entries else "(empty directory)")

    # ------------------------------------------------------------------ tools (AE)

    def _tool_edit_file(self, path: str, old: str, new: str, replace_all: bool = False) -> ToolResult:
        target = resolve_sandbox_path(self.root, path, for_write=True)
        rel = display_path(self.root, target)
        if not target.is_file():
            return ToolResult(f"Error: no such file: {rel} (use write_file to create files)", is_error=True)
        refusal = self._check_known(rel)
        if refusal:
            return refusal
        if old == "":
            return ToolResult("Error: `old` must not be empty", is_error=True)
        if old == new:
            return ToolResult("Error: `old` and `new` are identical; nothing to change", is_error=True)
        try:
            before = _read_regular(target).decode("utf-8")
        except _NotRegular:
            return ToolResult(f"Error: {rel} is not a regular file", is_error=True)
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
        _write_regular(target, after.encode("utf-8"), self._jail_owner)
        replaced = count if replace_all else 1
        plural = "s" if replaced > 1 else ""
        return ToolResult(f"Edited {rel} ({replaced} replacement{plural}).\n{self._diff(rel, before, after)}")

    def _tool_write_file(self, path: str, content: str) -> ToolResult:
        target = resolve_sandbox_path(self.root, path, for_write=True)
        rel = display_path(self.root, target)
        if target.is_dir():
            return ToolResult(f"Error: {rel} is a directory", is_error=True)
        if target.exists() and not target.is_file():
            return ToolResult(f"Error: {rel} is not a regular file", is_error=True)
        existed = target.is_file()
        if existed:
            refusal = self._check_known(rel)
            if refusal:
                return refusal
        try:
            before = _read_regular(target).decode("utf-8", errors="replace") if existed else ""
            self._make_parents(target)  # ``target`` is already real and inside the root
            _write_regular(target, content.encode("utf-8"), self._jail_owner)
        except _NotRegular:
            return ToolResult(f"Error: {rel} is not a regular file", is_error=True)
        self._known_paths.add(rel)
        verb = "Modified" if existed else "Created"
        return ToolResult(f"{verb} {rel} ({len(content)} characters).\n{self._diff(rel, before, content, existed)}")

    # ------------------------------------------------------------------ tools (RV and shell)

    def _tool_run_tests(self, path: str | None = None) -> ToolResult:
        selection = ""
        if path is not None:
            target = resolve_sandbox_path(self.root, path)
            if not target.exists():
                return ToolResult(f"Error: no such test file or directory: {path}", is_error=True)
            selection = " " + _quote(display_path(self.root, target))
        command = f"{_quote(sys.executable)} -I -B -m pytest -q --tb=short -p no:cacheprovider{selection}"
        result = self._run(command, self.root, self.limits.test_timeout_s)
        quota = self._enforce_quota()
        if result.timed_out:
            limit = self.limits.test_timeout_s
            return ToolResult(f"Tests timed out after {limit:g} s.\n{result.output}{quota}", is_error=True)
        return ToolResult(f"pytest exit code {result.exit_code}\n{result.output}{quota}", is_error=bool(quota))

    def _tool_bash(self, command: str, timeout: float | None = None) -> ToolResult:
        limit = self.limits.bash_timeout_s
        if timeout is not None:
            limit = min(max(float(timeout), 0.1), limit)
        result = self._run(command, self.root, limit)
        if result.rejected is not None:
            return ToolResult(f"Error: {result.output}", is_error=True)
        quota = self._enforce_quota()
        if result.timed_out:
            return ToolResult(f"Command timed out after {limit:g} s (killed).\n{result.output}{quota}", is_error=True)
        return ToolResult(f"exit code {result.exit_code}\n{result.output}{quota}", is_error=bool(quota))

    # ------------------------------------------------------------------ reward

    def evaluate(self) -> TestReport:
        """Run visible + hidden tests on the agent's current sources (cached per working-tree state)."""
        digest = self.snapshot().digest
        cached = self._report_cache.get(digest)
        if cached is not None:
            return cached
        self._build_eval_tree()
        # visible tests: the task's own tests on the agent's sources, in the jail (not the reward)
        command = (
            f"{_quote(sys.executable)} -I -B -c {_quote(RUNNER_SOURCE)} "
            "-q --tb=line -p no:cacheprovider -p no:junitxml --rootdir=. tests"
        )
        nonce = new_nonce()
        visible = self._run(command, self._eval_dir, self.limits.test_timeout_s, channel_input=nonce.encode())
        # hidden tests (the reward): a trainer-side pytest that calls the agent's code in the jail
        hidden = run_hidden_tests(
            self.task.hidden_test_files(),
            self._eval_dir,
            functools.partial(self._run, root=self._eval_dir, timeout_s=self.limits.test_timeout_s),
            timeout_s=self.limits.test_timeout_s,
            max_output_bytes=self.limits.max_output_bytes,
            host_env=_JAIL_ENV,
            task_tree=self.task.repo_dir,
        )
        report = self._read_report(visible, nonce, hidden)
        self._report_cache[digest] = report
        return report

    def reward(self) -> float:
        """Hidden-test outcome: ``binary`` 1.0/0.0 or the ``fraction`` of hidden tests passed."""
        report = self.evaluate()
        if self.reward_mode == "binary":
            return 1.0 if report.hidden_all_pass else 0.0
        return report.hidden_passed / report.hidden_total if report.hidden_total else 0.0

    # ------------------------------------------------------------------ state

    def snapshot(self) -> SandboxState:
        """Working-tree files (without ``.git`` and caches) and the paths the agent knows."""
        files: list[tuple[str, bytes]] = []
        for file in sorted(self._walk_files(self.root)):
            try:
                files.append((display_path(self.root, file), _read_regular(file)))
            except OSError:  # replaced by a FIFO/symlink or removed since the walk: not a file of the tree
                continue
        return SandboxState(tuple(files), frozenset(self._known_paths))

    def restore(self, state: SandboxState) -> None:
        """Make the working tree and the read set equal to ``state`` (``.git`` is left alone)."""
        wanted = dict(state.files)
        for file in list(self._walk_files(self.root, special=True)):
            if display_path(self.root, file) not in wanted or not _is_regular(file):
                file.unlink()  # FIFOs, sockets and devices are never part of a state
        for rel, content in wanted.items():
            target = resolve_sandbox_path(self.root, rel, for_write=True)
            self._make_parents(target)
            try:
                same = _read_regular(target) == content
            except OSError:
                same = False
            if not same:
                _write_regular(target, content, self._jail_owner)
        self._known_paths = set(state.known_paths)

    def git_diff(self) -> str:
        """``git diff`` of the working tree against the task's commit."""
        return self._git("diff", "--no-color", capture=True)

    # ------------------------------------------------------------------ helpers

    def _run(
        self,
        command: str,
        root: Path,
        timeout_s: float,
        channel_input: bytes | None = None,
        child_fds: Mapping[str, int] | None = None,
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
        )

    def _enforce_quota(self) -> str:
        """Delete the largest files of the sandbox directory until it uses at most ``max_workspace_bytes``."""
        sizes: list[tuple[int, Path]] = []
        for directory, _, filenames in os.walk(self._tmp):
            for name in filenames:
                path = Path(directory) / name
                try:
                    info = os.lstat(path)
                except OSError:
                    continue
                sizes.append((max(info.st_size, info.st_blocks * 512), path))
        used = sum(size for size, _ in sizes)
        if used <= self.limits.max_workspace_bytes:
            return ""
        removed: list[str] = []
        for size, path in sorted(sizes, key=lambda item: item[0], reverse=True):
            if used <= self.limits.max_workspace_bytes:
                break
            try:
                path.unlink()
            except OSError:
                continue
            used -= size
            removed.append(os.path.relpath(path, self.root))
        limit = self.limits.max_workspace_bytes
        return f"\n[disk quota of {limit} bytes exceeded: deleted {', '.join(removed)}]\n"

    def _check_known(self, rel: str) -> ToolResult | None:
        if self.require_read_before_edit and rel not in self._known_paths:
            return ToolResult(f"Error: {rel} has not been read yet; read it before editing it", is_error=True)
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

    def _walk_files(self, base: Path, *, special: bool = False) -> list[Path]:
        """Regular files under ``base`` (not following symlinks); ``special``: also FIFOs, sockets, devices."""
        if not base.is_dir():
            return [base] if _is_regular(base) else []
        found: list[Path] = []
        for directory, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
            for name in sorted(filenames):
                file = Path(directory) / name
                try:
                    mode = os.lstat(file).st_mode
                except OSError:
                    continue
                if stat.S_ISREG(mode) or (special and not stat.S_ISLNK(mode)):
                    found.append(file)
        return found

    def _build_eval_tree(self) -> None:
        shutil.rmtree(self._eval_dir, ignore_errors=True)
        self._eval_dir.mkdir()
        for file in self._walk_files(self.root):
            rel = Path(display_path(self.root, file))
            if rel.parts[0] in _PROTECTED_TOP or rel.name == "conftest.py":
                continue
            destination = self._eval_dir / rel
            destination.parent.mkdir(parents=True, exist_ok=True)
            try:
                destination.write_bytes(_read_regular(file))
            except OSError:  # no longer a regular file
                continue
        for name in _PROTECTED_TOP:
            original = self.task.repo_dir / name
            if original.is_dir():
                shutil.copytree(original, self._eval_dir / name, ignore=shutil.ignore_patterns(*_SKIP_DIRS))
            elif original.is_file():
                shutil.copyfile(original, self._eval_dir / name)
        (self._eval_dir / "tests").mkdir(exist_ok=True)
        give_to_jail(self._eval_dir, self.jail_mode)  # made just now by this process (regular files, dirs)

    def _read_report(self, visible: JailResult, nonce: str, hidden: HiddenRun) -> TestReport:
        seen = parse_channel(visible.channel, nonce, [], overflow=visible.channel_overflow)
        visible_passed, visible_total = seen.visible if seen.problem is None and not visible.timed_out else (0, 0)
        problem = hidden.verdict.problem
        if hidden.timed_out:
            problem = f"the hidden-test run timed out after {self.limits.test_timeout_s:g} s"
        hidden_passed, hidden_total = hidden.verdict.hidden if problem is None else (0, 0)
        hidden_total = max(hidden_total, 1)  # a run that collected nothing hidden is a failure
        output = f"{visible.output}\n{hidden.output}"
        if problem is not None:
            output += f"\n[reward not trusted: {problem}]\n"
        return TestReport(hidden_passed, hidden_total, visible_passed, visible_total, output, problem)

    def _make_parents(self, target: Path) -> None:
        """Create ``target``'s missing parent directories (inside the root), each given to the jail user."""
        missing: list[Path] = []
        parent = target.parent
        while not parent.exists() and parent != self.root:
            missing.append(parent)
            parent = parent.parent
        for directory in reversed(missing):
            try:
                directory.mkdir()
            except FileExistsError:
                continue  # made meanwhile (not by this call: left as it is)
            if self._jail_owner is not None:
                os.chown(directory, *self._jail_owner, follow_symlinks=False)
        target.parent.mkdir(parents=True, exist_ok=True)  # raises as before when a parent is a file

    def _git(self, *args: str, capture: bool = False) -> str:
        env = scrubbed_environment(self.root, self._fallback_tmp, _GIT_ENV)
        # the repository may belong to the jail user: trust it explicitly (git's ownership check)
        completed = subprocess.run(
            ["git", "-c", f"safe.directory={self.root}", *args],
            cwd=self.root,
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if completed.returncode != 0:
            raise RuntimeError(f"git {' '.join(args)} failed in {self.root}: {completed.stderr.strip()}")
        return completed.stdout if capture else ""


class _NotRegular(OSError):
    """A path that is a FIFO, socket, device or symlink: never opened by the file tools."""


_OPEN_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _read_regular(path: Path, limit: int | None = None) -> bytes:
    """Read (at most ``limit`` bytes of) a regular file without following a final symlink or blocking."""
    fd = os.open(path, os.O_RDONLY | _OPEN_FLAGS)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _NotRegular(f"{path} is not a regular file")
        os.set_blocking(fd, True)
        chunks: list[bytes] = []
        left = limit if limit is not None else -1
        while left != 0:
            chunk = os.read(fd, 1 << 20 if left < 0 else min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            if left > 0:
                left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _write_regular(path: Path, data: bytes, owner: tuple[int, int] | None = None) -> None:
    """Replace the contents of a regular file (created if missing); FIFOs/devices/symlinks are refused.

    ``owner``: a file this call creates is given to that ``(uid, gid)`` (the jail user); an existing
    file keeps its owner."""
    created = False
    try:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN_FLAGS, 0o644)
            created = True
        except FileExistsError:
            fd = os.open(path, os.O_WRONLY | _OPEN_FLAGS)
    except OSError as exc:
        if exc.errno in (errno.ENXIO, errno.ELOOP):  # a FIFO without a reader / a symlink
            raise _NotRegular(f"{path} is not a regular file") from exc
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _NotRegular(f"{path} is not a regular file")
        if created and owner is not None:
            os.fchown(fd, *owner)
        os.set_blocking(fd, True)
        os.ftruncate(fd, 0)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


# The ``search`` worker: reads a JSON request on stdin, prints {"matches": [[i, line_no, text]], "total": n}.
_SEARCH_SOURCE = r"""
import json, os, re, stat, sys
req = json.loads(sys.stdin.buffer.read())
regex = re.compile(req["pattern"])
matches, total = [], 0
for index, name in enumerate(req["files"]):
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        continue
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            continue
        os.set_blocking(fd, True)
        data = os.read(fd, req["max_bytes"])
    finally:
        os.close(fd)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        continue
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
        digest.update(rel.encode("utf-8") + b"\x00" + hashlib.sha256(content).digest())
    return digest.hexdigest()


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)
