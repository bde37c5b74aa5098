"""``verl-credit ingest`` holds memory linear in the log, with a small constant.

A session of n calls re-sends the whole conversation with every call, so its log holds O(n^2)
messages. The reader keeps each distinct message once, the prefix hashes are not kept, and the
records are built one at a time as they are written: the traced peak of a whole ingestion
(read, sessions, every record serialized) stays a fraction of the log for one long session, and
a few times the log for many short ones. Before, both were 6.7-7.6x the log (a 2,000-call session:
more than 3 GB).
"""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from verl_credit.ingest import ingest_log, read_gateway_log, stream_ingest

pytestmark = pytest.mark.timeout(300)


def _write_log(path: Path, sessions: int, calls: int) -> Path:
    """``sessions`` sessions of ``calls`` OpenAI calls each; every call re-sends the history."""
    with path.open("w") as out:
        for s in range(sessions):
            history = [
                {"role": "system", "content": "You are an agent."},
                {"role": "user", "content": f"task {s} " + "x" * 40},
            ]
            for k in range(calls):
                call = {
                    "id": f"c{s}_{k}",
                    "type": "function",
                    "function": {"name": "read", "arguments": f'{{"n": {k}}}'},
                }
                reply = {"role": "assistant", "content": None, "tool_calls": [call]}
                line = {
                    "session_id": f"s{s}",
                    "timestamp": 1.0e9 + s * 1e4 + k,
                    "request": {"model": "m", "messages": history},
                    "response": {
                        "id": f"x{s}_{k}",
                        "choices": [{"message": reply, "finish_reason": "tool_calls"}],
                        "usage": {"prompt_tokens": 10 + 2 * k, "completion_tokens": 5},
                    },
                }
                out.write(json.dumps(line) + "\n")
                history = [*history, reply, {"role": "tool", "tool_call_id": call["id"], "content": "y" * 40}]
            out.write(json.dumps({"session_id": f"s{s}", "reward": 1.0}) + "\n")
    return path


def _ingest_peak(path: Path) -> tuple[int, int]:
    """``(records written, traced peak bytes)`` of a whole streamed ingestion."""
    tracemalloc.start()
    try:
        records, _ = stream_ingest(path)
        count = sum(1 for record in records if json.dumps(record))
        return count, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.slow
def test_one_long_session_costs_a_fraction_of_its_log(tmp_path: Path) -> None:
    log = _write_log(tmp_path / "long.jsonl", sessions=1, calls=200)
    count, peak = _ingest_peak(log)
    size = log.stat().st_size
    assert count == 1
    assert peak < 1.0 * size, f"peak {peak / size:.2f}x a {size / 2**20:.1f} MiB log (was 6.7x)"


@pytest.mark.slow
def test_many_short_sessions_cost_a_few_times_their_log(tmp_path: Path) -> None:
    log = _write_log(tmp_path / "many.jsonl", sessions=1000, calls=5)
    count, peak = _ingest_peak(log)
    size = log.stat().st_size
    assert count == 1000
    assert peak < 5.0 * size, f"peak {peak / size:.2f}x a {size / 2**20:.1f} MiB log (was 7.6x)"


def test_streamed_records_equal_the_whole_list(tmp_path: Path) -> None:
    log = _write_log(tmp_path / "small.jsonl", sessions=3, calls=4)
    records, stats = ingest_log(log)
    streamed, streamed_stats = stream_ingest(log)
    assert [json.dumps(r) for r in streamed] == [json.dumps(r) for r in records]
    assert streamed_stats == stats and stats.trajectories == 3 and stats.per_request_tokens > 0
    assert len(records[0]["messages"]) == 2 + 2 * 4 - 1  # the leaf's request and its reply
    # one object per distinct message: the history each call re-sends is shared, not copied
    calls, _, _ = read_gateway_log(log)
    assert calls[3].request_messages[0] is calls[0].request_messages[0]
    assert calls[3].request_messages[2] is calls[1].request_messages[2]
