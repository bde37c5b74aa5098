"""The one batch path from graphs to per-action and per-token advantages.

Shared by the verl trainer, the CLI (``verl-credit route``), the demo and the benchmarks:

    scores + group ids  --grpo.py-->  A_tau (B,)
    graphs + lengths    --pad-->      degrees (B, T)  --iapo.py / call_credit.py-->  w (B, T)
    A_tau * w           --tokens.py-->  (rows, response_len)

Nothing here knows where a graph came from (annotator, cache, file) or how rows were packed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np
import torch

from verl_credit.call_graph import CallGraph
from verl_credit.config import CreditConfig
from verl_credit.credit.call_credit import ROLES, compute_call_scores, compute_call_weights
from verl_credit.credit.grpo import WIDE_SCORE, compute_grpo_trajectory_advantage
from verl_credit.credit.iapo import compute_iapo_weights
from verl_credit.credit.tokens import scatter_action_values_to_tokens
from verl_credit.graph import InfluenceGraph

__all__ = [
    "BatchCredit",
    "check_finite_scores",
    "compute_batch_credit",
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
    ``A_tau * w``; ``w_plus``/``w_minus`` are both branches (IAPO) for diagnostics.
    """

    estimator: str
    trajectory_advantage: torch.Tensor  # (B,)
    lengths: torch.Tensor  # (B, T)
    num_actions: torch.Tensor  # (B,)
    weight: torch.Tensor  # (B, T)
    action_advantage: torch.Tensor  # (B, T)
    extras: dict[str, torch.Tensor] = field(default_factory=dict)

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


def pad_influence_graphs(graphs: Sequence[InfluenceGraph], width: int) -> dict[str, torch.Tensor]:
    """Stack graph degrees into ``(B, width)`` float64 tensors: d_plus, d_minus, d_in, errors.

    Uses each graph's cached :attr:`InfluenceGraph.degree_table` (one copy per graph).
    """
    table = np.zeros((4, len(graphs), width), dtype=np.float64)
    for row, graph in enumerate(graphs):
        if graph.num_actions > width:
            raise ValueError(f"graph {row} has {graph.num_actions} actions, more than the batch width {width}")
        table[:, row, : graph.num_actions] = graph.degree_table
    return {name: torch.from_numpy(table[k]) for k, name in enumerate(("d_plus", "d_minus", "d_in", "errors"))}


def pad_call_graphs(graphs: Sequence[CallGraph], width: int, omega: dict[str, float]) -> dict[str, torch.Tensor]:
    """Stack call graphs into ``(B, width)`` float64 tensors: omega, out_degree, valid, one-hot roles.

    Uses each graph's cached :attr:`CallGraph.role_table` (one copy per graph).
    """
    table = np.zeros((1 + len(ROLES), len(graphs), width), dtype=np.float64)
    for row, graph in enumerate(graphs):
        if graph.num_calls > width:
            raise ValueError(f"call graph {row} has {graph.num_calls} calls, more than the batch width {width}")
        table[:, row, : graph.num_calls] = graph.role_table
    one_hot = table[1:]
    out = {
        "out_degree": table[0],
        "valid": one_hot.sum(axis=0),
        "omega": np.tensordot(np.array([omega[role] for role in ROLES]), one_hot, axes=1),
    }
    out.update({role: one_hot[k] for k, role in enumerate(ROLES)})
    return {name: torch.from_numpy(np.ascontiguousarray(value)) for name, value in out.items()}


def check_finite_scores(
    scores: torch.Tensor, index: Sequence[Any] | np.ndarray, names: Sequence[Any] | None = None
) -> None:
    """Raise ``ValueError`` naming the first trajectory (position, name if given, group) whose score
    is NaN or infinite: a non-finite reward would make its whole group's advantages NaN."""
    bad = torch.nonzero(~torch.isfinite(scores.detach())).flatten()
    if bad.numel():
        row = int(bad[0])
        name = f" {names[row]!r}" if names is not None else ""
        raise ValueError(
            f"reward of trajectory {row}{name} (group {index[row]!r}) is {float(scores[row])}: rewards must be "
            f"finite ({bad.numel()} non-finite of {scores.shape[0]})"
        )


