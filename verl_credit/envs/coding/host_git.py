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
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping
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


class HostGit:
    """``git`` over ``work_tree`` with the private git directory ``git_dir`` (see the module doc).

    Args:
        git_dir: the trainer's git directory (created by :meth:`init`; never inside ``work_tree``).
        work_tree: the agent's files.
        home: an empty directory used as ``HOME`` (no user configuration is found there).
        identity: ``GIT_AUTHOR_*``/``GIT_COMMITTER_*`` variables for :meth:`commit_all`.
    """

    def __init__(self, git_dir: Path, work_tree: Path, home: Path, identity: Mapping[str, str]) -> None:
        self.git_dir = git_dir
        self.work_tree = work_tree
        self.home = home
        self.identity = dict(identity)

    def run(self, *args: str) -> str:
        """Run ``git args`` and return its standard output; raises ``RuntimeError`` on failure."""
        argv = ["git", "--no-pager"]
        for setting in (*_SAFE_CONFIG, f"safe.directory={self.git_dir}", f"safe.directory={self.work_tree}"):
            argv += ["-c", setting]
        completed = subprocess.run(
            [*argv, *args],
            cwd=self.home,
            env=self._environment(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=_TIMEOUT_S,
            check=False,
        )
        if completed.returncode != 0:
            message = completed.stderr.decode("utf-8", errors="replace").strip()
            raise RuntimeError(f"git {' '.join(args)} failed in {self.work_tree}: {message}")
        return completed.stdout.decode("utf-8", errors="replace")

    def init_commit(self, message: str) -> None:
        """Make the private repository with one commit of the whole work tree."""
        self.run("init", "-q")
        self.run("add", "-A")
        self.run("commit", "-q", "--no-verify", "-m", message)

    def copy_to(self, destination: Path) -> None:
        """Copy the private repository to ``destination`` (the agent's own ``.git``, which the agent
        may change at will: nothing here reads it again)."""
        shutil.copytree(self.git_dir, destination, symlinks=True)
        subprocess.run(
            ["git", "--git-dir", str(destination), "config", "--unset", "core.worktree"],
            env=self._environment(include_repository=False),
            cwd=self.home,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=_TIMEOUT_S,
            check=False,
        )

    def diff(self) -> str:
        """``git diff`` of the work tree against the task's commit."""
        return self.run("diff", "--no-color", "--no-ext-diff", "--no-textconv")

    def _environment(self, include_repository: bool = True) -> dict[str, str]:
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.home),
            "XDG_CONFIG_HOME": str(self.home),
            "LC_ALL": "C",
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": "/dev/null",
            "GIT_ATTR_NOSYSTEM": "1",
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_OPTIONAL_LOCKS": "0",
            "GIT_NO_REPLACE_OBJECTS": "1",
            "GIT_PAGER": "cat",
            "GIT_CEILING_DIRECTORIES": str(self.home.parent),
            **self.identity,
        }
        if include_repository:
            env["GIT_DIR"] = str(self.git_dir)
            env["GIT_WORK_TREE"] = str(self.work_tree)
        return env
