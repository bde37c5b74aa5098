"""Optional parts of CALL-CREDIT (docs/design.md section 4), each off by default.

Notation:
    B: trajectories. T: the largest number of calls in the batch (rows padded, padding length 0).
    weight, lengths, action_advantage: ``(B, T)`` as in :class:`verl_credit.batch_credit.BatchCredit`
        (``action_advantage = A_tau * weight``).
    is_ae, is_ig, is_rv: ``(B, T)`` one-hot role masks (``BatchCredit.extras["AE"]`` ...).
    delta: ``(B, T)`` counterfactual effect ``Delta_k = R(tau) - R(tau')``; ``has_delta`` ``(B, T)``
        marks the calls that were replayed.

Equations:

    (14) RV self-correction (rv_reward=self_correction):
         r_i = kappa  if call i is RV, its output failed, a later AE j edits a path it named
                      (edge i -> j of kind RV->AE), and an RV after j passes;  0 otherwise.
         rv_reward=literal (the seed's formula, for comparison):
         r_i = kappa * (1[RV i passed] - 1[RV i failed and a later AE edited a path it named]).
         The RV call's advantage becomes A_i + r_i.
    (15) counterfactual calibration: w_k <- w_k * max(1 + eta * sign(A) * Delta_k, floor) for the
         replayed AE calls, then every row is rescaled so that sum_i L_i w_i keeps its value (mass).
         docs/design.md writes ``1 + eta Delta_k``, which is the same for A > 0 (the seed calibrates
         successful trajectories); for A < 0 the literal form would *shrink* the blame of an edit
         that caused the failure (Delta < 0), so the sign of A is applied.
    (16) adaptive role weights, after each step:
         a_r     = mean_{i: r_i = r} |A_i|           share_r = a_r / sum_r' a_r'
         S_r    <- (1 - beta) S_r + beta share_r      D_r <- (1 - beta) D_r + beta mean_{i: r_i=r} Delta_i
         target_r = sum(omega) * S_r g_r / sum_r' S_r' g_r',  g_r = max(1 + D_r, floor) (1 when no Delta yet)
         omega_r <- clip(omega_r + rho (target_r - omega_r), omega_min, omega_max)
    (17) IG down-weighting: w_i <- w_i * ig_factor for IG calls with Delta_i < theta_IG, then the
         row's mass is restored as in (15).

Pure tensor math. The replays that measure ``Delta`` (an environment's ``replay``, the edit
proposers, the concurrent runner) are :mod:`verl_credit.counterfactual_replay`; the results arrive here as
:class:`verl_credit.counterfactual_replay.CounterfactualResult` lists.

Settings (switches, budget, eta, bounds, thresholds) are ``verl_credit.config.CallCreditConfig``'s
sub-nodes ``counterfactual``, ``ig_downweight``, ``adaptive_omega`` and ``dpo_export``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from verl_credit.call_graph import ROLES, CallGraph
from verl_credit.config import RV_REWARDS, AdaptiveOmegaConfig
from verl_credit.credit_math.tokens import scatter_action_values_to_tokens

if TYPE_CHECKING:
    from verl_credit.counterfactual_replay import CounterfactualResult

__all__ = [
    "RV_REWARD_MODES",
    "AdaptiveRoleWeights",
    "apply_counterfactual_calibration",
    "compute_rv_rewards",
    "counterfactual_delta_matrix",
    "downweight_ig_calls",
    "rescale_row_mass",
    "route_rv_reward_tokens",
    "rv_reward_matrix",
    "select_counterfactual_calls",
]

RV_REWARD_MODES: tuple[str, ...] = RV_REWARDS  # "off", "self_correction", "literal" (CallCreditConfig.rv_reward)


# ---------------------------------------------------------------------------------------------
# (14) RV self-correction reward
# ---------------------------------------------------------------------------------------------


def compute_rv_rewards(
    call_graph: CallGraph, rv_status: Sequence[str | None], mode: str = "self_correction", kappa: float = 0.1
) -> np.ndarray:
    """Equation (14) for one trajectory.

    Args:
        call_graph: roles and edges (``RV->AE`` edges mark "a later edit of a named path").
        rv_status: per call ``"pass"`` / ``"fail"`` / ``None`` (see ``annotate.roles.rv_outcome``).
        mode: ``off``, ``self_correction`` or ``literal``.
        kappa: reward size.

    Returns:
        ``(num_calls,)`` float64, non-zero only on RV calls.
    """
    if mode not in RV_REWARD_MODES:
        raise ValueError(f"rv_reward must be one of {RV_REWARD_MODES}, got {mode!r}")
    if len(rv_status) != call_graph.num_calls:
        raise ValueError(f"rv_status has {len(rv_status)} entries for {call_graph.num_calls} calls")
    reward = np.zeros(call_graph.num_calls, dtype=np.float64)
    if mode == "off":
        return reward
    fixes: dict[int, list[int]] = {}
    for edge in call_graph.edges:
        if edge.kind == "RV->AE":
            fixes.setdefault(edge.src, []).append(edge.dst)
    for i, (role, status) in enumerate(zip(call_graph.roles, rv_status, strict=True)):
        if role != "RV":
            continue
        identified = status == "fail" and bool(fixes.get(i))
        if mode == "literal":
            reward[i] = kappa * (float(status == "pass") - float(identified))
        elif identified:
            first_fix = min(fixes[i])
            passed_later = any(
                call_graph.roles[k] == "RV" and rv_status[k] == "pass"
                for k in range(first_fix + 1, call_graph.num_calls)
            )
            reward[i] = kappa if passed_later else 0.0
    return reward


def rv_reward_matrix(
    call_graphs: Sequence[CallGraph], rv_statuses: Sequence[Sequence[str | None]], width: int, mode: str, kappa: float
) -> torch.Tensor:
    """Equation (14) for a batch: ``(B, width)`` float64, 0 on padding."""
    out = torch.zeros(len(call_graphs), max(width, 1), dtype=torch.float64)
    for row, (graph, status) in enumerate(zip(call_graphs, rv_statuses, strict=True)):
        if graph.num_calls > width:
            raise ValueError(f"call graph {row} has {graph.num_calls} calls, more than the batch width {width}")
        out[row, : graph.num_calls] = torch.from_numpy(compute_rv_rewards(graph, status, mode, kappa))
    return out


def route_rv_reward_tokens(
    rv_reward: torch.Tensor,
    row_trajectory: torch.Tensor,
    span_action: torch.Tensor,
    span_start: torch.Tensor,
    span_end: torch.Tensor,
    response_length: int,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The RV reward on the tokens of training rows (add it to ``batch_credit.route_token_advantages``).

    Args:
        rv_reward: ``(B, T)`` per-call reward.
        row_trajectory: ``(rows,)``; span_*: ``(rows, S)`` as in ``credit.tokens``.

    Returns:
        ``(rows, R)``: ``r_i`` on every token of call ``i``, 0 elsewhere.
    """
    per_row = rv_reward.to(dtype)[row_trajectory]
    return scatter_action_values_to_tokens(per_row, span_action, span_start, span_end, response_length)


