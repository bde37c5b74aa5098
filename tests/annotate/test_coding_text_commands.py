"""Coding-agent roles and call graphs on scaffolds that write their commands in the message text, and
the role and graph rules that generalise across scaffolds: reproduction scripts and builds are
verification, symbol edges need a symbol the edit defines, scratch scripts link only to their runs,
failed edits are no edits, and no edge has an empty unit.

Every transcript here is written for this project (an invented calculator package, invented outputs).
"""

from __future__ import annotations

import json

import pytest

from verl_credit.annotate.roles import AE, IG, RV, analyze_calls, build_call_graph, classify_tool_call
from verl_credit.annotate.text_commands import OpenFileTracker, parse_text_commands
from verl_credit.call_graph import CallGraph
from verl_credit.trajectory import Trajectory

ISSUE = "divide() in calc/ops.py raises ZeroDivisionError instead of returning None for a zero divisor"
OPS = "1\tdef divide(a, b):\n2\t    return a / b\n"
TRACEBACK = (
    'Traceback (most recent call last):\n  File "/repo/check_divide.py", line 2, in <module>\n'
    '  File "/repo/calc/ops.py", line 2, in divide\nZeroDivisionError: division by zero\n'
)
SCRIPT = "from calc.ops import divide\nprint(divide(1, 0))\n"
FIX = "sed -i 's/    return a \\/ b/    return None if b == 0 else a \\/ b/' calc/ops.py"
PASSED = "tests/test_ops.py ....                                   [100%]\n4 passed in 0.05s\n"

#: the work of one trajectory: (command line, its output)
STEPS = [
    ("cat -n calc/ops.py", OPS),
    (f"cat > check_divide.py <<'EOF'\n{SCRIPT}EOF", ""),
    ("python check_divide.py", TRACEBACK),
    (FIX, ""),
    ("python check_divide.py", "None\n"),
    ("python -m pytest tests/test_ops.py -q", PASSED),
]


def as_tool_calls() -> list[dict]:
    messages: list[dict] = [{"role": "user", "content": ISSUE}]
    for k, (command, output) in enumerate(STEPS):
        call = {
            "id": f"c{k}",
            "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"command": command})},
        }
        messages += [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{k}", "content": output},
        ]
    return messages


def as_text(wrap_command, wrap_output) -> list[dict]:
    messages: list[dict] = [{"role": "user", "content": ISSUE}]
    for command, output in STEPS:
        messages += [
            {"role": "assistant", "content": wrap_command(command)},
            {"role": "user", "content": wrap_output(output)},
        ]
    return messages


SCAFFOLDS = {
    "fenced bash block": lambda: as_text(
        lambda c: f"THOUGHT: next step.\n\n```bash\n{c}\n```",
        lambda o: f"<returncode>0</returncode>\n<output>\n{o}</output>",
    ),
    "fenced block without a language": lambda: as_text(
        lambda c: f"Let me run this.\n```\n{c}\n```",
        lambda o: f"{o}\n(Open file: n/a)\n(Current directory: /repo)\nbash-$",
    ),
    "CodeAct execute_bash": lambda: as_text(
        lambda c: f"I will run it.\n<execute_bash>\n{c}\n</execute_bash>", lambda o: f"OBSERVATION:\n{o}"
    ),
    "function-call text": lambda: as_text(
        lambda c: f"<function=execute_bash>\n<parameter=command>\n{c}\n</parameter>\n</function>",
        lambda o: f"EXECUTION RESULT of [execute_bash]:\n{o}",
    ),
}


def graph_of(messages: list[dict]) -> CallGraph:
    return build_call_graph(Trajectory.from_messages(messages))


def edges(graph: CallGraph) -> set[tuple[int, int, str]]:
    return {(e.src, e.dst, e.kind) for e in graph.edges}


# ---------------------------------------------------------------------------------------------
# Commands in text read like tool calls
# ---------------------------------------------------------------------------------------------


