"""Gateway ingestion when a provider reuses tool_call ids (``call_0`` in every reply): an id then
names several different replies, so it cannot link a re-sent reply to the call that generated it,
and the trajectory model pairs each tool result with the nearest unanswered call of its id."""

from __future__ import annotations

from pathlib import Path

from test_ingest_traffic import ingest_log, o_call, o_request, o_response, write_log

from verl_credit.trajectory import Trajectory


def test_a_reused_id_does_not_link_a_resent_reply_to_another_rollouts_call(tmp_path: Path) -> None:
    # two rollouts of one task (no session ids) read different files, both as "call_0"; rollout B's
    # next request re-sends its reply in another shape (text dropped, arguments re-encoded)
    reply_a = {"content": "Reading ops.", "tool_calls": [o_call("call_0", "read_file", {"path": "calc/ops.py"})]}
    reply_b = {"content": "Reading tests.", "tool_calls": [o_call("call_0", "read_file", {"path": "tests/t.py"})]}
    resent_b = {
        "role": "assistant",
        "content": "",
        "tool_calls": [o_call("call_0", "read_file", {"path": "./tests/t.py"})],
    }
    lines = [
        {"request": o_request(), "response": o_response(reply_a, "cmpl-a1")},
        {"request": o_request(), "response": o_response(reply_b, "cmpl-b1")},
        {
            "request": o_request(resent_b, {"role": "tool", "tool_call_id": "call_0", "content": "def test(): ..."}),
            "response": o_response({"content": "Tests read."}, "cmpl-b2"),
        },
    ]
    records, stats = ingest_log(write_log(tmp_path, lines))
    assert stats.tool_id_links == 0  # the id names two different replies: no link by it
    continued = [r for r in records if r["messages"][-1]["content"] == "Tests read."]
    assert len(continued) == 1
    assert "Reading ops." not in [m.get("content") for m in continued[0]["messages"]]  # never rollout A's reply


def test_results_of_a_reused_id_land_on_the_call_they_answer(tmp_path: Path) -> None:
    first = {"role": "assistant", "content": "", "tool_calls": [o_call("call_0", "read_file", {"path": "a.py"})]}
    second = {"role": "assistant", "content": "", "tool_calls": [o_call("call_0", "run_tests", {})]}
    request = o_request(
        first,
        {"role": "tool", "tool_call_id": "call_0", "content": "x = 1"},
        second,
        {"role": "tool", "tool_call_id": "call_0", "content": "Error: 2 tests failed"},
    )
    records, _ = ingest_log(write_log(tmp_path, [{"request": request, "response": o_response({"content": "Done."})}]))
    trajectory = Trajectory.from_record(records[0])
    assert [o.source_action for o in trajectory.observations if o.role == "tool"] == [0, 1]