# ---------------------------------------------------------------------------------------------
# (15) counterfactual calibration
# ---------------------------------------------------------------------------------------------


def select_counterfactual_calls(
    action_advantage: torch.Tensor, is_ae: torch.Tensor, budget: int
) -> list[tuple[int, int]]:
    """The ``budget`` AE calls of the step with the largest ``|A_i|`` (ties: earlier row, earlier call).

    Args:
        action_advantage, is_ae: ``(B, T)``.

    Returns:
        ``[(row, call), ...]`` sorted by decreasing ``|A_i|``; calls with ``A_i = 0`` are never picked.
    """
    if budget <= 0:
        return []
    magnitude = action_advantage.abs().to(torch.float64) * (is_ae > 0)
    flat = magnitude.flatten()
    candidates = torch.nonzero(flat > 0).flatten().tolist()
    width = action_advantage.shape[1]
    candidates.sort(key=lambda k: (-float(flat[k]), k))
    return [(k // width, k % width) for k in candidates[:budget]]


def counterfactual_delta_matrix(
    results: Sequence[CounterfactualResult], shape: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(delta, has_delta)``, both ``(B, T)`` float64, from replay results."""
    delta = torch.zeros(shape, dtype=torch.float64)
    has_delta = torch.zeros(shape, dtype=torch.float64)
    for result in results:
        delta[result.row, result.call_index] = result.delta
        has_delta[result.row, result.call_index] = 1.0
    return delta, has_delta


def rescale_row_mass(new_weight: torch.Tensor, old_weight: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Rescale each row of ``new_weight`` so that ``sum_i L_i w_i`` equals that of ``old_weight``.

    Rows whose new mass is 0, and rows ``new_weight`` leaves unchanged, keep ``old_weight`` exactly
    (bit for bit). Shapes ``(B, T)``.
    """
    lengths = lengths.to(new_weight.dtype)
    old_mass = (lengths * old_weight).sum(-1, keepdim=True)
    new_mass = (lengths * new_weight).sum(-1, keepdim=True)
    ok = (new_mass > 0) & ~(new_weight == old_weight).all(-1, keepdim=True)
    scaled = new_weight * old_mass / torch.where(ok, new_mass, torch.ones_like(new_mass))
    return torch.where(ok, scaled, old_weight)


def apply_counterfactual_calibration(
    weight: torch.Tensor,
    lengths: torch.Tensor,
    delta: torch.Tensor,
    has_delta: torch.Tensor,
    eta: float,
    floor: float = 1e-3,
    advantage: torch.Tensor | None = None,
) -> torch.Tensor:
    """Equation (15): ``w_k <- w_k max(1 + eta sign(A) Delta_k, floor)`` on replayed calls, mass restored.

    Shapes: ``weight, lengths, delta, has_delta`` ``(B, T)``, ``advantage`` ``(B,)`` (default: all
    positive) -> ``(B, T)`` (``weight``'s dtype). With ``eta = 0`` or no replayed call the weights
    are returned unchanged.
    """
    signed = delta.to(weight.dtype)
    if advantage is not None:
        signed = signed * torch.sign(advantage.to(weight.dtype)).unsqueeze(-1)
    factor = torch.where(has_delta > 0, (1.0 + eta * signed).clamp_min(floor), torch.ones_like(weight))
    return rescale_row_mass(weight * factor, weight, lengths)


# ---------------------------------------------------------------------------------------------
# (17) IG down-weighting
# ---------------------------------------------------------------------------------------------


def downweight_ig_calls(
    weight: torch.Tensor,
    lengths: torch.Tensor,
    is_ig: torch.Tensor,
    delta: torch.Tensor,
    has_delta: torch.Tensor,
    theta_ig: float = 0.0,
    factor: float = 0.5,
) -> torch.Tensor:
    """Equation (17): IG calls with a measured ``Delta < theta_ig`` get ``w * factor``; mass restored.

    Shapes: all ``(B, T)`` -> ``(B, T)``.
    """
    hit = (is_ig > 0) & (has_delta > 0) & (delta.to(weight.dtype) < theta_ig)
    return rescale_row_mass(torch.where(hit, weight * factor, weight), weight, lengths)


# ---------------------------------------------------------------------------------------------
# (16) adaptive role weights
# ---------------------------------------------------------------------------------------------


@dataclass
class AdaptiveRoleWeights:
    """Equation (16): the running omega, its EMAs, and the per-step update (logged as metrics)."""

    omega: dict[str, float]
    rho: float = 0.1
    ema_beta: float = 0.1
    omega_min: float = 0.1
    omega_max: float = 2.0
    floor: float = 0.05
    share: dict[str, float] = field(default_factory=dict)
    delta: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        missing = [r for r in ROLES if r not in self.omega]
        if missing:
            raise ValueError(f"omega is missing roles {missing}")
        total = sum(self.omega[r] for r in ROLES)
        if not self.share:
            self.share = {r: self.omega[r] / total for r in ROLES}

    @classmethod
    def from_config(cls, omega: Mapping[str, float], config: AdaptiveOmegaConfig) -> AdaptiveRoleWeights:
        """The state at the start of training (``credit.call_credit.omega`` and ``.adaptive_omega``)."""
        return cls(dict(omega), config.rho, config.ema_beta, config.omega_min, config.omega_max)

    def state_dict(self) -> dict[str, dict[str, float]]:
        """What a checkpoint keeps: the running omega and both EMAs (JSON-serializable)."""
        return {"omega": dict(self.omega), "share": dict(self.share), "delta": dict(self.delta)}

    def load_state_dict(self, state: Mapping[str, Mapping[str, float]]) -> None:
        """Restore :meth:`state_dict` (the knobs rho, ema_beta and bounds stay those of the config)."""
        for name in ("omega", "share"):
            values = dict(state[name])
            missing = [r for r in ROLES if r not in values]
            if missing:
                raise ValueError(f"adaptive omega state: {name} is missing roles {missing}")
        self.omega = {r: float(state["omega"][r]) for r in ROLES}
        self.share = {r: float(state["share"][r]) for r in ROLES}
        self.delta = {r: float(v) for r, v in dict(state.get("delta") or {}).items() if r in ROLES}

    def update(
        self,
        action_advantage: torch.Tensor,
        role_masks: Mapping[str, torch.Tensor],
        delta: torch.Tensor | None = None,
        has_delta: torch.Tensor | None = None,
    ) -> dict[str, float]:
        """One step of (16). Returns the metrics to log (``credit/omega_AE``, ``credit/role_share_AE``...).

        Args:
            action_advantage: ``(B, T)``.
            role_masks: role -> ``(B, T)`` one-hot mask (padding 0).
            delta, has_delta: ``(B, T)`` replay results of this step, if any.
        """
        magnitude = action_advantage.abs().to(torch.float64)
        means = {}
        for role in ROLES:
            mask = role_masks[role].to(torch.float64)
            if float(mask.sum()) > 0:
                means[role] = float((magnitude * mask).sum() / mask.sum())
        total = sum(means.values())
        if total > 0:
            for role, value in means.items():
                self.share[role] = (1 - self.ema_beta) * self.share[role] + self.ema_beta * value / total
        if delta is not None and has_delta is not None:
            for role in ROLES:
                measured = (role_masks[role] > 0) & (has_delta > 0)
                if bool(measured.any()):
                    mean_delta = float(delta.to(torch.float64)[measured].mean())
                    previous = self.delta.get(role)
                    self.delta[role] = (
                        mean_delta
                        if previous is None
                        else ((1 - self.ema_beta) * previous + self.ema_beta * mean_delta)
                    )
        gain = {r: max(1.0 + self.delta[r], self.floor) if r in self.delta else 1.0 for r in ROLES}
        scale = sum(self.omega[r] for r in ROLES)
        norm = sum(self.share[r] * gain[r] for r in ROLES)
        for role in ROLES:
            target = scale * self.share[role] * gain[role] / norm if norm > 0 else self.omega[role]
            moved = self.omega[role] + self.rho * (target - self.omega[role])
            self.omega[role] = min(max(moved, self.omega_min), self.omega_max)
        metrics = {f"credit/omega_{r}": self.omega[r] for r in ROLES}
        metrics.update({f"credit/role_share_{r}": self.share[r] for r in ROLES})
        metrics.update({f"credit/role_delta_{r}": self.delta[r] for r in ROLES if r in self.delta})
        return metrics
