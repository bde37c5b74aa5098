"""Training rows -> sessions -> action spans: the bookkeeping between verl's batch and the credit core.

verl 0.9.1 stores every agent-loop output as a row keyed ``{uid}_{session_id}_{index}``: one
*session* is one rollout (one trajectory), ``index`` orders its outputs, the largest index is
the session's final output (its reward is the session's reward). Synthetic padding rows
(``tags[i]["is_padding"]``) copy row 0's fields and are never part of a session.

Notation:
    rows: training rows of the batch. B: sessions (trajectories). S: most spans in a row.
    spans of a row: ``(action, start, end)``, ``action`` indexing the session's assistant
    messages, ``[start, end)`` offsets into the row's response.

:func:`plan_mini_batches` sizes the actor's mini-batches *in rows* so that a ``per_request`` step
(one row per model request) makes as many optimizer updates as the same step in the ``merged``
layout (one row per session), see its docstring for verl's rules it satisfies.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from verl_credit.credit_math.tokens import spans_from_response_mask

__all__ = [
    "CREDIT_KEY",
    "VALIDATE_KEY",
    "MiniBatchPlan",
    "Session",
    "ValidationBatches",
    "build_span_tensors",
    "count_sessions",
    "group_sessions",
    "plan_mini_batches",
    "session_spans",
    "tag_validation_batch",
]

CREDIT_KEY = "credit"
#: column the credit trainer adds to every validation batch (True per row); verl hands each
#: column of a batch to ``AgentLoopBase.run(**kwargs)``, so the agent loop sees
#: ``kwargs["credit_validate"]`` on validation episodes only
VALIDATE_KEY = "credit_validate"
Span = tuple[int, int, int]


@dataclass
class Session:
    """One trajectory's rows. ``rows`` are batch positions in output-index order."""

    key: str
    uid: str
    rows: list[int] = field(default_factory=list)
    indices: list[int] = field(default_factory=list)

    @property
    def final_row(self) -> int:
        """The row of the largest output index (verl's "final output" of the session)."""
        return self.rows[self.indices.index(max(self.indices))]


def split_key(key: str) -> tuple[str, int]:
    """``{uid}_{session}_{index}`` -> (``{uid}_{session}``, index); raises ValueError naming the key."""
    parts = key.rsplit("_", 2)
    if len(parts) != 3 or not parts[2].lstrip("-").isdigit():
        raise ValueError(f"batch key {key!r} is not of the form {{uid}}_{{session_id}}_{{index}}")
    return f"{parts[0]}_{parts[1]}", int(parts[2])


def group_sessions(
    keys: Sequence[str], tags: Sequence[Mapping[str, Any]], uids: Sequence[Any]
) -> tuple[list[Session], list[int]]:
    """Sessions in order of first appearance (the order verl's GRPO iterates them), and for
    every row its session (``-1`` for padding rows).
    """
    sessions: dict[str, Session] = {}
    position: dict[str, int] = {}
    row_session: list[int] = []
    for row, (key, tag) in enumerate(zip(keys, tags, strict=True)):
        if tag.get("is_padding", False):
            row_session.append(-1)
            continue
        session_key, index = split_key(key)
        if session_key not in sessions:
            sessions[session_key] = Session(session_key, str(uids[row]))
            position[session_key] = len(position)
        session = sessions[session_key]
        session.rows.append(row)
        session.indices.append(index)
        row_session.append(position[session_key])
    ordered = list(sessions.values())
    for session in ordered:
        ranked = sorted(zip(session.indices, session.rows, strict=True))
        session.indices = [i for i, _ in ranked]
        session.rows = [r for _, r in ranked]
    return ordered, row_session


def credit_payload(extra: Any) -> Mapping[str, Any]:
    """``extra_fields["credit"]`` of a row, or an empty mapping."""
    if isinstance(extra, Mapping):
        payload = extra.get(CREDIT_KEY)
        if isinstance(payload, Mapping):
            return payload
    return {}


