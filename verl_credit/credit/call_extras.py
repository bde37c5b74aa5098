"""Optional parts of CALL-CREDIT (DESIGN.md section 4), each off by default.

Notation:
    B: trajectories. T: the largest number of calls in the batch (rows padded, padding length 0).
    weight, lengths, action_advantage: ``(B, T)`` as in :class:`verl_credit.routing.BatchCredit`
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
         DESIGN.md writes ``1 + eta Delta_k``, which is the same for A > 0 (the seed calibrates
         successful trajectories); for A < 0 the literal form would *shrink* the blame of an edit
         that caused the failure (Delta < 0), so the sign of A is applied.
    (16) adaptive role weights, after each step:
         a_r     = mean_{i: r_i = r} |A_i|           share_r = a_r / sum_r' a_r'
         S_r    <- (1 - beta) S_r + beta share_r      D_r <- (1 - beta) D_r + beta mean_{i: r_i=r} Delta_i
         target_r = sum(omega) * S_r g_r / sum_r' S_r' g_r',  g_r = max(1 + D_r, floor) (1 when no Delta yet)
         omega_r <- clip(omega_r + rho (target_r - omega_r), omega_min, omega_max)
    (17) IG down-weighting: w_i <- w_i * ig_factor for IG calls with Delta_i < theta_IG, then the
         row's mass is restored as in (15).

Replay comes from an environment (the coding sandbox) through :class:`ReplayEnvironment`; the
alternative edit from an :class:`EditProposer` (built by name with :func:`build_edit_proposer`;
``remove``, the default, drops the call). :func:`run_replays` runs a step's replays concurrently,
each with a time limit, and returns the failures instead of raising them.

Settings (switches, budget, eta, bounds, thresholds) are ``verl_credit.config.CallCreditConfig``'s
sub-nodes ``counterfactual``, ``ig_downweight``, ``adaptive_omega`` and ``dpo_export``.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from verl_credit.call_graph import CallGraph
from verl_credit.config import RV_REWARDS, AdaptiveOmegaConfig
from verl_credit.credit.call_credit import ROLES
from verl_credit.credit.tokens import scatter_action_values_to_tokens
from verl_credit.trajectory import Trajectory

__all__ = [
    "EDIT_PROPOSERS",
    "RV_REWARD_MODES",
    "WEAKNESSES",
    "AdaptiveRoleWeights",
    "AlternativeEdit",
    "CallRecord",
    "CounterfactualResult",
    "EditProposer",
    "RemoveCallProposer",
    "ReplayEnvironment",
    "ReplayFailure",
    "ReplayRequest",
    "TrajectoryCalls",
    "add_rv_reward",
    "apply_counterfactual_calibration",
    "build_edit_proposer",
    "compute_rv_rewards",
    "compute_weakness_report",
    "counterfactual_delta_matrix",
    "downweight_ig_calls",
    "edit_proposer_factory",
    "estimate_counterfactual_deltas",
    "register_edit_proposer",
    "rescale_row_mass",
    "route_rv_reward_tokens",
    "run_counterfactuals",
    "run_replays",
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


def add_rv_reward(action_advantage: torch.Tensor, rv_reward: torch.Tensor) -> torch.Tensor:
    """``A_i + r_i`` per call. Shapes ``(B, T)``; the result has ``action_advantage``'s dtype."""
    return action_advantage + rv_reward.to(action_advantage.dtype)