def test_the_tool_call_version_of_the_work() -> None:
    graph = graph_of(as_tool_calls())
    assert graph.roles == (IG, AE, RV, AE, RV, RV)
    assert not any(graph.ambiguous)
    assert edges(graph) == {
        (0, 3, "IG->AE"),  # read calc/ops.py, then edited it
        (1, 2, "AE->RV"),  # the scratch script links to the runs that execute it ...
        (1, 4, "AE->RV"),  # ... and to nothing else (not to the pytest run)
        (2, 3, "RV->AE"),  # its traceback named calc/ops.py, which the fix edits
        (3, 4, "AE->RV"),
        (3, 5, "AE->RV"),
    }


@pytest.mark.parametrize("scaffold", SCAFFOLDS, ids=list(SCAFFOLDS))
def test_commands_in_text_give_the_same_roles_paths_and_graph(scaffold: str) -> None:
    expected = graph_of(as_tool_calls())
    messages = SCAFFOLDS[scaffold]()
    graph = graph_of(messages)
    assert graph.roles == expected.roles
    assert graph.ambiguous == expected.ambiguous
    assert [(e.src, e.dst, e.kind, e.unit) for e in graph.edges] == [
        (e.src, e.dst, e.kind, e.unit) for e in expected.edges
    ]
    facts = analyze_calls(Trajectory.from_messages(messages))
    assert all(f.from_text for f in facts)


def test_swe_agent_command_language() -> None:
    """open / goto / edit N:M ... end_of_edit (of the open file) / create / search_* / find_file / submit."""

    def say(text: str) -> dict:
        return {"role": "assistant", "content": f"Next.\n```\n{text}\n```"}

    def see(text: str, open_file: str = "/repo/calc/ops.py") -> dict:
        return {"role": "user", "content": f"{text}\n(Open file: {open_file})\n(Current directory: /repo)\nbash-$"}

    messages = [
        {"role": "user", "content": ISSUE},
        say('find_file "ops.py"'),
        see('Found 1 matches for "ops.py" in /repo:\n/repo/calc/ops.py', "n/a"),
        say("open calc/ops.py"),
        see("[File: /repo/calc/ops.py (2 lines total)]\n" + OPS.replace("\t", ":")),
        say('search_dir "divide(" tests'),
        see('Found 3 matches for "divide(" in /repo/tests:\n/repo/tests/test_ops.py (3 matches)'),
        say("goto 2"),
        see("[File: /repo/calc/ops.py (2 lines total)]\n2:    return a / b"),
        say("edit 2:2\n    return None if b == 0 else a / b\nend_of_edit"),
        see(
            "[File: /repo/calc/ops.py (2 lines total)]\n1:def divide(a, b):\n"
            "2:    return None if b == 0 else a / b\nFile updated."
        ),
        say("create check_divide.py"),
        see("[File: /repo/check_divide.py (1 lines total)]\n1:", "/repo/check_divide.py"),
        say("edit 1:1\n" + SCRIPT + "end_of_edit"),
        see(
            "[File: /repo/check_divide.py (2 lines total)]\n1:from calc.ops import divide\n2:print(divide(1, 0))",
            "/repo/check_divide.py",
        ),
        say("python check_divide.py"),
        see("None", "/repo/check_divide.py"),
        say("submit"),
        see("diff --git a/calc/ops.py b/calc/ops.py", "/repo/check_divide.py"),
    ]
    facts = analyze_calls(Trajectory.from_messages(messages))
    assert [f.role for f in facts] == [IG, IG, IG, IG, AE, AE, AE, RV, IG]
    assert facts[4].edited_paths == {"/repo/calc/ops.py"}  # the file `open` opened
    assert facts[6].edited_paths == {"/repo/check_divide.py"}  # `create` opened the new file
    assert facts[8].source == "default"  # submit: no role of its own
    graph = graph_of(messages)
    assert {(0, 4), (1, 4), (3, 4)} <= {(s, d) for s, d, k in edges(graph) if k == "IG->AE"}
    assert (2, 4, "IG->AE") not in edges(graph)  # the search named only tests/test_ops.py
    assert {(s, d) for s, d, k in edges(graph) if k == "AE->RV"} == {(4, 7), (6, 7)}


