"""The optional parts of CALL-CREDIT in a training step (docs/design.md section 4): counterfactual
calibration and IG down-weighting by replaying calls through the session's environment, adaptive
role weights kept across steps and in checkpoints, DPO pair export. Each behind a
``credit.call_credit.*`` switch, off by default; the tensor math is ``credit_math/call_adjustments.py``."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import json
import logging
import math
import os
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from verl_credit.batch_credit import BatchCredit
from verl_credit.call_graph import ROLES
from verl_credit.config import CallCreditConfig, CreditConfig
from verl_credit.counterfactual_replay import (
    CounterfactualResult,
    EditProposer,
    ReplayFailure,
    ReplayRequest,
    build_edit_proposer,
    run_replays,
)
from verl_credit.credit_math.call_adjustments import (
    AdaptiveRoleWeights,
    apply_counterfactual_calibration,
    counterfactual_delta_matrix,
    downweight_ig_calls,
    select_counterfactual_calls,
)
from verl_credit.dpo_export import append_dpo_pairs, build_dpo_pairs
from verl_credit.envs.base import build_environment, episode_task
from verl_credit.verl.session_inputs import SessionInputs
from verl_credit.verl.settings import CreditSettings, EnvSettings

__all__ = [
    "CREDIT_STATE_FILE",
    "CallAdjustmentsState",
    "SessionReplayer",
    "apply_call_adjustments",
    "load_credit_state",
    "reads_call_credit_settings",
    "replay_target",
    "save_credit_state",
    "session_reward",
]

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))

#: the trainer's own state in a checkpoint's ``global_step_N`` folder (next to verl's ``data.pt``)
CREDIT_STATE_FILE = "credit_state.json"


# Optional CALL-CREDIT parts (docs/design.md section 4): counterfactual calibration, IG down-weighting,
# adaptive role weights, DPO export
# ---------------------------------------------------------------------------------------------


@dataclass
class CallAdjustmentsState:
    """What the optional CALL-CREDIT parts keep across steps: one per trainer.

    ``adaptive`` is the running omega (``credit.call_credit.adaptive_omega``; the omega a step
    uses is the one the previous step left); ``proposer`` builds the alternative of a replayed call.
    """

    config: CallCreditConfig
    proposer: EditProposer | None = None
    adaptive: AdaptiveRoleWeights | None = None
    warned_failures: int = 0

    @classmethod
    def from_settings(cls, settings: CreditSettings) -> CallAdjustmentsState:
        """Raises ``ValueError`` naming ``credit.call_credit.counterfactual.proposer`` when it cannot be built."""
        config = settings.credit.call_credit
        proposer = None
        if config.needs_replay:
            try:
                proposer = build_edit_proposer(config.counterfactual.proposer)
            except ValueError as exc:
                raise ValueError(f"credit.call_credit.counterfactual.proposer: {exc}") from None
        adaptive = None
        if config.adaptive_omega.enabled:
            adaptive = AdaptiveRoleWeights.from_config(config.omega, config.adaptive_omega)
        if config.adjustments_enabled and not reads_call_credit_settings(settings):
            logger.warning(
                "credit.call_credit.{counterfactual,ig_downweight,adaptive_omega} apply to the call_credit "
                "estimator only; algorithm.adv_estimator=%s ignores them",
                settings.estimator,
            )
        return cls(config, proposer, adaptive)

    def applies_to(self, settings: CreditSettings) -> bool:
        """Whether a step with these settings runs the optional parts (call_credit, a switch on)."""
        return reads_call_credit_settings(settings) and self.config.adjustments_enabled

    def replays(self, settings: CreditSettings) -> bool:
        """Whether a step with these settings replays calls (it then needs the rows' ``extra_info``)."""
        return reads_call_credit_settings(settings) and self.config.needs_replay

    def credit_config(self, config: CreditConfig) -> CreditConfig:
        """``config`` with the running omega when adaptive_omega is on (else ``config`` itself)."""
        if self.adaptive is None:
            return config
        return replace(config, call_credit=replace(config.call_credit, omega=dict(self.adaptive.omega)))

    def state_dict(self) -> dict[str, Any]:
        return {"adaptive_omega": self.adaptive.state_dict() if self.adaptive is not None else None}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`; a saved omega is ignored when adaptive_omega is now off."""
        saved = state.get("adaptive_omega")
        if saved is not None and self.adaptive is not None:
            self.adaptive.load_state_dict(saved)


def reads_call_credit_settings(settings: CreditSettings) -> bool:
    """Whether the estimator's settings section is ``credit.call_credit``: the optional parts are
    sub-sections of it, so they run for every estimator that reads it (``call_credit`` and any
    plug-in that declares ``settings = CallCreditConfig``)."""
    return settings.credit.registered_estimator.settings is CallCreditConfig


def replay_target(
    payload: Mapping[str, Any], extra_info: Mapping[str, Any], env: EnvSettings
) -> tuple[str, dict[str, Any], Mapping[str, Any]]:
    """``(environment name, constructor options, task)`` of a session, resolved as ``credit_agent``
    opened it: the environment it recorded (``extra_fields["credit"]["env"]``), else the row's
    ``extra_info.env``, else ``credit.env.name``; options ``credit.env.options`` updated by
    ``extra_info.env_options``; task ``extra_info["task"]`` (the whole ``extra_info`` when it has no
    ``task`` mapping).

    Raises:
        ValueError: no environment is known for the session.
    """
    name = payload.get("env") or extra_info.get("env") or env.name
    if not name:
        raise ValueError("the session names no environment (credit.env.name is null and extra_info has no 'env')")
    options = {**dict(env.options), **dict(extra_info.get("env_options") or {})}
    return str(name), options, episode_task(extra_info)


class SessionReplayer:
    """``await replayer(request) -> R(tau')``: a fresh instance of the session's environment is
    started on its task, replays the trajectory with the request's alternative, and is closed.

    Synchronous ``replay`` methods (the coding sandbox) run in ``executor`` so replays overlap and
    a replay past its time limit does not block the step (its thread is abandoned).
    """

    def __init__(
        self,
        targets: Sequence[tuple[str, dict[str, Any], Mapping[str, Any]] | Exception],
        executor: concurrent.futures.Executor,
    ):
        self.targets = targets
        self.executor = executor

    async def __call__(self, request: ReplayRequest) -> float:
        target = self.targets[request.row]
        if isinstance(target, Exception):
            raise target
        name, options, task = target
        env = build_environment(name, **options)
        replay = getattr(env, "replay", None)
        if not callable(replay):
            raise TypeError(f"environment {name!r} does not support replay (no replay method)")
        messages = request.trajectory.messages
        arguments = request.alternative.arguments
        try:
            await env.start(task)
            if inspect.iscoroutinefunction(replay):
                value = await replay(messages, request.call_index, arguments)
            else:
                loop = asyncio.get_running_loop()
                value = await loop.run_in_executor(self.executor, replay, messages, request.call_index, arguments)
                if inspect.isawaitable(value):
                    value = await value
        finally:
            await env.close()
        return float(value)


def apply_call_adjustments(
    credit: BatchCredit,
    inputs: SessionInputs,
    extra_infos: Sequence[Mapping[str, Any]],
    rewards: Sequence[float],
    env: EnvSettings,
    state: CallAdjustmentsState,
    step: int | None = None,
) -> tuple[BatchCredit, dict[str, float]]:
    """The optional parts of docs/design.md section 4 on a call_credit batch, in order:

    1. replays: the ``counterfactual.budget`` AE calls and the ``ig_downweight.budget`` IG calls
       with the largest ``|A_i|`` (calls with a tool call, in sessions with a transcript) are
       replayed with the proposer's alternative: ``Delta = R(tau) - R(tau')``;
    2. counterfactual calibration of the replayed AE calls (eq. 15, sign of A, mass restored);
    3. IG down-weighting of replayed IG calls with ``Delta < theta_ig`` (eq. 17, mass restored);
    4. adaptive omega update (eq. 16) from this step's ``|A_i|`` and Deltas (used by the next step);
    5. DPO pairs of the AE replays appended to ``dpo_export.path``.

    Args:
        credit: the batch's call credit (B sessions, T calls).
        inputs: the sessions' transcripts (``inputs.trajectories``).
        extra_infos, rewards: per session, the dataset row's ``extra_info`` and ``R(tau)``.
        env: ``credit.env`` (environment of sessions whose row names none).
        state: the trainer's :class:`CallAdjustmentsState`.
        step: training step written into DPO records.

    Returns:
        The credit with the new ``weight``/``action_advantage`` (the same object when no weight
        changed) and the metrics of the step. Replay failures are counted, never raised.
    """
    config = state.config
    metrics: dict[str, float] = {}
    shape = (int(credit.weight.shape[0]), int(credit.weight.shape[1]))
    delta = torch.zeros(shape, dtype=torch.float64)
    has_delta = torch.zeros(shape, dtype=torch.float64)
    results: list[CounterfactualResult] = []
    if config.needs_replay and state.proposer is not None:
        started = time.perf_counter()
        requests, failures, selected = _replay_requests(credit, inputs, rewards, config, state.proposer)
        if requests:
            results, failed = _run_replays(requests, inputs, extra_infos, env, config)
            failures += failed
        delta, has_delta = counterfactual_delta_matrix(results, shape)
        _log_failures(failures, state)
        metrics["credit/counterfactual_failures"] = float(len(failures))
        metrics["credit/counterfactual_selected"] = float(selected)
        metrics["credit/counterfactual_seconds"] = time.perf_counter() - started

    is_ae, is_ig = credit.extras["AE"], credit.extras["IG"]
    ae_results = [r for r in results if is_ae[r.row, r.call_index] > 0]
    ig_results = [r for r in results if is_ig[r.row, r.call_index] > 0]
    weight = credit.weight
    if config.counterfactual.enabled:
        metrics["credit/counterfactual_calls"] = float(len(ae_results))
        if ae_results:
            metrics["credit/counterfactual_delta_mean"] = sum(r.delta for r in ae_results) / len(ae_results)
            weight = apply_counterfactual_calibration(
                weight,
                credit.lengths,
                delta,
                has_delta * is_ae,
                config.counterfactual.eta,
                config.counterfactual.factor_floor,
                advantage=credit.trajectory_advantage,
            )
    if config.ig_downweight.enabled:
        cfg_ig = config.ig_downweight
        metrics["credit/ig_replays"] = float(len(ig_results))
        metrics["credit/ig_downweighted"] = float(sum(r.delta < cfg_ig.theta_ig for r in ig_results))
        if ig_results:
            metrics["credit/ig_delta_mean"] = sum(r.delta for r in ig_results) / len(ig_results)
            weight = downweight_ig_calls(
                weight, credit.lengths, is_ig, delta, has_delta, cfg_ig.theta_ig, cfg_ig.factor
            )
    if weight is not credit.weight:
        advantage = credit.trajectory_advantage.unsqueeze(-1).to(torch.float64) * weight
        credit = replace(credit, weight=weight, action_advantage=advantage.to(credit.action_advantage.dtype))

    if state.adaptive is not None:
        measured = (delta, has_delta) if results else (None, None)
        masks = {role: credit.extras[role] for role in ROLES}
        metrics.update(state.adaptive.update(credit.action_advantage, masks, *measured))

    if config.dpo_export.path is not None:
        pairs = build_dpo_pairs(inputs.trajectories, ae_results, config.dpo_export.theta_ae, step=step)
        metrics["credit/dpo_pairs"] = float(append_dpo_pairs(config.dpo_export.path, pairs))
    return credit, metrics


def _replay_requests(
    credit: BatchCredit,
    inputs: SessionInputs,
    rewards: Sequence[float],
    config: CallCreditConfig,
    proposer: EditProposer,
) -> tuple[list[ReplayRequest], list[ReplayFailure], int]:
    """The step's replays: top-|A_i| AE calls (counterfactual) and IG calls (ig_downweight) among
    calls that made a tool call. Returns the requests, the proposer's failures and the number selected."""
    replayable = torch.zeros(credit.weight.shape, dtype=torch.float64)
    for row, trajectory in enumerate(inputs.trajectories):
        if trajectory is None:
            continue
        for index, action in enumerate(trajectory.actions[: replayable.shape[1]]):
            if action.tool_calls:
                replayable[row, index] = 1.0
    selected: list[tuple[int, int]] = []
    if config.counterfactual.enabled:
        is_ae = credit.extras["AE"] * replayable
        selected += select_counterfactual_calls(credit.action_advantage, is_ae, config.counterfactual.budget)
    if config.ig_downweight.enabled:
        is_ig = credit.extras["IG"] * replayable
        selected += select_counterfactual_calls(credit.action_advantage, is_ig, config.ig_downweight.budget)
    requests, failures = [], []
    for row, call_index in selected:
        trajectory = inputs.trajectories[row]
        if trajectory is None:  # never selected: such rows are not replayable
            continue
        try:
            alternative = proposer.propose(trajectory, call_index)
        except Exception as exc:  # counted like a failed replay
            failures.append(ReplayFailure(row, call_index, f"proposer: {type(exc).__name__}: {exc}"))
            continue
        if alternative is not None:
            requests.append(ReplayRequest(row, call_index, trajectory, alternative, float(rewards[row])))
    return requests, failures, len(selected)


def _run_replays(
    requests: list[ReplayRequest],
    inputs: SessionInputs,
    extra_infos: Sequence[Mapping[str, Any]],
    env: EnvSettings,
    config: CallCreditConfig,
) -> tuple[list[CounterfactualResult], list[ReplayFailure]]:
    """Run the replays in their sessions' environments (concurrently, each time-limited)."""
    targets: list[tuple[str, dict[str, Any], Mapping[str, Any]] | Exception] = []
    for payload, info in zip(inputs.payloads, extra_infos, strict=True):
        try:
            targets.append(replay_target(payload, info, env))
        except ValueError as exc:
            targets.append(exc)
    cfg = config.counterfactual
    executor = concurrent.futures.ThreadPoolExecutor(max_workers=cfg.concurrency, thread_name_prefix="credit-replay")
    try:
        replayer = SessionReplayer(targets, executor)
        return _run_coroutine(lambda: run_replays(requests, replayer, cfg.concurrency, cfg.timeout))
    finally:
        executor.shutdown(wait=False, cancel_futures=True)


def _run_coroutine(make: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """Run a coroutine to completion from synchronous code, also when an event loop is running."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()


def _log_failures(failures: list[ReplayFailure], state: CallAdjustmentsState) -> None:
    """Warn about the first few replay failures of the run (all are counted in the metrics)."""
    for failure in failures:
        if state.warned_failures >= 5:
            return
        state.warned_failures += 1
        logger.warning(
            "credit: replay of session %d call %d failed (%s); counted in credit/counterfactual_failures",
            failure.row,
            failure.call_index,
            failure.error,
        )


def session_reward(extra: Any, score: float) -> float:
    """``R(tau)`` for Delta: the environment's reward the agent loop recorded
    (``reward_extra_info.env_reward``), else the session's score."""
    info = extra.get("reward_extra_info") if isinstance(extra, Mapping) else None
    value = info.get("env_reward") if isinstance(info, Mapping) else None
    if isinstance(value, int | float) and math.isfinite(float(value)):
        return float(value)
    return score


def save_credit_state(folder: str, state: CallAdjustmentsState) -> str:
    """Write the trainer's credit state into a checkpoint folder; returns the file path."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, CREDIT_STATE_FILE)
    temporary = path + ".tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(state.state_dict(), handle, indent=1, sort_keys=True)
    os.replace(temporary, path)
    return path


def load_credit_state(folder: str, state: CallAdjustmentsState) -> bool:
    """Restore the state saved by :func:`save_credit_state`; False (state unchanged) when absent."""
    path = os.path.join(folder, CREDIT_STATE_FILE)
    if not os.path.exists(path):
        return False
    with open(path, encoding="utf-8") as handle:
        state.load_state_dict(json.load(handle))
    return True
