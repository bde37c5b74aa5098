"""The weakness report of ``verl-credit weakness``: credit by call role and three systematic weaknesses.

Input is one :class:`RunCall` per model call: its role as the credit file reports it (``IG`` /
``AE`` / ``RV``, or ``None`` for a call the rules could not classify -- it stays ``None`` and is
counted in the ``unclassified`` row, never put into a role), its tokens, weight and advantage, the
causal edges it starts, and a one-line description.

* **roles**: per role (and ``unclassified``) the calls, their share of calls / tokens / credit
  mass ``sum L_i |A_i|``, and the mean per-token advantage on successful (``R > 0``) and other
  trajectories;
* **weaknesses**: reads whose content was never used (IG calls with tools and no ``IG->AE``
  edge), edits never verified (AE calls with tools and no ``AE->RV`` edge), tests run but failures
  ignored (failing RV calls no later edit answered; unknown without transcripts), each with its
  count, denominator, rate, credit share and examples.

Every example carries a non-empty description (:func:`describe_call`): the call's tool calls or
text when the transcript is known, else what the credit line says of it (role, position, tokens,
weight, the units of its edges).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from verl_credit.call_graph import ROLES, CallGraph

__all__ = [
    "UNCLASSIFIED",
    "WEAKNESSES",
    "RunCall",
    "RunTrajectory",
    "compute_weakness_report",
    "describe_call",
    "format_weakness_report",
    "run_calls",
]

#: the row of calls whose role is null (ambiguous for the rules)
UNCLASSIFIED = "unclassified"
WEAKNESSES: dict[str, str] = {
    "unused_reads": "reads whose content was never used",
    "unverified_edits": "edits never verified",
    "ignored_failures": "tests run but failures ignored",
}
_DESCRIPTION_CHARS = 120


@dataclass(frozen=True)
class RunCall:
    """One model call as the report sees it.

    ``role``: ``IG``/``AE``/``RV`` or ``None`` (unclassified). ``acts``: it made a tool call
    (``None``: unknown, e.g. a credit line without messages). ``rv_status`` / ``failure_ignored``:
    ``None`` when unknown. ``description``: one line, never empty (see :func:`describe_call`).
    """

    role: str | None
    length: int
    advantage: float
    weight: float
    description: str
    acts: bool | None = None
    has_ig_use: bool = False  # an outgoing IG->AE edge
    has_verification: bool = False  # an outgoing AE->RV edge
    rv_status: str | None = None
    failure_ignored: bool | None = None


@dataclass(frozen=True)
class RunTrajectory:
    id: str
    reward: float
    calls: tuple[RunCall, ...]


def describe_call(
    index: int,
    role: str | None,
    summary: str = "",
    *,
    length: int | None = None,
    weight: float | None = None,
    graph: CallGraph | None = None,
) -> str:
    """A one-line, non-empty description of call ``index``: ``summary`` (its tool calls or text,
    whitespace collapsed, clipped) when it has any, else what is known of it without the
    transcript: its role, tokens, weight and the units of the causal edges it takes part in."""
    text = " ".join(summary.split())
    if text:
        return text if len(text) <= _DESCRIPTION_CHARS else text[: _DESCRIPTION_CHARS - 3] + "..."
    parts = [f"{role or 'unclassified (role null)'} call {index}"]
    details = []
    if length is not None:
        details.append(f"{length} tokens")
    if weight is not None:
        details.append(f"weight {weight:.3f}")
    if graph is not None:
        units = [
            f"{e.kind} {'to' if e.src == index else 'from'} call {e.dst if e.src == index else e.src}"
            + (f" via {e.unit}" if e.unit else "")
            for e in graph.edges
            if index in (e.src, e.dst)
        ]
        details.append("; ".join(units[:2]) if units else "no causal edges")
    if details:
        parts.append(f"({', '.join(details)})")
    return " ".join(parts)


def run_calls(
    graph: CallGraph,
    roles: Sequence[str | None],
    advantages: Sequence[float],
    weights: Sequence[float],
    lengths: Sequence[int],
    *,
    summaries: Sequence[str] | None = None,
    acts: Sequence[bool | None] | None = None,
    status: Sequence[str | None] | None = None,
    ignored: Sequence[bool | None] | None = None,
) -> tuple[RunCall, ...]:
    """The calls of one trajectory: ``roles`` as reported (``None`` stays ``None``), edges from
    ``graph``; ``acts`` / ``status`` / ``ignored`` are ``None`` (unknown) without a transcript."""
    n = graph.num_calls
    for name, values in (("roles", roles), ("advantages", advantages), ("weights", weights), ("lengths", lengths)):
        if len(values) != n:
            raise ValueError(f"{len(values)} {name} but the call graph has {n} calls")
    kinds = {(e.src, e.kind) for e in graph.edges}
    transcript = status is not None
    calls = []
    for i in range(n):
        role = roles[i]
        if role is not None and role not in ROLES:
            raise ValueError(f"call {i}: role {role!r} is not one of {list(ROLES)} or null")
        rv_status = status[i] if status is not None else None
        failure_ignored = None
        if transcript:
            failure_ignored = bool(ignored[i]) if (ignored is not None and rv_status == "fail") else False
        calls.append(
            RunCall(
                role=role,
                length=int(lengths[i]),
                advantage=float(advantages[i]),
                weight=float(weights[i]),
                description=describe_call(
                    i,
                    role,
                    summaries[i] if summaries is not None else "",
                    length=int(lengths[i]),
                    weight=float(weights[i]),
                    graph=graph,
                ),
                acts=acts[i] if acts is not None else None,
                has_ig_use=(i, "IG->AE") in kinds,
                has_verification=(i, "AE->RV") in kinds,
                rv_status=rv_status,
                failure_ignored=failure_ignored,
            )
        )
    return tuple(calls)


def _weakness_of(call: RunCall) -> tuple[str, bool] | None:
    """``(weakness, hit)`` when ``call`` is in a weakness's denominator, else ``None``."""
    if call.role == "IG" and call.acts is not False:
        return "unused_reads", not call.has_ig_use
    if call.role == "AE" and call.acts is not False:
        return "unverified_edits", not call.has_verification
    if call.role == "RV" and call.rv_status == "fail" and call.failure_ignored is not None:
        return "ignored_failures", call.failure_ignored
    return None


