"""``call_credit``: role- and causal-graph weights of coding-agent calls (docs/design.md section 4)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from verl_credit.call_graph import ROLES
from verl_credit.credit.call_credit import compute_call_scores, compute_call_weights
from verl_credit.estimators.registry import ActionCredit, Estimator, EstimatorInputs, register_estimator

if TYPE_CHECKING:
    from collections.abc import Sequence

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
    name = "call_credit"
    needs = frozenset({"call_graphs"})
    call_credit_parts = True

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
