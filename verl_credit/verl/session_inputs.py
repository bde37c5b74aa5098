"""What the credit core needs of each session of a verl batch, read from the rows and their
``extra_fields["credit"]``: scores, per-action lengths, transcripts, spans, and what the estimator
``needs`` (influence graphs, call graphs, anchor states, turn rewards)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from verl_credit.anchor_states import anchor_states
from verl_credit.annotate.base import AnnotationResult, AnnotationStats
from verl_credit.batch_credit import BatchCredit
from verl_credit.call_graph import CallGraph
from verl_credit.config import CreditConfig
from verl_credit.estimators.needs import (
    INFORMATION_GAINS_KEY,
    TURN_REWARDS_KEY,
    check_information_gains,
    check_turn_rewards,
    gather_needs,
)
from verl_credit.estimators.registry import EstimatorInputs
from verl_credit.graph import GraphValidation, InfluenceGraph
from verl_credit.trajectory import Trajectory
from verl_credit.verl.annotation import TRAINER_DEADLINE_ERROR, build_call_graph, result_from_payload
from verl_credit.verl.batch import (
    Session,
    credit_payload,
    session_lengths,
    session_spans,
)
from verl_credit.verl.settings import AnnotatorSettings, CreditSettings

__all__ = [
    "TIMEOUT_ERROR",
    "Annotate",
    "CreditStep",
    "SessionGraphs",
    "SessionInputs",
    "neutralize_groups",
    "neutralize_rewards",
    "payload_count",
    "read_sessions",
    "session_graphs",
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
    anchor_states: list[list[str]] | None = None  # per action (gigpo, turn_reward)
    turn_rewards: list[list[float] | None] | None = None  # per action, where the environment gave them
    information_gains: list[list[float | None] | None] | None = None  # per action (info_gain)
    annotated_in_trainer: int = 0
    missing_transcript: int = 0
    bad_turn_rewards: int = 0
    trainer_annotation_timeouts: int = 0  # sessions the trainer's own annotation gave up on (its deadline)

    def estimator_inputs(self, uids: Sequence[Any], scores: torch.Tensor) -> EstimatorInputs:
        """What the estimator gets: the gathered needs of the B sessions (None: not needed)."""
        return EstimatorInputs(
            uids=list(uids),
            scores=scores,
            graphs=self.graphs,
            call_graphs=self.call_graphs,
            anchor_states=self.anchor_states,
            turn_rewards=self.turn_rewards,
            information_gains=self.information_gains,
            rv_statuses=self.rv_statuses if self.call_graphs is not None else None,
        )


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
    """What the estimator needs (``Estimator.needs``) of every session: influence graphs, call
    graphs, anchor states, turn rewards, information gains (the trainer's extra forward passes put
    them in each session's payload, ``verl_credit.verl.info_gain_step``)."""
    stats = AnnotationStats()
    found = SessionGraphs(stats=stats)

    def influence_graphs() -> list[InfluenceGraph]:
        results = _influence_graphs(sessions, inputs, settings.annotator, annotate, found)
        for result in results:
            stats.add(result)
        return [result.graph for result in results]

    def call_graphs() -> list[CallGraph]:
        graphs, found.rv_statuses = _call_graphs(sessions, inputs, found)
        stats.total = len(sessions)
        stats.parsed = len(sessions)
        stats.seconds = sum(float((p.get("annotation") or {}).get("seconds", 0.0)) for p in inputs.payloads)
        return graphs

    def per_session(read: Callable[[Session, Mapping[str, Any], int], Any]) -> Callable[[], list[Any]]:
        return lambda: [
            read(session, payload, len(lengths))
            for session, payload, lengths in zip(sessions, inputs.payloads, inputs.lengths, strict=True)
        ]

    gathered = gather_needs(
        settings.credit.registered_estimator.needs,
        {
            "influence_graphs": influence_graphs,
            "call_graphs": call_graphs,
            # read with the call graphs (gathered first), from the same payloads
            "rv_statuses": lambda: found.rv_statuses,
            "anchor_states": lambda: _anchor_states(sessions, inputs, settings.credit, found),
            "information_gains": per_session(_information_gains),
            "turn_rewards": per_session(lambda s, p, n: _turn_rewards(s, p, n, found)),
        },
        estimator=settings.estimator,
        where="the credit trainer",
    )
    for name, value in gathered.items():
        setattr(found, name, value)
    if found.call_graphs is None:
        found.role_graphs = _role_graphs(inputs.payloads)
    return found


def _information_gains(session: Session, payload: Mapping[str, Any], num_actions: int) -> list[float | None] | None:
    """The session's per-action information gains (``None``: it has none, GRPO credit); malformed
    ones are dropped with a warning: that session gets GRPO credit."""
    try:
        return check_information_gains(payload.get(INFORMATION_GAINS_KEY), num_actions, f"session {session.key}")
    except ValueError as exc:
        logger.warning("credit: %s; its information gains are ignored", exc)
        return None


def _turn_rewards(
    session: Session, payload: Mapping[str, Any], num_actions: int, found: SessionGraphs
) -> list[float] | None:
    """The session's per-action environment rewards; malformed ones (an environment bug) are
    dropped with a warning and counted (``credit/bad_turn_rewards``): that session gets GRPO credit."""
    try:
        return check_turn_rewards(payload.get(TURN_REWARDS_KEY), num_actions, f"session {session.key}")
    except ValueError as exc:
        found.bad_turn_rewards += 1
        logger.warning("credit: %s; its turn rewards are ignored", exc)
        return None


def _anchor_states(
    sessions: list[Session], inputs: SessionInputs, config: CreditConfig, found: SessionGraphs
) -> list[list[str]]:
    """Per-action anchor states from each session's transcript; a session without one gets states
    of its own (no anchor group: step advantage 0), counted in ``credit/missing_transcript``."""
    states: list[list[str]] = []
    for session, trajectory, lengths in zip(sessions, inputs.trajectories, inputs.lengths, strict=True):
        if trajectory is None:
            found.missing_transcript += 1
            states.append([f"{session.key}:{number}" for number in range(len(lengths))])
        else:
            states.append(anchor_states(trajectory, config.gigpo.state))
    return states


def _role_graphs(payloads: Sequence[Mapping[str, Any]]) -> list[CallGraph] | None:
    """The call roles the agent loop recorded for the metrics (``credit/reward_hacking_rate``) of
    estimators that do not route with them; None unless every session has them."""
    if not payloads or any(p.get("call_graph") is None for p in payloads):
        return None
    return [CallGraph.from_json(p["call_graph"]) for p in payloads]


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
        elif result is None and annotation_timed_out(payload):
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
            found.trainer_annotation_timeouts += int(result.error == TRAINER_DEADLINE_ERROR)
    if timed_out:
        rules = settings.rule_fallback()
        annotated = annotate([inputs.trajectories[n] for n in timed_out], rules)  # type: ignore[misc]
        for number, result in zip(timed_out, annotated, strict=True):
            results[number] = replace(result, source="fallback:rules", error=result.error or TIMEOUT_ERROR)
    return [result for result in results if result is not None]


def annotation_timed_out(payload: Mapping[str, Any]) -> bool:
    """Whether the agent loop marked the session's in-rollout annotation as past its deadline."""
    return bool(payload.get("annotation_timeout", False))


def payload_count(value: Any) -> int:
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
