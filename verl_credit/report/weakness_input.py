"""What ``verl-credit weakness`` reads: rollouts or call_credit credit lines -> :class:`RunTrajectory`.

* a rollouts line (``messages``): roles, facts and the call graph from
  :func:`verl_credit.annotate.roles.analyze_calls`, credit from ``call_credit`` with the default
  settings; the roles reported are those a credit line would carry (``None`` for a call the rules
  could not classify), descriptions from the tool calls;
* a credit line (``actions`` + ``call_graph``): its own roles (``actions[i].role``, a null role
  stays null), weights, advantages and edges; test outcomes and tool use are unknown; calls are
  described by their tool calls when the rollouts are given (``summaries``), else by what the
  line says (:func:`verl_credit.report.weakness.describe_call`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from verl_credit.call_graph import CallGraph
from verl_credit.io import InputError, iter_jsonl
from verl_credit.report.weakness import RunTrajectory, run_calls
from verl_credit.trajectory import Trajectory, TrajectoryError

__all__ = ["call_summaries", "from_credit_line", "from_rollouts", "load_run"]


def from_rollouts(trajectories: list[Trajectory]) -> list[RunTrajectory]:
    import torch

    from verl_credit.annotate.roles import analyze_calls, call_graph_from_facts, failures_ignored
    from verl_credit.batch_credit import compute_batch_credit
    from verl_credit.config import CreditConfig

    facts = [analyze_calls(t) for t in trajectories]
    graphs = [call_graph_from_facts(f) for f in facts]
    credit = compute_batch_credit(
        torch.tensor([t.reward for t in trajectories], dtype=torch.float32),
        [t.uid for t in trajectories],
        [t.action_lengths for t in trajectories],
        CreditConfig(estimator="call_credit"),
        call_graphs=graphs,
    )
    out = []
    for row, (trajectory, call_facts, graph) in enumerate(zip(trajectories, facts, graphs, strict=True)):
        calls = run_calls(
            graph,
            graph.reported_roles(),
            credit.advantages_of(row),
            credit.weights_of(row),
            trajectory.action_lengths,
            summaries=[f.summary for f in call_facts],
            acts=[bool(a.tool_calls) for a in trajectory.actions],
            status=[f.rv_status for f in call_facts],
            ignored=failures_ignored(call_facts),
        )
        out.append(RunTrajectory(trajectory.id, trajectory.reward, calls))
    return out


def from_credit_line(
    record: dict[str, Any], path: str, line: int, summaries: Mapping[str, list[str]] | None = None
) -> RunTrajectory:
    try:
        graph = CallGraph.from_json(record["call_graph"])
        actions = record["actions"]
        if not isinstance(actions, list):
            raise ValueError("actions is not a list")
        if len(actions) != graph.num_calls:
            raise ValueError(f"{len(actions)} actions but the call graph has {graph.num_calls} calls")
        roles = []
        for position, action in enumerate(actions):
            role = action.get("role") if "role" in action else graph.reported_roles()[position]
            if role is not None and not isinstance(role, str):
                raise ValueError(f"actions[{position}].role is {role!r}, not a role or null")
            roles.append(role)
        described = (summaries or {}).get(str(record["id"]))
        calls = run_calls(
            graph,
            roles,
            [float(a["advantage"]) for a in actions],
            [float(a["weight"]) for a in actions],
            [int(a["length"]) for a in actions],
            summaries=described if described is not None and len(described) == graph.num_calls else None,
        )
        return RunTrajectory(str(record["id"]), float(record["reward"]), calls)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InputError(path, line, f"credit line: {exc}") from None


def call_summaries(path: str) -> dict[str, list[str]]:
    """Trajectory id -> one description per call (its tool calls, else its text) of a rollouts file."""
    from verl_credit.annotate.roles import analyze_calls

    out = {}
    for line, record in iter_jsonl(path):
        if not (isinstance(record, dict) and "messages" in record):
            raise InputError(path, line, "--rollouts needs rollouts lines ('messages')")
        try:
            trajectory = Trajectory.from_record(record)
        except TrajectoryError as exc:
            raise InputError(path, line, str(exc)) from None
        out[trajectory.id] = [fact.summary for fact in analyze_calls(trajectory)]
    return out


def load_run(path: str, summaries: Mapping[str, list[str]] | None = None) -> list[RunTrajectory]:
    """Every line of ``path`` (rollouts and credit lines may be mixed), in file order."""
    rollouts: list[tuple[int, Trajectory]] = []
    items: dict[int, RunTrajectory] = {}
    for line, record in iter_jsonl(path):
        if isinstance(record, dict) and "messages" in record:
            try:
                rollouts.append((line, Trajectory.from_record(record)))
            except TrajectoryError as exc:
                raise InputError(path, line, str(exc)) from None
        elif isinstance(record, dict) and "actions" in record and record.get("call_graph") is not None:
            items[line] = from_credit_line(record, path, line, summaries)
        else:
            raise InputError(
                path,
                line,
                "needs 'messages' (a rollouts line) or 'actions' and 'call_graph' "
                "(a credit line of route --estimator call_credit)",
            )
    if rollouts:
        for (line, _), calls in zip(rollouts, from_rollouts([t for _, t in rollouts]), strict=True):
            items[line] = calls
    return [items[line] for line in sorted(items)]
