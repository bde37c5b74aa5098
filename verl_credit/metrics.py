"""The ``credit/*`` metrics of DESIGN.md section 6, from one batch's credit and annotation stats.

Used by the trainer (logged through verl's tracker every step), the CLI summaries and the demo.
Definitions:

* ``w_pos_*``: the routed weights of actions (with tokens) of trajectories on the positive branch
  (``A > 0``); ``w_pos_frac_dev10`` / ``w_neg_frac_dev10``: share of those (resp. ``A < 0``)
  actions with ``|w - 1| > 0.1``.
* ``edges_per_action``: influence-graph edges per action; ``error_rate``: share of actions with
  ``e_i = 1``.
* ``reward_hacking_rate``: see ``credit.call_credit.compute_reward_hacking_rate`` (needs call
  roles: the call_credit estimator has them; for iapo pass ``call_graphs`` to get it).
* ``tool_call_redundancy``: mean, over trajectories, of tool calls that repeat an earlier call of
  the same trajectory with identical name and arguments.
* ``zero_adv_groups``: share of GRPO groups (sessions sharing a ``uid``) of at least two sessions
  whose scores are all equal, so every advantage of the group is 0 and it gives no gradient
  (a group of one has ``A = R``, verl's rule). Early in training, and on tasks the policy always
  or never solves, this is high; ``algorithm.filter_groups`` (DAPO) drops such groups.

Counters the trainer adds (``verl_credit.verl.credit_step.compute_credit_advantages``):
``nonfinite_rewards`` (sessions whose reward was NaN/inf: treated as 0 and their whole group's
advantages set to 0, so the step neither crashes nor trains on NaN), ``nonfinite_advantages``
(token advantages still non-finite after routing, set to 0; expected 0) and ``reward_failures``
(sessions whose environment reward raised, scored 0 by the agent loop, plus environments whose
``close()`` raised; expected 0 -- a policy that keeps it above 0 is breaking its grader).
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Sequence

import torch

from verl_credit.annotate.base import AnnotationStats
from verl_credit.call_graph import CallGraph
from verl_credit.credit.call_credit import compute_reward_hacking_rate
from verl_credit.graph import InfluenceGraph
from verl_credit.routing import BatchCredit, pad_call_graphs
from verl_credit.trajectory import Trajectory

__all__ = [
    "DESIGN_METRICS",
    "INFLUENCE_GRAPH_METRICS",
    "NONFINITE_METRICS",
    "compute_credit_metrics",
    "count_redundant_tool_calls",
    "weight_spread",
    "zero_variance_group_share",
]

#: counters of non-finite input that the trainer neutralized (see the module doc)
NONFINITE_METRICS: tuple[str, ...] = ("credit/nonfinite_rewards", "credit/nonfinite_advantages")

#: the metrics the trainer logs every step: DESIGN.md section 6, plus ``credit/zero_adv_groups``
#: (the share of GRPO groups whose advantages are all 0; not in DESIGN)
DESIGN_METRICS: tuple[str, ...] = (
    "credit/fallback_rate",
    "credit/repaired_edges",
    "credit/annotate_seconds",
    "credit/cache_hit_rate",
    "credit/w_pos_std",
    "credit/w_pos_min",
    "credit/w_pos_max",
    "credit/w_pos_frac_dev10",
    "credit/w_neg_frac_dev10",
    "credit/edges_per_action",
    "credit/error_rate",
    "credit/reward_hacking_rate",
    "credit/tool_call_redundancy",
    "credit/zero_adv_groups",
)
#: the ones defined on influence graphs (logged by estimators that route with them: iapo)
INFLUENCE_GRAPH_METRICS: tuple[str, ...] = ("credit/edges_per_action", "credit/error_rate")


def weight_spread(weight: torch.Tensor, selected: torch.Tensor) -> dict[str, float]:
    """std/min/max and share with ``|w - 1| > 0.1`` of ``weight[selected]`` (empty -> zeros)."""
    values = weight[selected]
    if values.numel() == 0:
        return {"std": 0.0, "min": 0.0, "max": 0.0, "frac_dev10": 0.0, "count": 0.0}
    return {
        "std": float(values.std(unbiased=False)),
        "min": float(values.min()),
        "max": float(values.max()),
        "frac_dev10": float(((values - 1.0).abs() > 0.1).double().mean()),
        "count": float(values.numel()),
    }


def zero_variance_group_share(rewards: torch.Tensor | Sequence[float], groups: Sequence[Hashable]) -> float:
    """Share of groups (``groups[i]``: group of trajectory ``i``) of two or more trajectories whose
    rewards are all equal; 0.0 for no groups."""
    values = [float(r) for r in (rewards.tolist() if isinstance(rewards, torch.Tensor) else rewards)]
    if len(values) != len(groups):
        raise ValueError(f"{len(values)} rewards for {len(groups)} group ids")
    members: dict[Hashable, list[float]] = {}
    for group, value in zip(groups, values, strict=True):
        members.setdefault(group, []).append(value)
    if not members:
        return 0.0
    flat = sum(1 for scores in members.values() if len(scores) > 1 and min(scores) == max(scores))
    return flat / len(members)


def count_redundant_tool_calls(trajectory: Trajectory) -> int:
    """Tool calls repeating an earlier call of the trajectory (same name, same canonical arguments)."""
    seen: set[tuple[str, str]] = set()
    repeats = 0
    for action in trajectory.actions:
        for call in action.tool_calls:
            key = (
                call.name,
                json.dumps(call.arguments, sort_keys=True) if call.arguments_valid else call.raw_arguments,
            )
            repeats += key in seen
            seen.add(key)
    return repeats


def compute_credit_metrics(
    credit: BatchCredit,
    stats: AnnotationStats | None = None,
    trajectories: Sequence[Trajectory] | None = None,
    graphs: Sequence[InfluenceGraph] | None = None,
    call_graphs: Sequence[CallGraph] | None = None,
    rewards: torch.Tensor | None = None,
    groups: Sequence[Hashable] | None = None,
) -> dict[str, float]:
    """DESIGN.md section 6 metrics for one batch (keys prefixed ``credit/``); ``zero_adv_groups``
    needs ``rewards`` and ``groups`` (the GRPO group id of each trajectory)."""
    metrics: dict[str, float] = {}
    if stats is not None:
        metrics["credit/fallback_rate"] = stats.fallback_rate
        metrics["credit/repaired_edges"] = float(stats.repaired_edges)
        metrics["credit/annotate_seconds"] = stats.seconds
        metrics["credit/cache_hit_rate"] = stats.cache_hit_rate
        metrics["credit/truncated_prompts"] = float(stats.truncated_prompts)

    has_tokens = credit.lengths > 0
    advantage = credit.trajectory_advantage.unsqueeze(-1)
    positive = weight_spread(credit.weight, has_tokens & (advantage > 0))
    negative = weight_spread(credit.weight, has_tokens & (advantage < 0))
    metrics["credit/w_pos_std"] = positive["std"]
    metrics["credit/w_pos_min"] = positive["min"]
    metrics["credit/w_pos_max"] = positive["max"]
    metrics["credit/w_pos_frac_dev10"] = positive["frac_dev10"]
    metrics["credit/w_neg_frac_dev10"] = negative["frac_dev10"]

    total_actions = int(credit.num_actions.sum())
    if graphs is not None and total_actions:
        metrics["credit/edges_per_action"] = sum(len(g.edges) for g in graphs) / total_actions
        metrics["credit/error_rate"] = sum(len(g.errors) for g in graphs) / total_actions

    roles = None
    if all(role in credit.extras for role in ("IG", "AE")):
        roles = credit.extras["IG"], credit.extras["AE"]
    elif call_graphs is not None:
        padded = pad_call_graphs(call_graphs, credit.weight.shape[1], {"IG": 1.0, "AE": 1.0, "RV": 1.0})
        roles = padded["IG"], padded["AE"]
    if roles is not None and rewards is not None:
        rate, _ = compute_reward_hacking_rate(
            rewards.to(torch.float64), credit.action_advantage.to(torch.float64), credit.lengths, roles[0], roles[1]
        )
        metrics["credit/reward_hacking_rate"] = rate

    if rewards is not None and groups is not None:
        metrics["credit/zero_adv_groups"] = zero_variance_group_share(rewards, groups)

    if "anchor_matched" in credit.extras and total_actions:  # gigpo: share of actions in an anchor group of 2+
        metrics["credit/anchor_match_rate"] = float(credit.extras["anchor_matched"].sum()) / total_actions

    if trajectories:
        metrics["credit/tool_call_redundancy"] = sum(count_redundant_tool_calls(t) for t in trajectories) / len(
            trajectories
        )
    return metrics
