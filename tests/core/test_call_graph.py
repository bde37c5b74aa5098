"""Causal call graphs of CALL-CREDIT (docs/design.md section 2.2) on realistic harness transcripts: exact edges."""

from __future__ import annotations

import json

import httpx
import pytest

from verl_credit.annotate.roles import (
    AE,
    IG,
    RV,
    OpenAIRoleClassifier,
    analyze_calls,
    build_call_graph,
)
from verl_credit.call_graph import CallEdge, CallGraph
from verl_credit.trajectory import Trajectory


def tc(call_id: str, name: str, args: dict) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def assistant(*calls: dict, content: str = "") -> dict:
    return {"role": "assistant", "content": content, "tool_calls": list(calls) if calls else None}


def tool(call_id: str, text: str) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def edges_of(graph: CallGraph) -> set[tuple[int, int, str]]:
    return {(e.src, e.dst, e.kind) for e in graph.edges}


def claude_code_transcript() -> list[dict]:
    """Grep -> Read -> Read (unrelated) -> failing test -> reasoning -> Edit -> passing test -> Edit -> answer."""
    return [
        {"role": "system", "content": "You are Claude Code."},
        {"role": "user", "content": "parse_date returns naive datetimes; make them UTC-aware"},
        assistant(tc("c0", "Grep", {"pattern": "parse_date\\(", "output_mode": "content", "-n": True})),
        tool(
            "c0",
            "src/utils/dates.py:5:def parse_date(value: str) -> datetime:\n"
            "src/app/billing.py:12:    due = parse_date(row['due'])",
        ),
        assistant(tc("c1", "Read", {"file_path": "/repo/src/utils/dates.py"})),
        tool(
            "c1",
            "     1\tfrom datetime import datetime, timezone\n     5\tdef parse_date(value: str) -> datetime:\n"
            "     7\t    return datetime.strptime(value, '%Y-%m-%d')\n",
        ),
        assistant(tc("c2", "Read", {"file_path": "/repo/README.md"})),
        tool("c2", "# billing\nA small billing app."),
        assistant(tc("c3", "Bash", {"command": "python -m pytest tests/test_dates.py -q"})),
        tool(
            "c3",
            "F\n>       assert parse_date('2024-01-01').tzinfo is not None\nE       AssertionError\n\n"
            "src/utils/dates.py:7: AssertionError\n1 failed in 0.05s",
        ),
        assistant(content="The parser drops the timezone; I will attach UTC."),
        assistant(
            tc(
                "c5",
                "Edit",
                {
                    "file_path": "/repo/src/utils/dates.py",
                    "old_string": "    return datetime.strptime(value, '%Y-%m-%d')",
                    "new_string": "    return datetime.strptime(value, '%Y-%m-%d').replace(tzinfo=timezone.utc)",
                },
            )
        ),
        tool("c5", "The file /repo/src/utils/dates.py has been updated."),
        assistant(tc("c6", "Bash", {"command": "python -m pytest tests/test_dates.py -q"})),
        tool("c6", ".\n1 passed in 0.04s"),
        assistant(
            tc(
                "c7",
                "Edit",
                {
                    "file_path": "/repo/src/app/billing.py",
                    "old_string": "datetime.utcnow()",
                    "new_string": "datetime.now(timezone.utc)",
                },
            )
        ),
        tool("c7", "The file /repo/src/app/billing.py has been updated."),
        assistant(content="Done: parse_date now returns UTC-aware datetimes."),
    ]


def test_claude_code_trajectory_roles_and_edges() -> None:
    trajectory = Trajectory.from_messages(claude_code_transcript(), reward=1.0)
    graph = build_call_graph(trajectory)
    # call 4 (plain reasoning) inherits AE from call 5; the final answer (8) has no next call -> IG.
    assert graph.roles == (IG, IG, IG, RV, AE, AE, RV, AE, IG)
    assert graph.ambiguous == (False,) * 9
    assert edges_of(graph) == {
        (0, 5, "IG->AE"),  # the grep result named src/utils/dates.py
        (1, 5, "IG->AE"),  # the read of that file
        (0, 7, "IG->AE"),  # the grep also named src/app/billing.py, edited 7 calls later
        (3, 5, "RV->AE"),  # the failing test named src/utils/dates.py; call 5 fixed it
        (5, 6, "AE->RV"),  # the test ran after the edit
    }
    # the README read (2) fed nothing; the billing edit (7) was never verified
    assert list(graph.out_degree()) == [2, 1, 0, 1, 0, 1, 0, 0, 0]
    units = {(e.src, e.dst): e.unit for e in graph.edges}
    assert units[(0, 7)] == "/repo/src/app/billing.py"
    facts = analyze_calls(trajectory)
    assert facts[3].rv_status == "fail" and facts[6].rv_status == "pass"
    assert facts[4].source == "inherited" and facts[8].source == "default"


