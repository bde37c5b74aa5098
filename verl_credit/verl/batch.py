"""Training rows -> sessions -> action spans: the bookkeeping between verl's batch and the credit core.

verl 0.9.1 stores every agent-loop output as a row keyed ``{uid}_{session_id}_{index}``: one
*session* is one rollout (one trajectory), ``index`` orders its outputs, the largest index is
the session's final output (its reward is the session's reward). Synthetic padding rows
(``tags[i]["is_padding"]``) copy row 0's fields and are never part of a session.

Notation:
    rows: training rows of the batch. B: sessions (trajectories). S: most spans in a row.
    spans of a row: ``(action, start, end)``, ``action`` indexing the session's assistant
    messages, ``[start, end)`` offsets into the row's response.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from verl_credit.credit.tokens import spans_from_response_mask

__all__ = ["CREDIT_KEY", "Session", "build_span_tensors", "group_sessions", "session_spans"]

CREDIT_KEY = "credit"
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
