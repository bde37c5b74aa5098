"""CALL-CREDIT: role-weighted causal decomposition of the trajectory advantage (docs/design.md section 4).

Notation:
    B: trajectories. T: the largest number of calls in the batch (rows padded).
    valid: ``(B, T)`` 1 for a real call, 0 for padding.
    lengths: ``(B, T)`` trainable tokens per call (0 for padding).

Equations:

    (10) s_i = omega(r_i) * (deg_i + lambda) / sum_j (deg_j + lambda) * gamma^(T - pos_i)
    (11) mass_conserving: w_i = L s_i / sum_j L_j s_j ;  A_i = A * w_i
    (12) paper:           A_i = A * s_i * T             (w_i = s_i * T)
    (13) fusion:          A~_t = alpha * A_t^GRPO + (1 - alpha) * A_{v(t)}

``pos_i`` is the 1-based call index and ``T`` the trajectory's own number of calls. With
``lambda = 0`` a call without outgoing causal edges gets ``s_i = 0``; a trajectory whose calls all
have ``deg + lambda = 0`` falls back to uniform ``s_i = omega_i gamma^(T - pos_i) / T``-shaped
scores (the degree factor becomes ``1/T``) so nothing divides by zero.
"""

from __future__ import annotations

from typing import Literal

import torch

__all__ = [
    "CALL_CREDIT_MODES",
    "compute_call_scores",
    "compute_call_weights",
    "compute_reward_hacking_rate",
    "fuse_token_advantages",
]

CALL_CREDIT_MODES: tuple[str, ...] = ("mass_conserving", "paper")
CallCreditMode = Literal["mass_conserving", "paper"]


def compute_call_scores(
    omega: torch.Tensor, out_degree: torch.Tensor, valid: torch.Tensor, smoothing: float = 1.0, gamma: float = 0.95
) -> torch.Tensor:
    """Equation (10).

    Args:
        omega: ``(B, T)`` role weight ``omega(r_i)`` of each call.
        out_degree: ``(B, T)`` number of outgoing causal edges ``deg_i``.
        valid: ``(B, T)`` 1 for real calls, 0 for padding.
        smoothing: ``lambda >= 0``.
        gamma: discount in (0, 1].

    Returns:
        ``s``: ``(B, T)``, 0 on padding.
    """
    valid = valid.to(omega.dtype)
    num_calls = valid.sum(dim=-1, keepdim=True)
    position = valid.cumsum(dim=-1)  # 1-based index of each real call
    smoothed = (out_degree.to(omega.dtype) + smoothing) * valid
    total = smoothed.sum(dim=-1, keepdim=True)
    uniform = valid / num_calls.clamp_min(1.0)
    degree_share = torch.where(total > 0, smoothed / total.clamp_min(torch.finfo(omega.dtype).tiny), uniform)
    discount = torch.pow(torch.as_tensor(gamma, dtype=omega.dtype), (num_calls - position).clamp_min(0.0))
    return omega * degree_share * discount * valid


def compute_call_weights(
    scores: torch.Tensor, lengths: torch.Tensor, valid: torch.Tensor, mode: CallCreditMode = "mass_conserving"
) -> torch.Tensor:
    """Equations (11)-(12): the per-call multiplier ``w_i`` of the trajectory advantage.

    Shapes: ``scores, lengths, valid`` ``(B, T)`` -> ``(B, T)`` (0 on padding).
    A trajectory with no trainable tokens (or zero total score mass) gets ``w = 1``.
    """
    if mode not in CALL_CREDIT_MODES:
        raise ValueError(f"call_credit mode must be one of {CALL_CREDIT_MODES}, got {mode!r}")
    valid = valid.to(scores.dtype)
    if mode == "paper":
        return scores * valid.sum(dim=-1, keepdim=True)
    lengths = lengths.to(scores.dtype)
    total = lengths.sum(dim=-1, keepdim=True)
    mass = (lengths * scores).sum(dim=-1, keepdim=True)
    ok = (total > 0) & (mass > 0)
    weights = total * scores / torch.where(ok, mass, torch.ones_like(mass))
    return torch.where(ok, weights, torch.ones_like(weights)) * valid


def fuse_token_advantages(grpo_tokens: torch.Tensor, call_tokens: torch.Tensor, alpha: float) -> torch.Tensor:
    """Equation (13): ``alpha * A^GRPO + (1 - alpha) * A^call`` per token. Shapes ``(B, R)``."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if alpha == 0.0:
        return call_tokens
    return alpha * grpo_tokens + (1.0 - alpha) * call_tokens


def compute_reward_hacking_rate(
    reward: torch.Tensor,
    action_advantage: torch.Tensor,
    lengths: torch.Tensor,
    is_ig: torch.Tensor,
    is_ae: torch.Tensor,
    margin: float = 0.10,
) -> tuple[float, int]:
    """``credit/reward_hacking_rate``: among successful trajectories (``R > 0``) that have both IG
    and AE calls with tokens, the share whose mean per-token advantage on IG calls exceeds the one
    on AE calls by more than ``margin`` (relative to ``|mean_AE|``).

    Args:
        reward: ``(B,)``. action_advantage, lengths, is_ig, is_ae: ``(B, T)``.

    Returns:
        ``(rate, eligible)``: the rate (0.0 when nothing is eligible) and the denominator.
    """
    lengths = lengths.to(action_advantage.dtype)
    ig_tokens = (lengths * is_ig).sum(-1)
    ae_tokens = (lengths * is_ae).sum(-1)
    eligible = (reward > 0) & (ig_tokens > 0) & (ae_tokens > 0)
    if not bool(eligible.any()):
        return 0.0, 0
    ig_mean = (lengths * is_ig * action_advantage).sum(-1) / ig_tokens.clamp_min(1.0)
    ae_mean = (lengths * is_ae * action_advantage).sum(-1) / ae_tokens.clamp_min(1.0)
    hacking = ig_mean > ae_mean + margin * ae_mean.abs()
    count = int(eligible.sum())
    return float((hacking & eligible).sum()) / count, count
