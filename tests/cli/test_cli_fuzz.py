"""Fuzzing ``verl-credit route`` / ``annotate`` in-process with malformed rollouts files.

Every run must end in exit 0 (a written file without a non-finite number) or exit 2 with one
stderr line naming ``file:line``; any other exception escaping :func:`main` fails the test.
Mutations of a valid file: wrong types at every field, huge integers, deep nesting, bad UTF-8
bytes, lone surrogates, non-finite tokens and broken graphs.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verl_credit.cli.main import main
from verl_credit.io import parse_json_line

pytestmark = pytest.mark.timeout(120)

BASE: dict[str, Any] = {
    "id": "t1",
    "uid": "g1",
    "reward": 1.0,
    "messages": [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "refund order #W12 please"},
        {"role": "assistant", "content": "To card or store credit?"},
        {"role": "user", "content": "card"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_order", "arguments": '{"order_id": "W12"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "name": "get_order", "content": '{"status": "delivered"}'},
        {"role": "assistant", "content": [{"type": "text", "text": "Refunded to your card."}]},
    ],
    "action_token_lengths": [5, 7, 4],
    "graph": {
        "num_actions": 3,
        "errors": [{"action": 1, "kind": "tool_error", "evidence": "x"}],
        "direct_user_inputs": {"0": 1},
        "edges": [
            {"src": 0, "dst": 1, "sign": "+", "type": "input", "unit": "card"},
            {"src": 1, "dst": 2, "sign": "-", "type": "failed_utilization", "unit": "order"},
        ],
    },
}
OTHER = {**BASE, "id": "t2", "reward": 0.0, "graph": None}
DEEP = 2000

# raw JSON tokens spliced in place of a value (json.dumps cannot produce them)
RAW_TOKENS = [
    "NaN",
    "Infinity",
    "-Infinity",
    "1e400",
    "-1e999",
    "1" + "0" * 400,
    "9" * 5000,
    "[" * DEEP + "]" * DEEP,
    "{" + '"a":{' * DEEP + "}" * DEEP + "}",
    '"\\ud800"',
    '"x\\udfff"',
    "1e308",
    "-1" + "0" * 300,
    str(2**64),
    "-0",
    "1.5e-400",
]
BAD_VALUES: list[Any] = [
    None,
    True,
    0,
    -1,
    1,
    2.5,
    "",
    "x",
    "1",
    "--0",
    "²",
    "٣",
    " 1 ",
    [],
    [1, 2],
    ["x"],
    {},
    {"a": 1},
    [[0, 1], [0, 2], 7],
]


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    paths = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            paths.extend(_paths(child, (*prefix, key)))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            paths.extend(_paths(child, (*prefix, index)))
    return paths


PATHS = [p for p in _paths(BASE) if p]
_MARK = "@@RAW@@"


def mutate(path: tuple, value: Any, raw: str | None = None) -> str:
    """``BASE`` as one JSON line with the value at ``path`` replaced (or a raw token spliced in)."""
    record = json.loads(json.dumps(BASE))
    target = record
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = _MARK if raw is not None else value
    text = json.dumps(record)
    return text.replace(json.dumps(_MARK), raw) if raw is not None else text


def run_cli(tmp: Path, line: bytes, command: list[str]) -> None:
    """Run ``command`` on a three-line file whose line 2 is ``line``; check the contract."""
    rollouts, out = tmp / "r.jsonl", tmp / "out.jsonl"
    good, other = json.dumps(BASE).encode(), json.dumps(OTHER).encode()
    rollouts.write_bytes(good + b"\n" + line + b"\n" + other + b"\n")
    out.unlink(missing_ok=True)
    import contextlib
    import io

    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        code = main([command[0], "--input", str(rollouts), "--out", str(out), *command[1:]])
    err = [x for x in stderr.getvalue().splitlines() if "warning" not in x and x.strip()]
    if code == 2:
        assert len(err) == 1, err
        assert re.search(re.escape(f"{rollouts}:") + r"[0-9]+: ", err[0]), err[0]
        assert not out.exists()
        return
    assert code == 0, (code, err)
    for text in out.read_text(encoding="utf-8").splitlines():
        record = parse_json_line(text)  # strict: refuses NaN/Infinity tokens
        _assert_finite(record)


def _assert_finite(value: Any) -> None:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            assert math.isfinite(item), item
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


COMMANDS = [["route"], ["route", "--estimator", "call_credit"], ["annotate"]]

TABLE: list[tuple[str, bytes]] = [
    ("tool_call_id list", mutate(("messages", 5, "tool_call_id"), ["c1"]).encode()),
    ("tool_call_id dict", mutate(("messages", 5, "tool_call_id"), {"a": 1}).encode()),
    ("edge type list", mutate(("graph", "edges", 0, "type"), ["input"]).encode()),
    ("edge src --0", mutate(("graph", "edges", 0, "src"), "--0").encode()),
    ("edge src superscript", mutate(("graph", "edges", 0, "src"), "²").encode()),
    ("reward 1e309 int", mutate(("reward",), None, "1" + "0" * 309).encode()),
    ("length huge", mutate(("action_token_lengths", 0), None, "1" + "0" * 300).encode()),
    ("direct huge", mutate(("graph", "direct_user_inputs", "0"), None, "1" + "0" * 300).encode()),
    ("deep record", b"[" * DEEP + b"]" * DEEP),
    ("deep args", mutate(("messages", 4, "tool_calls", 0, "function", "arguments"), "[" * DEEP + "]" * DEEP).encode()),
    ("5000 digits", mutate(("reward",), None, "9" * 5000).encode()),
    ("NaN reward", mutate(("reward",), None, "NaN").encode()),
    ("Infinity length", mutate(("action_token_lengths", 1), None, "Infinity").encode()),
    ("float overflow", mutate(("reward",), None, "1e400").encode()),
    ("bad utf-8", json.dumps(BASE).encode()[:30] + b"\xff\xfe" + json.dumps(BASE).encode()[30:]),
    ("truncated utf-8", json.dumps({**BASE, "id": "é"}, ensure_ascii=False).encode()[:-1][:11] + b"\xc3"),
    ("lone surrogate", mutate(("messages", 1, "content"), None, '"\\ud800"').encode()),
    ("surrogate key", json.dumps(BASE).replace('"uid"', '"\\udc00"', 1).encode()),
    ("graph without edges", mutate(("graph", "edges"), None).replace(', "edges": null', "").encode()),
    ("graph edges string", mutate(("graph", "edges"), "x").encode()),
    ("graph deep string", mutate(("graph",), "[" * DEEP + "]" * DEEP).encode()),
    ("graph 5000 digits string", mutate(("graph",), '{"num_actions": ' + "9" * 5000 + "}").encode()),
    ("uid null", mutate(("uid",), None).encode()),
    ("uid list", mutate(("uid",), [1, [2]]).encode()),
    ("duplicate id", json.dumps(BASE).encode()),
    ("record list", b"[1, 2]"),
    ("empty object", b"{}"),
    ("bare NaN", b"NaN"),
]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
@pytest.mark.parametrize(("name", "line"), TABLE, ids=[name for name, _ in TABLE])
def test_malformed_table(tmp_path: Path, name: str, line: bytes, command: list[str]) -> None:
    run_cli(tmp_path, line, command)


def test_reported_cases_are_rejected_with_their_line(tmp_path: Path, capsys) -> None:
    rollouts = tmp_path / "r.jsonl"
    for raw in ("NaN", "1e400", "9" * 5000, "1" + "0" * 309):
        rollouts.write_text(json.dumps(OTHER) + "\n" + mutate(("reward",), None, raw) + "\n")
        assert main(["route", "--input", str(rollouts), "--out", str(tmp_path / "o.jsonl")]) == 2
        assert f"{rollouts}:2: " in capsys.readouterr().err
    rollouts.write_bytes(json.dumps(OTHER).encode() + b"\n" + b'{"id": "\xff"}\n')
    assert main(["annotate", "--input", str(rollouts), "--out", str(tmp_path / "o.jsonl")]) == 2
    assert f"{rollouts}:2: invalid UTF-8" in capsys.readouterr().err


def _splice(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["value", "raw", "bytes", "graph"]))
    if kind == "value":
        path = draw(st.sampled_from(PATHS))
        return mutate(path, draw(st.sampled_from(BAD_VALUES))).encode()
    if kind == "raw":
        path = draw(st.sampled_from(PATHS))
        return mutate(path, None, draw(st.sampled_from(RAW_TOKENS))).encode()
    if kind == "graph":
        graph = draw(
            st.recursive(
                st.none() | st.booleans() | st.integers() | st.text(max_size=5) | st.sampled_from(BAD_VALUES[:13]),
                lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
                max_leaves=12,
            )
        )
        field = draw(st.sampled_from(["edges", "errors", "direct_user_inputs", "num_actions", None]))
        raw_graph = json.loads(json.dumps(BASE["graph"]))
        if field is None:
            raw_graph = graph
        else:
            raw_graph[field] = graph
        return json.dumps({**BASE, "graph": raw_graph}).encode()
    data = bytearray(json.dumps(BASE).encode())
    position = draw(st.integers(0, len(data)))
    junk = draw(st.binary(min_size=1, max_size=3).filter(lambda b: b"\n" not in b and b"\r" not in b))
    data[position:position] = junk
    return bytes(data)


@pytest.mark.slow
@settings(
    max_examples=int(os.environ.get("VERL_CREDIT_FUZZ_EXAMPLES", "60")),
    deadline=None,
    derandomize=os.environ.get("VERL_CREDIT_FUZZ_SEED") is None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_fuzzed_rollouts(tmp_path: Path, data: st.DataObject) -> None:
    line = data.draw(st.composite(lambda draw: _splice(draw))())
    command = data.draw(st.sampled_from(COMMANDS))
    run_cli(tmp_path, line, command)
