"""``credit_sync``: verl's V1 sync trainer with ``_compute_advantage`` replaced by the credit path.

Per step (``CreditTrainerSync._compute_advantage``), on the batch already in TransferQueue:

1. fetch the fields verl's own ``_compute_advantage`` fetches, plus ``extra_fields``;
2. KL-in-reward and rollout correction exactly as verl does them (same functions);
3. :func:`compute_credit_advantages`: rows -> sessions (``{uid}_{session}_{index}``; padding rows
   skipped), one score per session from its *final* output (verl's multi-output GRPO rule),
   graphs read from ``extra_fields`` (annotated in the rollout) or annotated now (counted),
   ``routing.compute_batch_credit`` + ``routing.route_token_advantages``;
   for call_credit, the optional parts of DESIGN section 4 between the call weights and the token
   routing (:func:`apply_call_extras`; each behind a ``credit.call_credit.*`` switch, off by
   default): counterfactual calibration of the top-|A| AE calls by replaying them through the
   session's environment, IG down-weighting, adaptive role weights (kept on the trainer across
   steps and in checkpoints) and DPO pair export;
4. write ``advantages``/``returns`` (and verl's optional fields) back, as verl does;
5. DESIGN section 6 metrics into ``metrics`` (verl's tracker logs them).

With uniform graphs (or ``algorithm.adv_estimator=grpo``) the written advantages equal verl's
GRPO advantages bit-for-bit.

Around the advantage step:

* ``credit.layout=per_request`` (one row per model request): verl sizes actor/critic
  mini-batches in rows (``ppo_mini_batch_size * rollout.n``), which would multiply the optimizer
  updates by the rows per session; ``_balance_batch`` pads the step to the multiple
  :func:`verl_credit.verl.batch.plan_mini_batches` needs and ``_update_actor``/``_update_critic``
  train with its mini-batch size in rows, so a step makes merged's number of updates
  (``credit/optimizer_updates``, ``credit/mini_batch_rows``, ``credit/padding_rows``);
* ``_validate`` tags every validation row ``credit_validate=True`` (it reaches the agent loop's
  ``run(**kwargs)``);
* ``algorithm.filter_groups`` (DAPO dynamic sampling) is verl's own sampler: ``reward`` or
  ``env_reward`` (:func:`check_filter_groups`); ``credit/zero_adv_groups`` shows what is left.
"""

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
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import torch
import transfer_queue as tq
from omegaconf import DictConfig, open_dict
from tensordict import TensorDict
from transfer_queue import KVBatchMeta
from verl.protocol import DataProto
from verl.trainer.ppo.ray_trainer import apply_kl_penalty
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.workers.utils.padding import response_to_nested

from verl_credit.annotate.base import AnnotationResult, AnnotationStats
from verl_credit.call_graph import CallGraph
from verl_credit.config import CallCreditConfig, CreditConfig
from verl_credit.credit.call_credit import ROLES, fuse_token_advantages
from verl_credit.credit.call_extras import (
    AdaptiveRoleWeights,
    CounterfactualResult,
    EditProposer,
    ReplayFailure,
    ReplayRequest,
    apply_counterfactual_calibration,
    build_edit_proposer,
    counterfactual_delta_matrix,
    downweight_ig_calls,
    route_rv_reward_tokens,
    run_replays,
    rv_reward_matrix,
    select_counterfactual_calls,
)
from verl_credit.credit.tokens import scatter_action_values_to_tokens
from verl_credit.dpo_export import append_dpo_pairs, build_dpo_pairs
from verl_credit.envs.base import build_environment, episode_task
from verl_credit.graph import GraphValidation, InfluenceGraph
from verl_credit.metrics import compute_credit_metrics
from verl_credit.routing import BatchCredit, compute_batch_credit, route_token_advantages
from verl_credit.trajectory import Trajectory
from verl_credit.verl.annotation import annotate_now, build_call_graph, result_from_payload
from verl_credit.verl.batch import (
    MiniBatchPlan,
    Session,
    ValidationBatches,
    build_span_tensors,
    count_sessions,
    credit_payload,
    group_sessions,
    plan_mini_batches,
    session_lengths,
    session_spans,
)
from verl_credit.verl.credit_dump import write_step_dump
from verl_credit.verl.settings import (
    CREDIT_TRAINER_MODE,
    AnnotatorSettings,
    CreditSettings,
    EnvSettings,
    load_settings,
)

__all__ = [
    "CREDIT_STATE_FILE",
    "FILTER_GROUPS_METRICS",
    "CallExtrasState",
    "CreditStep",
    "CreditTrainerSync",
    "SessionGraphs",
    "SessionInputs",
    "SessionReplayer",
    "apply_call_extras",
    "check_filter_groups",
    "compute_credit_advantages",
    "load_credit_state",
    "read_sessions",
    "replay_target",
    "save_credit_state",
    "session_graphs",
    "token_advantages",
]

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))

Annotate = Callable[[Sequence[Trajectory], AnnotatorSettings], list[AnnotationResult]]

