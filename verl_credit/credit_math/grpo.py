"""GRPO group-normalized trajectory advantage, identical to verl's ``compute_grpo_outcome_advantage``.

``A_tau = (R - mu_G) / (sigma_G + eps)`` where ``mu_G`` and ``sigma_G`` are the mean and the
Bessel-corrected standard deviation (``torch.std``) of the scores of the trajectory's group.
A group of one sample has ``mu = 0, sigma = 1``; ``norm_adv_by_std_in_grpo=False`` drops the
division (Dr.GRPO).

verl loops over rows and reduces each group with ``torch.mean`` / ``torch.std``; here groups of
equal size are reduced together as rows of one matrix, which gives the same bits, and the per-row
arithmetic is the same elementwise subtract/add/divide, vectorized, so the result is
bit-identical in fp32 (tests import verl's function and compare, on random float rewards too).

Finite scores always give finite advantages: a group (of two or more) holding a score with
``|R| >= WIDE_SCORE`` (where an fp32 sum or square can overflow, e.g. four rewards of ``3.4e38``)
is normalized in float64 on the scores divided by the group's largest ``|R|`` (the same quotient,
``eps`` divided too), then cast back (Dr.GRPO's ``R - mu`` is clamped to the dtype's range).
Every other group keeps verl's fp32 arithmetic bit for bit. Non-finite scores are the caller's
to reject (``batch_credit.compute_batch_credit``) or neutralize (the trainer).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["REWARD_LIMIT", "WIDE_SCORE", "compute_group_statistics", "compute_grpo_trajectory_advantage"]

#: groups with a score this large (in magnitude) are normalized in float64 (see the module doc)
WIDE_SCORE = 1e18
#: the largest trajectory reward in magnitude. Credit is linear in the rewards with factors of at
#: most ``config_rules.MAX_WEIGHT = 1e6`` summed over a group (GiGPO adds a step term, CALL-CREDIT
#: without std normalization keeps the raw difference), so rewards within +-1e300 keep every credit
#: term below float64's 1.8e308 for groups of up to 1e8 members; 1e308 itself overflows.
REWARD_LIMIT = 1e300


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
            advantage = (scores - mean) / (std + epsilon)
        else:
            advantage = scores - mean
        wide = _wide_rows(scores, index)
        if wide is not None:
            rows, scale, groups = wide
            advantage[rows] = _wide_advantage(
                scores[rows], scale, groups, epsilon, norm_adv_by_std_in_grpo, scores.dtype
            )
        return advantage


def _wide_rows(
    scores: torch.Tensor, index: Sequence[Any] | np.ndarray
) -> tuple[torch.Tensor, torch.Tensor, np.ndarray] | None:
    """Rows of groups (two or more members) with a finite ``|R| >= WIDE_SCORE``, the largest ``|R|``
    of each such row's group (float64) and its group id; ``None`` when there are none."""
    magnitude = scores.detach().abs().to(torch.float64).cpu().numpy()
    if not (magnitude >= WIDE_SCORE).any():
        return None
    group_of_row = _group_ids(index)
    largest = np.zeros(int(group_of_row.max()) + 1)
    np.maximum.at(largest, group_of_row, magnitude)
    sizes = np.bincount(group_of_row)
    wide_group = (largest >= WIDE_SCORE) & np.isfinite(largest) & (sizes > 1)
    rows = wide_group[group_of_row]
    if not rows.any():
        return None
    members = group_of_row[rows]
    return torch.from_numpy(np.flatnonzero(rows)), torch.from_numpy(largest[members]), members


def _wide_advantage(
    scores: torch.Tensor,
    scale: torch.Tensor,
    groups: np.ndarray,
    epsilon: float,
    norm_adv_by_std_in_grpo: bool,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The advantage of wide groups in float64, on scores scaled into ``[-1, 1]``."""
    scaled = scores.to(torch.float64) / scale
    mean, std = compute_group_statistics(scaled, groups)
    if norm_adv_by_std_in_grpo:
        advantage = (scaled - mean) / (std + epsilon / scale)
    else:
        advantage = (scaled - mean) * scale
    limit = torch.finfo(dtype).max
    return advantage.clamp(-limit, limit).to(dtype)