def route_rv_reward_tokens(
    rv_reward: torch.Tensor,
    row_trajectory: torch.Tensor,
    span_action: torch.Tensor,
    span_start: torch.Tensor,
    span_end: torch.Tensor,
    response_length: int,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The RV reward on the tokens of training rows (add it to ``routing.route_token_advantages``).

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


@runtime_checkable
class ReplayEnvironment(Protocol):
    """An environment that re-executes a finished trajectory with one call's tool call replaced.

    ``replacement_arguments`` are the new arguments of the call's (first) tool call, or ``None`` to
    drop it; the return value (or awaitable) is the reward ``R(tau')`` of the replayed trajectory.
    ``verl_credit.envs.coding.CodingEnvironment.replay`` implements it.
    """

    def replay(
        self,
        trajectory_messages: Sequence[Mapping[str, Any]],
        call_index: int,
        replacement_arguments: Mapping[str, Any] | None,
    ) -> float | Awaitable[float]: ...


@dataclass(frozen=True)
class AlternativeEdit:
    """A counterfactual for one AE call: new tool-call arguments (``None``: drop the call)."""

    arguments: Mapping[str, Any] | None
    source: str = ""  # e.g. "second-best sample"


@runtime_checkable
class EditProposer(Protocol):
    """Proposes the alternative edit of call ``call_index`` (``None``: no alternative, skip it)."""

    def propose(self, trajectory: Trajectory, call_index: int) -> AlternativeEdit | None: ...


@dataclass(frozen=True)
class CounterfactualResult:
    """One replay: ``delta = reward - counterfactual_reward`` (``Delta_k = R(tau) - R(tau')``)."""

    row: int
    call_index: int
    trajectory_id: str
    original_arguments: Mapping[str, Any] | None
    alternative: AlternativeEdit
    reward: float
    counterfactual_reward: float

    @property
    def delta(self) -> float:
        return self.reward - self.counterfactual_reward


class RemoveCallProposer:
    """``remove``: the alternative of a call is *not making it* (its first tool call is dropped):
    "what if this edit (or read) had not been made". Model-free; calls without a tool call have no
    alternative (``None``)."""

    def propose(self, trajectory: Trajectory, call_index: int) -> AlternativeEdit | None:
        if not trajectory.actions[call_index].tool_calls:
            return None
        return AlternativeEdit(None, source="remove")


#: edit proposers by name (``credit.call_credit.counterfactual.proposer``)
EDIT_PROPOSERS: dict[str, Callable[[], EditProposer]] = {"remove": RemoveCallProposer}


def register_edit_proposer(name: str) -> Callable[[Callable[[], EditProposer]], Callable[[], EditProposer]]:
    """Register a proposer factory (a class without constructor arguments) under ``name``."""

    def decorator(factory: Callable[[], EditProposer]) -> Callable[[], EditProposer]:
        existing = EDIT_PROPOSERS.get(name)
        if existing is not None and existing is not factory:
            raise ValueError(f"edit proposer {name!r} is already registered to {existing}")
        EDIT_PROPOSERS[name] = factory
        return factory

    return decorator


def edit_proposer_factory(name: str) -> Callable[[], EditProposer]:
    """The factory registered as ``name``, or the class at ``package.module:Class`` (not built).

    Raises:
        ValueError: unknown name or import failure.
    """
    factory = EDIT_PROPOSERS.get(name)
    if factory is None and ":" in name:
        module, _, attribute = name.partition(":")
        try:
            factory = getattr(importlib.import_module(module), attribute)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"cannot import edit proposer {name!r}: {exc}") from None
    if factory is None:
        raise ValueError(
            f"unknown edit proposer {name!r}; registered: {sorted(EDIT_PROPOSERS)} (or give package.module:Class)"
        )
    return factory


def build_edit_proposer(name: str) -> EditProposer:
    """An instance of :func:`edit_proposer_factory`'s factory.

    Raises:
        ValueError: unknown name, import failure, or an object without ``propose``.
    """
    proposer = edit_proposer_factory(name)()
    if not isinstance(proposer, EditProposer):
        raise ValueError(f"edit proposer {name!r} has no propose(trajectory, call_index) method")
    return proposer


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


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def estimate_counterfactual_deltas(
    trajectories: Sequence[Trajectory],
    selected: Sequence[tuple[int, int]],
    env: ReplayEnvironment,
    proposer: EditProposer,
) -> list[CounterfactualResult]:
    """Replay each selected call with the proposer's alternative; calls without one are skipped."""
    results = []
    for row, call_index in selected:
        trajectory = trajectories[row]
        alternative = proposer.propose(trajectory, call_index)
        if alternative is None:
            continue
        action = trajectory.actions[call_index]
        original = dict(action.tool_calls[0].arguments) if action.tool_calls else None
        counterfactual_reward = float(
            await _maybe_await(env.replay(trajectory.messages, call_index, alternative.arguments))
        )
        if not math.isfinite(counterfactual_reward):
            raise ValueError(f"replay of {trajectory.id} call {call_index} returned {counterfactual_reward}")
        results.append(
            CounterfactualResult(
                row, call_index, trajectory.id, original, alternative, trajectory.reward, counterfactual_reward
            )
        )
    return results


