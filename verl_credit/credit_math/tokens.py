"""Per-action values -> ``(bs, response_len)`` token tensors through exact token spans.

Notation:
    B: training rows. R: response length. S: the largest number of spans in a row.
    span_action: ``(B, S)`` action index (into the row's trajectory) of each span, -1 = padding.
    span_start, span_end: ``(B, S)`` half-open token offsets ``[start, end)`` in the row's
        response; spans of a row are sorted and disjoint; padding spans have ``start = end = 0``.
    action_values: ``(B, T)`` the value of every action of the row's trajectory.

A row may hold any subset of its trajectory's actions (merged layout: all of them; per-request
layout: the one action of that request), so a span names its action explicitly.

Vectorized: every row is cut into ``2S + 1`` segments (gap, span, gap, ..., gap) whose lengths
come from the span offsets, and one ``np.repeat`` writes each segment's value over its tokens.
Values are *copied*, never recomputed per token, so a weight of exactly 1 reproduces the
per-action value bit-for-bit; this is one pass over the output (as fast as verl's own
``A * response_mask``, see BENCHMARKS.md). Tensors are CPU tensors (verl's trainer holds the
batch on CPU at advantage time).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import numpy as np
import torch

__all__ = [
    "pad_spans",
    "scatter_action_values_to_tokens",
    "spans_from_response_mask",
]


def _span_segments(
    span_action: np.ndarray, span_start: np.ndarray, span_end: np.ndarray, response_length: int
) -> tuple[np.ndarray, np.ndarray]:
    """Each row as ``2S + 1`` consecutive segments ``gap, span_0, gap, span_1, ..., gap``.

    Returns ``(segment_kind, segment_length)``, each ``(B, 2S + 1)``: kind ``k + 1`` for span ``k``
    and 0 for a gap; padding spans (``span_action < 0``) become empty segments.
    """
    padding = span_action < 0
    # padding spans sit after the real ones: pin them to the last real end (empty, no gap)
    real_end = np.where(padding, 0, span_end)
    last_end = np.maximum.accumulate(real_end, axis=1)
    start = np.where(padding, last_end, span_start)
    end = np.where(padding, last_end, span_end)
    previous_end = np.concatenate([np.zeros_like(end[:, :1]), end[:, :-1]], axis=1)
    batch, width = start.shape
    lengths = np.empty((batch, 2 * width + 1), dtype=np.int64)
    lengths[:, 0:-1:2] = start - previous_end
    lengths[:, 1::2] = end - start
    lengths[:, -1] = response_length - (end[:, -1] if width else 0)
    kinds = np.zeros((batch, 2 * width + 1), dtype=np.int64)
    kinds[:, 1::2] = np.arange(1, width + 1)
    return kinds, lengths


def scatter_action_values_to_tokens(
    action_values: torch.Tensor,
    span_action: torch.Tensor,
    span_start: torch.Tensor,
    span_end: torch.Tensor,
    response_length: int,
    gap_values: torch.Tensor | None = None,
) -> torch.Tensor:
    """Token tensor whose value on every token of a span is its action's value.

    Args:
        action_values: ``(B, T)`` (CPU).
        span_action, span_start, span_end: ``(B, S)`` (see module notation). Spans that overlap,
            are unsorted, or leave the response raise ``ValueError``.
        response_length: R.
        gap_values: ``(B,)`` value of tokens outside every span (default 0).

    Returns:
        ``(B, R)`` tensor with ``action_values``' dtype. Values are copied (``np.repeat`` of the
        per-segment values), never recomputed per token.
    """
    batch = action_values.shape[0]
    if gap_values is None:
        gap_values = torch.zeros(batch, dtype=action_values.dtype)
    span_values = action_values.gather(1, span_action.long().clamp_min(0))  # (B, S)
    action = span_action.numpy()
    kinds, lengths = _span_segments(action, span_start.numpy(), span_end.numpy(), response_length)
    segment_values = np.empty(kinds.shape, dtype=span_values.numpy().dtype)
    segment_values[:] = gap_values.numpy()[:, None]
    segment_values[:, 1::2] = np.where(action >= 0, span_values.numpy(), gap_values.numpy()[:, None])
    if (lengths < 0).any():
        raise ValueError("token spans must be sorted, disjoint and within the response length")
    flat = np.repeat(segment_values.ravel(), lengths.ravel())
    if flat.size != batch * response_length:
        raise ValueError(f"token spans do not tile responses of length {response_length}")
    return torch.from_numpy(flat.reshape(batch, response_length))


def pad_spans(
    spans: Sequence[Sequence[tuple[int, int]]], actions: Sequence[Sequence[int]] | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Ragged per-row span lists -> ``(span_action, span_start, span_end)``, each ``(B, S)``.

    ``actions[row][k]`` is the action index of span ``k`` (default: ``k``, the merged layout).
    Built with one flat copy per field (no per-row tensor work).
    """
    counts = np.fromiter((len(row) for row in spans), dtype=np.int64, count=len(spans))
    width = max(int(counts.max(initial=0)), 1)
    present = np.arange(width)[None, :] < counts[:, None]
    total = int(counts.sum())
    flat = np.fromiter(chain.from_iterable(chain.from_iterable(spans)), dtype=np.int64, count=2 * total)
    starts = np.zeros((len(spans), width), dtype=np.int64)
    ends = np.zeros((len(spans), width), dtype=np.int64)
    starts[present], ends[present] = flat[0::2], flat[1::2]
    span_action = np.full((len(spans), width), -1, dtype=np.int64)
    if actions is None:
        span_action[present] = np.nonzero(present)[1]
    else:
        span_action[present] = np.fromiter(chain.from_iterable(actions), dtype=np.int64, count=total)
    return torch.from_numpy(span_action), torch.from_numpy(starts), torch.from_numpy(ends)


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
