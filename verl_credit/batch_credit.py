"""The one batch path from graphs to per-action and per-token advantages.

Shared by the verl trainer, the CLI (``verl-credit route``), the demo and the benchmarks:

    scores + group ids  --estimator.trajectory_advantage-->  A_tau (B,)     (GRPO's, credit_math/grpo.py)
    inputs + lengths    --estimator.action_credit-->  w (B, T)  or  A_i (B, T)  (credit_math/*.py math)
    A_tau * w  or  A_i  --tokens.py-->  (rows, response_len)  --estimator.post_process_tokens-->

The estimator is looked up by name in ``verl_credit.estimators`` (one module per estimator),
once per config (``CreditConfig.registered_estimator``).

Nothing here knows where a graph came from (annotator, cache, file) or how rows were packed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np
import torch

from verl_credit.call_graph import CallGraph
from verl_credit.config import CreditConfig
from verl_credit.credit_math.grpo import REWARD_LIMIT, WIDE_SCORE
from verl_credit.credit_math.tokens import scatter_action_values_to_tokens
from verl_credit.estimators.call_credit import pad_call_graphs
from verl_credit.estimators.iapo import pad_influence_graphs
from verl_credit.estimators.registry import EstimatorInputs, TokenLayout
from verl_credit.graph import InfluenceGraph

__all__ = [
    "BatchCredit",
    "check_finite_scores",
    "compute_batch_credit",
    "credit_from_inputs",
    "credit_with_token_hook",
    "estimator_token_advantages",
    "pad_call_graphs",
    "pad_influence_graphs",
    "pad_lengths",
    "route_token_advantages",
    "trajectory_scores",
]


@dataclass
class BatchCredit:
    """Per-trajectory credit for a batch. Tensors are padded to ``T`` actions (padding: length 0).

    ``weight`` is the routed ``w`` actually applied (1 where ``A = 0``); ``action_advantage`` is
    ``A_tau * w``; ``w_plus``/``w_minus`` are both branches (IAPO) for diagnostics. For an
    ``additive`` estimator (``gigpo``, ``turn_reward``) ``action_advantage`` is its own per-action
    value and ``weight`` is 1 on real actions.
    """

    estimator: str
    trajectory_advantage: torch.Tensor  # (B,)
    lengths: torch.Tensor  # (B, T)
    num_actions: torch.Tensor  # (B,)
    weight: torch.Tensor  # (B, T)
    action_advantage: torch.Tensor  # (B, T)
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    additive: bool = False

    def weights_of(self, row: int) -> list[float]:
        return self.weight[row, : int(self.num_actions[row])].tolist()

    def advantages_of(self, row: int) -> list[float]:
        return self.action_advantage[row, : int(self.num_actions[row])].tolist()


def pad_lengths(lengths: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged per-action lengths -> ``(B, T)`` float64 lengths and ``(B,)`` action counts."""
    counts = np.fromiter((len(row) for row in lengths), dtype=np.int64, count=len(lengths))
    width = max(int(counts.max(initial=0)), 1)
    present = np.arange(width)[None, :] < counts[:, None]
    padded = np.zeros((len(lengths), width), dtype=np.float64)
    padded[present] = np.fromiter(chain.from_iterable(lengths), dtype=np.float64, count=int(counts.sum()))
    return torch.from_numpy(padded), torch.from_numpy(counts)


def check_finite_scores(
    scores: torch.Tensor, index: Sequence[Any] | np.ndarray, names: Sequence[Any] | None = None
) -> None:
    """Raise ``ValueError`` naming the first trajectory (position, name if given, group) whose score
    is NaN or infinite (it would make its whole group's advantages NaN) or beyond
    :data:`~verl_credit.credit_math.grpo.REWARD_LIMIT` (its credit would overflow)."""
    detached = scores.detach()
    bad = torch.nonzero(~torch.isfinite(detached)).flatten()
    if bad.numel():
        row = int(bad[0])
        name = f" {names[row]!r}" if names is not None else ""
        raise ValueError(
            f"reward of trajectory {row}{name} (group {index[row]!r}) is {float(scores[row])}: rewards must be "
            f"finite ({bad.numel()} non-finite of {scores.shape[0]})"
        )
    huge = torch.nonzero(detached.abs() > REWARD_LIMIT).flatten()
    if huge.numel():
        row = int(huge[0])
        name = f" {names[row]!r}" if names is not None else ""
        raise ValueError(
            f"reward of trajectory {row}{name} (group {index[row]!r}) is {float(scores[row]):g}: rewards must lie "
            f"within +-{REWARD_LIMIT:g} (a larger one overflows the credit)"
        )


