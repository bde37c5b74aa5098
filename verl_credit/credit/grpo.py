"""GRPO group-normalized trajectory advantage, identical to verl's ``compute_grpo_outcome_advantage``.

``A_tau = (R - mu_G) / (sigma_G + eps)`` where ``mu_G`` and ``sigma_G`` are the mean and the
Bessel-corrected standard deviation (``torch.std``) of the scores of the trajectory's group.
A group of one sample has ``mu = 0, sigma = 1``; ``norm_adv_by_std_in_grpo=False`` drops the
division (Dr.GRPO).

verl loops over rows and reduces each group with ``torch.mean`` / ``torch.std``; here groups of
equal size are reduced together as rows of one matrix, which gives the same bits, and the per-row
arithmetic is the same elementwise subtract/add/divide, vectorized, so the result is
bit-identical in fp32 (tests import verl's function and compare, on random float rewards too).
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

    Groups of equal size are stacked into one ``(groups, size)`` matrix (members in row order,
    as verl stacks them) and reduced along its rows; a row reduction of a contiguous matrix
    gives the same bits as ``torch.mean`` / ``torch.std`` of that row as a 1-D tensor (tested
    against verl on random float rewards).

    Args:
        scores: ``(bs,)`` scalar outcome per row.
        index: ``(bs,)`` group id per row (verl's ``uid``).

    Returns:
        ``(mean, std)``, each ``(bs,)``: the statistics of the row's group.
    """
    group_of_row = _group_ids(index)
    order = np.argsort(group_of_row, kind="stable")  # rows grouped, row order kept inside a group
    sizes = np.bincount(group_of_row)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    mean = torch.zeros_like(scores)
    std = torch.ones_like(scores)  # a group of one: mean 0, std 1
    for size in np.unique(sizes):
        if size == 1:
            continue
        groups = np.flatnonzero(sizes == size)
        members = torch.from_numpy(order[starts[groups][:, None] + np.arange(size)[None, :]])  # (groups, size)
        member_scores = scores[members]
        mean[members] = member_scores.mean(dim=1, keepdim=True).expand_as(member_scores)
        std[members] = member_scores.std(dim=1, keepdim=True).expand_as(member_scores)
    return mean, std


def _group_ids(index: Sequence[Any] | np.ndarray) -> np.ndarray:
    """Dense integer id per row, numbered in order of first appearance."""
    ids: dict[Any, int] = {}
    return np.fromiter((ids.setdefault(group, len(ids)) for group in index), dtype=np.int64, count=len(index))


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
