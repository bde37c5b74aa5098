"""``credit_sync``: verl's V1 sync trainer with ``_compute_advantage`` replaced by the credit path.

Per step (``CreditTrainerSync._compute_advantage``), on the batch already in TransferQueue:

1. fetch the fields verl's own ``_compute_advantage`` fetches, plus ``extra_fields``;
2. KL-in-reward and rollout correction exactly as verl does them (same functions);
3. :func:`compute_credit_advantages`: rows -> sessions (``{uid}_{session}_{index}``; padding rows
   skipped), one score per session from its *final* output (verl's multi-output GRPO rule),
   graphs read from ``extra_fields`` (annotated in the rollout) or annotated now (counted),
   ``routing.compute_batch_credit`` + ``routing.route_token_advantages``;
4. write ``advantages``/``returns`` (and verl's optional fields) back, as verl does;
5. DESIGN section 6 metrics into ``metrics`` (verl's tracker logs them).

With uniform graphs (or ``algorithm.adv_estimator=grpo``) the written advantages equal verl's
GRPO advantages bit-for-bit.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
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
from verl_credit.credit.call_credit import fuse_token_advantages
from verl_credit.credit.call_extras import route_rv_reward_tokens, rv_reward_matrix
from verl_credit.credit.tokens import scatter_action_values_to_tokens
from verl_credit.graph import GraphValidation, InfluenceGraph
from verl_credit.metrics import compute_credit_metrics
from verl_credit.routing import BatchCredit, compute_batch_credit, route_token_advantages
from verl_credit.trajectory import Trajectory
from verl_credit.verl.annotation import annotate_now, build_call_graph, result_from_payload
from verl_credit.verl.batch import (
    Session,
    build_span_tensors,
    credit_payload,
    group_sessions,
    session_lengths,
    session_spans,
)
from verl_credit.verl.settings import CREDIT_TRAINER_MODE, AnnotatorSettings, CreditSettings, load_settings

__all__ = [
    "CreditStep",
    "CreditTrainerSync",
    "SessionGraphs",
    "SessionInputs",
    "compute_credit_advantages",
    "read_sessions",
    "session_graphs",
    "token_advantages",
]

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))

Annotate = Callable[[Sequence[Trajectory], AnnotatorSettings], list[AnnotationResult]]


@dataclass
class CreditStep:
    """One batch's credit: token advantages for every row and what produced them."""

    advantages: torch.Tensor  # (rows, R)
    credit: BatchCredit | None  # None when the batch holds only padding rows
    sessions: list[Session]
    metrics: dict[str, float]


@dataclass
class SessionInputs:
    """Per session (B) and per row: what the credit core needs, read from the batch."""

    scores: torch.Tensor  # (B,) reward of each session's final output
    lengths: list[list[int]]  # B lists: L_i per action
    payloads: list[Mapping[str, Any]]  # extra_fields["credit"] of each final row
    trajectories: list[Trajectory | None]  # the transcripts (None when a session has none)
    spans_per_row: list[list[tuple[int, int, int]]]  # rows lists of (action, start, end)


@dataclass
class SessionGraphs:
    graphs: list[InfluenceGraph] | None = None
    call_graphs: list[CallGraph] | None = None
    rv_statuses: list[list[str | None]] = field(default_factory=list)
    stats: AnnotationStats | None = None
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
) -> CreditStep:
    """Token advantages of a verl batch (rows padded to ``R``).

    Args:
        keys, tags, uids, extras: per row, as stored in TransferQueue.
        rollout_mask: ``(rows, R)`` response mask as produced by the rollout (defines the spans).
        response_mask: ``(rows, R)`` mask after rollout correction (tokens it zeroes get 0).
        token_level_rewards: ``(rows, R)``; a session's score is the sum over its final row.
        settings: the ``credit`` node.
        annotate: synchronous annotator for sessions that arrive without a graph.

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
    credit = compute_batch_credit(
        inputs.scores, [s.uid for s in sessions], inputs.lengths, settings.credit, found.graphs, found.call_graphs
    )
    row_trajectory = torch.tensor([max(s, 0) for s in row_session], dtype=torch.long)
    routed, rv_total = token_advantages(credit, row_trajectory, inputs.spans_per_row, response_length, settings, found)
    real = torch.tensor([s >= 0 for s in row_session], dtype=torch.bool).unsqueeze(-1)
    advantages = torch.where(real, routed * response_mask, advantages)

    metrics = compute_credit_metrics(
        credit,
        found.stats,
        [t for t in inputs.trajectories if t is not None],
        graphs=found.graphs,
        call_graphs=found.call_graphs,
        rewards=inputs.scores,
    )
    if rv_total is not None:
        metrics["credit/rv_reward_per_session"] = rv_total / len(sessions)
    metrics["credit/annotated_in_trainer"] = float(found.annotated_in_trainer)
    metrics["credit/missing_transcript"] = float(found.missing_transcript)
    metrics["credit/sessions"] = float(len(sessions))
    metrics["credit/rows_per_session"] = float(sum(len(s.rows) for s in sessions)) / len(sessions)
    return CreditStep(advantages, credit, sessions, metrics)


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
    return SessionInputs(scores, lengths, payloads, trajectories, spans_per_row)


def session_graphs(
    sessions: list[Session], inputs: SessionInputs, settings: CreditSettings, annotate: Annotate
) -> SessionGraphs:
    """Influence graphs (iapo) or call graphs (call_credit) of every session."""
    found = SessionGraphs()
    if settings.estimator == "iapo":
        results = _influence_graphs(sessions, inputs, settings.annotator, annotate, found)
        found.graphs = [result.graph for result in results]
        found.stats = AnnotationStats()
        for result in results:
            found.stats.add(result)
    elif settings.estimator == "call_credit":
        found.call_graphs, found.rv_statuses = _call_graphs(sessions, inputs, found)
    return found


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


def _influence_graphs(
    sessions: list[Session],
    inputs: SessionInputs,
    settings: AnnotatorSettings,
    annotate: Annotate,
    found: SessionGraphs,
) -> list[AnnotationResult]:
    """The stored graph of each session; sessions without one are annotated now (counted), and
    sessions without a transcript fall back to the uniform graph (counted)."""
    results: list[AnnotationResult | None] = []
    pending: list[int] = []
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
        elif result is None:
            pending.append(number)
        results.append(result)
    if pending:
        found.annotated_in_trainer += len(pending)
        annotated = annotate([inputs.trajectories[n] for n in pending], settings)  # type: ignore[misc]
        for number, result in zip(pending, annotated, strict=True):
            results[number] = result
    return [result for result in results if result is not None]


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
        settings = load_settings(config)  # fails before any worker starts
        with open_dict(config):
            # The mode string also selects the replay buffer, refill and checkpoint behaviour
            # (VERL_NOTES section 1): keep verl's "sync" semantics.
            config.trainer.v1.trainer_mode = "sync"
        super().__init__(config)
        self._credit_settings: CreditSettings | None = settings

    @property
    def credit_settings(self) -> CreditSettings:
        if getattr(self, "_credit_settings", None) is None:
            self._credit_settings = load_settings(self.config)
        return self._credit_settings  # type: ignore[return-value]

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

        # 3: credit
        step = compute_credit_advantages(
            batch.keys,
            batch.tags,
            uids,
            extras,
            rollout_mask,
            data.batch["response_mask"],
            data.batch["token_level_rewards"],
            self.credit_settings,
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
        return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=output)
