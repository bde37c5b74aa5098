"""Gateway-log ingestion: API-boundary logs (OpenAI chat completions, Anthropic messages) ->
trajectories in the rollouts format of docs/design.md section 8, with per-call token accounting.

    records, stats = ingest_log("gateway.jsonl")          # format auto-detected per line
    write_jsonl("rollouts.jsonl", records)

    records, stats = stream_ingest("gateway.jsonl")       # the same, one record at a time
    write_jsonl("rollouts.jsonl", records)                # stats complete once written

See :mod:`verl_credit.ingest.log_lines` for the log line format and what is fatal (a malformed
request, a wrong ``--format``, an unsupported API) versus counted (a failed or flagged call), and
:mod:`verl_credit.ingest.sessions` for deduplication, session grouping and token accounting.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from verl_credit.ingest.interning import Interner
from verl_credit.ingest.log_lines import FORMATS, RewardRecord, parse_record
from verl_credit.ingest.model_call import FormatError, ModelCall, RecordError
from verl_credit.ingest.sessions import IngestStats, iter_trajectories
from verl_credit.io import InputError, iter_jsonl

__all__ = [
    "FORMATS",
    "FormatError",
    "IngestStats",
    "ModelCall",
    "ingest_log",
    "read_gateway_log",
    "stream_ingest",
]


def read_gateway_log(path: str | Path, api_format: str = "auto") -> tuple[list[ModelCall], list[RewardRecord], int]:
    """Parse every line. A line that cannot be read as asked (malformed request, wrong format,
    unsupported API) raises :class:`InputError` naming file, line and field; a call whose reply is
    an error or cannot be parsed is returned as a failed :class:`ModelCall` and the run goes on."""
    if api_format not in FORMATS:
        raise ValueError(f"--format must be one of {FORMATS}, got {api_format!r}")
    calls: list[ModelCall] = []
    rewards: list[RewardRecord] = []
    shared = Interner()  # the messages and tools every call of a session re-sends: held once
    count = 0
    for line, record in iter_jsonl(path):
        count += 1
        try:
            parsed = parse_record(record, line, api_format)
        except RecordError as exc:
            raise InputError(path, line, str(exc)) from None
        del record  # the parsed line is not kept beside its call
        if isinstance(parsed, RewardRecord):
            rewards.append(parsed)
            continue
        parsed.request_messages = shared.many(parsed.request_messages)
        parsed.tools = shared.one(parsed.tools)
        calls.append(parsed)
    return calls, rewards, count


def stream_ingest(path: str | Path, api_format: str = "auto") -> tuple[Iterator[dict[str, Any]], IngestStats]:
    """Rollout records of one gateway log, built one at a time as they are consumed, and the
    counts (complete once the records are exhausted: see
    :func:`verl_credit.ingest.sessions.iter_trajectories`)."""
    calls, rewards, count = read_gateway_log(path, api_format)
    stats = IngestStats(records=count, calls=len(calls), reward_records=len(rewards))  # the rest: iter_trajectories
    stats.streamed_calls = sum(c.streamed for c in calls)
    stats.usage_token_calls = sum(c.ok and c.token_source == "usage" for c in calls)
    stats.whitespace_token_calls = sum(c.ok and c.token_source == "whitespace" for c in calls)
    return iter_trajectories(calls, rewards, stats)


def ingest_log(path: str | Path, api_format: str = "auto") -> tuple[list[dict[str, Any]], IngestStats]:
    """Rollout records and counts for one gateway log."""
    records, stats = stream_ingest(path, api_format)
    return list(records), stats
