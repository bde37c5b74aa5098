"""Credit JSONL records (docs/design.md section 8), written by ``verl-credit route`` and the demo.

One line per trajectory::

    {"id", "uid", "reward", "estimator", "trajectory_advantage",
     "actions": [{"index", "length", "role", "weight", "advantage"[, "ambiguous"]}, ...],
     "fallback", "repaired_edges", "graph"?, "call_graph"?}

``graph`` (the validated influence graph) and ``call_graph`` are extra keys so that the report
can draw edges; readers of the section 8 format may ignore them.
"""

from __future__ import annotations

from typing import Any

from verl_credit.annotate.base import AnnotationResult
from verl_credit.batch_credit import BatchCredit
from verl_credit.call_graph import CallGraph
from verl_credit.trajectory import Trajectory

__all__ = ["credit_record", "credit_records"]


def credit_record(
    trajectory: Trajectory,
    credit: BatchCredit,
    row: int,
    annotation: AnnotationResult | None = None,
    call_graph: CallGraph | None = None,
) -> dict[str, Any]:
    """The credit line of trajectory ``row`` of ``credit``."""
    weights = credit.weights_of(row)
    advantages = credit.advantages_of(row)
    roles = call_graph.reported_roles() if call_graph is not None else [None] * len(weights)
    actions = []
    for index, action in enumerate(trajectory.actions):
        entry: dict[str, Any] = {
            "index": index,
            "length": action.length,
            "role": roles[index],
            "weight": weights[index],
            "advantage": advantages[index],
        }
        if call_graph is not None and call_graph.ambiguous[index]:
            entry["ambiguous"] = True
        actions.append(entry)
    record: dict[str, Any] = {
        "id": trajectory.id,
        "uid": trajectory.uid,
        "reward": trajectory.reward,
        "estimator": credit.estimator,
        "trajectory_advantage": float(credit.trajectory_advantage[row]),
        "actions": actions,
        "fallback": bool(annotation.fallback) if annotation is not None else False,
        "repaired_edges": annotation.validation.repaired_edges if annotation is not None else 0,
    }
    if annotation is not None:
        record["graph"] = annotation.graph.to_json()
    if call_graph is not None:
        record["call_graph"] = call_graph.to_json()
    return record


def credit_records(
    trajectories: list[Trajectory],
    credit: BatchCredit,
    annotations: list[AnnotationResult] | None = None,
    call_graphs: list[CallGraph] | None = None,
) -> list[dict[str, Any]]:
    """Credit lines for a whole batch, in order."""
    return [
        credit_record(
            trajectory,
            credit,
            row,
            annotations[row] if annotations is not None else None,
            call_graphs[row] if call_graphs is not None else None,
        )
        for row, trajectory in enumerate(trajectories)
    ]
