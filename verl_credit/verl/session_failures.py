"""Sessions that fail for a reason outside the policy: the simulated user, the environment, the
rollout (policy) server, or the session's deadline.

What verl 0.9.1 does with them (``verl/trainer/ppo/v1/agent_loop_tq.py``, ``replay_buffer.py``):
an exception in a session marks its prompt group ``failure``; the sync replay buffer does not
refill failed groups (``sync_refill_failed_groups`` is off), it trains on whatever sessions of
the group finished (a GRPO baseline of fewer rollouts), and it raises once the groups it
selected have no rows at all. A user simulator that hangs instead stalls the step for its per-request
timeout times its retries.

Here, in the agent loop:

* one deadline bounds the whole episode (``credit.session.deadline``), however many requests and
  retries it makes (:func:`run_within_deadline`);
* the failures the loop knows to be outside the policy are :class:`SessionFailure` (raised where
  they happen: starting the environment, the user's reply, the rollout server's generate);
* a failed *training* session becomes one placeholder row (:func:`failed_session_output`): no
  trainable token, ``extra_fields["credit"]["session_failed"]`` saying what failed, so verl sees a
  finished group and the trainer sees exactly which sessions failed. A validation session
  re-raises (verl's validation skips failed sessions itself).

In the trainer (:func:`drop_failed_groups`): every group with a failed session is left out of the
step's credit -- its rows get advantage 0, as a zero-variance group's -- and counted
(``credit/failed_sessions``, ``credit/failed_session_share``, ``credit/dropped_groups``,
``credit/failed_sessions_<kind>``); :mod:`verl_credit.verl.run_guards` stops the run when the
share passes ``credit.session.max_failed_share``.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from verl_credit.verl.batch import Session, credit_payload

__all__ = [
    "FAILED_KEY",
    "FAILURE_KINDS",
    "FailedSessions",
    "SessionFailure",
    "drop_failed_groups",
    "failed_session_output",
    "run_within_deadline",
]

#: ``extra_fields["credit"]`` key of a failed session's placeholder row: ``{"kind": ..., "reason": ...}``
FAILED_KEY = "session_failed"
#: what can fail: the simulated user, the environment (its start: tau2's asks the user simulator
#: for the first message), the rollout server (generate), or the session's own deadline
FAILURE_KINDS: tuple[str, ...] = ("user", "environment", "policy", "deadline")

T = TypeVar("T")


class SessionFailure(RuntimeError):
    """A session that could not finish for a reason outside the policy's actions."""

    def __init__(self, kind: str, reason: str):
        if kind not in FAILURE_KINDS:
            raise ValueError(f"session failure kind must be one of {FAILURE_KINDS}, got {kind!r}")
        super().__init__(f"{kind}: {reason}")
        self.kind = kind
        self.reason = reason


async def run_within_deadline(episode: Awaitable[T], deadline: float | None) -> T:
    """``await episode`` within ``deadline`` seconds (``None``: no limit); past it the episode is
    cancelled (its requests with it) and :class:`SessionFailure` ``deadline`` is raised."""
    if deadline is None:
        return await episode
    try:
        return await asyncio.wait_for(episode, timeout=deadline)
    except TimeoutError:
        raise SessionFailure(
            "deadline", f"the episode passed credit.session.deadline={deadline:g}s (rollout server and user included)"
        ) from None


def failed_session_output(
    failure: SessionFailure,
    token_id: int,
    *,
    global_steps: int,
    with_log_probs: bool,
    extra_fields: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The fields of a failed session's placeholder row (``AgentLoopOutput(**fields)``): one token of
    prompt and of response, nothing trainable, reward 0, and ``extra_fields["credit"][FAILED_KEY]``.

    ``global_steps`` stands in for the weight versions verl's metrics read from every row
    (``min_global_steps`` / ``max_global_steps``) when the session generated nothing; ``with_log_probs``:
    the rollout records log-probs, so every row must carry them.
    """
    extra = dict(extra_fields or {})
    extra.setdefault("min_global_steps", int(global_steps))
    extra.setdefault("max_global_steps", int(global_steps))
    extra.setdefault("turn_scores", [])
    extra.setdefault("tool_rewards", [])
    extra["reward_extra_info"] = {"env_reward": 0.0}
    extra["credit"] = {
        "spans": [],
        "row": 0,
        "rows": 1,
        "final": True,
        "num_actions": 0,
        FAILED_KEY: {"kind": failure.kind, "reason": failure.reason},
    }
    return {
        "prompt_ids": [int(token_id)],
        "response_ids": [int(token_id)],
        "response_mask": [0],
        "response_logprobs": [0.0] if with_log_probs else None,
        "routed_experts": None,
        "multi_modal_data": {},
        "reward_score": 0.0,
        "num_turns": 0,
        "extra_fields": extra,
    }


def failure_of(extra: Any) -> Mapping[str, Any] | None:
    """A row's ``session_failed`` record, or ``None``."""
    value = credit_payload(extra).get(FAILED_KEY)
    return value if isinstance(value, Mapping) else None


@dataclass
class FailedSessions:
    """One step's failed sessions and what was dropped because of them."""

    sessions: int = 0  # all sessions of the step, failed ones included
    failed: int = 0
    dropped_groups: int = 0
    dropped_sessions: int = 0  # failed ones and their healthy siblings
    kinds: Counter = field(default_factory=Counter)
    reasons: list[str] = field(default_factory=list)  # one per failed session: "key: kind: reason"

    @property
    def share(self) -> float:
        return self.failed / self.sessions if self.sessions else 0.0

    def metrics(self) -> dict[str, float]:
        metrics = {
            "credit/failed_sessions": float(self.failed),
            "credit/failed_session_share": self.share,
            "credit/dropped_groups": float(self.dropped_groups),
            "credit/dropped_sessions": float(self.dropped_sessions),
        }
        metrics.update({f"credit/failed_sessions_{kind}": float(self.kinds.get(kind, 0)) for kind in FAILURE_KINDS})
        return metrics


def drop_failed_groups(
    sessions: Sequence[Session], row_session: Sequence[int], extras: Sequence[Any]
) -> tuple[list[Session], list[int], FailedSessions]:
    """The sessions whose group has no failed session (in order), every row's position among them
    (``-1``: padding or dropped: advantage 0), and the count."""
    summary = FailedSessions(sessions=len(sessions))
    poisoned: set[str] = set()
    for session in sessions:
        failure = failure_of(extras[session.final_row])
        if failure is None:
            continue
        summary.failed += 1
        kind = str(failure.get("kind", "unknown"))
        summary.kinds[kind] += 1
        summary.reasons.append(f"{session.key}: {kind}: {failure.get('reason', '')}")
        poisoned.add(session.uid)
    if not poisoned:
        return list(sessions), list(row_session), summary
    kept: list[Session] = []
    renumber: dict[int, int] = {}
    for number, session in enumerate(sessions):
        if session.uid in poisoned:
            summary.dropped_sessions += 1
            continue
        renumber[number] = len(kept)
        kept.append(session)
    summary.dropped_groups = len(poisoned)
    return kept, [renumber.get(number, -1) for number in row_session], summary
