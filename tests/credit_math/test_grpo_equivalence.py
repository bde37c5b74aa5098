"""The uniform graph reproduces verl's own GRPO estimator bit-for-bit (fp32), through token spans."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

from verl_credit.batch_credit import compute_batch_credit, route_token_advantages
from verl_credit.call_graph import CallGraph
from verl_credit.config import CallCreditConfig, CreditConfig
from verl_credit.credit_math.grpo import compute_grpo_trajectory_advantage
from verl_credit.credit_math.tokens import spans_from_response_mask
from verl_credit.graph import InfluenceGraph


def random_batch(seed: int, batch: int = 64, response_length: int = 96, group_size: int = 4):
    generator = torch.Generator().manual_seed(seed)
    # multi-turn style masks: runs of 1s (actions) separated by 0s (observations)
    mask = torch.zeros(batch, response_length)
    for row in range(batch):
        position = 0
        while position < response_length:
            run = int(torch.randint(1, 12, (1,), generator=generator))
            mask[row, position : position + run] = 1.0
            position += run + int(torch.randint(1, 8, (1,), generator=generator))
    rewards = torch.zeros(batch, response_length)
    last = mask.cumsum(-1).argmax(-1)
    rewards[torch.arange(batch), last] = torch.randint(0, 3, (batch,), generator=generator).float() * 0.5
    groups = [f"g{row // group_size}" for row in range(batch)]
    groups[-1] = "singleton"  # a group of one
    return rewards, mask, np.array(groups, dtype=object)


def padded_spans(mask: torch.Tensor):
    spans = spans_from_response_mask(mask)
    width = max(len(s) for s in spans)
    span_action = torch.full((len(spans), width), -1, dtype=torch.long)
    span_start = torch.zeros((len(spans), width), dtype=torch.long)
    span_end = torch.zeros((len(spans), width), dtype=torch.long)
    for row, row_spans in enumerate(spans):
        for k, (start, end) in enumerate(row_spans):
            span_action[row, k], span_start[row, k], span_end[row, k] = k, start, end
    return spans, span_action, span_start, span_end


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("norm_by_std", [True, False])
@pytest.mark.parametrize("estimator", ["iapo", "call_credit", "grpo"])
def test_uniform_graph_equals_verl_grpo_bit_for_bit(seed: int, norm_by_std: bool, estimator: str) -> None:
    rewards, mask, index = random_batch(seed)
    expected, _ = compute_grpo_outcome_advantage(rewards.clone(), mask, index, norm_adv_by_std_in_grpo=norm_by_std)
    spans, span_action, span_start, span_end = padded_spans(mask)
    lengths = [[end - start for start, end in row] for row in spans]
    # an uninformative call graph: one role everywhere, no edges, no discount, no smoothing effect
    call_config = CallCreditConfig(gamma=1.0, omega={"IG": 1.0, "AE": 1.0, "RV": 1.0})
    credit = compute_batch_credit(
        rewards.sum(-1),
        index,
        lengths,
        CreditConfig(estimator=estimator, norm_adv_by_std_in_grpo=norm_by_std, call_credit=call_config),
        graphs=[InfluenceGraph.uniform(len(row)) for row in lengths],
        call_graphs=[CallGraph(("AE",) * len(row), (False,) * len(row)) for row in lengths],
    )
    tokens = route_token_advantages(
        credit, torch.arange(len(lengths)), span_action, span_start, span_end, mask.shape[1]
    )
    assert tokens.dtype == expected.dtype
    assert torch.equal(tokens, expected)


def test_trajectory_advantage_matches_verl_per_row() -> None:
    rewards, mask, index = random_batch(7, batch=33, group_size=5)
    expected, _ = compute_grpo_outcome_advantage(rewards.clone(), torch.ones_like(mask), index)
    ours = compute_grpo_trajectory_advantage(rewards.sum(-1), index)
    assert torch.equal(ours, expected[:, 0])


@pytest.mark.parametrize("seed", range(5))
def test_random_float_rewards_and_mixed_group_sizes_match_verl_bitwise(seed: int) -> None:
    # rewards that are not exactly representable sums, groups of 1..17 members, shuffled rows
    generator = torch.Generator().manual_seed(seed)
    sizes = [1, 2, 3, 5, 8, 16, 17, 16, 4, 1]
    index = np.array([f"g{g}" for g, size in enumerate(sizes) for _ in range(size)], dtype=object)
    index = index[torch.randperm(len(index), generator=generator).numpy()]
    scores = torch.randn(len(index), generator=generator) * 3.7 + 0.1
    rewards = torch.zeros(len(index), 5)
    rewards[:, -1] = scores
    for norm_by_std in (True, False):
        expected, _ = compute_grpo_outcome_advantage(
            rewards.clone(), torch.ones_like(rewards), index, norm_adv_by_std_in_grpo=norm_by_std
        )
        ours = compute_grpo_trajectory_advantage(rewards.sum(-1), index, norm_adv_by_std_in_grpo=norm_by_std)
        assert torch.equal(ours, expected[:, 0])


def test_shape_errors_are_clear() -> None:
    with pytest.raises(ValueError, match="scores must have shape"):
        compute_grpo_trajectory_advantage(torch.zeros(2, 3), ["a", "b"])
    with pytest.raises(ValueError, match="index has 1 entries"):
        compute_grpo_trajectory_advantage(torch.zeros(2), ["a"])