def trajectory_scores(rewards: Sequence[float], names: Sequence[Any] | None = None) -> torch.Tensor:
    """``(B,)`` score tensor of per-trajectory rewards for :func:`compute_batch_credit`: float32
    (verl's dtype) when every reward is below ``grpo.WIDE_SCORE`` in magnitude, else float64, so
    that a finite reward such as ``1e39`` (beyond float32) stays finite. A NaN or infinite reward
    raises ``ValueError`` naming its position (and ``names[i]`` if given)."""
    values = torch.tensor([float(r) for r in rewards], dtype=torch.float64)
    bad = torch.nonzero(~torch.isfinite(values)).flatten()
    if bad.numel():
        row = int(bad[0])
        name = f" {names[row]!r}" if names is not None else ""
        raise ValueError(f"reward of trajectory {row}{name} is {float(values[row])}: rewards must be finite")
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

    Returns:
        :class:`BatchCredit` (weights in float64; advantages in ``scores``' dtype).

    Raises:
        ValueError: a score is NaN or infinite (naming the trajectory); finite scores, however
            large, give finite advantages (``grpo.WIDE_SCORE``).
    """
    if scores.dim() == 1 and len(index) == scores.shape[0]:
        check_finite_scores(scores, index, names)
    advantage = compute_grpo_trajectory_advantage(
        scores, index, epsilon=config.epsilon, norm_adv_by_std_in_grpo=config.norm_adv_by_std_in_grpo
    )
    padded_lengths, counts = pad_lengths(lengths)
    width = padded_lengths.shape[1]
    valid = torch.arange(width).unsqueeze(0) < counts.unsqueeze(1)
    extras: dict[str, torch.Tensor] = {}
    if config.estimator == "grpo":
        weight = valid.to(torch.float64)
    elif config.estimator == "iapo":
        if graphs is None or len(graphs) != len(lengths):
            raise ValueError("the iapo estimator needs one influence graph per trajectory")
        degrees = pad_influence_graphs(graphs, width)
        cfg = config.iapo
        routed = compute_iapo_weights(
            advantage.to(torch.float64),
            degrees["d_plus"],
            degrees["d_minus"],
            degrees["d_in"],
            degrees["errors"],
            padded_lengths,
            beta_plus=cfg.beta_plus,
            clip_c=cfg.clip_c,
            neg_route=cfg.neg_route,  # type: ignore[arg-type]
            beta_minus=cfg.beta_minus,
            eps=cfg.eps,
        )
        weight = routed.pop("weight")
        extras = {**routed, "errors": degrees["errors"]}
    elif config.estimator == "call_credit":
        if call_graphs is None or len(call_graphs) != len(lengths):
            raise ValueError("the call_credit estimator needs one call graph per trajectory")
        cfg_call = config.call_credit
        padded = pad_call_graphs(call_graphs, width, dict(cfg_call.omega))
        call_scores = compute_call_scores(
            padded["omega"], padded["out_degree"], padded["valid"], smoothing=cfg_call.smoothing, gamma=cfg_call.gamma
        )
        weight = compute_call_weights(call_scores, padded_lengths, padded["valid"], mode=cfg_call.mode)  # type: ignore[arg-type]
        extras = {"call_scores": call_scores, **{role: padded[role] for role in ROLES}}
    else:
        raise ValueError(f"unknown estimator {config.estimator!r}")
    weight = weight * valid
    action_advantage = (advantage.unsqueeze(-1).to(torch.float64) * weight).to(scores.dtype)
    return BatchCredit(
        estimator=config.estimator,
        trajectory_advantage=advantage,
        lengths=padded_lengths,
        num_actions=counts,
        weight=weight,
        action_advantage=action_advantage,
        extras=extras,
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
    action_values = row_advantage.unsqueeze(-1) * credit.weight.to(dtype)[row_trajectory]
    return scatter_action_values_to_tokens(
        action_values, span_action, span_start, span_end, response_length, gap_values=row_advantage * 0.0
    )