def test_the_open_file_is_tracked_across_messages() -> None:
    tracker = OpenFileTracker()
    assert parse_text_commands("```\nopen src/a.py 10\n```", tracker)[0].arguments == {"path": "src/a.py"}
    (edit,) = parse_text_commands("```\nedit 3:4\nx = 1\nend_of_edit\n```", tracker)
    assert edit.name == "edit" and edit.arguments == {"path": "src/a.py", "new_str": "x = 1"}
    (scroll,) = parse_text_commands("```\nscroll_down\n```", tracker)
    assert scroll.arguments == {"path": "src/a.py"}


def test_the_command_is_the_last_shell_block_not_the_text_between_two_blocks() -> None:
    text = (
        "The fix should look like this:\n```python\nreturn None if b == 0 else a / b\n```\n"
        "Let me apply it.\n\n```bash\nsed -i 's/x/y/' calc/ops.py\n```"
    )
    (command,) = parse_text_commands(text)
    assert command.arguments == {"command": "sed -i 's/x/y/' calc/ops.py"}
    assert parse_text_commands("Here is the code:\n```python\nprint(1)\n```\nDone.") == []


def test_autocoderover_api_calls_and_patch_blocks() -> None:
    messages = [
        {"role": "user", "content": ISSUE},
        {
            "role": "assistant",
            "content": 'I need the implementation.\nsearch_method_in_file("divide", "calc/ops.py")\n'
            'search_class("Calculator")',
        },
        {
            "role": "user",
            "content": "Result of search_method_in_file:\nFound 1 methods with name `divide` in file calc/ops.py:\n"
            "<file>calc/ops.py</file>\n<func>divide</func>",
        },
        {
            "role": "assistant",
            "content": "# modification 1\n<file>calc/ops.py</file>\n<original>    return a / b\n</original>\n"
            "<patched>    return None if b == 0 else a / b\n</patched>",
        },
        {"role": "user", "content": "Patch applied."},
    ]
    facts = analyze_calls(Trajectory.from_messages(messages))
    assert [f.role for f in facts] == [IG, AE]
    assert facts[1].edited_paths == {"calc/ops.py"}
    assert edges(graph_of(messages)) == {(0, 1, "IG->AE")}


def test_codeact_ipython_agent_skills() -> None:
    messages = [
        {"role": "user", "content": ISSUE},
        {"role": "assistant", "content": "<execute_ipython>\nopen_file('/repo/calc/ops.py')\n</execute_ipython>"},
        {
            "role": "user",
            "content": "OBSERVATION:\n[File: /repo/calc/ops.py (2 lines total)]\n"
            "1|def divide(a, b):\n2|    return a / b",
        },
        {
            "role": "assistant",
            "content": "<execute_ipython>\nedit_file_by_replace('/repo/calc/ops.py', to_replace='    return a / b', "
            "new_content='    return None if b == 0 else a / b')\n</execute_ipython>",
        },
        {"role": "user", "content": "OBSERVATION:\n[File: /repo/calc/ops.py (2 lines total after edit)]"},
        {
            "role": "assistant",
            "content": "<execute_ipython>\nfrom calc.ops import divide\nprint(divide(1, 0))\n</execute_ipython>",
        },
        {"role": "user", "content": "OBSERVATION:\nNone"},
    ]
    graph = graph_of(messages)
    assert graph.roles == (IG, AE, RV)  # the last block runs the changed code: a probe
    assert edges(graph) == {(0, 1, "IG->AE"), (1, 2, "AE->RV")}


def test_a_message_without_a_command_keeps_the_rule_for_text() -> None:
    messages = as_text(lambda c: f"```bash\n{c}\n```", lambda o: o)
    messages.insert(1, {"role": "assistant", "content": "Let me think about where divide() lives."})
    messages.insert(2, {"role": "user", "content": "Please continue."})
    facts = analyze_calls(Trajectory.from_messages(messages))
    assert facts[0].source == "inherited" and facts[0].role == IG and not facts[0].from_text


