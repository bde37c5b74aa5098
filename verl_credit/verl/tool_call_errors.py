"""Count, per episode, the tool calls verl's tool parser could not decode.

verl's parsers (``verl/experimental/agent_loop/tool_parser.py``) drop a call whose JSON does not
decode (or lacks ``name``/``arguments``) and only log ``Failed to decode tool call: ...`` at
ERROR level; the turn then goes on as if the model had written text. A policy that drifts into
malformed calls (thousands a run at a high learning rate) is invisible in the metrics unless this
is counted. Every verl parser logs that same message, so counting the log records counts for any
``multi_turn.format``.

Attribution: the agent-loop worker runs many episodes concurrently on one event loop, each as its
own asyncio task; a :class:`~contextvars.ContextVar` set for the duration of an episode (each task
has its own context) tells the log filter whose call failed. Records logged outside an episode are
not counted and pass through unchanged (the filter never drops a record).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["MALFORMED_TOOL_CALL_MESSAGE", "MalformedToolCalls", "count_malformed_tool_calls"]

#: the start of the message verl's tool parsers log for a call they dropped
MALFORMED_TOOL_CALL_MESSAGE = "Failed to decode tool call"


class MalformedToolCalls:
    """The running count of one episode."""

    def __init__(self) -> None:
        self.count = 0


_CURRENT: ContextVar[MalformedToolCalls | None] = ContextVar("credit_malformed_tool_calls", default=None)


class _CountingFilter(logging.Filter):
    """Adds one to the current episode's count for each decode failure; keeps every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        counter = _CURRENT.get()
        if counter is not None and str(record.msg).startswith(MALFORMED_TOOL_CALL_MESSAGE):
            counter.count += 1
        return True


_FILTER = _CountingFilter()


def _parser_logger() -> logging.Logger:
    # verl names the logger after the module's file path (``logging.getLogger(__file__)``)
    from verl.experimental.agent_loop import tool_parser

    return tool_parser.logger


@contextmanager
def count_malformed_tool_calls() -> Iterator[MalformedToolCalls]:
    """Within the block, decode failures logged by verl's tool parser in this task's context are
    counted in the yielded :class:`MalformedToolCalls` (nested blocks count in the innermost)."""
    logger = _parser_logger()
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
    counter = MalformedToolCalls()
    token = _CURRENT.set(counter)
    try:
        yield counter
    finally:
        _CURRENT.reset(token)
