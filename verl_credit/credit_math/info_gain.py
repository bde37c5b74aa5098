"""InfoPO's turn-level information gain, fused with the GRPO advantage (the ``info_gain`` estimator).

InfoPO ("Information-Driven Policy Optimization for User-Centric Agents", the authors' code at
GitHub ``kfq20/InfoPO``) rewards an action whose feedback (the tool result or user reply it
elicited) changes what the policy does next. Pure tensor functions; the teacher-forced
log-probabilities come from the trainer (``verl_credit.verl.info_gain_step``) or from a rollouts
file (``verl-credit route``).

Notation:
    B: trajectories in the batch.  T: the largest number of actions of a trajectory (padded).
    lengths: ``(B, T)`` trainable tokens ``L_i`` per action (0 on padding).
    a_i: action i; o_i: the feedback tokens between a_i and a_{i+1}; y_{i+1,l}: the l-th
    trainable token of a_{i+1}; ``ctx`` everything before it.
    A_tau: ``(B,)`` GRPO trajectory advantage; g(tau): the trajectory's group (uid).

Equations, and where each term is in the authors' code:

    (0) o_i -> placeholder: the feedback tokens are overwritten in place by the tokens of
        "No information found.", the last placeholder token repeated (or the placeholder cut)
        to the feedback's length, so positions do not move
        [``verl/trainer/ppo/intrinsic_reward.py``, ``compute_batched_kl_divergence``]
    (1) IG_i = (1 / L_{i+1}) sum_l [ log pi(y_{i+1,l} | ctx) - log pi(y_{i+1,l} | ctx with o_i masked) ]
        teacher-forced, the mean over a_{i+1}'s tokens; attributed to a_i, the action that
        produced the feedback; no IG for the last action or an action without feedback
        [same function; the attribution in ``compute_intrinsic_rewards``]
    (2) r_i = IG_i / L_i on each of a_i's tokens (a per-token reward; turn reward = IG_i)
        [``compute_intrinsic_rewards``: ``reward_per_token = kl_value / current_action_len``]
    (3) over the tokens with r != 0 of a group g: mean mu_g and Bessel std s_g (one token:
        mu_g = r, s_g = 1); Ahat_i = (r_i - mu_g) / (s_g + eps), or r_i - mu_g when GRPO does not
        divide by the std, or r_i itself with ``normalize`` off; 0 on tokens with r = 0
        [``verl/trainer/ppo/core_algos.py``, ``compute_info_grpo_advantage``, step 2]
    (4) gate_tau = sigmoid(-sigma_g / T_gate), sigma_g the Bessel std of the group's outcome
        rewards (1 for a group of one): about 1/2 where GRPO has no signal (all rewards equal),
        about 0 where the outcome already separates the rollouts  [same function, step 3b]
    (5) rho = min(1, max(s_A + eps, 1) / (s_Ahat + eps)), s_A and s_Ahat the Bessel stds over
        every trainable token of the batch of A_tau and of Ahat: shrinks Ahat only when it is
        larger than the outcome advantage, never below std 1  [same function, step 3a]
    (6) A_{i,l} = A_tau + beta * gate_tau * rho * Ahat_i on every trainable token of a_i
        [same function, ``combined_advantages``]

Defaults are the authors' tau2 recipe (``examples/tau2/config/tau2_trainer.yaml``):
``intrinsic_weight`` beta = 0.1, ``intrinsic_gate_temperature`` T_gate = 0.05, placeholder
"No information found.", ``normalize_intrinsic`` true, epsilon 1e-6. Their outcome term with
``turn_level_method=Equalized`` is GRPO's advantage broadcast to every token, as here.

Where this differs from their code (each a case their code leaves undefined or to chance):
fewer than two trainable tokens in the batch give a std of 0 in (5) (``torch.std`` of one value
is NaN); the weight decay ``intrinsic_decay_rate`` (0 in their recipes) and the ablation
``use_intrinsic_only`` are not offered. Token counts are trainable tokens (their ``loss_mask``).

Not mass-conserving and not sign-preserving: it is the comparator as published.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = [
    "DEFAULT_PLACEHOLDER",
    "InfoGainParts",
    "compute_feedback_gain",
    "compute_info_gain_advantage",
    "compute_info_gain_advantage_reference",
    "compute_intrinsic_token_rewards",
    "compute_magnitude_ratio",
    "compute_variance_gate",
    "mask_feedback_tokens",
    "normalize_intrinsic_rewards",
]

#: the authors' ``observation_placeholder``
DEFAULT_PLACEHOLDER = "No information found."


def mask_feedback_tokens(input_ids: torch.Tensor, start: int, end: int, placeholder_ids: Sequence[int]) -> torch.Tensor:
    """Equation (0): a copy of ``input_ids`` with ``[start, end)`` overwritten by the placeholder.

    Args:
        input_ids: ``(N,)`` token ids of one sequence.
        start, end: the feedback tokens, ``0 <= start <= end <= N``.
        placeholder_ids: the placeholder's tokens (at least one).

    Returns:
        ``(N,)``: same length; the placeholder is cut to ``end - start`` tokens, or its last token
        repeated up to it.
    """
    if not placeholder_ids:
        raise ValueError("the placeholder has no tokens")
    if not 0 <= start <= end <= input_ids.shape[0]:
        raise ValueError(f"feedback span [{start}, {end}) is outside a sequence of {input_ids.shape[0]} tokens")
    width = end - start
    filler = list(placeholder_ids[:width]) + [placeholder_ids[-1]] * max(0, width - len(placeholder_ids))
    masked = input_ids.clone()
    masked[start:end] = torch.tensor(filler, dtype=input_ids.dtype)
    return masked


def compute_feedback_gain(
    log_probs_with: torch.Tensor, log_probs_without: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Equation (1): mean over the next action's tokens of the log-prob lost by masking the feedback.

    Args:
        log_probs_with, log_probs_without: ``(P, N)`` teacher-forced log-probs of the tokens of
            ``P`` (feedback, next action) pairs, with the feedback and with it masked.
        mask: ``(P, N)`` bool, the next action's trainable tokens.

    Returns:
        ``(P,)`` float64 ``IG``; 0 for a pair without tokens.
    """
    weight = mask.to(torch.float64)
    difference = (log_probs_with.to(torch.float64) - log_probs_without.to(torch.float64)) * weight
    return difference.sum(dim=-1) / weight.sum(dim=-1).clamp_min(1.0)


