"""Bug-fix tasks shipped with the coding sandbox (``verl_credit/envs/coding/tasks/<name>/``).

Layout of one task directory::

    task.json          statement, target file, distractors, visible tests, reference solution, wrong edits
    repo/              the buggy repository the agent sees (sources, visible tests, pytest.ini)
    hidden/            hidden test files: copied into ``tests/`` only when the reward is computed

``task.json`` keys: ``name``, ``statement``, ``target`` (the file holding the bug), ``distractors``
(other source files), ``visible_tests`` (paths under ``repo/``), ``symbol`` (the function/class at
fault, for ``search``), ``solution`` (a list of edits ``{path, old, new}``: the reference fix) and
``wrong_edits`` (named plausible-but-wrong fixes, each a list of edits plus ``visible_passes``: whether
it fools the visible tests). Every wrong edit of a shipped task rewrites the same site as the solution
(same ``path`` and ``old``), so an agent can switch between them with one more edit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["TASKS_DIR", "CodingTask", "FileEdit", "WrongEdit", "list_tasks", "load_task"]

TASKS_DIR = Path(__file__).resolve().parent / "tasks"


@dataclass(frozen=True)
class FileEdit:
    """A ``str_replace`` edit: replace the single occurrence of ``old`` in ``path`` by ``new``."""

    path: str
    old: str
    new: str

    def to_arguments(self) -> dict[str, str]:
        """The ``edit_file`` tool arguments that perform this edit."""
        return {"path": self.path, "old": self.old, "new": self.new}


@dataclass(frozen=True)
class WrongEdit:
    name: str
    edits: tuple[FileEdit, ...]
    visible_passes: bool  # True: the visible tests pass after this edit although the hidden tests fail


@dataclass(frozen=True)
class CodingTask:
    """One bug-fix task: where its files are and what fixes it."""

    name: str
    directory: Path
    statement: str
    target: str
    distractors: tuple[str, ...]
    visible_tests: tuple[str, ...]
    symbol: str
    solution: tuple[FileEdit, ...]
    wrong_edits: tuple[WrongEdit, ...]

    @property
    def repo_dir(self) -> Path:
        return self.directory / "repo"

    @property
    def hidden_dir(self) -> Path:
        return self.directory / "hidden"

    def hidden_test_files(self) -> list[Path]:
        return sorted(self.hidden_dir.glob("test_*.py"))

    def wrong_edit(self, name: str) -> WrongEdit:
        for wrong in self.wrong_edits:
            if wrong.name == name:
                return wrong
        raise KeyError(f"task {self.name!r} has no wrong edit {name!r}; known: {[w.name for w in self.wrong_edits]}")

    @classmethod
    def from_directory(cls, directory: Path) -> CodingTask:
        """Load ``directory/task.json``; raises ``ValueError`` naming the file and the bad key."""
        spec_path = directory / "task.json"
        try:
            raw = json.loads(spec_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"{spec_path}: cannot read task spec: {exc}") from exc
        try:
            task = cls(
                name=str(raw["name"]),
                directory=directory,
                statement=str(raw["statement"]),
                target=str(raw["target"]),
                distractors=tuple(str(p) for p in raw.get("distractors", [])),
                visible_tests=tuple(str(p) for p in raw["visible_tests"]),
                symbol=str(raw.get("symbol", "")),
                solution=tuple(_edit(e) for e in raw["solution"]),
                wrong_edits=tuple(
                    WrongEdit(str(w["name"]), tuple(_edit(e) for e in w["edits"]), bool(w.get("visible_passes", False)))
                    for w in raw.get("wrong_edits", [])
                ),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"{spec_path}: missing or malformed key {exc}") from exc
        if task.name != directory.name:
            raise ValueError(f"{spec_path}: name {task.name!r} does not match the directory name {directory.name!r}")
        for rel in (task.target, *task.distractors, *task.visible_tests):
            if not (task.repo_dir / rel).is_file():
                raise ValueError(f"{spec_path}: file {rel!r} does not exist under repo/")
        if not task.solution:
            raise ValueError(f"{spec_path}: 'solution' must hold at least one edit")
        if not task.hidden_test_files():
            raise ValueError(f"{spec_path}: no hidden/test_*.py files")
        return task


def _edit(raw: dict[str, Any]) -> FileEdit:
    return FileEdit(path=str(raw["path"]), old=str(raw["old"]), new=str(raw["new"]))


def list_tasks(root: Path = TASKS_DIR) -> list[str]:
    """Names of the task directories under ``root`` (sorted)."""
    return sorted(p.name for p in root.iterdir() if p.is_dir() and (p / "task.json").is_file())


def load_task(name_or_path: str | Path, root: Path = TASKS_DIR) -> CodingTask:
    """A shipped task by name, or any task directory by path."""
    candidate = Path(name_or_path)
    directory = candidate if candidate.is_dir() and (candidate / "task.json").is_file() else root / str(name_or_path)
    if not (directory / "task.json").is_file():
        raise ValueError(f"unknown coding task {str(name_or_path)!r}; shipped tasks: {list_tasks(root)}")
    return CodingTask.from_directory(directory)
