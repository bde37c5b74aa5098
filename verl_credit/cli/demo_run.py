"""``verl-credit demo``: the whole credit pipeline on the built-in service world, offline, in seconds.

Steps (each a library call):

1. sample groups of rollouts from the stochastic scripted agent (``rollouts.sample_groups``);
2. annotate them with the rule annotator and route credit with ``iapo``; route ``grpo`` and
   ``call_credit`` (service-world call graphs, ``roles.build_service_call_graph``) for comparison
   (``batch_credit.compute_batch_credit`` for all three);
3. write ``rollouts.jsonl``, ``credit.jsonl`` (iapo), ``credit_grpo.jsonl``,
   ``credit_call_credit.jsonl`` and ``report.html``;
4. summarize: fallback rate, spread of ``w+``, share of weights moved by more than 10%, and --
   using the agent's ground truth, which the annotator never sees -- the mean ``|advantage|`` on
   causal vs non-causal actions and the credit precision of every estimator.

"Causal" actions: on a successful rollout, the actions its correct writes depended on (the write,
the lookups that supplied its ids, the questions whose answers chose them); on a failed rollout,
its mistakes (tool errors, unwanted writes, closing before the goal was done).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verl_credit.batch_credit import BatchCredit, compute_batch_credit
from verl_credit.config import CreditConfig
from verl_credit.credit_output import credit_records
from verl_credit.envs.service.roles import build_service_call_graph
from verl_credit.envs.service.rollouts import Rollout, sample_groups
from verl_credit.io import write_jsonl
from verl_credit.metrics import compute_credit_metrics
from verl_credit.pipeline import annotate_trajectories
from verl_credit.report.credit_input import action_labels, attach_labels, parse_credit_line
from verl_credit.report.html import render_report

__all__ = ["DemoResult", "causal_mask", "format_summary", "run_demo", "summarize_credit"]

ESTIMATORS: tuple[str, ...] = ("iapo", "call_credit", "grpo")


@dataclass
class DemoResult:
    out_dir: Path
    files: dict[str, Path]
    summary: list[dict[str, Any]]
    success_rate: float
    num_trajectories: int
    extras: dict[str, Any] = field(default_factory=dict)


def causal_mask(rollouts: Sequence[Rollout], width: int) -> torch.Tensor:
    """``(B, width)`` bool: ground-truth causal actions (successes: the dependency chain of the
    correct writes; failures: the mistakes)."""
    mask = torch.zeros((len(rollouts), width), dtype=torch.bool)
    for row, rollout in enumerate(rollouts):
        flags = rollout.episode.causal if rollout.episode.reward > 0 else rollout.episode.mistakes
        for action, flag in enumerate(flags):
            mask[row, action] = flag
    return mask


def summarize_credit(
    credit: BatchCredit, rollouts: Sequence[Rollout], fallback_rate: float | None = None
) -> dict[str, Any]:
    """One summary row: weight spread (docs/design.md section 6 names) and ground-truth credit placement."""
    metrics = compute_credit_metrics(credit, trajectories=[r.trajectory for r in rollouts])
    valid = credit.lengths > 0
    causal = causal_mask(rollouts, credit.weight.shape[1]) & valid
    other = valid & ~causal
    magnitude = credit.action_advantage.abs().to(torch.float64)
    on_causal = float(magnitude[causal].mean()) if causal.any() else 0.0
    off_causal = float(magnitude[other].mean()) if other.any() else 0.0
    # Credit precision: share of the positive advantage mass (A_i * L_i, A_i > 0) on causal actions.
    positive_mass = (credit.action_advantage.to(torch.float64).clamp_min(0.0) * credit.lengths).sum()
    causal_mass = (credit.action_advantage.to(torch.float64).clamp_min(0.0) * credit.lengths)[causal].sum()
    return {
        "estimator": credit.estimator,
        "fallback_rate": fallback_rate,
        "w+ std": metrics["credit/w_pos_std"],
        "w+ min": metrics["credit/w_pos_min"],
        "w+ max": metrics["credit/w_pos_max"],
        "w+ moved>10%": metrics["credit/w_pos_frac_dev10"],
        "w- moved>10%": metrics["credit/w_neg_frac_dev10"],
        "|A| causal": on_causal,
        "|A| non-causal": off_causal,
        "causal/non-causal": on_causal / off_causal if off_causal > 0 else float("nan"),
        "credit precision": float(causal_mass / positive_mass) if positive_mass > 0 else float("nan"),
    }


def format_summary(rows: Sequence[dict[str, Any]]) -> str:
    """A fixed-width text table of the summary rows."""
    columns = list(rows[0])
    cells = [[_cell(row[c]) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[k]) for r in cells)) for k, c in enumerate(columns)]
    lines = [
        "  ".join(c.ljust(w) if k == 0 else c.rjust(w) for k, (c, w) in enumerate(zip(columns, widths, strict=True)))
    ]
    for row in cells:
        lines.append(
            "  ".join(v.ljust(w) if k == 0 else v.rjust(w) for k, (v, w) in enumerate(zip(row, widths, strict=True)))
        )
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "nan" if np.isnan(value) else f"{value:.3f}"
    return str(value)


def run_demo(
    out: str | Path,
    groups: int = 8,
    group_size: int = 8,
    seed: int = 0,
    variant: str = "mixed",
    max_trajectories: int = 12,
) -> DemoResult:
    """Sample, annotate, route, write files and the report into ``out``; returns the summary."""
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    rollouts = sample_groups(groups, group_size, seed=seed, variant=variant)
    trajectories = [r.trajectory for r in rollouts]
    scores = torch.tensor([t.reward for t in trajectories], dtype=torch.float32)
    uids = [t.uid for t in trajectories]
    lengths = [t.action_lengths for t in trajectories]

    annotations, stats = annotate_trajectories(trajectories, "rules")
    call_graphs = [build_service_call_graph(t) for t in trajectories]
    credits = {
        "iapo": compute_batch_credit(
            scores, uids, lengths, CreditConfig(estimator="iapo"), graphs=[a.graph for a in annotations]
        ),
        "call_credit": compute_batch_credit(
            scores, uids, lengths, CreditConfig(estimator="call_credit"), call_graphs=call_graphs
        ),
        "grpo": compute_batch_credit(scores, uids, lengths, CreditConfig(estimator="grpo")),
    }
    records = {
        "iapo": credit_records(trajectories, credits["iapo"], annotations=annotations),
        "call_credit": credit_records(trajectories, credits["call_credit"], call_graphs=call_graphs),
        "grpo": credit_records(trajectories, credits["grpo"]),
    }
    files = {
        "rollouts": out_dir / "rollouts.jsonl",
        "credit": out_dir / "credit.jsonl",
        "credit_call_credit": out_dir / "credit_call_credit.jsonl",
        "credit_grpo": out_dir / "credit_grpo.jsonl",
        "report": out_dir / "report.html",
    }
    write_jsonl(files["rollouts"], (r.record for r in rollouts))
    write_jsonl(files["credit"], records["iapo"])
    write_jsonl(files["credit_call_credit"], records["call_credit"])
    write_jsonl(files["credit_grpo"], records["grpo"])

    summary = [
        summarize_credit(credits[name], rollouts, stats.fallback_rate if name == "iapo" else None)
        for name in ESTIMATORS
    ]
    labels = {t.id: action_labels(t) for t in trajectories}
    lines = {name: [parse_credit_line(record) for record in records[name]] for name in ESTIMATORS}
    for group in lines.values():
        attach_labels(group, labels)
    success = float(scores.mean())
    render_report(
        lines["iapo"],
        files["report"],
        title="verl-credit demo: routed credit in the service world",
        comparisons={"call_credit": lines["call_credit"], "grpo": lines["grpo"]},
        summary_rows=summary,
        max_trajectories=max_trajectories,
        intro=(
            f"{len(rollouts)} rollouts ({groups} tasks x {group_size}) of the stochastic scripted agent, "
            f"success rate {success:.0%}; graphs from the rule annotator; iapo with the default settings "
            f"(beta+ 0.05, c 0.25). 'Causal' uses the simulator's ground truth, which no annotator sees."
        ),
    )
    return DemoResult(
        out_dir, files, summary, success, len(rollouts), extras={"annotation_sources": dict(stats.by_source)}
    )