def compute_intrinsic_token_rewards(gains: torch.Tensor, has_gain: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Equation (2): ``r_i = IG_i / L_i`` where action i has a gain and tokens, else 0.

    Shapes: ``gains`` ``(B, T)`` float, ``has_gain`` ``(B, T)`` bool, ``lengths`` ``(B, T)`` -> ``(B, T)`` float64.
    """
    lengths = lengths.to(torch.float64)
    present = has_gain & (lengths > 0)
    return torch.where(present, gains.to(torch.float64) / lengths.clamp_min(1.0), torch.zeros_like(lengths))


def _weighted_std(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Bessel std of a multiset holding ``weights[k]`` copies of ``values[k]`` (token counts);
    0 with fewer than two copies. Shapes: ``(...)`` -> scalar."""
    values, weights = values.to(torch.float64).flatten(), weights.to(torch.float64).flatten()
    count = weights.sum()
    if float(count) < 2.0:
        return torch.zeros((), dtype=torch.float64)
    mean = (weights * values).sum() / count
    return ((weights * (values - mean) ** 2).sum() / (count - 1.0)).sqrt()


def normalize_intrinsic_rewards(
    rewards: torch.Tensor,
    lengths: torch.Tensor,
    group_ids: torch.Tensor,
    eps: float = 1e-6,
    norm_by_std: bool = True,
    normalize: bool = True,
) -> torch.Tensor:
    """Equation (3): each group's non-zero token rewards centred (and scaled) by the group's.

    Args:
        rewards: ``(B, T)`` float64 ``r`` (equation 2).
        lengths: ``(B, T)`` tokens per action (each action's ``r`` counts once per token).
        group_ids: ``(B,)`` int64 group of each trajectory (same uid: same id).
        eps: added to the group's std.
        norm_by_std: divide by ``s_g + eps`` (GRPO's ``norm_adv_by_std_in_grpo``) or only centre.
        normalize: off: ``r`` unchanged (the authors' ``normalize_intrinsic=False``).

    Returns:
        ``(B, T)`` float64 ``Ahat``, 0 where ``r = 0`` or the action has no tokens.
    """
    rewards = rewards.to(torch.float64)
    weight = torch.where((rewards != 0) & (lengths > 0), lengths.to(torch.float64), torch.zeros_like(rewards))
    present = weight > 0
    if not normalize:
        return torch.where(present, rewards, torch.zeros_like(rewards))
    groups = group_ids.to(torch.long)
    size = int(groups.max()) + 1 if groups.numel() else 0
    count = torch.zeros(size, dtype=torch.float64).index_add_(0, groups, weight.sum(dim=-1))
    total = torch.zeros(size, dtype=torch.float64).index_add_(0, groups, (weight * rewards).sum(dim=-1))
    mean = (total / count.clamp_min(1.0))[groups].unsqueeze(-1)  # (B, 1)
    squares = torch.zeros(size, dtype=torch.float64).index_add_(0, groups, (weight * (rewards - mean) ** 2).sum(dim=-1))
    # one token in the group: its own value is the mean and the std is 1 (so Ahat = 0)
    std = torch.where(count > 1, (squares / (count - 1.0).clamp_min(1.0)).sqrt(), torch.ones_like(count))
    centred = rewards - mean
    scaled = centred / (std[groups].unsqueeze(-1) + eps) if norm_by_std else centred
    return torch.where(present, scaled, torch.zeros_like(scaled))


def compute_variance_gate(score_std: torch.Tensor, temperature: float) -> torch.Tensor:
    """Equation (4): ``sigmoid(-sigma_g / T_gate)``. Shapes: ``(B,)`` -> ``(B,)`` float64."""
    if not temperature > 0:
        raise ValueError(f"the gate temperature must be > 0, got {temperature}")
    return torch.sigmoid(-score_std.to(torch.float64) / float(temperature))


def compute_magnitude_ratio(
    advantage: torch.Tensor,
    intrinsic: torch.Tensor,
    lengths: torch.Tensor,
    eps: float = 1e-6,
    baseline_std: float = 1.0,
) -> torch.Tensor:
    """Equation (5): ``min(1, max(s_A + eps, baseline_std) / (s_Ahat + eps))`` over the batch's tokens.

    Args:
        advantage: ``(B,)`` ``A_tau`` (each trajectory's value counts once per trainable token).
        intrinsic: ``(B, T)`` ``Ahat``.
        lengths: ``(B, T)`` tokens per action.
        eps: added to both stds.
        baseline_std: the smallest std the intrinsic term is scaled to (the authors' 1.0).

    Returns:
        scalar float64 ``rho`` in ``(0, 1]``.
    """
    lengths = lengths.to(torch.float64)
    outcome_std = _weighted_std(advantage.to(torch.float64), lengths.sum(dim=-1)) + eps
    intrinsic_std = _weighted_std(intrinsic, lengths) + eps
    target = torch.clamp(outcome_std, min=float(baseline_std))
    return torch.clamp(target / intrinsic_std, max=1.0)


@dataclass(frozen=True)
class InfoGainParts:
    """The terms of equation (6), for diagnostics."""

    rewards: torch.Tensor  # (B, T) r, equation (2)
    intrinsic: torch.Tensor  # (B, T) Ahat, equation (3)
    gate: torch.Tensor  # (B,) equation (4)
    ratio: torch.Tensor  # scalar rho, equation (5)
    bonus: torch.Tensor  # (B, T) beta * gate * rho * Ahat


def compute_info_gain_advantage(
    advantage: torch.Tensor,
    gains: torch.Tensor,
    has_gain: torch.Tensor,
    lengths: torch.Tensor,
    valid: torch.Tensor,
    group_ids: torch.Tensor,
    score_std: torch.Tensor,
    weight: float = 0.1,
    gate_temperature: float = 0.05,
    eps: float = 1e-6,
    norm_by_std: bool = True,
    normalize: bool = True,
) -> tuple[torch.Tensor, InfoGainParts]:
    """Equations (2)-(6): per-action advantage ``A_tau + beta gate rho Ahat_i``.

    Args:
        advantage: ``(B,)`` float64 ``A_tau``.
        gains: ``(B, T)`` ``IG_i`` (equation 1), any value where ``has_gain`` is false.
        has_gain: ``(B, T)`` bool, actions that have an information gain.
        lengths: ``(B, T)`` trainable tokens per action.
        valid: ``(B, T)`` bool, real actions.
        group_ids: ``(B,)`` int64 group of each trajectory.
        score_std: ``(B,)`` Bessel std of the outcome rewards of the trajectory's group (1 alone).
        weight: beta (``credit.info_gain.weight``).
        gate_temperature: T_gate.
        eps: the epsilon of equations (3) and (5).
        norm_by_std: GRPO's ``norm_adv_by_std_in_grpo`` (equation 3 divides by the std or not).
        normalize: equation (3) on or off.

    Returns:
        ``(B, T)`` float64 action advantages (0 on padding) and the :class:`InfoGainParts`.
    """
    lengths = torch.where(valid, lengths.to(torch.float64), torch.zeros_like(lengths, dtype=torch.float64))
    rewards = compute_intrinsic_token_rewards(gains, has_gain & valid, lengths)
    intrinsic = normalize_intrinsic_rewards(rewards, lengths, group_ids, eps, norm_by_std, normalize)
    gate = compute_variance_gate(score_std, gate_temperature)
    ratio = compute_magnitude_ratio(advantage, intrinsic, lengths, eps)
    bonus = float(weight) * gate.unsqueeze(-1) * ratio * intrinsic
    action_advantage = (advantage.to(torch.float64).unsqueeze(-1) + bonus) * valid
    return action_advantage, InfoGainParts(rewards, intrinsic, gate, ratio, bonus)


def compute_info_gain_advantage_reference(
    advantage: Sequence[float],
    gains: Sequence[Sequence[float | None]],
    lengths: Sequence[Sequence[int]],
    groups: Sequence[object],
    score_std: Sequence[float],
    weight: float = 0.1,
    gate_temperature: float = 0.05,
    eps: float = 1e-6,
    norm_by_std: bool = True,
    normalize: bool = True,
) -> list[list[float]]:
    """A literal per-token transcription of equations (2)-(6), the layout of the authors' code:
    every trajectory is a flat list of token values, statistics are taken over token lists.
    ``gains[b][i]`` is ``None`` where action i has no gain. Slow; for tests."""
    import math
    import statistics

    def std(values: list[float]) -> float:
        return statistics.stdev(values) if len(values) > 1 else 0.0

    token_rewards = [
        [(g / n if g is not None and n > 0 else 0.0) for g, n in zip(row, sizes, strict=True) for _ in range(n)]
        for row, sizes in zip(gains, lengths, strict=True)
    ]
    pooled: dict[object, list[float]] = {}
    for row, group in zip(token_rewards, groups, strict=True):
        pooled.setdefault(group, []).extend(v for v in row if v != 0)
    normalized = []
    for row, group in zip(token_rewards, groups, strict=True):
        values = pooled.get(group, [])
        mean = values[0] if len(values) == 1 else (sum(values) / len(values) if values else 0.0)
        scale = 1.0 if len(values) == 1 else std(values)
        out = []
        for value in row:
            if value == 0:
                out.append(0.0)
            elif not normalize:
                out.append(value)
            else:
                out.append((value - mean) / (scale + eps) if norm_by_std else value - mean)
        normalized.append(out)
    outcome_tokens = [a for a, row in zip(advantage, token_rewards, strict=True) for _ in row]
    intrinsic_tokens = [v for row in normalized for v in row]
    ratio = min(1.0, max(std(outcome_tokens) + eps, 1.0) / (std(intrinsic_tokens) + eps))
    result = []
    for b, row in enumerate(normalized):
        gate = 1.0 / (1.0 + math.exp(score_std[b] / gate_temperature))
        tokens = [advantage[b] + weight * gate * ratio * v for v in row]
        per_action, position = [], 0
        for n in lengths[b]:
            per_action.append(tokens[position] if n > 0 else advantage[b])
            position += n
        result.append(per_action)
    return result