def codex_transcript() -> list[dict]:
    def sh(call_id: str, script: str) -> dict:
        return tc(call_id, "shell", {"command": ["bash", "-lc", script], "workdir": "/w"})

    def out(text: str, code: int = 0) -> str:
        return json.dumps({"output": text, "metadata": {"exit_code": code}})

    patch_parser = (
        "*** Begin Patch\n*** Update File: src/parser.rs\n@@\n-    let (k, v) = line.split_once(':').unwrap();\n"
        "+    let (k, v) = line.split_once(':').ok_or(Error::MissingColon)?;\n*** End Patch"
    )
    patch_import = "*** Begin Patch\n*** Update File: src/parser.rs\n@@\n+use crate::error::Error;\n*** End Patch"
    patch_error = "*** Begin Patch\n*** Add File: src/error.rs\n+pub enum Error { MissingColon }\n*** End Patch"
    return [
        {"role": "user", "content": "parse_header panics on lines without a colon"},
        assistant(sh("c0", 'rg -n "fn parse_header" -S')),
        tool("c0", out("src/parser.rs:3:pub fn parse_header(line: &str) -> Result<Header, Error> {")),
        assistant(sh("c1", "sed -n '1,80p' src/lib.rs")),
        tool("c1", out("mod parser;\npub use parser::parse_header;")),
        assistant(tc("c2", "apply_patch", {"input": patch_parser})),
        tool("c2", "Success. Updated the following files:\nM src/parser.rs"),
        assistant(sh("c3", "cargo test -q")),
        tool(
            "c3", out("error[E0433]: failed to resolve: use of undeclared type `Error`\n --> src/parser.rs:4:52", 101)
        ),
        assistant(sh("c4", "apply_patch <<'PATCH'\n" + patch_import + "\nPATCH")),
        tool("c4", out("Success. Updated the following files:\nM src/parser.rs")),
        assistant(tc("c5", "shell", {"command": ["apply_patch", patch_error]})),
        tool("c5", out("Success. Updated the following files:\nA src/error.rs")),
        assistant(sh("c6", "cargo test -q")),
        tool("c6", out("running 6 tests\n......\ntest result: ok. 6 passed; 0 failed")),
    ]


def test_codex_trajectory_self_correction_and_blocked_verification() -> None:
    trajectory = Trajectory.from_messages(codex_transcript(), reward=1.0)
    graph = build_call_graph(trajectory)
    assert graph.roles == (IG, IG, AE, RV, AE, AE, RV)
    assert edges_of(graph) == {
        (0, 2, "IG->AE"),
        (0, 4, "IG->AE"),  # rg named src/parser.rs, patched twice
        (2, 3, "AE->RV"),  # the first build checked the first patch
        (3, 4, "RV->AE"),  # the build error named src/parser.rs; call 4 patched it
        (4, 6, "AE->RV"),
        (5, 6, "AE->RV"),
        # no 2 -> 6: call 4 touched src/parser.rs again before the last test (and its output names no path)
        # nothing from 1: src/lib.rs was read but never edited
    }
    facts = analyze_calls(trajectory)
    assert [sorted(f.edited_paths) for f in facts if f.role == AE] == [
        ["src/parser.rs"],
        ["src/parser.rs"],
        ["src/error.rs"],
    ]


