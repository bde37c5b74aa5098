"""JSONL files of DESIGN.md section 8 with errors that name the file, the line and the field."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from verl_credit.trajectory import Trajectory, TrajectoryError

__all__ = ["InputError", "count_lines", "iter_jsonl", "load_trajectories", "write_jsonl"]


class InputError(ValueError):
    """Malformed input; ``str(error)`` is the one-line message the CLI prints."""

    def __init__(self, path: str | Path, line: int | None, message: str):
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {message}")
        self.path, self.line = str(path), line


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, Any]]:
    """Yield ``(line_number, object)`` for every non-blank line (1-based line numbers)."""
    try:
        handle = open(path, encoding="utf-8")
    except OSError as exc:
        raise InputError(path, None, f"cannot open: {exc.strerror or exc}") from None
    with handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(path, number, f"bad JSON: {exc.msg} (column {exc.colno})") from None


def count_lines(path: str | Path) -> int:
    """Number of non-blank lines (for progress bars)."""
    try:
        with open(path, encoding="utf-8") as handle:
            return sum(1 for line in handle if line.strip())
    except OSError:
        return 0


def load_trajectories(path: str | Path) -> Iterator[tuple[int, Trajectory]]:
    """Yield ``(line_number, trajectory)``; a malformed record raises :class:`InputError`."""
    for number, record in iter_jsonl(path):
        try:
            yield number, Trajectory.from_record(record)
        except TrajectoryError as exc:
            raise InputError(path, number, str(exc)) from None


def write_jsonl(path: str | Path, records: Iterable[dict[str, Any]]) -> int:
    """Write records atomically enough for a CLI (to ``path.tmp`` then rename); returns the count."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(target.name + ".tmp")
    count = 0
    with open(temporary, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            count += 1
    temporary.replace(target)
    return count