def run_counterfactuals(
    trajectories: Sequence[Trajectory],
    action_advantage: torch.Tensor,
    is_ae: torch.Tensor,
    env: ReplayEnvironment,
    proposer: EditProposer,
    budget: int,
) -> list[CounterfactualResult]:
    """Select the top-``budget`` AE calls by ``|A_i|`` and replay them (synchronous wrapper)."""
    selected = select_counterfactual_calls(action_advantage, is_ae, budget)
    return asyncio.run(estimate_counterfactual_deltas(trajectories, selected, env, proposer))


@dataclass(frozen=True)
class ReplayRequest:
    """One call to replay: its place in the batch, its trajectory, the alternative and ``R(tau)``."""

    row: int
    call_index: int
    trajectory: Trajectory
    alternative: AlternativeEdit
    reward: float


@dataclass(frozen=True)
class ReplayFailure:
    """A replay that raised, timed out or returned a non-finite reward (counted, never raised)."""

    row: int
    call_index: int
    error: str


async def run_replays(
    requests: Sequence[ReplayRequest],
    replay: Callable[[ReplayRequest], Awaitable[float]],
    concurrency: int = 4,
    timeout: float = 300.0,
) -> tuple[list[CounterfactualResult], list[ReplayFailure]]:
    """Run ``replay`` (which returns ``R(tau')``) for every request, ``concurrency`` at a time, each
    limited to ``timeout`` seconds. Results and failures keep the order of ``requests``."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    gate = asyncio.Semaphore(concurrency)

    async def one(request: ReplayRequest) -> CounterfactualResult | ReplayFailure:
        async with gate:
            try:
                value = float(await asyncio.wait_for(replay(request), timeout))
            except TimeoutError:
                return ReplayFailure(request.row, request.call_index, f"replay timed out after {timeout} s")
            except Exception as exc:  # a replay never stops training; the caller counts it
                return ReplayFailure(request.row, request.call_index, f"{type(exc).__name__}: {exc}")
        if not math.isfinite(value):
            return ReplayFailure(request.row, request.call_index, f"replay returned {value}")
        action = request.trajectory.actions[request.call_index]
        original = dict(action.tool_calls[0].arguments) if action.tool_calls else None
        return CounterfactualResult(
            request.row,
            request.call_index,
            request.trajectory.id,
            original,
            request.alternative,
            request.reward,
            value,
        )

    outcomes = await asyncio.gather(*(one(request) for request in requests))
    results = [o for o in outcomes if isinstance(o, CounterfactualResult)]
    failures = [o for o in outcomes if isinstance(o, ReplayFailure)]
    return results, failures


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


# ---------------------------------------------------------------------------------------------
# Weakness report (diagnostics): credit aggregated by role across a run
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CallRecord:
    """What the weakness report needs of one call.

    ``acts``: the call made a tool call (plain-text calls are never "unused reads" or "unverified
    edits"); ``None`` when unknown (credit lines without messages). ``rv_status`` and
    ``failure_ignored`` are ``None`` when unknown.
    """

    role: str
    length: int
    advantage: float
    weight: float
    acts: bool | None = None
    has_ig_use: bool = False  # an outgoing IG->AE edge
    has_verification: bool = False  # an outgoing AE->RV edge
    rv_status: str | None = None
    failure_ignored: bool | None = None
    summary: str = ""


@dataclass(frozen=True)
class TrajectoryCalls:
    id: str
    reward: float
    calls: tuple[CallRecord, ...]


WEAKNESSES: dict[str, str] = {
    "unused_reads": "reads whose content was never used",
    "unverified_edits": "edits never verified",
    "ignored_failures": "tests run but failures ignored",
}


def _weakness_of(call: CallRecord) -> tuple[str, bool] | None:
    """``(weakness, hit)`` when ``call`` is in a weakness's denominator, else ``None``."""
    if call.role == "IG" and call.acts is not False:
        return "unused_reads", not call.has_ig_use
    if call.role == "AE" and call.acts is not False:
        return "unverified_edits", not call.has_verification
    if call.role == "RV" and call.rv_status == "fail" and call.failure_ignored is not None:
        return "ignored_failures", call.failure_ignored
    return None


def compute_weakness_report(trajectories: Sequence[TrajectoryCalls], examples: int = 3) -> dict[str, Any]:
    """Credit by role across a run and the three systematic weaknesses of issue 7.

    Per role: number of calls, share of calls and of tokens, mean per-token advantage on successful
    (``R > 0``) and on other trajectories, and the share of the run's ``sum L_i |A_i|`` (credit mass).
    Per weakness: count, the denominator (IG calls with tools / AE calls with tools / failing RV
    calls), the rate, the credit mass those calls received, and up to ``examples`` examples.
    """
    roles: dict[str, dict[str, float]] = {
        r: {
            "calls": 0,
            "tokens": 0,
            "mass": 0.0,
            "adv_success": 0.0,
            "tok_success": 0,
            "adv_failure": 0.0,
            "tok_failure": 0,
        }
        for r in ROLES
    }
    weakness = {key: {"count": 0, "of": 0, "mass": 0.0, "examples": []} for key in WEAKNESSES}
    unknown_failures = 0
    total_calls = total_tokens = 0
    total_mass = 0.0
    for trajectory in trajectories:
        success = trajectory.reward > 0
        for index, call in enumerate(trajectory.calls):
            stats = roles[call.role]
            mass = call.length * abs(call.advantage)
            stats["calls"] += 1
            stats["tokens"] += call.length
            stats["mass"] += mass
            key = "success" if success else "failure"
            stats[f"adv_{key}"] += call.length * call.advantage
            stats[f"tok_{key}"] += call.length
            total_calls += 1
            total_tokens += call.length
            total_mass += mass
            if call.role == "RV" and call.failure_ignored is None:
                unknown_failures += 1  # no transcript: pass/fail unknown
            found = _weakness_of(call)
            if found is None:
                continue
            entry = weakness[found[0]]
            entry["of"] += 1
            if found[1]:
                entry["count"] += 1
                entry["mass"] += mass
                if len(entry["examples"]) < examples:
                    entry["examples"].append(
                        {"id": trajectory.id, "call": index, "summary": call.summary, "advantage": call.advantage}
                    )
    report_roles = {}
    for role, stats in roles.items():
        report_roles[role] = {
            "calls": int(stats["calls"]),
            "call_share": stats["calls"] / total_calls if total_calls else 0.0,
            "token_share": stats["tokens"] / total_tokens if total_tokens else 0.0,
            "credit_share": stats["mass"] / total_mass if total_mass else 0.0,
            "mean_advantage_success": stats["adv_success"] / stats["tok_success"] if stats["tok_success"] else None,
            "mean_advantage_failure": stats["adv_failure"] / stats["tok_failure"] if stats["tok_failure"] else None,
        }
    report_weakness = {}
    for name, entry in weakness.items():
        report_weakness[name] = {
            "label": WEAKNESSES[name],
            "count": entry["count"],
            "of": entry["of"],
            "rate": entry["count"] / entry["of"] if entry["of"] else 0.0,
            "credit_share": entry["mass"] / total_mass if total_mass else 0.0,
            "examples": entry["examples"],
        }
    report_weakness["ignored_failures"]["rv_calls_without_status"] = unknown_failures
    return {
        "trajectories": len(trajectories),
        "successful": sum(t.reward > 0 for t in trajectories),
        "calls": total_calls,
        "roles": report_roles,
        "weaknesses": report_weakness,
    }
