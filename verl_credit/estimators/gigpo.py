"""``gigpo``: episode advantage plus GiGPO's step advantage over anchor states (docs/design.md 4b).

The IAPO paper's Table 1 comparator, as published (not mass-conserving). Its episode advantage
follows ``credit.gigpo.mode``: ``mean_norm`` drops GRPO's division by the group std (verl-agent),
``mean_std_norm`` keeps it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from verl_credit.anchor_states import anchor_group_ids
from verl_credit.config import GiGPOConfig
from verl_credit.credit_math.gigpo import compute_anchor_step_advantage, compute_discounted_step_returns
from verl_credit.credit_math.grpo import compute_grpo_trajectory_advantage
from verl_credit.estimators.registry import ActionCredit, Estimator, EstimatorInputs, register_estimator

if TYPE_CHECKING:
    from verl_credit.config import CreditConfig


def turn_reward_matrix(turn_rewards: Sequence[Sequence[float] | None] | None, width: int, rows: int) -> torch.Tensor:
    """``(B, width)`` float64 per-action rewards (rows without any: zeros; ``has`` in the caller)."""
    table = torch.zeros((rows, width), dtype=torch.float64)
    for row, values in enumerate(turn_rewards or []):
        if values:
            count = min(len(values), width)
            table[row, :count] = torch.tensor([float(v) for v in values[:count]], dtype=torch.float64)
    return table


@register_estimator
class GiGPOEstimator(Estimator):
    name = "gigpo"
    needs = frozenset({"anchor_states", "turn_rewards"})
    settings = GiGPOConfig

    def trajectory_advantage(self, scores: torch.Tensor, index: Sequence[Any], config: CreditConfig) -> torch.Tensor:
        return compute_grpo_trajectory_advantage(
            scores, index, epsilon=config.epsilon, norm_adv_by_std_in_grpo=config.gigpo.mode == "mean_std_norm"
        )

    def action_credit(
        self,
        advantage: torch.Tensor,
        lengths: torch.Tensor,
        valid: torch.Tensor,
        inputs: EstimatorInputs,
        config: CreditConfig,
    ) -> ActionCredit:
        cfg = config.gigpo
        states = self.require(inputs, "anchor_states")
        rows, width = valid.shape
        returns = compute_discounted_step_returns(inputs.scores, valid.sum(dim=1), width, cfg.gamma)
        returns = returns + turn_reward_matrix(inputs.turn_rewards, width, rows) * valid
        groups = anchor_group_ids(inputs.uids, states, width)
        step, matched = compute_anchor_step_advantage(returns, groups, valid, mode=cfg.mode, eps=cfg.eps)
        action_advantage = (advantage.unsqueeze(1) + cfg.step_advantage_w * step) * valid
        return ActionCredit(
            valid.to(torch.float64),
            action_advantage,
            extras={"step_advantage": step, "anchor_matched": matched.to(torch.float64)},
        )