def session_spans(
    session: Session, extras: Sequence[Any], masks: Sequence[torch.Tensor], keys: Sequence[str]
) -> tuple[dict[int, list[Span]], bool]:
    """Spans of every row of a session, checked against the rows' response masks.

    Recorded spans (``extra_fields["credit"]["spans"]``, written by ``credit_agent``) are used
    when every row has them; otherwise each maximal run of ones in a row's mask is one action,
    numbered consecutively over the session's rows (stock agent loops). Returns the spans and
    whether they were recorded.

    Raises:
        ValueError: a recorded span outside the row, over a masked token, or spans that do not
            cover every trainable token (names the row key).
    """
    recorded = all("spans" in credit_payload(extras[row]) for row in session.rows)
    spans: dict[int, list[Span]] = {}
    next_action = 0
    for row in session.rows:
        mask = masks[row]
        if recorded:
            row_spans = [(int(a), int(s), int(e)) for a, s, e in credit_payload(extras[row])["spans"]]
            _check_spans(row_spans, mask, keys[row])
        else:
            runs = spans_from_response_mask(mask.unsqueeze(0))[0]
            row_spans = [(next_action + k, start, end) for k, (start, end) in enumerate(runs)]
            next_action += len(runs)
        spans[row] = row_spans
    return spans, recorded


def _check_spans(spans: list[Span], mask: torch.Tensor, key: str) -> None:
    length = int(mask.shape[0])
    covered = 0
    for action, start, end in spans:
        if action < 0 or not 0 <= start <= end <= length:
            raise ValueError(f"row {key}: span (action={action}, {start}, {end}) outside a response of {length} tokens")
        if not bool(mask[start:end].bool().all()):
            raise ValueError(f"row {key}: span (action={action}, {start}, {end}) covers tokens with response_mask 0")
        covered += end - start
    trainable = int(mask.sum())
    if covered != trainable:
        raise ValueError(f"row {key}: spans cover {covered} tokens but response_mask has {trainable} trainable tokens")


def session_lengths(spans: Mapping[int, list[Span]], num_actions: int) -> list[int]:
    """``L_i`` per action: trainable tokens of action ``i`` summed over the session's rows."""
    lengths = [0] * num_actions
    for row_spans in spans.values():
        for action, start, end in row_spans:
            if action >= num_actions:
                raise ValueError(f"span names action {action} but the session has {num_actions} actions")
            lengths[action] += end - start
    return lengths


