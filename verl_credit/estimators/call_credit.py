"""``call_credit``: role- and causal-graph weights of coding-agent calls (docs/design.md section 4)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from verl_credit.call_graph import ROLES
from verl_credit.config import CallCreditConfig
from verl_credit.credit_math.call_adjustments import route_rv_reward_tokens, rv_reward_matrix
from verl_credit.credit_math.call_credit import compute_call_scores, compute_call_weights, fuse_token_advantages
from verl_credit.credit_math.tokens import scatter_action_values_to_tokens
from verl_credit.estimators.registry import (
    ActionCredit,
    Estimator,
    EstimatorInputs,
    TokenLayout,
    register_estimator,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from verl_credit.batch_credit import BatchCredit
    from verl_credit.call_graph import CallGraph
    from verl_credit.config import CreditConfig


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


@register_estimator
class CallCreditEstimator(Estimator):
    """Role- and graph-weighted call credit; its token hook adds the alpha fusion (eq. 13) and the
    RV self-correction reward (eq. 14). The trainer's optional parts (replays, adaptive omega, DPO
    export: ``credit.call_credit.*`` sub-sections) run for an estimator with these settings."""

    name = "call_credit"
    needs = frozenset({"call_graphs", "rv_statuses"})
    settings = CallCreditConfig

    def action_credit(
        self,
        advantage: torch.Tensor,
        lengths: torch.Tensor,
        valid: torch.Tensor,
        inputs: EstimatorInputs,
        config: CreditConfig,
    ) -> ActionCredit:
        call_graphs = self.require(inputs, "call_graphs")
        cfg = config.call_credit
        padded = pad_call_graphs(call_graphs, lengths.shape[1], dict(cfg.omega))
        call_scores = compute_call_scores(
            padded["omega"], padded["out_degree"], padded["valid"], smoothing=cfg.smoothing, gamma=cfg.gamma
        )
        weight = compute_call_weights(call_scores, lengths, padded["valid"], mode=cfg.mode)  # type: ignore[arg-type]
        return ActionCredit(weight, extras={"call_scores": call_scores, **{role: padded[role] for role in ROLES}})

    def changes_tokens(self, config: CreditConfig) -> bool:
        return config.call_credit.alpha > 0 or config.call_credit.rv_reward != "off"

    def post_process_tokens(
        self,
        tokens: torch.Tensor,
        credit: BatchCredit,
        layout: TokenLayout,
        inputs: EstimatorInputs,
        config: CreditConfig,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """``alpha * A_tau + (1 - alpha) * A_tau w_i`` on action tokens, then ``+ r_i`` (the RV
        reward) on the tokens of call ``i``; ``credit/rv_reward_per_session`` when the reward is on."""
        cfg = config.call_credit
        dtype = tokens.dtype
        spans = (layout.span_action, layout.span_start, layout.span_end)
        if cfg.alpha > 0:
            ones = torch.ones_like(credit.weight, dtype=dtype)[layout.row_trajectory]
            action_tokens = scatter_action_values_to_tokens(ones, *spans, layout.response_length)
            grpo_tokens = credit.trajectory_advantage[layout.row_trajectory].unsqueeze(-1) * action_tokens
            tokens = fuse_token_advantages(grpo_tokens, tokens, cfg.alpha)
        if cfg.rv_reward == "off" or inputs.call_graphs is None:
            return tokens, {}
        rv_reward = rv_reward_matrix(
            self.require(inputs, "call_graphs"),
            self.require(inputs, "rv_statuses"),
            credit.weight.shape[1],
            cfg.rv_reward,
            cfg.kappa,
        )
        tokens = tokens + route_rv_reward_tokens(
            rv_reward, layout.row_trajectory, *spans, layout.response_length, dtype=dtype
        )
        return tokens, {"credit/rv_reward_per_session": float(rv_reward.sum()) / len(inputs.uids)}
