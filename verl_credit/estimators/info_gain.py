"""``info_gain``: InfoPO's turn-level information gain fused with GRPO's advantage.

The math, its equations and where each term comes from in the authors' code (GitHub
``kfq20/InfoPO``: ``verl/trainer/ppo/intrinsic_reward.py``, ``compute_batched_kl_divergence`` and
``compute_intrinsic_rewards``; ``verl/trainer/ppo/core_algos.py``, ``compute_info_grpo_advantage``)
are in :mod:`verl_credit.credit_math.info_gain`. In one line::

    A_i = A_tau + beta * sigmoid(-sigma_g / T_gate) * rho * Ahat_i,
    Ahat_i = group-normalized IG_i / L_i,
    IG_i   = mean over a_{i+1}'s tokens of log pi(. | feedback of a_i) - log pi(. | feedback masked)

What it needs (``information_gains``, one number or ``None`` per action):

* in the credit trainer, two teacher-forced passes of the policy: verl's ``old_log_probs`` (the
  feedback as it was) and one extra actor forward pass per feedback turn with the feedback
  overwritten by ``credit.info_gain.placeholder`` (``verl_credit.verl.info_gain_step``);
* offline (``verl-credit route --estimator info_gain``), the ``information_gains`` field of each
  rollouts-file line (``verl_credit.estimators.needs``); a line without it gets GRPO's credit.

The magnitude ratio is a statistic of the whole batch (every trainable token), so groups are not
independent (``couples_groups``): ``route`` routes a file as one batch, as the trainer routes a step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from verl_credit.config import InfoGainConfig
from verl_credit.credit_math.grpo import compute_group_statistics
from verl_credit.credit_math.info_gain import compute_info_gain_advantage
from verl_credit.estimators.registry import ActionCredit, Estimator, EstimatorInputs, register_estimator

if TYPE_CHECKING:
    from verl_credit.config import CreditConfig

__all__ = ["InfoGainEstimator", "information_gain_matrix"]


def information_gain_matrix(
    gains: Sequence[Sequence[float | None] | None] | None, width: int, rows: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(B, width)`` float64 gains and ``(B, width)`` bool ``has_gain`` from ragged per-action lists
    (``None``: the action, or the whole trajectory, has no gain)."""
    values = torch.zeros((rows, width), dtype=torch.float64)
    has = torch.zeros((rows, width), dtype=torch.bool)
    for row, row_gains in enumerate(gains or []):
        for action, gain in enumerate((row_gains or [])[:width]):
            if gain is not None:
                values[row, action] = float(gain)
                has[row, action] = True
    return values, has


def _dense_group_ids(uids: Sequence[object]) -> torch.Tensor:
    ids: dict[object, int] = {}
    return torch.tensor([ids.setdefault(uid, len(ids)) for uid in uids], dtype=torch.long)


@register_estimator
class InfoGainEstimator(Estimator):
    name = "info_gain"
    needs = frozenset({"information_gains"})
    settings = InfoGainConfig
    couples_groups = True

    def action_credit(
        self,
        advantage: torch.Tensor,
        lengths: torch.Tensor,
        valid: torch.Tensor,
        inputs: EstimatorInputs,
        config: CreditConfig,
    ) -> ActionCredit:
        cfg = config.info_gain
        rows, width = valid.shape
        gains, has_gain = information_gain_matrix(inputs.information_gains, width, rows)
        _, score_std = compute_group_statistics(inputs.scores.to(torch.float64), list(inputs.uids))
        action_advantage, parts = compute_info_gain_advantage(
            advantage,
            gains,
            has_gain,
            lengths,
            valid,
            _dense_group_ids(list(inputs.uids)),
            score_std,
            weight=cfg.weight,
            gate_temperature=cfg.gate_temperature,
            eps=cfg.eps,
            norm_by_std=config.norm_adv_by_std_in_grpo,
            normalize=cfg.normalize,
        )
        return ActionCredit(
            valid.to(torch.float64),
            action_advantage,
            extras={
                "information_gain": torch.where(has_gain & valid, gains, torch.zeros_like(gains)),
                "has_information_gain": (has_gain & valid).to(torch.float64),
                "intrinsic_advantage": parts.intrinsic,
                "information_gain_bonus": parts.bonus,
                "information_gain_gate": parts.gate.unsqueeze(-1).expand(rows, width) * valid,
                "information_gain_ratio": parts.ratio.expand(rows, width) * valid,
            },
        )