def test_a_tool_calling_agent_showing_a_command_to_the_user_makes_no_call() -> None:
    shown = {"role": "assistant", "content": "Done. Run it yourself with:\n```bash\npytest -q\n```"}
    messages = [*as_tool_calls(), shown]
    facts = analyze_calls(Trajectory.from_messages(messages))
    assert facts[-1].source == "default" and not facts[-1].from_text


# ---------------------------------------------------------------------------------------------
# Reproduction scripts, probes and builds are verification
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        "python reproduce.py",
        "python3 /tmp/repro_issue.py",
        "cd /repo && python check_fix.py",
        "python verify_divide.py --verbose",
        "node debug_parser.js",
        "bash reproduce.sh",
        "python -c 'from calc.ops import divide; print(divide(1, 0))'",
        "python - <<'EOF'\nfrom calc.ops import divide\nprint(divide(4, 2))\nEOF",
    ],
)
def test_reproduction_runs_and_probes_are_verification_whatever_they_print(command: str) -> None:
    for output in ("None\n", "", TRACEBACK):
        decision = classify_tool_call("bash", {"command": command}, output)
        assert decision.role == RV and not decision.ambiguous, (command, output, decision.reason)


@pytest.mark.parametrize(
    "command",
    [
        "python -c 'import calc, inspect; print(inspect.getsource(calc.ops.divide))'",
        "python -c 'import calc; print(calc.__file__)'",
        "python -c 'import numpy; print(numpy.__version__)'",
    ],
)
def test_probes_that_only_look_something_up_are_reads(command: str) -> None:
    decision = classify_tool_call("bash", {"command": command}, "/repo/calc/__init__.py\n")
    assert decision.role == IG and not decision.ambiguous, decision.reason


def test_a_script_the_trajectory_wrote_is_verification_when_run() -> None:
    messages = [
        {"role": "user", "content": ISSUE},
        *_bash("c0", "cat > scenario_zero.py <<'EOF'\n" + SCRIPT + "EOF", ""),
        *_bash("c1", "python scenario_zero.py", "None\n"),
        *_bash("c2", "python tools/seed.py", "seeded\n"),  # a script the trajectory did not write
    ]
    facts = analyze_calls(Trajectory.from_messages(messages))
    assert (facts[1].role, facts[1].ambiguous) == (RV, False)
    assert facts[2].ambiguous


@pytest.mark.parametrize(
    ("command", "role"),
    [
        ("make", RV),
        ("make -j4 all", RV),
        ("make lib", RV),
        ("gcc -Wall -o ops ops.c", RV),
        ("g++ -std=c++17 main.cpp", RV),
        ("cargo build --release", RV),
        ("go build ./...", RV),
        ("mypy calc/", RV),
        ("npx tsc --noEmit", RV),
        ("javac Ops.java", RV),
        ("python setup.py build_ext --inplace", RV),
        ("make install", AE),
        ("make clean", AE),
    ],
)
def test_builds_and_type_checks_are_verification(command: str, role: str) -> None:
    decision = classify_tool_call("bash", {"command": command}, "")
    assert decision.role == role and not decision.ambiguous, decision.reason


# ---------------------------------------------------------------------------------------------
# Symbol edges, scratch scripts, failed edits, units
# ---------------------------------------------------------------------------------------------


def _bash(call_id: str, command: str, output: str) -> list[dict]:
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": "bash", "arguments": json.dumps({"command": command})},
    }
    return [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": output},
    ]


def _replace(call_id: str, path: str, old: str, new: str, output: str = "The file has been edited.") -> list[dict]:
    arguments = {"command": "str_replace", "path": path, "old_str": old, "new_str": new}
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": "str_replace_editor", "arguments": json.dumps(arguments)},
    }
    return [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": output},
    ]