#: the trainer's own state in a checkpoint's ``global_step_N`` folder (next to verl's ``data.pt``)
CREDIT_STATE_FILE = "credit_state.json"
#: ``algorithm.filter_groups.metric`` values verl's sampler finds on credit_agent rows with an
#: environment reward: ``reward`` (verl's canonical ``rm_scores``) and ``env_reward``
FILTER_GROUPS_METRICS: tuple[str, ...] = ("reward", "env_reward")


@dataclass
class CreditStep:
    """One batch's credit: token advantages for every row and what produced them."""

    advantages: torch.Tensor  # (rows, R)
    credit: BatchCredit | None  # None when the batch holds only padding rows
    sessions: list[Session]
    metrics: dict[str, float]
    config: CreditConfig | None = None  # what the step routed with (the running omega included)


@dataclass
class SessionInputs:
    """Per session (B) and per row: what the credit core needs, read from the batch."""

    scores: torch.Tensor  # (B,) reward of each session's final output
    lengths: list[list[int]]  # B lists: L_i per action
    payloads: list[Mapping[str, Any]]  # extra_fields["credit"] of each final row
    trajectories: list[Trajectory | None]  # the transcripts (None when a session has none)
    spans_per_row: list[list[tuple[int, int, int]]]  # rows lists of (action, start, end)
    nonfinite: list[int] = field(default_factory=list)  # sessions whose score was NaN/inf (now 0)


@dataclass
class SessionGraphs:
    graphs: list[InfluenceGraph] | None = None
    call_graphs: list[CallGraph] | None = None
    rv_statuses: list[list[str | None]] = field(default_factory=list)
    stats: AnnotationStats | None = None
    role_graphs: list[CallGraph] | None = None  # call roles for the metrics only (iapo, grpo)
    annotated_in_trainer: int = 0
    missing_transcript: int = 0


def compute_credit_advantages(
    keys: Sequence[str],
    tags: Sequence[Mapping[str, Any]],
    uids: Sequence[Any],
    extras: Sequence[Any],
    rollout_mask: torch.Tensor,
    response_mask: torch.Tensor,
    token_level_rewards: torch.Tensor,
    settings: CreditSettings,
    annotate: Annotate = annotate_now,
    call_extras: CallExtrasState | None = None,
    extra_infos: Sequence[Mapping[str, Any] | None] | None = None,
    step: int | None = None,
) -> CreditStep:
    """Token advantages of a verl batch (rows padded to ``R``).

    Args:
        keys, tags, uids, extras: per row, as stored in TransferQueue.
        rollout_mask: ``(rows, R)`` response mask as produced by the rollout (defines the spans).
        response_mask: ``(rows, R)`` mask after rollout correction (tokens it zeroes get 0).
        token_level_rewards: ``(rows, R)``; a session's score is the sum over its final row.
        settings: the ``credit`` node.
        annotate: synchronous annotator for sessions that arrive without a graph.
        call_extras: the trainer's state of the optional CALL-CREDIT parts (call_credit only;
            ``None`` or all switches off: not used).
        extra_infos: per row, the dataset row's ``extra_info`` (environment and task of the session;
            needed by replays only).
        step: the training step (DPO records).

    Returns:
        :class:`CreditStep`; ``advantages`` has ``token_level_rewards``' dtype, 0 on padding rows.
    """
    rows, response_length = response_mask.shape
    sessions, row_session = group_sessions(keys, tags, uids)
    advantages = torch.zeros((rows, response_length), dtype=token_level_rewards.dtype)
    if not sessions:
        return CreditStep(advantages, None, [], {})

    inputs = read_sessions(sessions, keys, extras, rollout_mask, token_level_rewards)
    found = session_graphs(sessions, inputs, settings, annotate)
    state = call_extras if call_extras is not None and call_extras.applies_to(settings) else None
    config = state.credit_config(settings.credit) if state is not None else settings.credit
    credit = compute_batch_credit(
        inputs.scores, [s.uid for s in sessions], inputs.lengths, config, found.graphs, found.call_graphs
    )
    if inputs.nonfinite:
        neutralize_groups(credit, sessions, inputs.nonfinite)
    extra_metrics: dict[str, float] = {}
    if state is not None:
        infos = [dict((extra_infos[s.final_row] if extra_infos is not None else None) or {}) for s in sessions]
        rewards = [_session_reward(extras[s.final_row], float(inputs.scores[n])) for n, s in enumerate(sessions)]
        credit, extra_metrics = apply_call_extras(credit, inputs, infos, rewards, settings.env, state, step)
    row_trajectory = torch.tensor([max(s, 0) for s in row_session], dtype=torch.long)
    routed, rv_total = token_advantages(credit, row_trajectory, inputs.spans_per_row, response_length, settings, found)
    real = torch.tensor([s >= 0 for s in row_session], dtype=torch.bool).unsqueeze(-1)
    advantages = torch.where(real, routed * response_mask, advantages)
    nonfinite_advantages = ~torch.isfinite(advantages)
    if bool(nonfinite_advantages.any()):  # a last guard: a step never trains on NaN/inf advantages
        logger.warning(
            "credit: %d non-finite token advantages set to 0; counted in credit/nonfinite_advantages",
            int(nonfinite_advantages.sum()),
        )
        advantages = torch.where(nonfinite_advantages, torch.zeros_like(advantages), advantages)

    metrics = compute_credit_metrics(
        credit,
        found.stats,
        [t for t in inputs.trajectories if t is not None],
        graphs=found.graphs,
        call_graphs=found.call_graphs if found.call_graphs is not None else found.role_graphs,
        rewards=inputs.scores,
        groups=[s.uid for s in sessions],
    )
    if rv_total is not None:
        metrics["credit/rv_reward_per_session"] = rv_total / len(sessions)
    metrics.update(extra_metrics)
    metrics["credit/annotated_in_trainer"] = float(found.annotated_in_trainer)
    metrics["credit/missing_transcript"] = float(found.missing_transcript)
    metrics["credit/annotation_timeouts"] = float(sum(_timed_out(p) for p in inputs.payloads))
    metrics["credit/dropped_tool_calls"] = float(sum(_count(p.get("dropped_tool_calls")) for p in inputs.payloads))
    metrics["credit/nonfinite_rewards"] = float(len(inputs.nonfinite))
    metrics["credit/nonfinite_advantages"] = float(nonfinite_advantages.sum())
    metrics["credit/sessions"] = float(len(sessions))
    metrics["credit/rows_per_session"] = float(sum(len(s.rows) for s in sessions)) / len(sessions)
    return CreditStep(advantages, credit, sessions, metrics, config)


