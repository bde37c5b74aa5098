"""``iapo``: influence-graph routing of ``A_tau`` (docs/design.md section 3, ``credit_math/iapo.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from verl_credit.config import IAPOConfig
from verl_credit.credit_math.iapo import compute_iapo_weights
from verl_credit.estimators.registry import ActionCredit, Estimator, EstimatorInputs, register_estimator

if TYPE_CHECKING:
    from collections.abc import Sequence

    from verl_credit.config import CreditConfig
    from verl_credit.graph import InfluenceGraph


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


@register_estimator
class IAPOEstimator(Estimator):
    name = "iapo"
    needs = frozenset({"influence_graphs"})
    settings = IAPOConfig
    routes_influence_graphs = True

    def action_credit(
        self,
        advantage: torch.Tensor,
        lengths: torch.Tensor,
        valid: torch.Tensor,
        inputs: EstimatorInputs,
        config: CreditConfig,
    ) -> ActionCredit:
        routed = route_influence_graphs(advantage, self.require(inputs, "graphs"), lengths, config.iapo)
        weight = routed.pop("weight")
        return ActionCredit(weight, extras=routed)


def route_influence_graphs(
    advantage: torch.Tensor, graphs: Sequence[InfluenceGraph], lengths: torch.Tensor, config: IAPOConfig
) -> dict[str, torch.Tensor]:
    """:func:`~verl_credit.credit_math.iapo.compute_iapo_weights` on B graphs with ``credit.iapo``
    settings: ``(B,)`` advantages and ``(B, T)`` float64 lengths in; ``weight``, both branches,
    ``m_plus``/``m_minus`` and ``errors`` out, each ``(B, T)`` (the estimator's and the audit's path)."""
    degrees = pad_influence_graphs(graphs, lengths.shape[1])
    routed = compute_iapo_weights(
        advantage,
        degrees["d_plus"],
        degrees["d_minus"],
        degrees["d_in"],
        degrees["errors"],
        lengths,
        beta_plus=config.beta_plus,
        clip_c=config.clip_c,
        neg_route=config.neg_route,  # type: ignore[arg-type]
        beta_minus=config.beta_minus,
        eps=config.eps,
    )
    return {**routed, "errors": degrees["errors"]}