def trajectory_scores(rewards: Sequence[float], names: Sequence[Any] | None = None) -> torch.Tensor:
    """``(B,)`` score tensor of per-trajectory rewards for :func:`compute_batch_credit`: float32
    (verl's dtype) when every reward is below ``grpo.WIDE_SCORE`` in magnitude, else float64, so
    that a finite reward such as ``1e39`` (beyond float32) stays finite. A NaN or infinite reward
    raises ``ValueError`` naming its position (and ``names[i]`` if given), and so does one beyond
    :data:`~verl_credit.credit_math.grpo.REWARD_LIMIT`."""
    values = torch.tensor([float(r) for r in rewards], dtype=torch.float64)
    bad = torch.nonzero(~torch.isfinite(values)).flatten()
    if bad.numel():
        row = int(bad[0])
        name = f" {names[row]!r}" if names is not None else ""
        raise ValueError(f"reward of trajectory {row}{name} is {float(values[row])}: rewards must be finite")
    huge = torch.nonzero(values.abs() > REWARD_LIMIT).flatten()
    if huge.numel():
        row = int(huge[0])
        name = f" {names[row]!r}" if names is not None else ""
        raise ValueError(
            f"reward of trajectory {row}{name} is {float(values[row]):g}: rewards must lie within +-{REWARD_LIMIT:g}"
        )
    if values.numel() and float(values.abs().max()) >= WIDE_SCORE:
        return values
    return values.to(torch.float32)


def compute_batch_credit(
    scores: torch.Tensor,
    index: Sequence[Any] | np.ndarray,
    lengths: Sequence[Sequence[int]],
    config: CreditConfig,
    graphs: Sequence[InfluenceGraph] | None = None,
    call_graphs: Sequence[CallGraph] | None = None,
    names: Sequence[Any] | None = None,
    anchor_states: Sequence[Sequence[str]] | None = None,
    turn_rewards: Sequence[Sequence[float] | None] | None = None,
    information_gains: Sequence[Sequence[float | None] | None] | None = None,
    rv_statuses: Sequence[Sequence[str | None]] | None = None,
) -> BatchCredit:
    """Trajectory advantage and per-action weights for a batch of B trajectories.

    Args:
        scores: ``(B,)`` outcome reward per trajectory (one entry per trajectory, not per row).
        index: ``(B,)`` group id (uid) per trajectory.
        lengths: B lists of per-action trainable token counts.
        config: which estimator and its parameters.
        graphs: B influence graphs (``iapo``); validated already.
        call_graphs: B call graphs (``call_credit``).
        names: B trajectory names, only for the message of a non-finite score.
        anchor_states: B lists of per-action state digests (``gigpo``, ``turn_reward``).
        turn_rewards: B lists of per-action environment rewards, or None per trajectory.
        information_gains: B lists of per-action information gains (a number or None per action),
            or None per trajectory (``info_gain``).
        rv_statuses: B lists of per-call verification outcomes (``call_credit``'s RV reward).

    The estimator is ``config.registered_estimator``; what it needs (``Estimator.needs``) must be
    given (``verl_credit.estimators.needs.gather_needs`` gathers it).

    Returns:
        :class:`BatchCredit` (weights in float64; advantages in ``scores``' dtype).

    Raises:
        ValueError: a score is NaN or infinite (naming the trajectory); finite scores, however
            large, give finite advantages (``grpo.WIDE_SCORE``).
    """
    inputs = EstimatorInputs(
        uids=list(index),
        scores=scores,
        graphs=graphs,
        call_graphs=call_graphs,
        anchor_states=anchor_states,
        turn_rewards=turn_rewards,
        information_gains=information_gains,
        rv_statuses=rv_statuses,
    )
    return credit_from_inputs(inputs, lengths, config, names)