def test_verification_that_names_the_path_survives_a_later_edit() -> None:
    # AE0 edits a.py, AE1 edits a.py again, RV2 names a.py in its output -> both AE -> RV edges.
    messages = [
        {"role": "user", "content": "x"},
        assistant(tc("a", "Edit", {"file_path": "a.py", "old_string": "x", "new_string": "y"})),
        tool("a", "ok"),
        assistant(tc("b", "Edit", {"file_path": "a.py", "old_string": "y", "new_string": "z"})),
        tool("b", "ok"),
        assistant(tc("c", "Bash", {"command": "pytest -q"})),
        tool("c", "tests/test_a.py .. \nCoverage: a.py 100%\n2 passed in 0.1s"),
        assistant(tc("d", "Edit", {"file_path": "b.py", "old_string": "x", "new_string": "y"})),
        tool("d", "ok"),
        assistant(tc("e", "Bash", {"command": "pytest -q"})),
        tool("e", "2 passed in 0.1s"),
    ]
    graph = build_call_graph(Trajectory.from_messages(messages))
    assert graph.roles == (AE, AE, RV, AE, RV)
    # AE1 -> RV4 too: the b.py edit in between touches another file, so it does not block
    assert edges_of(graph) == {(0, 2, "AE->RV"), (1, 2, "AE->RV"), (1, 4, "AE->RV"), (3, 4, "AE->RV")}


def test_self_correction_edge_stops_at_the_next_test_run() -> None:
    messages = [
        {"role": "user", "content": "x"},
        assistant(tc("a", "run_tests", {})),
        tool("a", "FAILED tests/test_m.py::test_x - AssertionError\nsrc/m.py:3: AssertionError\n1 failed in 0.1s"),
        assistant(tc("b", "run_tests", {})),
        tool("b", "FAILED tests/test_m.py::test_x\n1 failed in 0.1s"),
        assistant(tc("c", "edit_file", {"path": "src/m.py", "old": "1", "new": "2"})),
        tool("c", "--- a/src/m.py\n+++ b/src/m.py\n@@ -3 +3 @@\n-1\n+2"),
    ]
    graph = build_call_graph(Trajectory.from_messages(messages))
    # RV0 named src/m.py but RV1 ran in between; RV1's failure output names only the test file.
    assert graph.roles == (RV, RV, AE)
    assert edges_of(graph) == set()


def test_long_distance_read_to_edit_edge() -> None:
    filler = []
    for k in range(8):
        filler += [assistant(tc(f"f{k}", "Read", {"file_path": f"docs/page{k}.md"})), tool(f"f{k}", "text")]
    messages = [
        {"role": "user", "content": "x"},
        assistant(tc("a", "Glob", {"pattern": "**/*.py"})),
        tool("a", "/w/pkg/core.py\n/w/pkg/util.py"),
        *filler,
        assistant(tc("b", "Write", {"file_path": "/w/pkg/util.py", "content": "X = 1\n"})),
        tool("b", "File created successfully at: /w/pkg/util.py"),
    ]
    graph = build_call_graph(Trajectory.from_messages(messages))
    assert graph.num_calls == 10
    assert edges_of(graph) == {(0, 9, "IG->AE")}


def test_symbol_reference_links_a_read_to_an_edit() -> None:
    # the search names parse_header_line (no path of the edited file); the edit changes its definition
    messages = [
        {"role": "user", "content": "x"},
        assistant(tc("a", "Grep", {"pattern": "parse_header"})),
        tool("a", "defined in the header module: def parse_header(raw): ..."),
        assistant(
            tc(
                "b",
                "str_replace_editor",
                {
                    "command": "str_replace",
                    "path": "/w/hdr/core.py",
                    "old_str": "def parse_header_line(line):\n    k, v = line.split(':')",
                    "new_str": "def parse_header_line(line, strict=True):\n    k, v = line.split(':', 1)",
                },
            )
        ),
        tool("b", "The file /w/hdr/core.py has been edited."),
    ]
    graph = build_call_graph(Trajectory.from_messages(messages))
    assert graph.roles == (IG, AE) and graph.ambiguous == (False, False)
    assert edges_of(graph) == set()  # parse_header != parse_header_line: whole-word match only
    messages[2]["content"] = "('x', '') from parse_header_line"
    graph = build_call_graph(Trajectory.from_messages(messages))
    assert [(e.src, e.dst, e.kind, e.unit) for e in graph.edges] == [(0, 1, "IG->AE", "symbol:parse_header_line")]


