"""``verl-credit weakness``: where a run's coding agent is systematically weak, by call role.

Reads rollouts (``messages``: roles, graph and call_credit credit are computed here with the
DESIGN defaults) or credit lines of ``verl-credit route --estimator call_credit`` (``actions`` +
``call_graph``: their credit is used; pass/fail of test runs is unknown without messages).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import torch

from verl_credit.annotate.roles import AE, IG, RV, analyze_calls, call_graph_from_facts, failures_ignored
from verl_credit.call_graph import CallGraph
from verl_credit.config import CreditConfig
from verl_credit.credit.call_extras import CallRecord, TrajectoryCalls, compute_weakness_report
from verl_credit.io import InputError, iter_jsonl
from verl_credit.routing import compute_batch_credit
from verl_credit.trajectory import Trajectory, TrajectoryError


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "weakness",
        help="aggregate call credit by role: unused reads, unverified edits, ignored test failures",
        description="Aggregate CALL-CREDIT by role across a run and report reads whose content was never "
        "used, edits never verified, and tests run but failures ignored.",
    )
    parser.add_argument("--input", required=True, help="rollouts JSONL or call_credit credit JSONL")
    parser.add_argument("--json", default=None, help="also write the report as JSON here")
    parser.add_argument("--examples", type=int, default=3, help="examples listed per weakness")
    parser.set_defaults(run=run)


def _from_rollouts(trajectories: list[Trajectory]) -> list[TrajectoryCalls]:
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
        out.append(
            TrajectoryCalls(
                trajectory.id,
                trajectory.reward,
                _records(
                    graph,
                    credit.advantages_of(row),
                    credit.weights_of(row),
                    trajectory.action_lengths,
                    acts=[bool(a.tool_calls) for a in trajectory.actions],
                    status=[f.rv_status for f in call_facts],
                    ignored=failures_ignored(call_facts),
                    summaries=[f.summary for f in call_facts],
                    transcript=True,
                ),
            )
        )
    return out


def _records(
    graph: CallGraph,
    advantages: list[float],
    weights: list[float],
    lengths: list[int],
    acts: list[bool | None],
    status: list[str | None],
    ignored: list[bool | None],
    summaries: list[str],
    transcript: bool,
) -> tuple[CallRecord, ...]:
    """Call records of one trajectory; without a transcript, tool use and test outcomes are unknown."""
    kinds = {(e.src, e.kind) for e in graph.edges}
    records = []
    for i, role in enumerate(graph.roles):
        failure_ignored = (bool(ignored[i]) if status[i] == "fail" else False) if transcript else None
        records.append(
            CallRecord(
                role=role,
                length=int(lengths[i]),
                advantage=float(advantages[i]),
                weight=float(weights[i]),
                acts=acts[i],
                has_ig_use=(i, "IG->AE") in kinds,
                has_verification=(i, "AE->RV") in kinds,
                rv_status=status[i],
                failure_ignored=failure_ignored,
                summary=summaries[i],
            )
        )
    return tuple(records)


def _from_credit_line(record: dict[str, Any], path: str, line: int) -> TrajectoryCalls:
    try:
        graph = CallGraph.from_json(record["call_graph"])
        actions = record["actions"]
        if len(actions) != graph.num_calls:
            raise ValueError(f"{len(actions)} actions but the call graph has {graph.num_calls} calls")
        n = graph.num_calls
        calls = _records(
            graph,
            [a["advantage"] for a in actions],
            [a["weight"] for a in actions],
            [a["length"] for a in actions],
            [None] * n,
            [None] * n,
            [None] * n,
            [""] * n,
            transcript=False,
        )
        return TrajectoryCalls(str(record["id"]), float(record["reward"]), calls)
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(path, line, f"credit line: {exc}") from None


def load_run(path: str) -> list[TrajectoryCalls]:
    rollouts: list[tuple[int, Trajectory]] = []
    items: dict[int, TrajectoryCalls] = {}
    for line, record in iter_jsonl(path):
        if isinstance(record, dict) and "messages" in record:
            try:
                rollouts.append((line, Trajectory.from_record(record)))
            except TrajectoryError as exc:
                raise InputError(path, line, str(exc)) from None
        elif isinstance(record, dict) and "actions" in record and record.get("call_graph") is not None:
            items[line] = _from_credit_line(record, path, line)
        else:
            raise InputError(
                path,
                line,
                "needs 'messages' (a rollouts line) or 'actions' and 'call_graph' "
                "(a credit line of route --estimator call_credit)",
            )
    if rollouts:
        for (line, _), calls in zip(rollouts, _from_rollouts([t for _, t in rollouts]), strict=True):
            items[line] = calls
    return [items[line] for line in sorted(items)]


def format_report(report: dict[str, Any]) -> str:
    lines = [
        f"weakness report: {report['trajectories']} trajectories ({report['successful']} successful), "
        f"{report['calls']} calls",
        f"{'role':<5}{'calls':>7}{'calls%':>8}{'tokens%':>9}{'credit%':>9}{'adv(R>0)':>10}{'adv(R<=0)':>11}",
    ]
    for role in (IG, AE, RV):
        r = report["roles"][role]

        def fmt(value: float | None) -> str:
            return "-" if value is None else f"{value:+.3f}"

        lines.append(
            f"{role:<5}{r['calls']:>7}{r['call_share']:>8.1%}{r['token_share']:>9.1%}{r['credit_share']:>9.1%}"
            f"{fmt(r['mean_advantage_success']):>10}{fmt(r['mean_advantage_failure']):>11}"
        )
    for entry in report["weaknesses"].values():
        lines.append(
            f"{entry['label']}: {entry['count']} / {entry['of']} ({entry['rate']:.1%}), "
            f"{entry['credit_share']:.1%} of the credit mass"
        )
        lines.extend(
            f"    {e['id']} call {e['call']}: {e['summary']} (A={e['advantage']:+.3f})" for e in entry["examples"]
        )
    unknown = report["weaknesses"]["ignored_failures"]["rv_calls_without_status"]
    if unknown:
        lines.append(f"    ({unknown} RV calls without transcripts: pass/fail unknown)")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.examples < 0:
        raise ValueError(f"--examples must be >= 0, got {args.examples}")
    report = compute_weakness_report(load_run(args.input), examples=args.examples)
    print(format_report(report))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=2)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0
