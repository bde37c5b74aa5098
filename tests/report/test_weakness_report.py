"""``verl-credit weakness``: credit by role and the three systematic weaknesses."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from verl_credit.cli.main import main
from verl_credit.report.weakness import RunCall, RunTrajectory, compute_weakness_report


def tc(call_id: str, name: str, args: dict) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def step(call_id: str, name: str, args: dict, result: str) -> list[dict]:
    return [
        {"role": "assistant", "content": "", "tool_calls": [tc(call_id, name, args)]},
        {"role": "tool", "tool_call_id": call_id, "content": result},
    ]


EDIT = {"path": "pkg/a.py", "old": "x = 1", "new": "x = 2"}
DIFF = "--- a/pkg/a.py\n+++ b/pkg/a.py\n@@ -1 +1 @@\n-x = 1\n+x = 2"

RUN = [
    {  # T1, success: an unused README read, a used read, an edit, a passing test
        "id": "t1",
        "uid": "u",
        "reward": 1.0,
        "action_token_lengths": [2, 2, 4, 2],
        "messages": [
            {"role": "user", "content": "fix x"},
            *step("a", "read_file", {"path": "README.md"}, "# project"),
            *step("b", "read_file", {"path": "pkg/a.py"}, "x = 1\n"),
            *step("c", "edit_file", EDIT, DIFF),
            *step("d", "run_tests", {}, "2 passed in 0.1s"),
        ],
    },
    {  # T2, failure: a used read, an edit never verified, a final answer (IG, no tools)
        "id": "t2",
        "uid": "u",
        "reward": 0.0,
        "action_token_lengths": [2, 4, 1],
        "messages": [
            {"role": "user", "content": "fix x"},
            *step("a", "read_file", {"path": "pkg/a.py"}, "x = 1\n"),
            *step("b", "edit_file", EDIT, DIFF),
            {"role": "assistant", "content": "done"},
        ],
    },
    {  # T3, failure (its own group): a failing test naming pkg/b.py that nothing answers, an unused read
        "id": "t3",
        "uid": "v",
        "reward": 0.0,
        "action_token_lengths": [2, 2, 1],
        "messages": [
            {"role": "user", "content": "fix y"},
            *step("a", "run_tests", {}, "FAILED tests/test_b.py::test_y\npkg/b.py:3: AssertionError\n1 failed in 0.1s"),
            *step("b", "read_file", {"path": "pkg/c.py"}, "z = 3\n"),
            {"role": "assistant", "content": "I give up"},
        ],
    },
]


def write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_weakness_report_from_rollouts_hand_computed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rollouts = write(tmp_path / "run.jsonl", RUN)
    out = tmp_path / "weak.json"
    assert main(["weakness", "--input", str(rollouts), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    report = json.loads(out.read_text())
    weak = report["weaknesses"]
    # IG calls with tools: t1 README (unused), t1 pkg/a.py (used), t2 pkg/a.py (used), t3 pkg/c.py (unused)
    assert (weak["unused_reads"]["count"], weak["unused_reads"]["of"]) == (2, 4)
    assert [(e["id"], e["call"]) for e in weak["unused_reads"]["examples"]] == [("t1", 0), ("t3", 1)]
    # AE calls: t1's edit is followed by a test (AE->RV); t2's is not
    assert (weak["unverified_edits"]["count"], weak["unverified_edits"]["of"]) == (1, 2)
    # failing RV calls: t3's names pkg/b.py and no edit follows
    assert (weak["ignored_failures"]["count"], weak["ignored_failures"]["of"]) == (1, 1)
    assert weak["ignored_failures"]["rv_calls_without_status"] == 0
    # Credit (call_credit defaults: lambda 1, gamma 0.95, omega AE 1 / IG 0.6 / RV 0.4):
    # group u: R = (1, 0) -> A = +-0.70711; group v has one sample -> A = R = 0 (no mass).
    # t1: deg + 1 = (1, 2, 2, 1) / 6, gamma^(4 - pos) = (.857375, .9025, .95, 1)
    #     s = (.0857375, .1805, .316667, .0666667); sum L s = 1.932475 with L = (2, 2, 4, 2), L = 10
    #     w = 10 s / 1.932475 = (0.443667, 0.934036, 1.638660, 0.344981)
    # t2: deg + 1 = (2, 1, 1) / 4, gamma = (.9025, .95, 1), omega (.6, 1, .6)
    #     s = (.27075, .2375, .15); sum L s = 1.6415 with L = (2, 4, 1) -> w = (1.154584, 1.012793, 0.639659)
    # total mass sum L |A| = 0.70711 * (10 + 7); unused reads: 2 * 0.443667 (t1 README) + 0 (t3) -> / 17
    assert math.isclose(weak["unused_reads"]["credit_share"], 2 * 0.443667 / 17, abs_tol=1e-5)
    assert math.isclose(weak["unverified_edits"]["credit_share"], 4 * 1.012793 / 17, abs_tol=1e-5)
    roles = report["roles"]
    # calls: IG 2 + 2 + 2 (incl. the two final answers), AE 2, RV 2 of 10 (t2's and t3's answers are IG)
    assert [roles[r]["calls"] for r in ("IG", "AE", "RV")] == [6, 2, 2]
    # mean per-token advantage of IG on successful trajectories: t1 calls 0, 1 (2 tokens each):
    # 0.70711 * (0.443667 + 0.934036) / 2 = 0.487097
    assert math.isclose(roles["IG"]["mean_advantage_success"], 0.487097, abs_tol=1e-5)
    assert math.isclose(roles["AE"]["mean_advantage_success"], 0.70711 * 1.638660, abs_tol=1e-5)
    assert "reads whose content was never used: 2 / 4 (50.0%)" in text
    assert "edits never verified: 1 / 2 (50.0%)" in text
    assert "tests run but failures ignored: 1 / 1 (100.0%)" in text
    assert "t3 call 0: run_tests({})" in text


def test_weakness_report_from_credit_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rollouts = write(tmp_path / "run.jsonl", RUN)
    credit = tmp_path / "credit.jsonl"
    assert main(["route", "--input", str(rollouts), "--out", str(credit), "--estimator", "call_credit"]) == 0
    capsys.readouterr()
    out = tmp_path / "weak.json"
    assert main(["weakness", "--input", str(credit), "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    weak = report["weaknesses"]
    # without transcripts every IG call counts (tool use unknown): 6 IG calls, 4 without IG->AE edges
    assert (weak["unused_reads"]["count"], weak["unused_reads"]["of"]) == (4, 6)
    assert (weak["unverified_edits"]["count"], weak["unverified_edits"]["of"]) == (1, 2)
    # test outcomes are unknown from credit lines: reported, not guessed
    assert (weak["ignored_failures"]["of"], weak["ignored_failures"]["rv_calls_without_status"]) == (0, 2)
    assert "2 RV calls without transcripts" in capsys.readouterr().out


def test_weakness_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = write(tmp_path / "bad.jsonl", [RUN[0], {"id": "x", "reward": 1.0}])
    assert main(["weakness", "--input", str(bad)]) == 2
    assert "bad.jsonl:2: needs 'messages'" in capsys.readouterr().err
    bad = write(tmp_path / "bad2.jsonl", [{"id": "x", "reward": 1.0, "actions": [], "call_graph": {"roles": ["IG"]}}])
    assert main(["weakness", "--input", str(bad)]) == 2
    assert "bad2.jsonl:1: credit line: 0 actions but the call graph has 1 calls" in capsys.readouterr().err


def test_compute_weakness_report_directly() -> None:
    calls = (
        RunCall("IG", 3, 0.5, 1.0, "cat x", acts=True, has_ig_use=False),
        RunCall("AE", 1, 2.0, 1.0, "edit", acts=True, has_verification=True),
        RunCall("RV", 1, -1.0, 1.0, "pytest", acts=True, rv_status="fail", failure_ignored=False),
        RunCall("IG", 0, 0.0, 1.0, "text", acts=False),  # a plain-text call never counts as an unused read
    )
    report = compute_weakness_report([RunTrajectory("a", 1.0, calls)], examples=0)
    # mass = 3 * 0.5 + 1 * 2 + 1 * 1 = 4.5; the unused read holds 1.5 of it
    assert report["weaknesses"]["unused_reads"] == {
        "label": "reads whose content was never used",
        "count": 1,
        "of": 1,
        "rate": 1.0,
        "credit_share": 1.5 / 4.5,
        "examples": [],
    }
    assert report["weaknesses"]["ignored_failures"]["count"] == 0
    assert report["weaknesses"]["ignored_failures"]["of"] == 1
    assert report["roles"]["RV"]["mean_advantage_success"] == -1.0
    assert report["roles"]["AE"]["mean_advantage_failure"] is None


# -- the credit file's roles, null kept; descriptions never empty -----------------
AMBIGUOUS_RUN = [
    {  # a read, an edit, a script run whose output checks nothing (the rules cannot classify it), a test
        "id": "s1",
        "uid": "w",
        "reward": 1.0,
        "action_token_lengths": [2, 4, 3, 2],
        "messages": [
            {"role": "user", "content": "fix x"},
            *step("a", "read_file", {"path": "pkg/a.py"}, "x = 1\n"),
            *step("b", "edit_file", EDIT, DIFF),
            *step("c", "bash", {"command": "python scripts/seed.py"}, "Inserted 5000 rows"),
            *step("d", "run_tests", {}, "2 passed in 0.1s"),
        ],
    },
    {  # a failure: an unused read and a final message without text or tools
        "id": "s2",
        "uid": "w",
        "reward": 0.0,
        "action_token_lengths": [2, 1],
        "messages": [
            {"role": "user", "content": "fix x"},
            *step("a", "read_file", {"path": "docs/notes.md"}, "# notes"),
            {"role": "assistant", "content": ""},
        ],
    },
]


def routed(tmp_path: Path, capsys: pytest.CaptureFixture[str], records: list[dict]) -> tuple[Path, Path]:
    rollouts = write(tmp_path / "run.jsonl", records)
    credit = tmp_path / "credit.jsonl"
    assert main(["route", "--input", str(rollouts), "--out", str(credit), "--estimator", "call_credit"]) == 0
    capsys.readouterr()
    return rollouts, credit


def test_a_null_role_in_the_credit_file_stays_null(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rollouts, credit = routed(tmp_path, capsys, AMBIGUOUS_RUN)
    line = json.loads(credit.read_text().splitlines()[0])
    assert [a["role"] for a in line["actions"]] == ["IG", "AE", None, "RV"]  # the script run is ambiguous
    assert line["call_graph"]["roles"][2] == "RV"  # ... the math used the position prior's tie-break
    out = tmp_path / "weak.json"
    assert main(["weakness", "--input", str(credit), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    roles = json.loads(out.read_text())["roles"]
    assert [roles[r]["calls"] for r in ("IG", "AE", "RV", "unclassified")] == [3, 1, 1, 1]
    assert "unclassified (null)" in text
    # the rollouts give the same report as their credit file
    out_rollouts = tmp_path / "weak_rollouts.json"
    assert main(["weakness", "--input", str(rollouts), "--json", str(out_rollouts)]) == 0
    capsys.readouterr()
    assert json.loads(out_rollouts.read_text())["roles"]["unclassified"]["calls"] == 1


def test_the_credit_files_roles_are_used_not_the_call_graphs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, credit = routed(tmp_path, capsys, AMBIGUOUS_RUN)
    lines = [json.loads(text) for text in credit.read_text().splitlines()]
    lines[0]["actions"][0]["role"] = "RV"  # relabelled in the credit file (e.g. by a reviewer)
    edited = write(tmp_path / "edited.jsonl", lines)
    out = tmp_path / "weak.json"
    assert main(["weakness", "--input", str(edited), "--json", str(out)]) == 0
    capsys.readouterr()
    roles = json.loads(out.read_text())["roles"]
    assert [roles[r]["calls"] for r in ("IG", "AE", "RV", "unclassified")] == [2, 1, 2, 1]
    lines[0]["actions"][0]["role"] = "XX"
    bad = write(tmp_path / "bad.jsonl", lines)
    assert main(["weakness", "--input", str(bad)]) == 2
    assert "bad.jsonl:1: credit line: call 0: role 'XX'" in capsys.readouterr().err


def test_every_example_has_a_description(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rollouts, credit = routed(tmp_path, capsys, AMBIGUOUS_RUN)
    for argv, expect in (
        (["--input", str(credit)], "IG call 0 (2 tokens"),  # what the credit line says
        (["--input", str(credit), "--rollouts", str(rollouts)], "read_file("),  # its tool calls
        (["--input", str(rollouts)], "read_file("),
    ):
        out = tmp_path / "weak.json"
        assert main(["weakness", *argv, "--json", str(out), "--examples", "5"]) == 0
        text = capsys.readouterr().out
        examples = [e for w in json.loads(out.read_text())["weaknesses"].values() for e in w["examples"]]
        assert examples and all(e["summary"].strip() for e in examples), examples
        assert expect in text
        assert not [row for row in text.splitlines() if ":  (A=" in row or row.rstrip().endswith(":")]


def test_a_call_with_neither_text_nor_tools_is_described(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from verl_credit.report.weakness import describe_call

    assert describe_call(4, None, "  \n ") == "unclassified (role null) call 4"
    assert describe_call(1, "IG", "", length=2, weight=0.5) == "IG call 1 (2 tokens, weight 0.500)"
    assert describe_call(0, "IG", "cat   a.py\n| head") == "cat a.py | head"