def build_span_tensors(spans_per_row: Sequence[Sequence[Span]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Ragged spans -> ``(rows, S)`` long tensors ``span_action, span_start, span_end``
    (padding: action -1, start = end = 0), sorted by start within a row."""
    width = max((len(s) for s in spans_per_row), default=0)
    width = max(width, 1)
    rows = len(spans_per_row)
    action = torch.full((rows, width), -1, dtype=torch.long)
    start = torch.zeros((rows, width), dtype=torch.long)
    end = torch.zeros((rows, width), dtype=torch.long)
    for row, row_spans in enumerate(spans_per_row):
        for column, (a, s, e) in enumerate(sorted(row_spans, key=lambda span: span[1])):
            action[row, column], start[row, column], end[row, column] = a, s, e
    return action, start, end


def count_sessions(keys: Sequence[str], tags: Sequence[Mapping[str, Any]]) -> int:
    """Sessions among the rows (padding rows excluded)."""
    return len({split_key(key)[0] for key, tag in zip(keys, tags, strict=True) if not tag.get("is_padding", False)})


@dataclass(frozen=True)
class MiniBatchPlan:
    """One step's optimizer updates, per training role (``actor``, ``critic``).

    ``batch_multiple``: what verl pads the batch to a multiple of (``_get_required_batch_multiple``);
    ``padded_rows``: the batch after that padding; ``updates[role]``: optimizer updates per epoch;
    ``mini_batch_rows[role]``: the ``mini_batch_size`` (= ``global_batch_size``) the role's
    ``train_mini_batch`` gets, ``padded_rows == updates * mini_batch_rows``.
    """

    rows: int
    sessions: int
    padded_rows: int
    batch_multiple: int
    updates: Mapping[str, int]
    mini_batch_rows: Mapping[str, int]

    @property
    def rows_per_session(self) -> float:
        return self.rows / self.sessions


def plan_mini_batches(
    rows: int,
    sessions: int,
    mini_batch_sessions: Mapping[str, int],
    dp_size: int = 1,
    micro_batch_sizes: Mapping[str, int] | None = None,
    forward_micro_batch_sizes: Sequence[int] = (),
) -> MiniBatchPlan:
    """Mini-batches in rows that give a step of ``rows`` rows (``sessions`` sessions) the optimizer
    updates the same sessions get in the merged layout (one row per session).

    verl 0.9.1 (V1 trainer, engine workers) splits by rows: ``_balance_batch`` pads the batch to a
    multiple of ``lcm(dp, ppo_mini_batch_size * n, ...)`` (``_get_required_batch_multiple``), each
    dp rank gets ``rows / dp`` rows and ``TrainingWorker.train_mini_batch`` makes
    ``(rows / dp) // (mini_batch_size / dp)`` optimizer steps per epoch, asserting
    ``mini_batch_size % dp == 0`` and (``tu.make_iterator``) that ``mini_batch_size / dp`` divides
    ``rows / dp``; without dynamic batch size ``prepare_micro_batches`` asserts that the micro-batch
    size per GPU divides every mini-batch (training) and every rank's rows (forward passes).

    Merged: ``P = ceil(sessions / L) * L`` rows with ``L = lcm(dp, *mini_batch_sessions)`` and
    ``updates[role] = P / mini_batch_sessions[role]``. Here: the batch is padded to a multiple of
    ``lcm(dp * f for f in forward_micro_batch_sizes, updates[role] * dp * micro_batch_sizes[role])``,
    so ``mini_batch_rows[role] = padded_rows / updates[role]`` satisfies every rule above.

    Args:
        rows: real rows of the step (no padding yet).
        sessions: sessions among them.
        mini_batch_sessions: per role, sessions per update (``ppo_mini_batch_size * rollout.n``).
        dp_size: data-parallel ranks of the actor.
        micro_batch_sizes: per role, the training micro-batch size per GPU (1 with dynamic bsz).
        forward_micro_batch_sizes: micro-batch sizes per GPU of the forward passes over the whole
            batch (old log-probs, reference, values; 1 with dynamic bsz).

    Raises:
        ValueError: a size below 1 or fewer rows than sessions.
    """
    micro = dict(micro_batch_sizes or {})
    sizes = [dp_size, *mini_batch_sessions.values(), *micro.values(), *forward_micro_batch_sizes]
    if sessions < 1 or rows < sessions or any(int(size) < 1 for size in sizes):
        raise ValueError(
            f"plan_mini_batches: need 1 <= sessions <= rows and sizes >= 1, got rows={rows}, sessions={sessions}, "
            f"mini_batch_sessions={dict(mini_batch_sessions)}, dp_size={dp_size}, micro={micro}, "
            f"forward_micro={list(forward_micro_batch_sizes)}"
        )
    merged_multiple = math.lcm(dp_size, *mini_batch_sessions.values())
    merged_rows = -(-sessions // merged_multiple) * merged_multiple
    updates = {role: merged_rows // size for role, size in mini_batch_sessions.items()}
    multiple = math.lcm(
        dp_size,
        *(dp_size * int(size) for size in forward_micro_batch_sizes),
        *(updates[role] * dp_size * int(micro.get(role, 1)) for role in updates),
    )
    padded = -(-rows // multiple) * multiple
    return MiniBatchPlan(
        rows=rows,
        sessions=sessions,
        padded_rows=padded,
        batch_multiple=multiple,
        updates=updates,
        mini_batch_rows={role: padded // count for role, count in updates.items()},
    )


def tag_validation_batch(batch_dict: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a validation dataloader batch with :data:`VALIDATE_KEY` = True on every row (an
    object array of Python bools, the way verl turns ``uid`` into a per-row column)."""
    tagged = dict(batch_dict)
    if "raw_prompt" in tagged:
        size = len(tagged["raw_prompt"])
    else:
        size = len(next(iter(tagged.values()))) if tagged else 0
    column = np.empty(size, dtype=object)
    column[:] = True
    tagged[VALIDATE_KEY] = column
    return tagged


class ValidationBatches:
    """Iterable over a validation dataloader's batches, each tagged by :func:`tag_validation_batch`;
    every other attribute (``len``, ``batch_size``, ``state_dict`` ...) is the loader's."""

    def __init__(self, loader: Iterable[Mapping[str, Any]]):
        self.loader = loader

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch_dict in self.loader:
            yield tag_validation_batch(batch_dict)

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name == "loader":  # not set yet (copy/unpickle): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)
