"""``turn_reward``: per-turn environment rewards with a leave-one-out baseline (docs/design.md 4b).

``A_i = A_tau + lambda_turn (G_i - b_i)``; the baseline never depends on the trajectory's own
action (other rollouts of the uid at the same anchor state, else at the same turn index) and is
not divided by a per-turn-index std (verl issue #7244). A trajectory without turn rewards gets
plain GRPO credit; so does a whole batch without them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from verl_credit.anchor_states import anchor_group_ids, turn_group_ids
from verl_credit.config import TurnRewardConfig
from verl_credit.credit_math.gigpo import compute_leave_one_out_baseline, compute_turn_returns
from verl_credit.estimators.gigpo import turn_reward_matrix
from verl_credit.estimators.registry import ActionCredit, Estimator, EstimatorInputs, register_estimator

if TYPE_CHECKING:
    from verl_credit.config import CreditConfig


@register_estimator
class TurnRewardEstimator(Estimator):
    name = "turn_reward"
    needs = frozenset({"anchor_states", "turn_rewards"})
    settings = TurnRewardConfig

    def action_credit(
        self,
        advantage: torch.Tensor,
        lengths: torch.Tensor,
        valid: torch.Tensor,
        inputs: EstimatorInputs,
        config: CreditConfig,
    ) -> ActionCredit:
        cfg = config.turn_reward
        rows, width = valid.shape
        turn_rewards = inputs.turn_rewards or [None] * rows
        has = torch.tensor([bool(values) for values in turn_rewards], dtype=torch.bool).unsqueeze(1) & valid
        returns = compute_turn_returns(turn_reward_matrix(turn_rewards, width, rows), has, cfg.gamma)
        states = self.require(inputs, "anchor_states")
        baseline, found = compute_leave_one_out_baseline(
            returns,
            anchor_group_ids(inputs.uids, states, width),
            turn_group_ids(inputs.uids, valid.sum(dim=1), width),
            has,
        )
        turn_term = torch.where(found, returns - baseline, torch.zeros_like(returns))
        action_advantage = (advantage.unsqueeze(1) + cfg.lambda_turn * turn_term) * valid
        return ActionCredit(
            valid.to(torch.float64),
            action_advantage,
            extras={"turn_return": returns, "turn_baseline_found": found.to(torch.float64)},
        )
