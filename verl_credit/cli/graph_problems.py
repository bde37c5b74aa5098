"""The given graphs that validation repaired or replaced: one stderr warning each (``annotate`` and
``route`` alike), collected over a stream without keeping its transcripts."""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

__all__ = ["GraphProblems", "is_graph_problem", "print_graph_problems"]

#: warnings shown before the "more graphs were repaired" line
LIMIT = 20


def is_graph_problem(annotation: Any) -> bool:
    """A given graph that validation repaired or replaced."""
    validation = annotation.validation
    return annotation.source == "given" and bool(validation.fallback or validation.repaired_edges)


def print_graph_problems(trajectories: list[Any], annotations: list[Any], limit: int = LIMIT) -> None:
    """One stderr line per repaired or replaced given graph (the first ``limit``), naming its id."""
    shown = 0
    for trajectory, annotation in zip(trajectories, annotations, strict=True):
        validation = annotation.validation
        if not is_graph_problem(annotation):
            continue
        if shown == limit:
            print("verl-credit: warning: more graphs were repaired (see repaired_edges)", file=sys.stderr)
            return
        shown += 1
        action = "replaced by the uniform graph" if validation.fallback else f"{validation.repaired_edges} repairs"
        problems = "; ".join(validation.problems[:3])
        print(f"verl-credit: warning: graph of {trajectory.id!r}: {action}: {problems}", file=sys.stderr)


class GraphProblems:
    """The first repaired or replaced given graphs of a stream, as many as
    :func:`print_graph_problems` shows (and one more, for its "more" line)."""

    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        self.trajectories: list[Any] = []
        self.annotations: list[Any] = []

    def add(self, trajectory: Any, annotation: Any) -> None:
        if len(self.annotations) <= self.limit and is_graph_problem(annotation):
            self.trajectories.append(SimpleNamespace(id=trajectory.id))  # the id, not the transcript
            self.annotations.append(annotation)

    def add_all(self, trajectories: list[Any], annotations: list[Any]) -> None:
        for trajectory, annotation in zip(trajectories, annotations, strict=False):
            self.add(trajectory, annotation)

    def print(self) -> None:
        print_graph_problems(self.trajectories, self.annotations, self.limit)
