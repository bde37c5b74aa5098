"""credit/* metrics (docs/design.md section 6) on hand-built batches."""

from __future__ import annotations

import json

import pytest
import torch

from verl_credit.annotate.base import AnnotationResult, AnnotationStats
from verl_credit.batch_credit import compute_batch_credit
from verl_credit.call_graph import CallGraph
from verl_credit.config import CreditConfig
from verl_credit.graph import GraphValidation, InfluenceGraph, validate_graph
from verl_credit.metrics import (
    DESIGN_METRICS,
    compute_credit_metrics,
    count_redundant_tool_calls,
    zero_variance_group_share,
)
from verl_credit.trajectory import Trajectory


def tool_action(name: str, args: dict) -> dict:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "x", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}],
    }


def test_tool_call_redundancy_counts_identical_repeats() -> None:
    messages = [
        tool_action("get_order", {"order_id": "#1"}),
        tool_action("get_order", {"order_id": "#1"}),  # repeat
        tool_action("get_order", {"order_id": "#2"}),  # different args
        tool_action("get_order", {"order_id": "#1"}),  # repeat again
    ]
    assert count_redundant_tool_calls(Trajectory.from_messages(messages)) == 2


def test_metrics_hand_example() -> None:
    # two trajectories in one group: rewards 1 and 0 -> A = +0.7071, -0.7071
    graph, _ = validate_graph(
        {
            "num_actions": 3,
            "edges": [{"src": 0, "dst": 2, "sign": "+", "type": "input"}],
            "errors": [{"action": 1, "kind": "tool_error"}],
        },
        3,
    )
    graphs = [graph, InfluenceGraph.uniform(2)]
    credit = compute_batch_credit(
        torch.tensor([1.0, 0.0]), ["g", "g"], [[1, 1, 2], [3, 3]], CreditConfig(), graphs=graphs
    )
    stats = AnnotationStats()
    stats.add(AnnotationResult(graph, GraphValidation(repaired_edges=2), "llm", cached=True, prompt_truncated=True))
    stats.add(AnnotationResult(InfluenceGraph.uniform(2), GraphValidation(fallback=True), "fallback:uniform"))
    metrics = compute_credit_metrics(credit, stats, graphs=graphs)
    assert metrics["credit/truncated_prompts"] == 1.0  # the LLM prompt was cut to fit the context
    assert metrics["credit/fallback_rate"] == 0.5
    assert metrics["credit/repaired_edges"] == 2.0
    assert metrics["credit/cache_hit_rate"] == 0.5
    positive = credit.weights_of(0)
    assert metrics["credit/w_pos_min"] == pytest.approx(min(positive))
    assert metrics["credit/w_pos_max"] == pytest.approx(max(positive))
    moved = sum(abs(w - 1) > 0.1 for w in positive) / 3
    assert metrics["credit/w_pos_frac_dev10"] == pytest.approx(moved)
    # negative trajectory has no errors -> uniform negative branch -> nothing moved
    assert metrics["credit/w_neg_frac_dev10"] == 0.0
    assert metrics["credit/edges_per_action"] == pytest.approx(1 / 5)
    assert metrics["credit/error_rate"] == pytest.approx(1 / 5)


def test_reward_hacking_rate_from_call_graphs() -> None:
    # one successful trajectory; IG call weighted far above the AE call -> counts as hacking
    calls = CallGraph(("IG", "AE"), (False, False))
    credit = compute_batch_credit(
        torch.tensor([1.0, 0.0]),
        ["g", "g"],
        [[1, 1], [1, 1]],
        CreditConfig.from_mapping(
            {"estimator": "call_credit", "call_credit": {"omega": {"IG": 3.0, "AE": 1.0, "RV": 1.0}, "gamma": 1.0}}
        ),
        call_graphs=[calls, calls],
    )
    metrics = compute_credit_metrics(credit, rewards=torch.tensor([1.0, 0.0]))
    assert metrics["credit/reward_hacking_rate"] == 1.0
    flat = compute_batch_credit(torch.tensor([1.0, 0.0]), ["g", "g"], [[1, 1], [1, 1]], CreditConfig(estimator="grpo"))
    assert (
        compute_credit_metrics(flat, call_graphs=[calls, calls], rewards=torch.tensor([1.0, 0.0]))[
            "credit/reward_hacking_rate"
        ]
        == 0.0
    )


def test_zero_variance_group_share() -> None:
    # g1 all equal (no gradient), g2 mixed, g3 a single session (A = R: not flat), g4 all zero
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.5, 0.0, 0.0])
    groups = ["g1", "g1", "g1", "g2", "g2", "g3", "g4", "g4"]
    assert zero_variance_group_share(rewards, groups) == 0.5
    assert zero_variance_group_share([], []) == 0.0
    with pytest.raises(ValueError, match="2 rewards for 1 group ids"):
        zero_variance_group_share([1.0, 1.0], ["g"])


def test_zero_adv_groups_metric_matches_the_advantages() -> None:
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0])
    groups = ["a", "a", "b", "b"]
    credit = compute_batch_credit(rewards, groups, [[2], [2], [2], [2]], CreditConfig(estimator="grpo"))
    metrics = compute_credit_metrics(credit, rewards=rewards, groups=groups)
    assert metrics["credit/zero_adv_groups"] == 0.5
    assert credit.trajectory_advantage[:2].abs().max() == 0.0 and credit.trajectory_advantage[2:].abs().min() > 0
    assert "credit/zero_adv_groups" in DESIGN_METRICS
    assert "credit/zero_adv_groups" not in compute_credit_metrics(credit, rewards=rewards)  # needs the groups