def test_language_keywords_make_no_symbol_edge() -> None:
    # the edit's changed lines are full of keywords (return, lambda, None, if, else); a read that
    # names only those keywords supports nothing, a read naming the defined function does
    messages = [
        {"role": "user", "content": "x"},
        assistant(tc("a", "Grep", {"pattern": "return"})),
        tool("a", "return None if not ok else lambda: None  # return lambda None True False self"),
        assistant(
            tc(
                "b",
                "str_replace_editor",
                {
                    "command": "str_replace",
                    "path": "/w/cb/hooks.py",
                    "old_str": "def make_hook(flag):\n    return None",
                    "new_str": "def make_hook(flag):\n    return lambda: None if flag else None",
                },
            )
        ),
        tool("b", "The file /w/cb/hooks.py has been edited."),
    ]
    graph = build_call_graph(Trajectory.from_messages(messages))
    assert graph.roles == (IG, AE)
    assert edges_of(graph) == set()
    messages[2]["content"] = "return None  # from make_hook"
    graph = build_call_graph(Trajectory.from_messages(messages))
    assert [(e.src, e.dst, e.unit) for e in graph.edges] == [(0, 1, "symbol:make_hook")]


def openhands_transcript() -> list[dict]:
    return [
        {"role": "user", "content": "bulk_create ignores the backend batch limit"},
        assistant(
            tc(
                "a",
                "str_replace_editor",
                {"command": "view", "path": "/w/django/db/models/query.py", "view_range": [1200, 1210]},
            )
        ),
        tool("a", "Here's the result of running `cat -n`:\n  1205\t        batch_size = batch_size or max_batch_size"),
        assistant(
            tc(
                "b",
                "str_replace_editor",
                {
                    "command": "create",
                    "path": "/w/reproduce_issue.py",
                    "file_text": "from django.db.models.query import QuerySet\n",
                },
            )
        ),
        tool("b", "File created successfully at: /w/reproduce_issue.py"),
        assistant(tc("c", "execute_bash", {"command": "cd /w && python reproduce_issue.py"})),
        tool(
            "c",
            'Traceback (most recent call last):\n  File "/w/django/db/models/query.py", line 1205\n'
            "OperationalError: too many SQL variables",
        ),
        assistant(
            tc(
                "d",
                "str_replace_editor",
                {
                    "command": "str_replace",
                    "path": "/w/django/db/models/query.py",
                    "old_str": "batch_size = batch_size or max_batch_size",
                    "new_str": "batch_size = min(batch_size or max_batch_size, max_batch_size)",
                },
            )
        ),
        tool("d", "The file /w/django/db/models/query.py has been edited."),
        assistant(tc("e", "execute_bash", {"command": "cd /w && python reproduce_issue.py"})),
        tool("e", "Inserted 5000 rows"),
        assistant(tc("f", "finish", {"message": "fixed"})),
        tool("f", ""),
    ]


def test_reproduction_script_runs_are_verification_whatever_they_print() -> None:
    graph = build_call_graph(Trajectory.from_messages(openhands_transcript()))
    # c (reproduction) printed a traceback, e (re-run) prints no verdict: both run the script the
    # trajectory wrote, so both are RV; the finish call has no role of its own and no next call -> IG.
    assert graph.roles == (IG, AE, RV, AE, RV, IG)
    assert graph.ambiguous == (False,) * 6
    assert edges_of(graph) == {
        (0, 3, "IG->AE"),
        (1, 2, "AE->RV"),  # the reproduction script, to the runs that execute it
        (1, 4, "AE->RV"),
        (2, 3, "RV->AE"),  # its traceback named query.py, which call 3 edited
        (3, 4, "AE->RV"),
    }


def test_ambiguous_script_runs_use_the_position_prior() -> None:
    messages = openhands_transcript()
    # e runs a script the trajectory did not write and whose output checks nothing: undecided; it
    # follows an AE call, so the position prior says RV
    messages[9]["tool_calls"][0]["function"]["arguments"] = json.dumps({"command": "cd /w && python tools/load.py"})
    graph = build_call_graph(Trajectory.from_messages(messages))
    assert graph.roles == (IG, AE, RV, AE, RV, IG)
    assert graph.ambiguous == (False, False, False, False, True, False)
    assert graph.reported_roles() == [IG, AE, RV, AE, None, IG]