def compute_weakness_report(trajectories: Iterable[RunTrajectory], examples: int = 3) -> dict[str, Any]:
    """Credit by role (plus ``unclassified``) and the three weaknesses (module docstring)."""
    rows = (*ROLES, UNCLASSIFIED)
    stats: dict[str, dict[str, float]] = {
        r: {"calls": 0, "tokens": 0, "mass": 0.0, "adv_s": 0.0, "tok_s": 0, "adv_f": 0.0, "tok_f": 0} for r in rows
    }
    weakness: dict[str, dict[str, Any]] = {k: {"count": 0, "of": 0, "mass": 0.0, "examples": []} for k in WEAKNESSES}
    unknown_failures = total_calls = total_tokens = 0
    total_mass = 0.0
    count = successful = 0
    for trajectory in trajectories:
        count += 1
        success = trajectory.reward > 0
        successful += success
        for index, call in enumerate(trajectory.calls):
            row = stats[call.role if call.role is not None else UNCLASSIFIED]
            mass = call.length * abs(call.advantage)
            row["calls"] += 1
            row["tokens"] += call.length
            row["mass"] += mass
            side = "s" if success else "f"
            row[f"adv_{side}"] += call.length * call.advantage
            row[f"tok_{side}"] += call.length
            total_calls += 1
            total_tokens += call.length
            total_mass += mass
            if call.role == "RV" and call.failure_ignored is None:
                unknown_failures += 1  # no transcript: pass/fail unknown
            found = _weakness_of(call)
            if found is None:
                continue
            entry = weakness[found[0]]
            entry["of"] += 1
            if found[1]:
                entry["count"] += 1
                entry["mass"] += mass
                if len(entry["examples"]) < examples:
                    entry["examples"].append(
                        {
                            "id": trajectory.id,
                            "call": index,
                            "role": call.role,
                            "summary": call.description,
                            "advantage": call.advantage,
                        }
                    )
    report_roles = {}
    for role, row in stats.items():
        report_roles[role] = {
            "calls": int(row["calls"]),
            "call_share": row["calls"] / total_calls if total_calls else 0.0,
            "token_share": row["tokens"] / total_tokens if total_tokens else 0.0,
            "credit_share": row["mass"] / total_mass if total_mass else 0.0,
            "mean_advantage_success": row["adv_s"] / row["tok_s"] if row["tok_s"] else None,
            "mean_advantage_failure": row["adv_f"] / row["tok_f"] if row["tok_f"] else None,
        }
    report_weakness = {}
    for name, entry in weakness.items():
        report_weakness[name] = {
            "label": WEAKNESSES[name],
            "count": entry["count"],
            "of": entry["of"],
            "rate": entry["count"] / entry["of"] if entry["of"] else 0.0,
            "credit_share": entry["mass"] / total_mass if total_mass else 0.0,
            "examples": entry["examples"],
        }
    report_weakness["ignored_failures"]["rv_calls_without_status"] = unknown_failures
    return {
        "trajectories": count,
        "successful": successful,
        "calls": total_calls,
        "roles": report_roles,
        "weaknesses": report_weakness,
    }


def format_weakness_report(report: dict[str, Any]) -> str:
    """The report as the text the CLI prints (the ``unclassified`` row only when it has calls)."""
    lines = [
        f"weakness report: {report['trajectories']} trajectories ({report['successful']} successful), "
        f"{report['calls']} calls",
        f"{'role':<13}{'calls':>7}{'calls%':>8}{'tokens%':>9}{'credit%':>9}{'adv(R>0)':>10}{'adv(R<=0)':>11}",
    ]

    def fmt(value: float | None) -> str:
        return "-" if value is None else f"{value:+.3f}"

    for role, r in report["roles"].items():
        if role == UNCLASSIFIED and not r["calls"]:
            continue
        label = f"{role} (null)" if role == UNCLASSIFIED else role
        lines.append(
            f"{label:<13}{r['calls']:>7}{r['call_share']:>8.1%}{r['token_share']:>9.1%}{r['credit_share']:>9.1%}"
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
