"""One step's token advantages from a verl batch: sessions -> estimator inputs -> batch credit ->
(optional CALL-CREDIT parts) -> token advantages (the estimator's token hook included) + the
step's metrics."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from verl_credit.batch_credit import credit_from_inputs, estimator_token_advantages
from verl_credit.estimators.registry import TokenLayout
from verl_credit.metrics import compute_credit_metrics
from verl_credit.verl.annotation import annotate_now
from verl_credit.verl.batch import build_span_tensors, group_sessions
from verl_credit.verl.call_adjustments_step import CallAdjustmentsState, apply_call_adjustments, session_reward
from verl_credit.verl.session_failures import drop_failed_groups
from verl_credit.verl.session_inputs import (
    Annotate,
    CreditStep,
    annotation_timed_out,
    neutralize_groups,
    payload_count,
    read_sessions,
    session_graphs,
)
from verl_credit.verl.settings import CreditSettings

__all__ = ["compute_credit_advantages"]

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))


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
    call_adjustments: CallAdjustmentsState | None = None,
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
        call_adjustments: the trainer's state of the optional CALL-CREDIT parts (call_credit only;
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
    # groups with a session that failed outside the policy (user, environment, rollout server,
    # deadline) are left out: their rows get 0, counted (verl_credit.verl.session_failures)
    sessions, row_session, failures = drop_failed_groups(sessions, row_session, extras)
    if not sessions:
        return CreditStep(advantages, None, [], failures.metrics())

    inputs = read_sessions(sessions, keys, extras, rollout_mask, token_level_rewards)
    found = session_graphs(sessions, inputs, settings, annotate)
    state = call_adjustments if call_adjustments is not None and call_adjustments.applies_to(settings) else None
    config = state.credit_config(settings.credit) if state is not None else settings.credit
    estimator_inputs = found.estimator_inputs([s.uid for s in sessions], inputs.scores)
    credit = credit_from_inputs(estimator_inputs, inputs.lengths, config)
    if inputs.nonfinite:
        neutralize_groups(credit, sessions, inputs.nonfinite)
    extra_metrics: dict[str, float] = {}
    if state is not None:
        infos = [dict((extra_infos[s.final_row] if extra_infos is not None else None) or {}) for s in sessions]
        rewards = [session_reward(extras[s.final_row], float(inputs.scores[n])) for n, s in enumerate(sessions)]
        credit, extra_metrics = apply_call_adjustments(credit, inputs, infos, rewards, settings.env, state, step)
    row_trajectory = torch.tensor([max(s, 0) for s in row_session], dtype=torch.long)
    layout = TokenLayout(row_trajectory, *build_span_tensors(inputs.spans_per_row), response_length)
    routed, hook_metrics = estimator_token_advantages(credit, layout, estimator_inputs, config)
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
    metrics.update(hook_metrics)
    metrics.update(extra_metrics)
    metrics["credit/annotated_in_trainer"] = float(found.annotated_in_trainer)
    metrics["credit/trainer_annotation_timeouts"] = float(found.trainer_annotation_timeouts)
    metrics["credit/missing_transcript"] = float(found.missing_transcript)
    if found.turn_rewards is not None:
        metrics["credit/bad_turn_rewards"] = float(found.bad_turn_rewards)
        metrics["credit/turn_reward_sessions"] = float(sum(r is not None for r in found.turn_rewards))
    metrics["credit/annotation_timeouts"] = float(sum(annotation_timed_out(p) for p in inputs.payloads))
    metrics["credit/dropped_tool_calls"] = float(
        sum(payload_count(p.get("dropped_tool_calls")) for p in inputs.payloads)
    )
    metrics["credit/malformed_tool_calls"] = float(
        sum(payload_count(p.get("malformed_tool_calls")) for p in inputs.payloads)
    )
    metrics["credit/reward_failures"] = float(sum(payload_count(p.get("reward_failures")) for p in inputs.payloads))
    metrics["credit/nonfinite_rewards"] = float(len(inputs.nonfinite))
    metrics["credit/nonfinite_advantages"] = float(nonfinite_advantages.sum())
    metrics["credit/sessions"] = float(len(sessions))
    metrics.update(failures.metrics())
    metrics["credit/rows_per_session"] = float(sum(len(s.rows) for s in sessions)) / len(sessions)
    return CreditStep(advantages, credit, sessions, metrics, config)