def test_llm_classifier_decides_ambiguous_calls_but_keeps_the_flag() -> None:
    asked: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        prompt = json.loads(request.content)["messages"][1]["content"]
        asked.append(prompt)
        role = "IG" if "Inserted 5000 rows" in prompt else "RV"  # the stub model reads the result
        return httpx.Response(
            200, json={"choices": [{"message": {"role": "assistant", "content": json.dumps({"role": role})}}]}
        )

    classifier = OpenAIRoleClassifier("http://stub/v1", "m", transport=httpx.MockTransport(handler))
    messages = openhands_transcript()
    messages[9]["tool_calls"][0]["function"]["arguments"] = json.dumps({"command": "cd /w && python tools/load.py"})
    graph = build_call_graph(Trajectory.from_messages(messages), classifier=classifier)
    assert len(asked) == 1  # only the ambiguous call goes to the model (call 2's traceback decided it)
    assert graph.roles == (IG, AE, RV, AE, IG, IG)
    assert graph.ambiguous == (False, False, False, False, True, False)
    # now call 4 is a read: no AE -> RV edges into it
    assert not {e for e in edges_of(graph) if e[1] == 4}
    facts = analyze_calls(Trajectory.from_messages(messages), classifier=classifier)
    assert facts[4].source == "llm" and facts[2].source == "rules"


def test_qwen_code_trajectory_and_graph_json_round_trip() -> None:
    messages = [
        {"role": "user", "content": "cart total ignores quantity"},
        assistant(tc("a", "search_file_content", {"pattern": "reduce\\(", "include": "src/**/*.ts"})),
        tool("a", "File: src/cart.ts\nL4: return this.items.reduce((s, i) => s + i.price, 0);"),
        assistant(
            tc(
                "b",
                "replace",
                {
                    "file_path": "/home/dev/shop/src/cart.ts",
                    "old_string": "s + i.price",
                    "new_string": "s + i.price * i.qty",
                },
            )
        ),
        tool("b", "Successfully modified file: /home/dev/shop/src/cart.ts (1 replacements)."),
        assistant(tc("c", "run_shell_command", {"command": "npm test"})),
        tool("c", "Command: npm test\nStdout:  Test Files  1 passed (1)\nExit Code: 0"),
        assistant(content="Fixed."),
    ]
    graph = build_call_graph(Trajectory.from_messages(messages))
    assert graph.roles == (IG, AE, RV, IG)
    # units name the edited path as the edit wrote it
    assert graph.edges == (
        CallEdge(0, 1, "IG->AE", "/home/dev/shop/src/cart.ts"),
        CallEdge(1, 2, "AE->RV", "/home/dev/shop/src/cart.ts"),
    )
    assert CallGraph.from_json(json.loads(json.dumps(graph.to_json()))) == graph


def test_empty_and_text_only_trajectories() -> None:
    assert build_call_graph(Trajectory.from_messages([{"role": "user", "content": "hi"}])).num_calls == 0
    graph = build_call_graph(
        Trajectory.from_messages([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])
    )
    assert graph.roles == (IG,) and graph.edges == ()


@pytest.mark.parametrize(
    ("command", "result", "paths"),
    [
        ("sed -i 's/a.py/b.py/g' src/x.py src/y.py", "", {"src/x.py", "src/y.py"}),  # the expression is no file
        ("echo hi >> notes.txt 2>/dev/null", "", {"notes.txt"}),
        ("cat <<'EOF' > src/new.py\nprint('x')\nEOF", "", {"src/new.py"}),
        ("git checkout -- src/z.py", "", {"src/z.py"}),
        ("patch -p1 < fix.diff", "patching file src/w.py\n", {"src/w.py"}),
        ("perl -pi -e 's/foo/bar/g' lib/Shop/*.pm", "", {"lib/Shop/*.pm"}),
        ("printf 'x' | tee -a out/log.md", "", {"out/log.md"}),
        ("git apply fix.patch", "", set()),  # unknown targets
        ("git apply <<'P'\ndiff --git a/m.py b/m.py\n--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-a\n+b\nP", "", {"m.py"}),
    ],
)
def test_files_written_by_shell_edits(command: str, result: str, paths: set[str]) -> None:
    messages = [{"role": "user", "content": "x"}, assistant(tc("a", "Bash", {"command": command})), tool("a", result)]
    facts = analyze_calls(Trajectory.from_messages(messages))
    assert facts[0].role == AE and set(facts[0].edited_paths) == paths
