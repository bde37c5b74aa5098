"""Git commands the trainer runs on the agent's work tree, blind to everything the agent wrote.

The agent's repository (``repo/.git``) is writable from the jail: ``bash`` can set
``core.fsmonitor``, ``diff.external``, ``core.hooksPath`` or an ``include.path`` there, plant hooks
(``post-index-change`` runs on an index refresh), or replace ``.git`` by a ``gitdir:`` file
pointing at a repository it made. Any of these runs a command *as the trainer* the next time the
trainer's own ``git`` reads that repository. So the trainer never does: :class:`HostGit` uses a
private git directory (a copy of the task's commit made before any jailed command ran, outside
the work tree) with

* no system, global or XDG configuration (``GIT_CONFIG_NOSYSTEM``, ``GIT_CONFIG_GLOBAL=/dev/null``,
  an empty ``HOME``), and its own repository configuration, which only the trainer writes;
* ``core.hooksPath=/dev/null``, ``core.fsmonitor=false``, ``core.attributesFile=/dev/null``, no
  pager, ``--no-ext-diff --no-textconv`` for diffs, and ``GIT_OPTIONAL_LOCKS=0`` (a diff does not
  rewrite the index);
* attributes from the work tree's ``.gitattributes`` can name a ``filter``/``diff`` driver, but a
  driver only runs a command if the *configuration* defines it, and none does.

The private directory is not trusted either: in the ``fallback`` jail mode a jailed command runs
as the trainer's user without a mount namespace, so it can reach ``<tmp>/host.git`` and
``<tmp>/home`` (``$(dirname "$PWD")/host.git/config``). So the repository lives in the trainer's
memory: :meth:`HostGit.init_commit` reads the fresh git directory into bytes, and every later
command runs on a copy written from those bytes into a new private temporary directory (with a new
empty ``HOME``), removed when the command ends. Nothing a jailed command wrote after the commit,
anywhere, is configuration to the trainer's git (no jailed process outlives its command:
:mod:`.reaper`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

__all__ = ["HostGit"]

_SAFE_CONFIG = (
    "core.fsmonitor=false",
    "core.hooksPath=/dev/null",
    "core.attributesFile=/dev/null",
    "core.pager=cat",
    "core.untrackedCache=false",
    "color.ui=false",
    "protocol.allow=never",
)
_TIMEOUT_S = 30
#: a task's repository is a few hundred KB; a larger private directory means something is wrong
_MAX_REPOSITORY_BYTES = 256 * 1024 * 1024


class HostGit:
    """``git`` over ``work_tree`` with a private git directory kept in memory (see the module doc).

    Args:
        git_dir: where :meth:`init_commit` builds the repository (never inside ``work_tree``); read
            into memory and removed at the end of :meth:`init_commit`.
        work_tree: the agent's files.
        home: an empty directory used as ``HOME`` while the repository is built.
        identity: ``GIT_AUTHOR_*``/``GIT_COMMITTER_*`` variables for :meth:`init_commit`.
    """

    def __init__(self, git_dir: Path, work_tree: Path, home: Path, identity: Mapping[str, str]) -> None:
        self.git_dir = git_dir
        self.work_tree = work_tree
        self.home = home
        self.identity = dict(identity)
        #: the repository after :meth:`init_commit`: relative path -> (mode, bytes); None for a directory
        self._pristine: dict[str, tuple[int, bytes | None]] | None = None

    def run(self, *args: str) -> str:
        """Run ``git args`` and return its standard output; raises ``RuntimeError`` on failure.

        After :meth:`init_commit`, on a fresh copy of the repository written from memory."""
        if self._pristine is None:
            return self._run_in(self.git_dir, self.home, args)
        with self._fresh_copy() as (git_dir, home):
            return self._run_in(git_dir, home, args)

    def init_commit(self, message: str) -> None:
        """Make the private repository with one commit of the whole work tree, then keep it in memory."""
        self.run("init", "-q")
        self.run("add", "-A")
        self.run("commit", "-q", "--no-verify", "-m", message)
        self._pristine = _read_repository(self.git_dir)
        shutil.rmtree(self.git_dir)  # never read again: a jailed command may write where it was

    def copy_to(self, destination: Path) -> None:
        """Copy the private repository to ``destination`` (the agent's own ``.git``, which the agent
        may change at will: nothing here reads it again)."""
        if self._pristine is None:
            raise RuntimeError("copy_to before init_commit")
        _write_repository(self._pristine, destination)
        subprocess.run(
            ["git", "--git-dir", str(destination), "config", "--unset", "core.worktree"],
            env=self._environment(self.home, git_dir=None),
            cwd=self.home,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=_TIMEOUT_S,
            check=False,
        )

    def diff(self) -> str:
        """``git diff`` of the work tree against the task's commit."""
        return self.run("diff", "--no-color", "--no-ext-diff", "--no-textconv")

    @contextlib.contextmanager
    def _fresh_copy(self) -> Iterator[tuple[Path, Path]]:
        """A new private temporary directory holding the repository (``git``) and an empty ``home``."""
        assert self._pristine is not None
        scratch = Path(tempfile.mkdtemp(prefix="vc-host-git-"))
        try:
            _write_repository(self._pristine, scratch / "git")
            (scratch / "home").mkdir(mode=0o700)
            yield scratch / "git", scratch / "home"
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _run_in(self, git_dir: Path, home: Path, args: tuple[str, ...]) -> str:
        argv = ["git", "--no-pager"]
        for setting in (*_SAFE_CONFIG, f"safe.directory={git_dir}", f"safe.directory={self.work_tree}"):
            argv += ["-c", setting]
        completed = subprocess.run(
            [*argv, *args],
            cwd=home,
            env=self._environment(home, git_dir=git_dir),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=_TIMEOUT_S,
            check=False,
        )
        if completed.returncode != 0:
            message = completed.stderr.decode("utf-8", errors="replace").strip()
            raise RuntimeError(f"git {' '.join(args)} failed in {self.work_tree}: {message}")
        return completed.stdout.decode("utf-8", errors="replace")

    def _environment(self, home: Path, git_dir: Path | None) -> dict[str, str]:
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home),
            "LC_ALL": "C",
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": "/dev/null",
            "GIT_ATTR_NOSYSTEM": "1",
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_OPTIONAL_LOCKS": "0",
            "GIT_NO_REPLACE_OBJECTS": "1",
            "GIT_PAGER": "cat",
            "GIT_CEILING_DIRECTORIES": str(home.parent),
            **self.identity,
        }
        if git_dir is not None:
            env["GIT_DIR"] = str(git_dir)
            env["GIT_WORK_TREE"] = str(self.work_tree)
        return env


