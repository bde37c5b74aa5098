"""GiGPO's step advantage over anchor-state groups and the turn-reward advantage (docs/design.md 4b).

Pure tensor math; the estimators in ``verl_credit.estimators`` feed it. Shapes: ``B`` trajectories
padded to ``T`` actions; ``valid`` marks real actions. Anchor groups come as integer ids per action
(``-1`` on padding): equal ids are the same state of the same ``uid``.

``gigpo`` (arXiv 2505.10978, verl-agent's defaults)::

    R_i   = gamma^(T_tau - 1 - i) R_tau  (+ r_i when the environment gives per-turn rewards)
    A^S_i = R_i - mean_{g(i)} R          [/ (std_{g(i)} R + eps) in mode mean_std_norm]
    A^S_i = 0 when |g(i)| = 1

``turn_reward``::

    G_i = sum_{k >= i} gamma^(k - i) r_k
    b_i = mean of G over the *other* trajectories' actions with the same key (the anchor state;
          where none has it, the same turn index in the same uid; where none, b_i = G_i: no signal)
    A_i = A_tau + lambda_turn (G_i - b_i)

The std of an anchor group is Bessel-corrected (``torch.std``), as verl's and verl-agent's GRPO.
"""

from __future__ import annotations

import torch

__all__ = [
    "GIGPO_MODES",
    "compute_anchor_step_advantage",
    "compute_discounted_step_returns",
    "compute_leave_one_out_baseline",
    "compute_turn_returns",
]

GIGPO_MODES: tuple[str, ...] = ("mean_norm", "mean_std_norm")


def compute_discounted_step_returns(
    scores: torch.Tensor, num_actions: torch.Tensor, width: int, gamma: float
) -> torch.Tensor:
    """``R_i = gamma^(T_tau - 1 - i) R_tau`` for every action.

    Args:
        scores: ``(B,)`` outcome rewards.
        num_actions: ``(B,)`` actions per trajectory.
        width: T (padded action count).
        gamma: discount in (0, 1].

    Returns:
        ``(B, T)`` float64, 0 on padding.
    """
    position = torch.arange(width, dtype=torch.float64).unsqueeze(0)
    steps_to_end = num_actions.to(torch.float64).unsqueeze(1) - 1.0 - position
    valid = steps_to_end >= 0
    discount = torch.where(valid, torch.full_like(steps_to_end, float(gamma)) ** steps_to_end.clamp(min=0), 0.0)
    return discount * scores.to(torch.float64).unsqueeze(1)


def _group_sums(values: torch.Tensor, groups: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per-entry count, sum and sum of squares of its group (valid entries only)."""
    ids = torch.where(valid, groups, torch.full_like(groups, -1)).flatten()
    flat = torch.where(valid, values, torch.zeros_like(values)).flatten()
    _, inverse = torch.unique(ids, return_inverse=True)
    size = int(inverse.max()) + 1 if inverse.numel() else 0
    count = torch.zeros(size, dtype=torch.float64).index_add_(0, inverse, valid.flatten().to(torch.float64))
    total = torch.zeros(size, dtype=torch.float64).index_add_(0, inverse, flat)
    squares = torch.zeros(size, dtype=torch.float64).index_add_(0, inverse, flat * flat)
    shape = values.shape
    return count[inverse].view(shape), total[inverse].view(shape), squares[inverse].view(shape)


def compute_anchor_step_advantage(
    step_returns: torch.Tensor,
    anchor_groups: torch.Tensor,
    valid: torch.Tensor,
    mode: str = "mean_norm",
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GiGPO's step advantage ``A^S``.

    Args:
        step_returns: ``(B, T)`` float64 ``R_i``.
        anchor_groups: ``(B, T)`` int64 anchor-group id of each action (same id: same uid and state).
        valid: ``(B, T)`` bool, real actions.
        mode: ``mean_norm`` (``R_i - mean``) or ``mean_std_norm`` (divided by ``std + eps``).
        eps: added to the std.

    Returns:
        ``(A^S, matched)``: ``(B, T)`` float64 step advantages (0 where ``|g(i)| = 1`` and on
        padding) and ``(B, T)`` bool, actions whose anchor group has two or more members.
    """
    if mode not in GIGPO_MODES:
        raise ValueError(f"mode must be one of {GIGPO_MODES}, got {mode!r}")
    values = step_returns.to(torch.float64)
    count, total, squares = _group_sums(values, anchor_groups, valid)
    matched = valid & (count > 1)
    mean = total / count.clamp(min=1)
    centred = values - mean
    if mode == "mean_std_norm":
        variance = (squares - count * mean * mean).clamp(min=0) / (count - 1).clamp(min=1)
        centred = centred / (variance.sqrt() + eps)
    return torch.where(matched, centred, torch.zeros_like(centred)), matched


def compute_turn_returns(turn_rewards: torch.Tensor, valid: torch.Tensor, gamma: float) -> torch.Tensor:
    """``G_i = sum_{k >= i} gamma^(k - i) r_k`` over each trajectory's actions.

    Args:
        turn_rewards: ``(B, T)`` per-action rewards (0 on padding).
        valid: ``(B, T)`` bool.
        gamma: discount in (0, 1].

    Returns:
        ``(B, T)`` float64, 0 on padding.
    """
    rewards = torch.where(valid, turn_rewards.to(torch.float64), 0.0)
    returns = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[0], dtype=torch.float64)
    for column in range(rewards.shape[1] - 1, -1, -1):  # T steps of (B,) work: linear in actions
        running = rewards[:, column] + float(gamma) * running
        returns[:, column] = running
    return torch.where(valid, returns, 0.0)


def compute_leave_one_out_baseline(
    values: torch.Tensor,
    state_groups: torch.Tensor,
    turn_groups: torch.Tensor,
    valid: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean of ``values`` over the other trajectories' actions with the same state group, else the
    same turn group; where neither has another trajectory, the action's own value (no signal).

    Args:
        values: ``(B, T)`` float64 (the returns ``G``).
        state_groups: ``(B, T)`` int64 anchor-state group ids (uid and state).
        turn_groups: ``(B, T)`` int64 turn-index group ids (uid and action index).
        valid: ``(B, T)`` bool.

    Returns:
        ``(baseline, has_baseline)``, both ``(B, T)``; ``has_baseline`` marks actions that got a
        baseline from another trajectory.
    """
    rows = torch.arange(values.shape[0]).unsqueeze(1).expand_as(values)
    baseline = values.clone()
    found = torch.zeros_like(valid)
    for groups in (state_groups, turn_groups):
        count, total, _ = _group_sums(values, groups, valid)
        # the same group within the same trajectory: what "leave one out" removes
        own_ids = groups * values.shape[0] + rows
        own_count, own_total, _ = _group_sums(values, own_ids, valid)
        others = count - own_count
        usable = valid & ~found & (others > 0)
        baseline = torch.where(usable, (total - own_total) / others.clamp(min=1), baseline)
        found = found | usable
    return torch.where(valid, baseline, 0.0), found