# ---------------------------------------------------------------------------------------------
# Optional CALL-CREDIT parts (DESIGN section 4): counterfactual calibration, IG down-weighting,
# adaptive role weights, DPO export
# ---------------------------------------------------------------------------------------------


@dataclass
class CallExtrasState:
    """What the optional CALL-CREDIT parts keep across steps: one per trainer.

    ``adaptive`` is the running omega (``credit.call_credit.adaptive_omega``; the omega a step
    uses is the one the previous step left); ``proposer`` builds the alternative of a replayed call.
    """

    config: CallCreditConfig
    proposer: EditProposer | None = None
    adaptive: AdaptiveRoleWeights | None = None
    warned_failures: int = 0

    @classmethod
    def from_settings(cls, settings: CreditSettings) -> CallExtrasState:
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
        if config.extras_enabled and settings.estimator != "call_credit":
            logger.warning(
                "credit.call_credit.{counterfactual,ig_downweight,adaptive_omega} apply to the call_credit "
                "estimator only; algorithm.adv_estimator=%s ignores them",
                settings.estimator,
            )
        return cls(config, proposer, adaptive)

    def applies_to(self, settings: CreditSettings) -> bool:
        """Whether a step with these settings runs the optional parts (call_credit, a switch on)."""
        return settings.estimator == "call_credit" and self.config.extras_enabled

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


def apply_call_extras(
    credit: BatchCredit,
    inputs: SessionInputs,
    extra_infos: Sequence[Mapping[str, Any]],
    rewards: Sequence[float],
    env: EnvSettings,
    state: CallExtrasState,
    step: int | None = None,
) -> tuple[BatchCredit, dict[str, float]]:
    """The optional parts of DESIGN section 4 on a call_credit batch, in order:

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
        state: the trainer's :class:`CallExtrasState`.
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


def _log_failures(failures: list[ReplayFailure], state: CallExtrasState) -> None:
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


def _session_reward(extra: Any, score: float) -> float:
    """``R(tau)`` for Delta: the environment's reward the agent loop recorded
    (``reward_extra_info.env_reward``), else the session's score."""
    info = extra.get("reward_extra_info") if isinstance(extra, Mapping) else None
    value = info.get("env_reward") if isinstance(info, Mapping) else None
    if isinstance(value, int | float) and math.isfinite(float(value)):
        return float(value)
    return score