def _read_repository(git_dir: Path) -> dict[str, tuple[int, bytes | None]]:
    """Every directory and regular file under ``git_dir`` (just made by the trainer's own git, before
    any jailed command ran), as relative path -> (permission bits, bytes or None for a directory)."""
    entries: dict[str, tuple[int, bytes | None]] = {}
    total = 0
    for directory, dirnames, filenames in os.walk(git_dir):
        relative = os.path.relpath(directory, git_dir)
        for name in dirnames:
            mode = os.lstat(os.path.join(directory, name)).st_mode
            entries[os.path.normpath(os.path.join(relative, name))] = (stat.S_IMODE(mode), None)
        for name in filenames:
            path = os.path.join(directory, name)
            info = os.lstat(path)
            if not stat.S_ISREG(info.st_mode):
                raise RuntimeError(f"unexpected non-regular file in the trainer's git directory: {path}")
            total += info.st_size
            if total > _MAX_REPOSITORY_BYTES:
                raise RuntimeError(f"the task's repository is over {_MAX_REPOSITORY_BYTES} bytes: {git_dir}")
            with open(path, "rb") as handle:
                entries[os.path.normpath(os.path.join(relative, name))] = (stat.S_IMODE(info.st_mode), handle.read())
    return entries


def _write_repository(entries: Mapping[str, tuple[int, bytes | None]], destination: Path) -> None:
    """Write :func:`_read_repository`'s entries under ``destination`` (which must not exist)."""
    destination.mkdir(mode=0o700)
    for relative in sorted(entries):  # parents sort before their children
        mode, content = entries[relative]
        path = destination / relative
        if content is None:
            path.mkdir(mode=0o700)
            os.chmod(path, mode | stat.S_IRWXU)
            continue
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(content)
        os.chmod(path, mode | stat.S_IRUSR)
