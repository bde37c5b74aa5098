"""``grpo``: every action of a trajectory gets ``A_tau`` (verl's GRPO; the reference)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from verl_credit.estimators.registry import ActionCredit, Estimator, EstimatorInputs, register_estimator

if TYPE_CHECKING:
    from verl_credit.config import CreditConfig


@register_estimator
class GRPOEstimator(Estimator):
    name = "grpo"

    def action_credit(
        self,
        advantage: torch.Tensor,
        lengths: torch.Tensor,
        valid: torch.Tensor,
        inputs: EstimatorInputs,
        config: CreditConfig,
    ) -> ActionCredit:
        return ActionCredit(valid.to(torch.float64))