@pytest.mark.parametrize(
    ("old", "new", "linked"),
    [
        (
            "def safe_divide(a, b):\n    return a / b",
            "def safe_divide(a, b):\n    return None if not b else a / b",
            True,
        ),
        ("    x = safe_divide(a, b)", "    x = safe_divide(a, b) or 0", False),  # calls it, defines nothing
    ],
)
def test_a_symbol_edge_needs_a_symbol_the_edit_defines_or_changes(old: str, new: str, linked: bool) -> None:
    messages = [
        {"role": "user", "content": ISSUE},
        *_bash("c0", "grep -rn safe_divide --include=*.cfg .", "setup.cfg:3: entry = safe_divide"),
        *_replace("c1", "/repo/lib/numeric.py", old, new),
    ]
    graph = graph_of(messages)
    assert graph.roles == (IG, AE)
    assert ([(e.src, e.dst, e.unit) for e in graph.edges] == [(0, 1, "symbol:safe_divide")]) is linked


@pytest.mark.parametrize(
    ("path", "old", "found"),
    [
        ("/repo/calc/__init__.py", "def __init__(self, precision):\n    self.p = precision", "__init__"),
        ("/repo/calc/errors.py", "class DivisionUndefinedError(ValueError):\n    pass", "DivisionUndefinedError"),
        ("/repo/tests/test_ops.py", "    def setUp(self):\n        self.c = Calc()", "setUp"),
        ("/repo/calc/ops.py", "def print(x):\n    return x", "print"),
        ("/repo/calc/ops.py", "class ops:\n    pass", "ops"),  # the file's own stem
    ],
)
def test_names_that_identify_no_change_give_no_symbol_edge(path: str, old: str, found: str) -> None:
    messages = [
        {"role": "user", "content": ISSUE},
        *_bash("c0", "grep -rn x docs/", f"docs/notes.rst:1: see {found} for details"),
        *_replace("c1", path, old, old + "\n# reviewed"),
    ]
    assert edges(graph_of(messages)) == set()


def test_a_scratch_script_links_only_to_the_runs_that_execute_it() -> None:
    messages = [
        {"role": "user", "content": ISSUE},
        *_bash("c0", "cat > check_divide.py <<'EOF'\n" + SCRIPT + "EOF", ""),
        *_bash("c1", "python -m pytest tests/test_ops.py -q", PASSED),
        *_bash("c2", "python check_divide.py", TRACEBACK),
        *_bash("c3", "python -m pytest tests -q", PASSED),
    ]
    assert edges(graph_of(messages)) == {(0, 2, "AE->RV")}


@pytest.mark.parametrize(
    "failure",
    [
        "sed: -e expression #1, char 9: unterminated `s' command",
        "<returncode>1</returncode>\n<output>\nsed: can't read calc/opz.py: No such file or directory\n</output>",
        "bash: warning: here-document at line 1 delimited by end-of-file (wanted `EOF')",
        "patching file calc/ops.py\nHunk #1 FAILED at 2.\n1 out of 1 hunk FAILED",
    ],
)
def test_a_failed_edit_is_no_edit_and_does_not_hide_the_next_test_from_the_fix(failure: str) -> None:
    messages = [
        {"role": "user", "content": ISSUE},
        *_bash("c0", "cat -n calc/ops.py", OPS),
        *_bash("c1", FIX, ""),
        *_bash("c2", "sed -i 's/None if/None  if/' calc/ops.py", failure),  # fails: edits nothing
        *_bash("c3", "python -m pytest tests/test_ops.py -q", PASSED),
    ]
    facts = analyze_calls(Trajectory.from_messages(messages))
    assert facts[2].role == AE and facts[2].failed_edit and not facts[2].edited_paths
    assert edges(graph_of(messages)) == {(0, 1, "IG->AE"), (1, 3, "AE->RV")}


def test_no_edge_has_an_empty_unit() -> None:
    messages = [
        {"role": "user", "content": ISSUE},
        *_bash("c0", "cat -n calc/ops.py", OPS),
        *_bash("c1", "git checkout -- .", ""),  # an edit whose files are unknown
        *_bash("c2", "python -m pytest tests -q", PASSED),
    ]
    graph = graph_of(messages)
    assert graph.roles == (IG, AE, RV)
    assert graph.edges == ()
    for build in (as_tool_calls, *SCAFFOLDS.values()):
        assert all(edge.unit for edge in graph_of(build()).edges)
