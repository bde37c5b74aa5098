"""verl's own clipped policy loss, for code outside the trainer (the token-policy benchmark).

The benchmark trains its tiny policies with exactly the loss verl's actor uses; this module is the
one place outside the trainer glue that reaches into ``verl.trainer.ppo.core_algos`` for it, so
that nothing outside ``verl_credit/verl/`` imports verl.
"""

from __future__ import annotations

from typing import Any

import torch
from verl.trainer.ppo.core_algos import get_policy_loss_fn

__all__ = ["vanilla_policy_loss"]


class _LossConfig:
    """The fields of verl's ``ActorConfig`` that ``compute_policy_loss_vanilla`` reads."""

    def __init__(self, clip_ratio: float):
        self.clip_ratio = clip_ratio
        self.clip_ratio_low: float | None = None
        self.clip_ratio_high: float | None = None
        self.global_batch_info: dict[str, Any] = {}

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)


def vanilla_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_ratio: float,
) -> torch.Tensor:
    """verl's ``get_policy_loss_fn("vanilla")`` (symmetric clip ``clip_ratio``), token-mean over
    ``mask``. All inputs ``(B, N)``; returns a scalar."""
    loss, _ = get_policy_loss_fn("vanilla")(
        old_log_prob, log_prob, advantages, mask, loss_agg_mode="token-mean", config=_LossConfig(clip_ratio)
    )
    return loss
