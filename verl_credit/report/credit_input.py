"""Credit JSONL lines (docs/design.md section 8) as the report draws them.

A line carries per-action weights and advantages; ``verl-credit route`` and the demo add the
validated influence graph (``"graph"``) and, for call_credit, the call graph (``"call_graph"``).
Both are optional: without them the pictures show weights only. A graph that does not fit the
line (wrong action count, malformed) is dropped with a note, never drawn wrong.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_credit.call_graph import CallGraph
from verl_credit.graph import InfluenceGraph, validate_graph
from verl_credit.io import InputError, iter_jsonl
from verl_credit.trajectory import Trajectory

__all__ = [
    "CreditLine",
    "action_kinds",
    "action_labels",
    "attach_labels",
    "load_credit_lines",
    "parse_credit_line",
]


@dataclass
class CreditLine:
    """One trajectory's credit. Lists have one entry per action (``T`` entries)."""

    id: str
    uid: str
    reward: float
    estimator: str
    trajectory_advantage: float
    weights: list[float]
    advantages: list[float]
    lengths: list[int]
    roles: list[str | None]
    fallback: bool = False
    graph: InfluenceGraph | None = None
    call_graph: CallGraph | None = None
    labels: list[str] | None = None  # short action descriptions, when the transcript is known
    kinds: list[str] | None = None  # per action "tool:<name>" or "text", when the transcript is known
    notes: list[str] = field(default_factory=list)

    @property
    def num_actions(self) -> int:
        return len(self.weights)


def _number(record: Mapping[str, Any], key: str, where: str) -> float:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{where}{key}: expected a number, got {value!r}")
    return float(value)


def parse_credit_line(record: Any) -> CreditLine:
    """Validate one credit object; raises ``ValueError`` naming the field."""
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    if "id" not in record:
        raise ValueError("id: missing")
    actions = record.get("actions")
    if not isinstance(actions, list):
        raise ValueError(f"actions: expected a list, got {type(actions).__name__}")
    weights, advantages, lengths, roles = [], [], [], []
    for position, action in enumerate(actions):
        where = f"actions[{position}]."
        if not isinstance(action, dict):
            raise ValueError(f"actions[{position}]: expected an object")
        weights.append(_number(action, "weight", where))
        advantages.append(_number(action, "advantage", where))
        length = action.get("length", 1)
        if isinstance(length, bool) or not isinstance(length, int) or length < 0:
            raise ValueError(f"{where}length: expected a non-negative integer, got {length!r}")
        lengths.append(length)
        role = action.get("role")
        roles.append(role if isinstance(role, str) else None)
    line = CreditLine(
        id=str(record["id"]),
        uid=str(record.get("uid", record["id"])),
        reward=_number(record, "reward", ""),
        estimator=str(record.get("estimator", "?")),
        trajectory_advantage=_number(record, "trajectory_advantage", ""),
        weights=weights,
        advantages=advantages,
        lengths=lengths,
        roles=roles,
        fallback=bool(record.get("fallback", False)),
    )
    raw_graph = record.get("graph")
    if raw_graph is not None:
        graph, validation = validate_graph(raw_graph, line.num_actions)
        if validation.fallback:
            line.notes.append(f"graph not drawn: {'; '.join(validation.problems)}")
        else:
            line.graph = graph
    raw_call_graph = record.get("call_graph")
    if raw_call_graph is not None:
        try:
            call_graph = CallGraph.from_json(raw_call_graph)
        except (KeyError, TypeError, ValueError) as exc:
            line.notes.append(f"call graph not drawn: {exc}")
        else:
            if call_graph.num_calls == line.num_actions:
                line.call_graph = call_graph
            else:
                line.notes.append(f"call graph not drawn: {call_graph.num_calls} calls for {line.num_actions} actions")
    return line


def load_credit_lines(path: str | Path, labels: Mapping[str, list[str]] | None = None) -> list[CreditLine]:
    """Every line of a credit JSONL; ``labels`` (trajectory id -> action labels) is attached when
    its length matches. Malformed lines raise :class:`InputError` naming file, line and field."""
    lines = []
    for number, record in iter_jsonl(path):
        try:
            line = parse_credit_line(record)
        except ValueError as exc:
            raise InputError(path, number, str(exc)) from None
        attach_labels([line], labels)
        lines.append(line)
    if not lines:
        raise InputError(path, None, "no credit lines")
    return lines


def attach_labels(lines: Iterable[CreditLine], labels: Mapping[str, list[str]] | None) -> None:
    """Set ``line.labels`` from ``labels[line.id]`` where the action counts agree."""
    if not labels:
        return
    for line in lines:
        found = labels.get(line.id)
        if found is not None and len(found) == line.num_actions:
            line.labels = list(found)


def action_labels(trajectory: Trajectory) -> list[str]:
    """Short descriptions of a trajectory's actions: ``tool(first argument)`` or the first words."""
    labels = []
    for action in trajectory.actions:
        if action.tool_calls:
            call = action.tool_calls[0]
            first = next((str(v) for v in call.arguments.values() if isinstance(v, str | int | float)), "")
            more = "+" if len(action.tool_calls) > 1 else ""
            labels.append(f"{call.name}({first}){more}")
        else:
            labels.append(action.content or "(empty)")
    return labels


def action_kinds(trajectory: Trajectory) -> list[str]:
    """What each action of a trajectory is: ``tool:<first call's name>`` or ``text``."""
    return [f"tool:{a.tool_calls[0].name}" if a.tool_calls else "text" for a in trajectory.actions]
