"""GRPO group-normalized trajectory advantage, identical to verl's ``compute_grpo_outcome_advantage``.

``A_tau = (R - mu_G) / (sigma_G + eps)`` where ``mu_G`` and ``sigma_G`` are the mean and the
Bessel-corrected standard deviation (``torch.std``) of the scores of the trajectory's group.
A group of one sample has ``mu = 0, sigma = 1``; ``norm_adv_by_std_in_grpo=False`` drops the
division (Dr.GRPO).

verl loops over rows; here the per-group statistics are computed with exactly the same torch
calls on tensors with exactly the same values (the group's scores as one 1-D tensor, then
``torch.mean`` and ``torch.std``), and the per-row arithmetic is the same elementwise
subtract/add/divide, vectorized, so the result is bit-identical in fp32 (a test imports verl's
function and compares).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["compute_group_statistics", "compute_grpo_trajectory_advantage"]


def compute_group_statistics(
    scores: torch.Tensor, index: Sequence[Any] | np.ndarray
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row group mean and std.

    Args:
        scores: ``(bs,)`` scalar outcome per row.
        index: ``(bs,)`` group id per row (verl's ``uid``).

    Returns:
        ``(mean, std)``, each ``(bs,)``: the statistics of the row's group.
    """
    rows_of_group: dict[Any, list[int]] = {}
    for row, group in enumerate(index):
        rows_of_group.setdefault(group, []).append(row)
    mean = torch.empty_like(scores)
    std = torch.empty_like(scores)
    for rows in rows_of_group.values():
        if len(rows) == 1:
            mean[rows[0]] = 0.0
            std[rows[0]] = 1.0
            continue
        rows_tensor = torch.tensor(rows)
        group_scores = scores[rows_tensor]  # same values as verl's torch.stack of scalars
        mean[rows_tensor] = torch.mean(group_scores)
        std[rows_tensor] = torch.std(group_scores)
    return mean, std


def compute_grpo_trajectory_advantage(
    scores: torch.Tensor,
    index: Sequence[Any] | np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
) -> torch.Tensor:
    """Group-normalized scalar advantage per row.

    Args:
        scores: ``(bs,)`` outcome reward per row (verl: ``token_level_rewards.sum(-1)``).
        index: ``(bs,)`` group id per row.
        epsilon: added to the std before dividing (verl's default ``1e-6``).
        norm_adv_by_std_in_grpo: divide by the group std (GRPO) or not (Dr.GRPO).

    Returns:
        ``(bs,)`` advantage ``A_tau`` per row, same dtype as ``scores``.
    """
    if scores.dim() != 1:
        raise ValueError(f"scores must have shape (bs,), got {tuple(scores.shape)}")
    if len(index) != scores.shape[0]:
        raise ValueError(f"index has {len(index)} entries for {scores.shape[0]} scores")
    with torch.no_grad():
        mean, std = compute_group_statistics(scores, index)
        if norm_adv_by_std_in_grpo:
            return (scores - mean) / (std + epsilon)
        return scores - mean