def credit_from_inputs(
    inputs: EstimatorInputs, lengths: Sequence[Sequence[int]], config: CreditConfig, names: Sequence[Any] | None = None
) -> BatchCredit:
    """:func:`compute_batch_credit` on inputs already gathered (``inputs.uids`` are the group ids,
    ``inputs.scores`` the ``(B,)`` rewards)."""
    scores, index = inputs.scores, inputs.uids
    if scores.dim() == 1 and len(index) == scores.shape[0]:
        check_finite_scores(scores, index, names)
    estimator = config.registered_estimator
    advantage = estimator.trajectory_advantage(scores, index, config)
    padded_lengths, counts = pad_lengths(lengths)
    width = padded_lengths.shape[1]
    valid = torch.arange(width).unsqueeze(0) < counts.unsqueeze(1)
    routed = estimator.action_credit(advantage.to(torch.float64), padded_lengths, valid, inputs, config)
    weight = routed.weight * valid
    if routed.action_advantage is None:
        action_advantage = (advantage.unsqueeze(-1).to(torch.float64) * weight).to(scores.dtype)
    else:
        action_advantage = (routed.action_advantage * valid).to(scores.dtype)
    return BatchCredit(
        estimator=config.estimator,
        trajectory_advantage=advantage,
        lengths=padded_lengths,
        num_actions=counts,
        weight=weight,
        action_advantage=action_advantage,
        extras=routed.extras,
        additive=routed.action_advantage is not None,
    )


def route_token_advantages(
    credit: BatchCredit,
    row_trajectory: torch.Tensor,
    span_action: torch.Tensor,
    span_start: torch.Tensor,
    span_end: torch.Tensor,
    response_length: int,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Token advantages ``A_tau * w_i`` for training rows.

    Each action's value is ``A_tau * w_i`` in the row dtype and tokens outside spans get
    ``A_tau * 0``, exactly the products verl's GRPO forms (``A * response_mask``), so ``w = 1``
    reproduces verl's tensor bit-for-bit (signed zeros included). Tokens copy these values.

    Args:
        credit: the batch's per-trajectory credit.
        row_trajectory: ``(rows,)`` index into ``credit``'s trajectories for every training row.
        span_action, span_start, span_end: ``(rows, S)`` spans of each row (see ``credit.tokens``).
        response_length: R.

    Returns:
        ``(rows, R)`` advantages, 0 outside action spans.
    """
    row_advantage = credit.trajectory_advantage.to(dtype)[row_trajectory]
    if credit.additive:
        action_values = credit.action_advantage.to(dtype)[row_trajectory]
    else:
        action_values = row_advantage.unsqueeze(-1) * credit.weight.to(dtype)[row_trajectory]
    return scatter_action_values_to_tokens(
        action_values, span_action, span_start, span_end, response_length, gap_values=row_advantage * 0.0
    )


def estimator_token_advantages(
    credit: BatchCredit, layout: TokenLayout, inputs: EstimatorInputs, config: CreditConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    """``(rows, R)`` token advantages of the layout's rows (:func:`route_token_advantages`, in the
    credit's dtype), then the estimator's token hook (``Estimator.post_process_tokens``; e.g.
    call_credit's alpha fusion and RV reward). Also returns the hook's metrics."""
    tokens = route_token_advantages(
        credit,
        layout.row_trajectory,
        layout.span_action,
        layout.span_start,
        layout.span_end,
        layout.response_length,
        credit.trajectory_advantage.dtype,
    )
    return config.registered_estimator.post_process_tokens(tokens, credit, layout, inputs, config)


def credit_with_token_hook(
    credit: BatchCredit, inputs: EstimatorInputs, config: CreditConfig
) -> tuple[BatchCredit, dict[str, float]]:
    """``credit`` whose ``action_advantage`` is what every token of each action gets in training:
    the estimator's token hook applied on one token per action (``TokenLayout.one_token_per_action``).
    ``credit`` itself when the hook changes nothing under ``config`` (bit for bit); otherwise the
    result is ``additive`` (its ``weight`` is still the routed ``w``)."""
    if not config.registered_estimator.changes_tokens(config):
        return credit, {}
    layout = TokenLayout.one_token_per_action(credit.num_actions)
    # the layout's width is the batch's padded action count, so token t of row b is action t of b
    values, metrics = estimator_token_advantages(credit, layout, inputs, config)
    return dataclasses.replace(credit, action_advantage=values, additive=True), metrics