def save_credit_state(folder: str, state: CallExtrasState) -> str:
    """Write the trainer's credit state into a checkpoint folder; returns the file path."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, CREDIT_STATE_FILE)
    temporary = path + ".tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(state.state_dict(), handle, indent=1, sort_keys=True)
    os.replace(temporary, path)
    return path


def load_credit_state(folder: str, state: CallExtrasState) -> bool:
    """Restore the state saved by :func:`save_credit_state`; False (state unchanged) when absent."""
    path = os.path.join(folder, CREDIT_STATE_FILE)
    if not os.path.exists(path):
        return False
    with open(path, encoding="utf-8") as handle:
        state.load_state_dict(json.load(handle))
    return True


def read_sessions(
    sessions: list[Session],
    keys: Sequence[str],
    extras: Sequence[Any],
    rollout_mask: torch.Tensor,
    token_level_rewards: torch.Tensor,
) -> SessionInputs:
    """Scores (final outputs only: verl's multi-output GRPO rule), exact spans, L_i and transcripts."""
    final_rows = torch.tensor([s.final_row for s in sessions], dtype=torch.long)
    scores = token_level_rewards[final_rows].sum(dim=-1)
    scores, nonfinite = neutralize_rewards(scores, sessions)
    spans_per_row: list[list[tuple[int, int, int]]] = [[] for _ in range(rollout_mask.shape[0])]
    lengths, payloads, trajectories = [], [], []
    for number, session in enumerate(sessions):
        payload = credit_payload(extras[session.final_row])
        spans, recorded = session_spans(session, extras, rollout_mask, keys)
        for row, row_spans in spans.items():
            spans_per_row[row] = row_spans
        largest = max((a for row_spans in spans.values() for a, _, _ in row_spans), default=-1)
        num_actions = int(payload["num_actions"]) if recorded and "num_actions" in payload else largest + 1
        session_len = session_lengths(spans, num_actions)
        lengths.append(session_len)
        payloads.append(payload)
        trajectories.append(_trajectory(session, payload, float(scores[number]), session_len))
    return SessionInputs(scores, lengths, payloads, trajectories, spans_per_row, nonfinite)


def neutralize_rewards(scores: torch.Tensor, sessions: Sequence[Session]) -> tuple[torch.Tensor, list[int]]:
    """Scores with every NaN/inf one (a broken reward function, or an fp32 sum that overflowed)
    replaced by 0, and the numbers of those sessions (logged; :func:`neutralize_groups` then
    zeroes their groups' advantages, ``credit/nonfinite_rewards`` counts them)."""
    finite = torch.isfinite(scores)
    if bool(finite.all()):
        return scores, []
    nonfinite = torch.nonzero(~finite).flatten().tolist()
    for number in nonfinite:
        logger.warning(
            "credit: session %s (uid %s) has a non-finite reward (%s); its group's advantages are set to 0 "
            "(counted in credit/nonfinite_rewards)",
            sessions[number].key,
            sessions[number].uid,
            float(scores[number]),
        )
    return torch.where(finite, scores, torch.zeros_like(scores)), nonfinite


def neutralize_groups(credit: BatchCredit, sessions: Sequence[Session], nonfinite: Sequence[int]) -> None:
    """Zero the trajectory and action advantages of every session sharing a uid with a session of
    ``nonfinite``: without that reward the group has no baseline, so it gives no gradient."""
    poisoned = {sessions[number].uid for number in nonfinite}
    rows = torch.tensor([s.uid in poisoned for s in sessions], dtype=torch.bool)
    credit.trajectory_advantage = torch.where(
        rows, torch.zeros_like(credit.trajectory_advantage), credit.trajectory_advantage
    )
    credit.action_advantage = torch.where(
        rows.unsqueeze(-1), torch.zeros_like(credit.action_advantage), credit.action_advantage
    )


def session_graphs(
    sessions: list[Session], inputs: SessionInputs, settings: CreditSettings, annotate: Annotate
) -> SessionGraphs:
    """Influence graphs (iapo) or call graphs (call_credit) of every session."""
    found = SessionGraphs()
    found.stats = AnnotationStats()
    if settings.estimator == "iapo":
        results = _influence_graphs(sessions, inputs, settings.annotator, annotate, found)
        found.graphs = [result.graph for result in results]
        for result in results:
            found.stats.add(result)
    elif settings.estimator == "call_credit":
        found.call_graphs, found.rv_statuses = _call_graphs(sessions, inputs, found)
        found.stats.total = len(sessions)
        found.stats.parsed = len(sessions)
        found.stats.seconds = sum(float((p.get("annotation") or {}).get("seconds", 0.0)) for p in inputs.payloads)
    if found.call_graphs is None:
        found.role_graphs = _role_graphs(inputs.payloads)
    return found


def _role_graphs(payloads: Sequence[Mapping[str, Any]]) -> list[CallGraph] | None:
    """The call roles the agent loop recorded for the metrics (``credit/reward_hacking_rate``) of
    estimators that do not route with them; None unless every session has them."""
    if not payloads or any(p.get("call_graph") is None for p in payloads):
        return None
    return [CallGraph.from_json(p["call_graph"]) for p in payloads]


def token_advantages(
    credit: BatchCredit,
    row_trajectory: torch.Tensor,
    spans_per_row: list[list[tuple[int, int, int]]],
    response_length: int,
    settings: CreditSettings,
    found: SessionGraphs,
) -> tuple[torch.Tensor, float | None]:
    """``(rows, R)`` token advantages: ``A_tau * w_i`` on the tokens of action ``i``
    (``routing.route_token_advantages``); for call_credit also the alpha fusion (eq. 13) and the
    optional RV reward (eq. 14). Returns the advantages and the batch's total RV reward (or None)."""
    span_action, span_start, span_end = build_span_tensors(spans_per_row)
    dtype = credit.trajectory_advantage.dtype
    routed = route_token_advantages(credit, row_trajectory, span_action, span_start, span_end, response_length, dtype)
    if settings.estimator != "call_credit":
        return routed, None
    call_cfg = settings.credit.call_credit
    if call_cfg.alpha > 0:
        ones = torch.ones_like(credit.weight, dtype=dtype)[row_trajectory]
        action_tokens = scatter_action_values_to_tokens(ones, span_action, span_start, span_end, response_length)
        grpo_tokens = credit.trajectory_advantage[row_trajectory].unsqueeze(-1) * action_tokens
        routed = fuse_token_advantages(grpo_tokens, routed, call_cfg.alpha)
    if call_cfg.rv_reward == "off" or found.call_graphs is None:
        return routed, None
    rv_reward = rv_reward_matrix(
        found.call_graphs, found.rv_statuses, credit.weight.shape[1], call_cfg.rv_reward, call_cfg.kappa
    )
    routed = routed + route_rv_reward_tokens(
        rv_reward, row_trajectory, span_action, span_start, span_end, response_length, dtype=dtype
    )
    return routed, float(rv_reward.sum())


def _trajectory(session: Session, payload: Mapping[str, Any], reward: float, lengths: list[int]) -> Trajectory | None:
    """The session's transcript as a :class:`Trajectory` (``None`` without a transcript)."""
    if "messages" not in payload:
        return None
    trajectory = Trajectory.from_messages(
        list(payload["messages"]), id=session.key, uid=session.uid, reward=reward, action_token_lengths=lengths
    )
    if payload.get("tools") is not None:
        trajectory.extra["tools"] = list(payload["tools"])
    return trajectory


#: ``error`` of the fallback a session gets when its in-rollout annotation passed its deadline
TIMEOUT_ERROR = "in-rollout annotation passed credit.annotator.deadline"


def _influence_graphs(
    sessions: list[Session],
    inputs: SessionInputs,
    settings: AnnotatorSettings,
    annotate: Annotate,
    found: SessionGraphs,
) -> list[AnnotationResult]:
    """The stored graph of each session; sessions without one are annotated now (counted), and
    sessions without a transcript fall back to the uniform graph (counted).

    A session whose in-rollout annotation passed its deadline (``annotation_timeout``) is never
    sent to the configured annotator again (an LLM would stall the step the same way): it gets
    ``credit.annotator.fallback`` -- the rule annotator (``rules``) or the uniform graph
    (``uniform``) -- marked ``fallback:*`` so ``credit/fallback_rate`` counts it.
    """
    results: list[AnnotationResult | None] = []
    pending: list[int] = []
    timed_out: list[int] = []
    for number, (payload, trajectory) in enumerate(zip(inputs.payloads, inputs.trajectories, strict=True)):
        num_actions = len(inputs.lengths[number])
        result = result_from_payload(payload, num_actions)
        if result is None and trajectory is None:
            found.missing_transcript += 1
            logger.warning("credit: session %s has no transcript in extra_fields; uniform graph", sessions[number].key)
            result = AnnotationResult(
                InfluenceGraph.uniform(num_actions),
                GraphValidation(fallback=True),
                "fallback:uniform",
                error="no transcript in extra_fields (agent loop is not credit_agent)",
            )
        elif result is None and _timed_out(payload):
            if settings.fallback == "rules":
                timed_out.append(number)
            else:
                result = AnnotationResult(
                    InfluenceGraph.uniform(num_actions),
                    GraphValidation(fallback=True),
                    "fallback:uniform",
                    error=TIMEOUT_ERROR,
                )
        elif result is None:
            pending.append(number)
        results.append(result)
    if pending:
        found.annotated_in_trainer += len(pending)
        annotated = annotate([inputs.trajectories[n] for n in pending], settings)  # type: ignore[misc]
        for number, result in zip(pending, annotated, strict=True):
            results[number] = result
    if timed_out:
        rules = replace(settings, name="rules", cache_path=None)
        annotated = annotate([inputs.trajectories[n] for n in timed_out], rules)  # type: ignore[misc]
        for number, result in zip(timed_out, annotated, strict=True):
            results[number] = replace(result, source="fallback:rules", error=result.error or TIMEOUT_ERROR)
    return [result for result in results if result is not None]


def _timed_out(payload: Mapping[str, Any]) -> bool:
    """Whether the agent loop marked the session's in-rollout annotation as past its deadline."""
    return bool(payload.get("annotation_timeout", False))


def _count(value: Any) -> int:
    """A non-negative count recorded in a payload (anything else: 0)."""
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 else 0


def _call_graphs(
    sessions: list[Session], inputs: SessionInputs, found: SessionGraphs
) -> tuple[list[CallGraph], list[list[str | None]]]:
    """The stored call graph (and RV outcomes) of each session, built now when missing (counted)."""
    graphs, statuses = [], []
    for session, payload, trajectory, session_len in zip(
        sessions, inputs.payloads, inputs.trajectories, inputs.lengths, strict=True
    ):
        if payload.get("call_graph") is not None:
            graph = CallGraph.from_json(payload["call_graph"])
            status = list(payload.get("rv_status") or [None] * graph.num_calls)
        elif trajectory is not None:
            found.annotated_in_trainer += 1
            graph, status = build_call_graph(trajectory)
        else:
            raise ValueError(
                f"session {session.key}: call_credit needs the transcript in extra_fields['credit'] "
                "(use actor_rollout_ref.rollout.agent.default_agent_loop=credit_agent)"
            )
        if graph.num_calls != len(session_len):
            raise ValueError(
                f"session {session.key}: call graph has {graph.num_calls} calls for {len(session_len)} actions"
            )
        graphs.append(graph)
        statuses.append(status)
    return graphs, statuses


@register_trainer(CREDIT_TRAINER_MODE)
class CreditTrainerSync(PPOTrainerSync):
    """verl's synchronous V1 trainer; only the advantage step differs."""

    def __init__(self, config: DictConfig):
        # The start-up checks of ``python -m verl_credit.main`` again, for verl's own entry point
        # (``verl.trainer.main_ppo --config-name=credit_trainer``): before any worker is built.
        from verl_credit.verl.main import validate

        settings = validate(config)
        check_filter_groups(config, settings)
        with open_dict(config):
            # The mode string also selects the replay buffer, refill and checkpoint behaviour
            # (VERL_NOTES section 1): keep verl's "sync" semantics.
            config.trainer.v1.trainer_mode = "sync"
        call_extras = CallExtrasState.from_settings(settings)  # a bad proposer fails before workers start
        super().__init__(config)
        self._credit_settings: CreditSettings | None = settings
        self._call_extras: CallExtrasState | None = call_extras

    @property
    def credit_settings(self) -> CreditSettings:
        if getattr(self, "_credit_settings", None) is None:
            self._credit_settings = load_settings(self.config)
        return self._credit_settings  # type: ignore[return-value]

    @property
    def call_extras(self) -> CallExtrasState:
        """State of the optional CALL-CREDIT parts, kept across steps (and in checkpoints)."""
        if getattr(self, "_call_extras", None) is None:
            self._call_extras = CallExtrasState.from_settings(self.credit_settings)
        return self._call_extras  # type: ignore[return-value]

    def _save_checkpoint(self):
        """verl's checkpoint plus ``credit_state.json`` (the adaptive omega), written first so a
        checkpoint verl marks as latest always has it."""
        folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        save_credit_state(folder, self.call_extras)
        return super()._save_checkpoint()

    def _load_checkpoint(self):
        """verl's resume, then the credit state of the same ``global_step_N`` folder (if any)."""
        result = super()._load_checkpoint()
        folder = self._resumed_folder()
        if folder is not None and not load_credit_state(folder, self.call_extras):
            logger.warning("credit: %s has no %s; the credit state starts fresh", folder, CREDIT_STATE_FILE)
        return result

    def _resumed_folder(self) -> str | None:
        """The ``global_step_N`` folder verl's ``_load_checkpoint`` resumed from (None: from scratch)."""
        trainer = self.config.trainer
        if not getattr(self, "global_steps", 0) or trainer.resume_mode == "disable":
            return None
        if trainer.resume_mode == "resume_path":
            folder = str(trainer.resume_from_path)
        else:
            folder = os.path.join(str(trainer.default_local_dir), f"global_step_{self.global_steps}")
        return folder if os.path.isabs(folder) else os.path.join(os.getcwd(), folder)

    def _compute_advantage(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        """verl's advantage step with the credit core in place of the estimator call."""
        fields = ["uid", "response_mask", "rm_scores", "rollout_log_probs", "old_log_probs", "ref_log_prob", "values"]
        fetched = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=[*fields, "extra_fields"]
        )
        extras = fetched.pop("extra_fields").tolist()
        response_mask = fetched["response_mask"]
        data = DataProto(batch=fetched.to_padded_tensor())
        data.batch["token_level_scores"] = data.batch["rm_scores"]
        uids = data.batch.pop("uid").tolist()
        data.non_tensor_batch["uid"] = np.array(uids, dtype=object)
        rollout_mask = data.batch["response_mask"].clone()

        # 1-2: KL penalty in the reward and rollout correction, exactly as verl's trainer
        if self.config.algorithm.use_kl_in_reward:
            data, kl_metrics = apply_kl_penalty(
                data, kl_ctrl=self.kl_ctrl_in_reward, kl_penalty=self.config.algorithm.kl_penalty
            )
            metrics.update(kl_metrics)
        else:
            data.batch["token_level_rewards"] = data.batch["token_level_scores"]
        rollout_corr_config = self.config.algorithm.get("rollout_correction", None)
        bypass = rollout_corr_config and rollout_corr_config.get("bypass_mode", False)
        rollout_correction = rollout_corr_config is not None and "rollout_log_probs" in data.batch and not bypass
        if rollout_correction:
            data, is_metrics = compute_rollout_correction_and_add_to_batch(data, rollout_corr_config)
            metrics.update(is_metrics)

        # 3: credit (for call_credit with replays on, also the rows' extra_info: environment and task)
        settings = self.credit_settings
        replaying = settings.estimator == "call_credit" and settings.credit.call_credit.needs_replay
        step = compute_credit_advantages(
            batch.keys,
            batch.tags,
            uids,
            extras,
            rollout_mask,
            data.batch["response_mask"],
            data.batch["token_level_rewards"],
            settings,
            call_extras=self.call_extras,
            extra_infos=_fetch_extra_infos(batch) if replaying else None,
            step=getattr(self, "global_steps", None),
        )
        data.batch["advantages"] = step.advantages
        data.batch["returns"] = step.advantages
        metrics.update(step.metrics)

        # 4: write back like verl
        out_fields = ["advantages", "returns"]
        if self.config.algorithm.use_kl_in_reward:
            out_fields.append("token_level_rewards")
        if rollout_correction:
            out_fields.append("response_mask")
            if "rollout_is_weights" in data.batch:
                out_fields.append("rollout_is_weights")
        output = TensorDict(
            {name: response_to_nested(data.batch[name], response_mask) for name in out_fields}, batch_size=len(batch)
        )
        if settings.debug.dump_dir:
            self._pending_dump = {
                "keys": list(batch.keys),
                "tags": [dict(tag) for tag in batch.tags],
                "uids": list(uids),
                "rollout_mask": rollout_mask.to(torch.int8),
                "response_mask": data.batch["response_mask"].to(torch.int8),
                "token_level_rewards": data.batch["token_level_rewards"].clone(),
                "payloads": [dict(credit_payload(extra)) or None for extra in extras],
                "estimator": settings.estimator,
                "credit_config": asdict(step.config or settings.credit),
                "norm_adv_by_std_in_grpo": bool(self.config.algorithm.norm_adv_by_std_in_grpo),
                "epsilon": float(settings.credit.epsilon),
                "trainer_advantages": step.advantages.clone(),
            }
        return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=output)

    # -- per_request: optimizer updates per step as in the merged layout ----------------------

    def _balance_batch(self, batch: KVBatchMeta, metrics, logging_prefix="global_seqlen", keep_minibatch=False):
        """verl's padding + dp balancing; for ``credit.layout=per_request`` the padding multiple and
        the mini-batch sizes in rows come from :func:`plan_mini_batches` (computed with the dp size
        verl determines here), so the step makes merged's number of optimizer updates."""
        self._mini_batch_plan: MiniBatchPlan | None = None
        sessions = count_sessions(batch.keys, batch.tags) if self.credit_settings.layout == "per_request" else 0
        self._plan_request = (len(batch), sessions) if sessions and self._mini_batch_sessions() else None
        try:
            balanced = super()._balance_batch(
                batch, metrics=metrics, logging_prefix=logging_prefix, keep_minibatch=keep_minibatch
            )
        finally:
            self._plan_request = None
        plan = self._mini_batch_plan
        if plan is not None:
            if len(balanced) != plan.padded_rows:
                raise RuntimeError(
                    f"credit: the balanced batch has {len(balanced)} rows; the mini-batch plan expects "
                    f"{plan.padded_rows}"
                )
            metrics["credit/padding_rows"] = float(plan.padded_rows - plan.rows)
        return balanced

    def _get_required_batch_multiple(self, dp_size: int) -> int:
        request = getattr(self, "_plan_request", None)
        if request is None:
            return super()._get_required_batch_multiple(dp_size)
        rows, sessions = request
        micro, forward = self._micro_batch_sizes()
        plan = plan_mini_batches(rows, sessions, self._mini_batch_sessions(), dp_size, micro, forward)
        self._mini_batch_plan = plan
        return plan.batch_multiple

    def _mini_batch_sessions(self) -> dict[str, int]:
        """Sessions per optimizer update of each role that trains this step (verl's
        ``ppo_mini_batch_size * rollout.n``; the roles verl's ``_get_required_batch_multiple`` counts)."""
        n = int(self.config.actor_rollout_ref.rollout.n)
        sizes: dict[str, int] = {}
        if self.use_critic:
            sizes["critic"] = int(self.config.critic.ppo_mini_batch_size) * n
        if self.config.trainer.critic_warmup <= getattr(self, "global_steps", 0):
            sizes["actor"] = int(self.config.actor_rollout_ref.actor.ppo_mini_batch_size) * n
        return sizes

    def _micro_batch_sizes(self) -> tuple[dict[str, int], list[int]]:
        """Micro-batch sizes per GPU that must divide a mini-batch (training) or a rank's rows
        (forward passes) -- verl's ``prepare_micro_batches`` asserts it without dynamic bsz."""
        ref = self.config.actor_rollout_ref

        def size(node: Any, dynamic: str, key: str) -> int:
            return 1 if node.get(dynamic, False) else int(node.get(key, None) or 1)

        micro = {"actor": size(ref.actor, "use_dynamic_bsz", "ppo_micro_batch_size_per_gpu")}
        forward = [size(ref.rollout, "log_prob_use_dynamic_bsz", "log_prob_micro_batch_size_per_gpu")]
        if self.use_reference_policy:
            forward.append(size(ref.ref, "log_prob_use_dynamic_bsz", "log_prob_micro_batch_size_per_gpu"))
        if self.use_critic:
            critic = self.config.critic
            micro["critic"] = size(critic, "use_dynamic_bsz", "ppo_micro_batch_size_per_gpu")
            forward.append(size(critic, "use_dynamic_bsz", "forward_micro_batch_size_per_gpu"))
        return micro, forward

    def _planned_rows(self, role: str) -> int | None:
        plan = getattr(self, "_mini_batch_plan", None)
        return plan.mini_batch_rows.get(role) if plan is not None else None

    def _update_critic(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        """verl's critic update; per_request: with the planned mini-batch size in rows."""
        rows = self._planned_rows("critic")
        if rows is None:
            return super()._update_critic(batch, metrics)
        self.critic_wg = _MiniBatchRows(self.critic_wg, "train_mini_batch", rows)
        try:
            return super()._update_critic(batch, metrics)
        finally:
            self.critic_wg = self.critic_wg.group

    def _validate(self) -> dict[str, float]:
        """verl's validation with every validation row tagged ``credit_validate=True``: the column
        reaches ``CreditAgentLoop.run(**kwargs)`` (verl passes a batch's columns as kwargs), so the
        agent loop can tell validation episodes from training ones."""
        loader = self.val_dataloader
        self.val_dataloader = ValidationBatches(loader)
        try:
            return super()._validate()
        finally:
            self.val_dataloader = loader

    def _update_actor(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        """verl's actor update; with ``credit.debug.dump_dir`` set, the step's dump is written first,
        with the advantages read back from TransferQueue exactly as the actor is about to read them.
        per_request: the mini-batch size in rows is the planned one (``_balance_batch``), so the
        update count is merged's; ``credit/optimizer_updates`` is logged for both layouts."""
        pending = getattr(self, "_pending_dump", None)
        folder = self.credit_settings.debug.dump_dir
        if folder and pending is not None and list(batch.keys) == pending["keys"]:
            fetched = tq.kv_batch_get(
                keys=batch.keys, partition_id=batch.partition_id, select_fields=["advantages", "response_mask"]
            )
            actor = fetched.to_padded_tensor()["advantages"]
            width = pending["trainer_advantages"].shape[1]
            padded = torch.zeros((actor.shape[0], width), dtype=actor.dtype)
            padded[:, : min(width, actor.shape[1])] = actor[:, :width]
            pending["actor_advantages"] = padded
            pending["credit_state"] = self.call_extras.state_dict()
            write_step_dump(folder, int(self.global_steps), pending)
            self._pending_dump = None
        actor = self.config.actor_rollout_ref.actor
        rows = self._planned_rows("actor")
        size = (
            rows if rows is not None else int(actor.ppo_mini_batch_size) * int(self.config.actor_rollout_ref.rollout.n)
        )
        metrics["credit/mini_batch_rows"] = float(size)
        metrics["credit/optimizer_updates"] = float(len(batch) // size * int(actor.ppo_epochs))
        if rows is None:
            return super()._update_actor(batch, metrics)
        self.actor_rollout_wg = _MiniBatchRows(self.actor_rollout_wg, "update_actor", rows)
        try:
            return super()._update_actor(batch, metrics)
        finally:
            self.actor_rollout_wg = self.actor_rollout_wg.group


class _MiniBatchRows:
    """A worker group whose ``method`` trains with ``mini_batch_size = global_batch_size = rows``
    (set in the batch's ``extra_info`` after verl's own values); everything else is the group's."""

    def __init__(self, group: Any, method: str, rows: int):
        self.group = group
        self.method = method
        self.rows = rows

    def __getattr__(self, name: str) -> Any:
        if name in ("group", "method", "rows"):
            raise AttributeError(name)
        if name != self.method:
            return getattr(self.group, name)
        forward = getattr(self.group, name)

        def train(batch: KVBatchMeta, *args: Any, **kwargs: Any) -> Any:
            batch.extra_info.update(mini_batch_size=self.rows, global_batch_size=self.rows)
            return forward(batch, *args, **kwargs)

        return train


def check_filter_groups(config: Any, settings: CreditSettings) -> None:
    """``algorithm.filter_groups`` (DAPO dynamic sampling) with ``credit_agent`` and an environment
    reward: the agent loop records only ``reward_extra_info.env_reward`` (and ``rm_scores``), so
    verl's sampler can filter on ``env_reward`` or ``reward``; any other metric would fail only
    after the first rollout (``Finished groups are missing DAPO metric``). Raises ``ValueError``."""
    algorithm = config.get("algorithm") or {}
    filter_groups = algorithm.get("filter_groups") or {}
    if not filter_groups.get("enable", False):
        return
    metric = filter_groups.get("metric", None)
    agent = config.get("actor_rollout_ref", {}).get("rollout", {}).get("agent", {}).get("default_agent_loop")
    if settings.env.name and agent == "credit_agent" and metric not in FILTER_GROUPS_METRICS:
        raise ValueError(
            f"algorithm.filter_groups.metric={metric!r}: with credit.env.name={settings.env.name!r} the credit_agent "
            f"loop records the environment's reward only as rm_scores and reward_extra_info.env_reward; "
            f"set algorithm.filter_groups.metric to one of {list(FILTER_GROUPS_METRICS)}"
        )


def _fetch_extra_infos(batch: KVBatchMeta) -> list[Mapping[str, Any] | None]:
    """Each row's ``extra_info`` (verl stores the dataset row's fields with every output); rows
    without one get ``None`` (their replays fail, counted)."""
    fetched = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_info"])
    values = fetched.get("extra_info", None) if "extra_info" in fetched.keys() else None
    if values is None:
        logger.warning("credit: the batch has no extra_info field; replays cannot find their tasks")
        return [None] * len(batch.keys)
    return [value if isinstance(value, Mapping) else None for value in values.tolist()]
