"""Gateway-log ingestion: both API formats, interleaved sessions, retries, streaming,
prefix continuity, token accounting, malformed records."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from verl_credit.cli.main import main
from verl_credit.ingest import ingest_log
from verl_credit.io import InputError
from verl_credit.trajectory import Trajectory, whitespace_token_count

GATEWAY = Path(__file__).parents[1] / "data" / "gateway"


def by_id(records: list[dict]) -> dict[str, dict]:
    return {r["id"]: r for r in records}


def shape(messages: list[dict]) -> list[str]:
    """role, or role:tool-name for assistant tool calls (compact view of a transcript)."""
    out = []
    for m in messages:
        calls = [c["function"]["name"] for c in m.get("tool_calls") or []]
        out.append(m["role"] + (":" + ",".join(calls) if calls else ""))
    return out


def test_openai_interleaved_sessions_retries_and_streaming() -> None:
    records, stats = ingest_log(GATEWAY / "openai_interleaved.jsonl")
    assert [r["id"] for r in records] == ["s1", "s2"]  # ordered by first call; lines were interleaved
    s1, s2 = records
    assert shape(s1["messages"]) == [
        "system",
        "user",
        "assistant:str_replace_editor",
        "tool",
        "assistant:str_replace_editor",
        "tool",
        "assistant:execute_bash",
        "tool",
        "assistant",
    ]
    # the abandoned response to the re-sent request (python -m pytest) is gone; the continued one stays
    bash = json.loads(s1["messages"][6]["tool_calls"][0]["function"]["arguments"])
    assert bash == {"command": "cd /workspace/stats && pytest -q"}
    assert (s1["reward"], s1["uid"], s1["reward_known"]) == (1.0, "median_even", True)
    # usage tokens: completions 18, 64, 20, 12
    assert s1["action_token_lengths"] == [18, 64, 20, 12]
    # per_request = (120+18) + (260+64) + (300+20) + (350+12) = 1144; prefix_merged = last row 350 + 12 = 362
    assert s1["token_accounting"] == {
        "per_request": 1144,
        "prefix_merged": 362,
        "completion_tokens": 114,
        "prompt_tokens_per_request": 1030,
    }
    assert [c["attempts"] for c in s1["calls"]] == [1, 2, 2, 1]  # call 2: a 500 then a retry; call 3: a timeout
    assert [c["message_index"] for c in s1["calls"]] == [2, 4, 6, 8]

    # s2: session id from a header; call 2 assembled from chat.completion.chunk deltas, call 3 from SSE lines
    assert shape(s2["messages"]) == [
        "system",
        "user",
        "assistant:read_file",
        "tool",
        "assistant:replace",
        "tool",
        "assistant:run_shell_command",
        "tool",
        "assistant",
    ]
    replace = s2["messages"][4]["tool_calls"][0]
    assert replace["id"] == "call_p1"
    assert json.loads(replace["function"]["arguments"]) == {
        "file_path": "/home/dev/shop/src/cart.ts",
        "old_string": "s + i.price",
        "new_string": "s + i.price * i.qty",
    }
    assert json.loads(s2["messages"][6]["tool_calls"][0]["function"]["arguments"]) == {"command": "npm test"}
    assert [c["token_source"] for c in s2["calls"]] == ["whitespace", "usage", "whitespace", "usage"]
    assert [c["streamed"] for c in s2["calls"]] == [False, True, True, False]
    # whitespace fallback: 'read_file({"absolute_path": "/home/dev/shop/src/cart.ts"})' -> 2 words;
    # 'run_shell_command({"command": "npm test"})' -> 3 words; prompt of call 1 = 4 + 6 words
    assert s2["action_token_lengths"] == [2, 40, 3, 9]
    assert s2["calls"][0]["prompt_tokens"] == whitespace_token_count("You are Qwen Code.") + 6 == 10
    assert (s2["reward"], s2["uid"]) == (0.0, "cart_qty")  # reward and uid carried on the last call's line

    assert (stats.records, stats.calls, stats.failed_attempts, stats.retries_dropped, stats.streamed_calls) == (
        11,
        10,
        1,
        1,
        2,
    )
    assert (stats.sessions, stats.trajectories, stats.missing_rewards) == (2, 2, 0)
    assert stats.per_request_tokens == 1144 + 720 and stats.prefix_merged_tokens == 362 + 409
    for record in records:  # section 8 records: loadable as trajectories
        trajectory = Trajectory.from_record(record)
        assert trajectory.action_lengths == record["action_token_lengths"]


def test_anthropic_messages_with_streams_and_a_duplicate_line() -> None:
    records, stats = ingest_log(GATEWAY / "anthropic_claude_code.jsonl")
    cc1, cc2 = by_id(records)["cc1"], by_id(records)["cc2"]
    assert shape(cc1["messages"]) == [
        "system",
        "user",
        "assistant:Grep",
        "tool",
        "assistant:Read",
        "tool",
        "assistant:Edit",
        "tool",
        "user",
        "assistant:Bash",
        "tool",
        "assistant",
    ]
    first = cc1["messages"][2]
    assert first["content"] == "Let me find parse_date." and first["reasoning_content"] == "Find the function first."
    assert first["tool_calls"][0]["id"] == "toolu_01"
    assert cc1["messages"][3] == {
        "role": "tool",
        "tool_call_id": "toolu_01",
        "content": "src/utils/dates.py:5:def parse_date(value: str) -> datetime:",
    }
    # the Read call was streamed: input_json_delta pieces reassembled
    assert json.loads(cc1["messages"][4]["tool_calls"][0]["function"]["arguments"]) == {
        "file_path": "/repo/src/utils/dates.py"
    }
    assert cc1["messages"][8] == {"role": "user", "content": "<system-reminder>Keep going.</system-reminder>"}
    assert cc1["messages"][11]["content"] == "parse_date now returns UTC-aware datetimes; tests pass."
    assert cc1["action_token_lengths"] == [45, 31, 88, 30, 14]  # output_tokens (streams: from message_delta)
    # prompt = input + cache reads + cache writes: 900 + 3000 + 120
    assert cc1["calls"][0]["prompt_tokens"] == 4020
    assert cc1["calls"][2]["attempts"] == 2 and stats.duplicates_dropped == 1
    assert cc1["token_accounting"]["prefix_merged"] == 60 + 3400 + 14
    assert (cc1["reward"], cc1["uid"]) == (1.0, "utc_dates")
    # cc2: session id from the x-claude-code-session-id header; no reward anywhere -> counted, written as 0.0
    assert shape(cc2["messages"]) == ["system", "user", "assistant:Read", "tool", "assistant"]
    assert (cc2["reward"], cc2["reward_known"], stats.missing_rewards) == (0.0, False, 1)


def test_sessions_without_ids_are_chained_by_prefix_continuity() -> None:
    records, stats = ingest_log(GATEWAY / "no_session_ids.jsonl")
    # two rollouts of one task: the same first request with different responses, each continued
    assert [r["id"] for r in records] == ["session-1", "session-2"]
    good, bad = records
    assert shape(good["messages"]) == [
        "system",
        "user",
        "assistant:read_file",
        "tool",
        "assistant:edit_file",
        "tool",
        "assistant:run_tests",
        "tool",
        "assistant",
    ]
    assert shape(bad["messages"]) == ["system", "user", "assistant:edit_file", "tool", "assistant"]
    assert (good["reward"], bad["reward"]) == (1.0, 0.0)
    assert good["action_token_lengths"] == [12, 35, 8, 4] and bad["action_token_lengths"] == [30, 2]
    assert stats.retries_dropped == 0 and stats.sessions == 2


def _line(messages: list[dict], reply: str, **extra: object) -> str:
    response = {
        "choices": [{"message": {"role": "assistant", "content": reply}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2},
    }
    return json.dumps({"request": {"messages": messages}, "response": response, **extra})


def test_uncontinued_retry_keeps_the_last_response(tmp_path: Path) -> None:
    request = [{"role": "user", "content": "hi"}]
    log = tmp_path / "log.jsonl"
    log.write_text(
        _line(request, "first try", session_id="a", timestamp=1)
        + "\n"
        + _line(request, "second try", session_id="a", timestamp=2)
        + "\n"
    )
    records, stats = ingest_log(log)
    assert len(records) == 1 and records[0]["messages"][-1]["content"] == "second try"
    assert stats.retries_dropped == 1 and records[0]["calls"][0]["attempts"] == 2


def test_branches_inside_one_session_become_separate_trajectories(tmp_path: Path) -> None:
    u = {"role": "user", "content": "go"}
    a1, a2 = {"role": "assistant", "content": "plan A"}, {"role": "assistant", "content": "plan B"}
    lines = [
        _line([u], "plan A", session_id="b"),
        _line([u], "plan B", session_id="b"),
        _line([u, a1, {"role": "user", "content": "ok A"}], "done A", session_id="b"),
        _line([u, a2, {"role": "user", "content": "ok B"}], "done B", session_id="b"),
    ]
    log = tmp_path / "log.jsonl"
    log.write_text("\n".join(lines) + "\n")
    records, stats = ingest_log(log)
    assert [r["id"] for r in records] == ["b#1", "b#2"]
    assert [r["messages"][-1]["content"] for r in records] == ["done A", "done B"]
    assert stats.branched_sessions == 1 and stats.sessions == 1


def test_history_not_generated_by_a_logged_call_gets_zero_tokens(tmp_path: Path) -> None:
    history = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "injected answer"},
        {"role": "user", "content": "q2"},
    ]
    log = tmp_path / "log.jsonl"
    log.write_text(_line(history, "real answer", session_id="h") + "\n")
    records, stats = ingest_log(log)
    assert records[0]["action_token_lengths"] == [0, 2]
    assert stats.unlogged_assistant_messages == 1


@pytest.mark.parametrize(
    ("content", "line", "field"),
    [
        ('{"session_id": "s", "reward": 1}\nnot json\n', 2, "bad JSON"),
        ("[1, 2]\n", 1, "field '<record>'"),
        ('{"session_id": "x"}\n', 1, "field 'request'"),
        ('{"request": {"model": "m", "input": "hi"}}\n', 1, "Responses API"),
        (
            '{"request": {"messages": [{"role": "robot", "content": "x"}]}, "response": null}\n',
            1,
            "request.messages[0].role",
        ),
        # an empty `choices`, a cut-off tool input and bad JSON in one SSE line are response-side:
        # no longer fatal, a failed or flagged call -- see tests/ingest/test_ingest_traffic.py
        ('{"session_id": "s", "reward": "yes"}\n', 1, "field 'reward'"),
    ],
)
def test_malformed_records_name_file_line_and_field(tmp_path: Path, content: str, line: int, field: str) -> None:
    log = tmp_path / "bad.jsonl"
    log.write_text(content)
    with pytest.raises(InputError, match=re.escape(field)) as caught:
        ingest_log(log)
    assert caught.value.line == line and caught.value.path == str(log)


def test_shipped_malformed_log() -> None:
    with pytest.raises(InputError, match=r"malformed.jsonl:3: field 'request.messages\[2\].tool_calls\[0\]"):
        ingest_log(GATEWAY / "malformed.jsonl")


def test_forced_format_mismatch_is_an_error() -> None:
    # an OpenAI request read as Anthropic: a system message inside messages is not allowed there
    with pytest.raises(InputError, match=re.escape("openai_interleaved.jsonl:1: field 'request.messages[0].role'")):
        ingest_log(GATEWAY / "openai_interleaved.jsonl", "anthropic")
    with pytest.raises(InputError, match=r"response\.choices"):
        ingest_log(GATEWAY / "anthropic_claude_code.jsonl", "openai")
    with pytest.raises(ValueError, match="format"):
        ingest_log(GATEWAY / "openai_interleaved.jsonl", "bogus")


def test_cli_ingest_then_route_call_credit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rollouts, stats_path = tmp_path / "rollouts.jsonl", tmp_path / "stats.json"
    assert (
        main(
            [
                "ingest",
                "--input",
                str(GATEWAY / "anthropic_claude_code.jsonl"),
                "--out",
                str(rollouts),
                "--stats",
                str(stats_path),
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert "wrote 2 trajectories" in err and "1 duplicates dropped" in err and "without reward" in err
    assert json.loads(stats_path.read_text())["trajectories"] == 2
    credit = tmp_path / "credit.jsonl"
    assert main(["route", "--input", str(rollouts), "--out", str(credit), "--estimator", "call_credit"]) == 0
    first = json.loads(credit.read_text().splitlines()[0])
    assert [a["role"] for a in first["actions"]] == ["IG", "IG", "AE", "RV", "IG"]


def test_cli_ingest_malformed_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["ingest", "--input", str(GATEWAY / "malformed.jsonl"), "--out", str(tmp_path / "o.jsonl")])
    assert code == 2
    assert "malformed.jsonl:3" in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists()
