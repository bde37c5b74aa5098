"""Per-action values -> ``(bs, response_len)`` token tensors through exact token spans.

Notation:
    B: training rows. R: response length. S: the largest number of spans in a row.
    span_action: ``(B, S)`` action index (into the row's trajectory) of each span, -1 = padding.
    span_start, span_end: ``(B, S)`` half-open token offsets ``[start, end)`` in the row's
        response; spans of a row are sorted and disjoint; padding spans have ``start = end = 0``.
    action_values: ``(B, T)`` the value of every action of the row's trajectory.

A row may hold any subset of its trajectory's actions (merged layout: all of them; per-request
layout: the one action of that request), so a span names its action explicitly.

Vectorized: one cumulative sum assigns every token to the span that covers it; no Python loop
over tokens or spans.
"""

from __future__ import annotations

import torch

__all__ = ["scatter_action_values_to_tokens", "spans_from_response_mask", "token_span_index"]


def token_span_index(span_start: torch.Tensor, span_end: torch.Tensor, response_length: int) -> torch.Tensor:
    """For every token, the index of the span that covers it, or -1.

    Args:
        span_start, span_end: ``(B, S)`` sorted, disjoint, half-open spans (padding: 0, 0).
        response_length: R.

    Returns:
        ``(B, R)`` long tensor.
    """
    batch, _ = span_start.shape
    starts = torch.zeros(batch, response_length + 1, dtype=torch.long, device=span_start.device)
    ends = torch.zeros_like(starts)
    real = span_end > span_start
    # Every non-empty span marks its start (+1) and its end (+1 in a separate counter).
    starts.scatter_add_(1, span_start.long(), real.long())
    ends.scatter_add_(1, span_end.long(), real.long())
    opened = starts.cumsum(dim=1)[:, :response_length]
    closed = ends.cumsum(dim=1)[:, :response_length]
    inside = opened > closed
    # Index among non-empty spans -> index among all spans (empty/padding spans are skipped).
    nonempty_rank = real.long().cumsum(dim=1) - 1  # (B, S): rank of each span among non-empty ones
    rank_to_span = torch.full_like(span_start, -1, dtype=torch.long)
    span_ids = torch.arange(span_start.shape[1], device=span_start.device).expand_as(span_start)
    safe_rank = torch.where(real, nonempty_rank, torch.full_like(nonempty_rank, span_start.shape[1]))
    rank_to_span = torch.cat([rank_to_span, rank_to_span[:, :1]], dim=1)
    rank_to_span.scatter_(1, safe_rank, torch.where(real, span_ids, -1))
    rank = (opened - 1).clamp_min(0)
    covering = rank_to_span.gather(1, rank)
    return torch.where(inside, covering, torch.full_like(covering, -1))


def scatter_action_values_to_tokens(
    action_values: torch.Tensor,
    span_action: torch.Tensor,
    span_start: torch.Tensor,
    span_end: torch.Tensor,
    response_length: int,
) -> torch.Tensor:
    """Token tensor whose value on every token of a span is its action's value; 0 elsewhere.

    Args:
        action_values: ``(B, T)``.
        span_action, span_start, span_end: ``(B, S)`` (see module notation).
        response_length: R.

    Returns:
        ``(B, R)`` tensor with ``action_values``' dtype.
    """
    span_of_token = token_span_index(span_start, span_end, response_length)
    inside = span_of_token >= 0
    action_of_token = span_action.long().gather(1, span_of_token.clamp_min(0))
    inside = inside & (action_of_token >= 0)
    values = action_values.gather(1, action_of_token.clamp_min(0))
    return torch.where(inside, values, torch.zeros_like(values))


def spans_from_response_mask(response_mask: torch.Tensor) -> list[list[tuple[int, int]]]:
    """Maximal runs of 1s per row, as ``[(start, end), ...]``.

    In verl's multi-turn rows every assistant turn is one such run (turns are separated by at
    least one masked context token), so this recovers the action spans when a rollout did not
    record them. Shapes: ``(B, R)`` -> B lists.
    """
    mask = response_mask.to(torch.int8)
    padded = torch.nn.functional.pad(mask, (1, 1))
    change = padded[:, 1:] - padded[:, :-1]
    rows, positions = torch.nonzero(change != 0, as_tuple=True)
    values = change[rows, positions]
    spans: list[list[tuple[int, int]]] = [[] for _ in range(mask.shape[0])]
    opened: dict[int, int] = {}
    for row, position, value in zip(rows.tolist(), positions.tolist(), values.tolist(), strict=True):
        if value > 0:
            opened[row] = position
        else:
            spans[row].append((opened.pop(row), position))
    return spans
