"""Gateway-log ingestion that survives real API traffic.

Every payload here is synthetic, written for these tests in the shapes the providers use: cut-off
Anthropic streams, in-stream errors (Groq, OpenRouter, Anthropic), a wrong ``--format``, replies
re-sent with ``<think>`` text, identical rollouts without session ids, server-side tools and a
Gemini request.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from verl_credit.cli.main import main
from verl_credit.ingest import ingest_log
from verl_credit.ingest.anthropic_messages_log import anthropic_response_message
from verl_credit.ingest.log_lines import in_stream_error, stream_events
from verl_credit.io import InputError
from verl_credit.trajectory import Trajectory

SYSTEM = "You fix bugs in a Python repository."
TASK = "divide(1, 0) crashes in calc/ops.py"
SOURCE = "def divide(a, b):\n    return a / b\n"


def write_log(tmp_path: Path, lines: list[dict[str, Any]], name: str = "gateway.jsonl") -> Path:
    log = tmp_path / name
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return log


def shape(messages: list[dict[str, Any]]) -> list[str]:
    out = []
    for m in messages:
        calls = [c["function"]["name"] for c in m.get("tool_calls") or []]
        out.append(m["role"] + (":" + ",".join(calls) if calls else ""))
    return out


# --- Anthropic shapes -------------------------------------------------------------------------


def sse(event: str, data: dict[str, Any]) -> str:
    return f"event: {event}\ndata: {json.dumps(data)}\n"


def a_request(*turns: dict[str, Any]) -> dict[str, Any]:
    return {"model": "claude", "system": SYSTEM, "messages": [{"role": "user", "content": TASK}, *turns]}


def a_read_turn() -> list[dict[str, Any]]:
    """The assistant's Read call and the client's tool result, as the client re-sends them."""
    return [
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_r", "name": "Read", "input": {"file_path": "calc/ops.py"}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_r", "content": SOURCE}]},
    ]


def a_response(content: list[dict[str, Any]], msg_id: str, stop: str = "tool_use", out: int = 20) -> dict[str, Any]:
    return {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": "claude",
        "content": content,
        "stop_reason": stop,
        "usage": {"input_tokens": 300, "output_tokens": out},
    }


READ = [{"type": "tool_use", "id": "toolu_r", "name": "Read", "input": {"file_path": "calc/ops.py"}}]
DONE = [{"type": "text", "text": "divide now raises ZeroDivisionError with a message."}]


def cut_write_stream(msg_id: str = "msg_cut", stop: str | None = "max_tokens") -> list[str]:
    """A streamed Write call whose input JSON stops mid-string (the reply hit max_tokens)."""
    events = [
        sse(
            "message_start",
            {"type": "message_start", "message": {"id": msg_id, "model": "claude", "usage": {"input_tokens": 420}}},
        ),
        sse(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "tool_use", "id": "toolu_w", "name": "Write", "input": {}},
            },
        ),
        sse(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "input_json_delta", "partial_json": '{"file_path": "calc/ops.py", "content": "def'},
            },
        ),
    ]
    if stop is not None:
        events.append(
            sse(
                "message_delta",
                {"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": 4096}},
            )
        )
    return events


CUT_ARGUMENTS = '{"file_path": "calc/ops.py", "content": "def'


# --- OpenAI shapes ----------------------------------------------------------------------------


def o_request(*turns: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": "qwen3-8b",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}, *turns],
    }


def o_call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def o_response(message: dict[str, Any], response_id: str | None = "chatcmpl-1", model: str = "qwen3-8b") -> dict:
    body: dict[str, Any] = {
        "object": "chat.completion",
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 10},
    }
    if response_id is not None:
        body["id"] = response_id
    return body


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-s",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        **extra,
    }


READ_CALL = o_call("call_r", "read_file", {"path": "calc/ops.py"})
READ_TURN = [
    {"role": "assistant", "content": "", "tool_calls": [READ_CALL]},
    {"role": "tool", "tool_call_id": "call_r", "content": SOURCE},
]


# --- 1. a cut-off call is flagged (or failed), never fatal -----------------------------------------


def truncated_log(tmp_path: Path) -> Path:
    return write_log(
        tmp_path,
        [
            {"session_id": "good1", "request": a_request(), "response": a_response(READ, "msg_1")},
            {"session_id": "good1", "request": a_request(*a_read_turn()), "response": a_response(DONE, "msg_2")},
            {"session_id": "cut", "request": a_request(), "stream": cut_write_stream()},
            {"session_id": "good2", "request": a_request(), "response": a_response(READ, "msg_3")},
        ],
    )


def test_a_cut_off_tool_call_is_flagged_and_the_run_goes_on(tmp_path: Path) -> None:
    records, stats = ingest_log(truncated_log(tmp_path))
    assert [r["id"] for r in records] == ["good1", "cut", "good2"]  # the sessions around it survive
    cut = records[1]
    assert shape(cut["messages"]) == ["system", "user", "assistant:Write"]
    assert cut["messages"][2]["tool_calls"][0]["function"]["arguments"] == CUT_ARGUMENTS  # raw text kept
    assert cut["action_token_lengths"] == [4096]
    (flag,) = cut["calls"][0]["flags"]
    assert flag.startswith("field 'response.tool_calls[0].function.arguments': tool call 'Write'")
    # the JSON position survives, and the why
    assert "Unterminated string starting at: line 1 column 41 (char 40)" in flag
    assert "stop_reason 'max_tokens': the reply was cut off" in flag
    assert (stats.parsed_calls, stats.flagged_calls, stats.failed_attempts, stats.sessions) == (4, 1, 0, 3)
    assert stats.issues == [f"3: {flag} (flagged call, kept)"]
    Trajectory.from_record(cut)  # still a loadable section-8 record (arguments_valid False downstream)


def test_a_cut_off_call_retried_by_the_client_is_dropped_for_the_retry(tmp_path: Path) -> None:
    log = write_log(
        tmp_path,
        [
            {"session_id": "s", "request": a_request(), "stream": cut_write_stream()},
            {"session_id": "s", "request": a_request(), "response": a_response(READ, "msg_1")},
            {"session_id": "s", "request": a_request(*a_read_turn()), "response": a_response(DONE, "msg_2")},
        ],
    )
    records, stats = ingest_log(log)
    assert len(records) == 1 and shape(records[0]["messages"])[2] == "assistant:Read"
    assert records[0]["calls"][0]["attempts"] == 2 and stats.retries_dropped == 1 and stats.flagged_calls == 1


def test_a_cut_off_dead_end_the_client_moved_on_from_is_no_branch(tmp_path: Path) -> None:
    # after the cut-off Write the client asked for a smaller edit instead of re-sending
    nudge = {"role": "user", "content": "Your reply was cut off; make a smaller edit."}
    edit = [{"type": "tool_use", "id": "toolu_e", "name": "Edit", "input": {"file_path": "calc/ops.py"}}]
    log = write_log(
        tmp_path,
        [
            {"session_id": "s", "request": a_request(), "response": a_response(READ, "msg_1")},
            {"session_id": "s", "request": a_request(*a_read_turn()), "stream": cut_write_stream()},
            {
                "session_id": "s",
                "request": a_request(*a_read_turn(), {"role": "assistant", "content": "..."}, nudge),
                "response": a_response(edit, "msg_3"),
            },
        ],
    )
    records, stats = ingest_log(log)
    assert [r["id"] for r in records] == ["s"]
    assert stats.abandoned_flagged_dropped == 1 and stats.flagged_calls == 1 and stats.branched_sessions == 0


@pytest.mark.parametrize(
    ("line", "kind", "field"),
    [
        # these three were once fatal (they aborted the whole log)
        ({"request": o_request(), "response": {"choices": []}}, "unparseable", "field 'response.choices'"),
        (
            {"request": o_request(), "stream": ['data: {"choices": [{"delta": {"content": "Let']},
            "unparseable",
            "field 'stream[0]': bad JSON in SSE data: Unterminated string starting at: line 1 column 36 (char 35)",
        ),
        ({"request": a_request(), "stream": cut_write_stream(stop=None)}, "flagged", "Unterminated string"),
        ({"request": o_request(), "stream": []}, "unparseable", "field 'stream': no events"),
    ],
)
def test_response_side_problems_are_counted_not_fatal(
    tmp_path: Path, line: dict[str, Any], kind: str, field: str
) -> None:
    good = {"request": o_request(), "response": o_response({"content": "ok"}, "chatcmpl-ok"), "timestamp": 5}
    records, stats = ingest_log(write_log(tmp_path, [{**line, "session_id": "bad"}, {**good, "session_id": "ok"}]))
    assert "ok" in [r["id"] for r in records]
    issue = "\n".join(i for i in stats.issues if i.startswith("1: "))
    assert field in issue
    if kind == "flagged":  # the cut-off input and the stream that never said why it stopped
        assert stats.flagged_calls == 1
        assert "field 'stream': ended without a finish/stop reason (the stream was cut off?)" in issue
    else:
        assert stats.unparseable_calls == 1 and stats.failed_attempts == 1 and issue.endswith("(failed attempt)")


def test_cli_prints_one_summary_line_per_log_and_the_notes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log, stats_path = truncated_log(tmp_path), tmp_path / "stats.json"
    assert main(["ingest", "--input", str(log), "--out", str(tmp_path / "o.jsonl"), "--stats", str(stats_path)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert (
        f"{log}: 4 calls parsed, 0 failed attempts (0 API errors, 0 unparseable), 1 flagged calls, "
        "3 sessions -> 3 trajectories"
    ) in err
    assert any(e.startswith(f"note: {log}:3: field 'response.tool_calls[0].function.arguments'") for e in err)
    saved = json.loads(stats_path.read_text())
    assert saved["flagged_calls"] == 1 and len(saved["issues"]) == 1


def test_cli_caps_the_notes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = [{"session_id": f"s{k}", "request": a_request(), "stream": cut_write_stream(f"m{k}")} for k in range(3)]
    log = write_log(tmp_path, lines)
    assert main(["ingest", "--input", str(log), "--out", str(tmp_path / "o.jsonl"), "--max-notes", "1"]) == 0
    notes = [e for e in capsys.readouterr().err.splitlines() if e.startswith("note: ")]
    assert notes[0].startswith(f"note: {log}:1: ") and notes[1] == "note: ... and 2 more (see --stats)"


# --- 2. errors inside HTTP-200 streams are failed attempts -------------------------------------------


def test_in_stream_errors_of_every_shape_are_failed_attempts(tmp_path: Path) -> None:
    final = o_response({"content": "Fixed: divide raises ZeroDivisionError."}, "chatcmpl-2")
    groq_error = {
        "error": {
            "message": "Failed to call a function. Please adjust your prompt.",
            "type": "invalid_request_error",
            "code": "tool_use_failed",
            "failed_generation": '<function=read_file>{"path": "calc/ops.py"</function>',
        }
    }
    groq = [
        "data: " + json.dumps(chunk({"role": "assistant", "content": ""})),
        "event: error",
        "data: " + json.dumps(groq_error),
    ]
    openrouter = [
        chunk({"role": "assistant", "content": "Let me "}),
        chunk({"content": ""}, "error", error={"code": 400, "message": "Token limit reached"}),
    ]
    good = [
        chunk({"role": "assistant", "tool_calls": [{"index": 0, "id": "call_r", "function": {"name": "read_file"}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"path": "calc/ops.py"}'}}]}, "tool_calls"),
    ]
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    anthropic_cut = [
        sse("message_start", {"type": "message_start", "message": {"id": "msg_x", "usage": {"input_tokens": 9}}}),
        sse("error", overloaded),
    ]
    log = write_log(
        tmp_path,
        [
            {"session_id": "o", "request": o_request(), "stream": groq},
            {"session_id": "o", "request": o_request(), "stream": openrouter},
            {"session_id": "o", "request": o_request(), "stream": good},
            {"session_id": "o", "request": o_request(*READ_TURN), "response": final},
            {"session_id": "a", "request": a_request(), "stream": anthropic_cut},
            {"session_id": "a", "request": a_request(), "response": overloaded},  # an error body with status 200
            {"session_id": "a", "request": a_request(), "response": a_response(DONE, "msg_ok", "end_turn")},
        ],
    )
    records, stats = ingest_log(log)
    assert [r["id"] for r in records] == ["o", "a"]  # one trajectory per session, no empty replies
    assert shape(records[0]["messages"]) == ["system", "user", "assistant:read_file", "tool", "assistant"]
    assert [c["attempts"] for c in records[0]["calls"]] == [3, 1] and records[1]["calls"][0]["attempts"] == 3
    assert (stats.failed_attempts, stats.api_errors, stats.http_failures, stats.parsed_calls) == (4, 4, 0, 3)
    issues = "\n".join(stats.issues)
    assert "1: field 'stream[2]': in-stream error: tool_use_failed: Failed to call a function." in issues
    assert "2: field 'stream[1]': in-stream error: 400: Token limit reached" in issues
    assert "5: field 'stream[1]': in-stream error: overloaded_error: Overloaded" in issues
    assert "6: field 'response.error': error response: overloaded_error: Overloaded" in issues


# --- 3. a wrong --format on a stream is an error ------------------------------------------------


def test_a_stream_read_in_the_wrong_format_names_file_line_and_field(tmp_path: Path) -> None:
    anthropic_stream = [
        sse("message_start", {"type": "message_start", "message": {"id": "m", "usage": {"input_tokens": 442}}}),
        sse("content_block_start", {"type": "content_block_start", "index": 0, "content_block": READ[0]}),
        sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {}}),
    ]
    plain = {"messages": [{"role": "user", "content": TASK}]}  # a request valid in both formats
    first = {"session_id": "s1", "request": plain, "response": o_response({"content": "hi"})}
    log = write_log(tmp_path, [first, {"session_id": "s2", "request": plain, "stream": anthropic_stream}])
    with pytest.raises(InputError, match=re.escape(f"{log}:2: field 'stream': none of its 3 events is an OpenAI")) as e:
        ingest_log(log, "openai")
    assert "they are anthropic events: wrong --format?" in str(e.value)
    assert len(ingest_log(log)[0]) == 2  # auto-detected, the same log reads fine

    openai_stream = [chunk({"role": "assistant", "content": "Looking."}, "stop")]
    reverse = write_log(tmp_path, [{"request": plain, "stream": openai_stream}], "r.jsonl")
    with pytest.raises(
        InputError, match=re.escape(f"{reverse}:1: field 'stream': none of its 1 events is an Anthropic")
    ):
        ingest_log(reverse, "anthropic")


def test_cli_wrong_format_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = write_log(tmp_path, [{"request": a_request(), "stream": cut_write_stream()}])
    assert main(["ingest", "--input", str(log), "--out", str(tmp_path / "o.jsonl"), "--format", "openai"]) == 2
    assert f"{log}:1: field 'stream'" in capsys.readouterr().err and not (tmp_path / "o.jsonl").exists()


# --- 4. a reply re-sent in another shape still continues its call ------------------------------------


def test_reasoning_resent_as_think_text_keeps_one_session(tmp_path: Path) -> None:
    reasoning = "The crash is a division by zero; read calc/ops.py first."
    streamed = [  # Groq / OpenRouter / vLLM name the field `reasoning`
        chunk({"role": "assistant", "reasoning": reasoning}),
        chunk({"tool_calls": [{"index": 0, "id": "call_r", "function": {"name": "read_file", "arguments": ""}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"path": "calc/ops.py"}'}}]}, "tool_calls"),
    ]
    resent = {"role": "assistant", "content": f"<think>{reasoning}</think>\n\n", "tool_calls": [READ_CALL]}
    log = write_log(
        tmp_path,
        [
            {"session_id": "r", "request": o_request(), "stream": streamed},
            {
                "session_id": "r",
                "request": o_request(resent, READ_TURN[1]),
                "response": o_response({"content": "Done."}),
            },
        ],
    )
    records, stats = ingest_log(log)
    assert [r["id"] for r in records] == ["r"]  # was 2 trajectories
    generated = records[0]["messages"][2]
    assert generated["reasoning_content"] == reasoning and generated["content"] == ""  # the generated version
    assert stats.tool_id_links == 0  # matched by content once reasoning text is left out

    message = o_response({"content": "", "reasoning": reasoning, "tool_calls": [READ_CALL]})
    single = write_log(tmp_path, [{"request": o_request(), "response": message}], "one.jsonl")
    assert ingest_log(single)[0][0]["messages"][2]["reasoning_content"] == reasoning


def test_calls_are_linked_by_tool_call_ids_that_reappear(tmp_path: Path) -> None:
    # the client dropped the reply's text and re-encoded the path when sending the call back
    reply = {"content": "I'll read the file.", "tool_calls": [READ_CALL]}
    resent = {
        "role": "assistant",
        "content": "",
        "tool_calls": [o_call("call_r", "read_file", {"path": "./calc/ops.py"})],
    }
    log = write_log(
        tmp_path,
        [
            {"session_id": "k", "request": o_request(), "response": o_response(reply, "chatcmpl-1")},
            {
                "session_id": "k",
                "request": o_request(resent, READ_TURN[1]),
                "response": o_response({"content": "Done."}, "chatcmpl-2"),
            },
        ],
    )
    records, stats = ingest_log(log)
    assert [r["id"] for r in records] == ["k"] and stats.tool_id_links == 1
    assert records[0]["messages"][2]["content"] == "I'll read the file."
    assert [c["line"] for c in records[0]["calls"]] == [1, 2]


# --- 5. calls of different sessions never merge -------------------------------------------------------


def rollout_lines(ids: tuple[str | None, str | None], model: str = "qwen3-8b", timestamp: float | None = None) -> list:
    first = {"request": o_request(), "response": o_response({"content": "", "tool_calls": [READ_CALL]}, ids[0], model)}
    second = {"request": o_request(*READ_TURN), "response": o_response({"content": "Fixed."}, ids[1], model)}
    if timestamp is not None:
        first["timestamp"], second["timestamp"] = timestamp, timestamp + 1
    return [first, second]


def test_identical_rollouts_without_session_ids_stay_separate(tmp_path: Path) -> None:
    a, b = rollout_lines(("cmpl-a1", "cmpl-a2")), rollout_lines(("cmpl-b1", "cmpl-b2"))
    records, stats = ingest_log(write_log(tmp_path, [a[0], b[0], a[1], b[1]]))  # interleaved, as a GRPO group runs
    assert [r["id"] for r in records] == ["session-1", "session-2"]
    assert [[c["line"] for c in r["calls"]] for r in records] == [[1, 3], [2, 4]]
    assert (stats.sessions, stats.duplicates_dropped, stats.retries_dropped) == (2, 0, 0)
    assert [c["attempts"] for r in records for c in r["calls"]] == [1, 1, 1, 1]


def test_the_model_tells_identical_replies_apart(tmp_path: Path) -> None:
    lines = rollout_lines((None, None), "qwen3-8b") + rollout_lines((None, None), "qwen3-8b-sft")
    records, stats = ingest_log(write_log(tmp_path, lines))
    assert len(records) == 2 and stats.duplicates_dropped == 0


def test_the_same_call_logged_twice_is_still_one_call(tmp_path: Path) -> None:
    a = rollout_lines(("cmpl-a1", "cmpl-a2"), timestamp=10.0)
    records, stats = ingest_log(write_log(tmp_path, [a[0], a[0], a[1]]))
    assert len(records) == 1 and stats.duplicates_dropped == 1


# --- 6. server-side tools are calls with their results inside one model call -------------------------

SEARCH = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "ruff 0.6 notes"}}
HITS = {
    "type": "web_search_tool_result",
    "tool_use_id": "srvtoolu_1",
    "content": [
        {
            "type": "web_search_result",
            "title": "Ruff v0.6.0",
            "url": "https://example.com/ruff-0.6",
            "encrypted_content": "Zm9v",
        }
    ],
}
EDIT = {"type": "tool_use", "id": "toolu_e", "name": "Edit", "input": {"file_path": "pyproject.toml"}}
SEARCH_REPLY = [
    {"type": "text", "text": "I'll check the release notes."},
    SEARCH,
    HITS,
    {"type": "text", "text": "Ruff 0.6 "},
    {"type": "text", "text": "stabilised the formatter.", "citations": [{"url": "https://example.com/ruff-0.6"}]},
    EDIT,
]
SERVER_CALL = {
    "id": "srvtoolu_1",
    "name": "web_search",
    "arguments": '{"query": "ruff 0.6 notes"}',
    "result_type": "web_search_tool_result",
    "result": "Ruff v0.6.0 https://example.com/ruff-0.6",
}


def search_stream() -> list[str]:
    start = {"type": "message_start", "message": {"id": "msg_s", "usage": {"input_tokens": 50}}}
    events = [sse("message_start", start)]
    for k, block in enumerate(SEARCH_REPLY):
        opened = {**block, "input": {}} if "input" in block else block
        events.append(sse("content_block_start", {"type": "content_block_start", "index": k, "content_block": opened}))
        if "input" in block:
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
            events.append(sse("content_block_delta", {"type": "content_block_delta", "index": k, "delta": delta}))
    events.append(sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {}}))
    return events


def test_server_tools_stay_inside_their_model_call(tmp_path: Path) -> None:
    resent = {"role": "assistant", "content": SEARCH_REPLY}
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_e", "content": "edited"}]}
    log = write_log(
        tmp_path,
        [
            {"session_id": "w", "request": a_request(), "response": a_response(SEARCH_REPLY, "msg_1")},
            {
                "session_id": "w",
                "request": a_request(resent, result),
                "response": a_response(DONE, "msg_2", "end_turn"),
            },
            {"session_id": "v", "request": a_request(), "stream": search_stream()},
        ],
    )
    records, stats = ingest_log(log)
    w, v = records
    # no tool message is owed for the search: it ran server-side, inside the first call
    assert shape(w["messages"]) == ["system", "user", "assistant:Edit", "tool", "assistant"]
    reply = w["messages"][2]
    # text on either side of the search is not glued; the citation-split sentence is
    assert reply["content"] == "I'll check the release notes.\n\nRuff 0.6 stabilised the formatter."
    assert reply["server_tool_calls"] == [SERVER_CALL]
    assert v["messages"][2] == reply  # the streamed reply assembles to the same message
    assert stats.server_tool_calls == 2 and stats.flagged_calls == 0
    for record in records:
        Trajectory.from_record(record)


# --- 7. an unsupported API says so ------------------------------------------------------------------


def test_a_gemini_request_is_named_unsupported(tmp_path: Path) -> None:
    gemini = {
        "request": {"contents": [{"role": "user", "parts": [{"text": TASK}]}]},
        "response": {"candidates": [{"content": {"role": "model", "parts": [{"text": "Looking."}]}}]},
    }
    log = write_log(tmp_path, [gemini])
    with pytest.raises(InputError, match=re.escape(f"{log}:1: field 'request.contents': unsupported API: a Gemini")):
        ingest_log(log)


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        (
            'data: {"object": "error", "message": "max_tokens is too large", "code": 400}',
            "400: max_tokens is too large",
        ),
        ('event: error\ndata: {"message": "upstream closed"}', "upstream closed"),
        (json.dumps(chunk({}, "error")), "finish_reason 'error' (no error object sent)"),
        ('data: {"error": "rate limited"}', "rate limited"),
        (json.dumps(chunk({"content": "fine"})), None),
    ],
)
def test_in_stream_error_shapes(item: str, expected: str | None) -> None:
    stream = [item if item.startswith(("data:", "event:")) else json.loads(item)]
    assert [in_stream_error(event) for event in stream_events(stream)] == [expected]


def test_an_anthropic_request_read_as_openai_is_named(tmp_path: Path) -> None:
    log = write_log(tmp_path, [{"request": a_request(*a_read_turn()), "response": a_response(DONE, "m")}])
    with pytest.raises(InputError, match=re.escape("field 'request.messages[1].content[0].type': 'tool_use' is an")):
        ingest_log(log, "openai")


def test_server_tool_results_of_other_kinds_read_as_text() -> None:
    run = {"type": "server_tool_use", "id": "srvtoolu_c", "name": "code_execution", "input": {"code": "print(1/1)"}}
    ran = {
        "type": "code_execution_tool_result",
        "tool_use_id": "srvtoolu_c",
        "content": {"type": "code_execution_result", "stdout": "1.0\n", "stderr": "", "return_code": 0},
    }
    failed = {
        "type": "web_search_tool_result",
        "tool_use_id": "srvtoolu_s",
        "content": {"error_code": "max_uses_exceeded"},
    }
    message = anthropic_response_message({"content": [run, ran, failed]})
    assert [(c["name"], c["result"]) for c in message["server_tool_calls"]] == [
        ("code_execution", "stdout: 1.0\n\nreturn_code: 0"),
        (None, "error: max_uses_exceeded"),  # a result whose call is not in the reply: kept, not dropped
    ]
