"""Coding roles and the call graph on the patterns real coding-agent logs show.

Transcripts are written in the shapes mini-swe-agent / SWE-agent / OpenHands runs take on SWE-bench
(a bash tool, a test runner of the project's own, a reproduction script, a submission step):

* test runners beyond ``pytest`` are verification (``python -m django test``, ``runtests.py``,
  ``tox``, ``nox``, ``python -m pytest`` with interpreter options, ``coverage run -m pytest``...);
  a ``python script.py`` whose output holds test results or a traceback is verification;
* ``git diff > patch.txt`` (the submission) is not an edit; neither is the harness's final echo;
* a glob in a read's command line names no file, and a read that returned nothing supports nothing.
"""

from __future__ import annotations

import json

import pytest

from verl_credit.annotate.call_paths import is_glob, returned_nothing
from verl_credit.annotate.roles import (
    AE,
    IG,
    RV,
    analyze_calls,
    build_call_graph,
    classify_shell_command,
    classify_tool_call,
)
from verl_credit.call_graph import CallGraph
from verl_credit.trajectory import Trajectory


def tc(call_id: str, name: str, args: dict) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def bash(call_id: str, command: str, output: str) -> list[dict]:
    """One call of a bash tool and its result (mini-swe-agent wraps output like this)."""
    return [
        {"role": "assistant", "content": "", "tool_calls": [tc(call_id, "bash", {"command": command})]},
        {"role": "tool", "tool_call_id": call_id, "content": output},
    ]


def wrapped(output: str, code: int = 0) -> str:
    return f"<returncode>{code}</returncode>\n<output>\n{output}</output>"


def edges_of(graph: CallGraph) -> set[tuple[int, int, str]]:
    return {(e.src, e.dst, e.kind) for e in graph.edges}


# -- item 10: test runners beyond pytest -------------------------------------------------------
TEST_RUNNERS = [
    "python -m django test auth_tests.test_views -v 2",
    "cd /testbed && python -m django test --settings=tests.settings",
    "django-admin test myapp",
    "python manage.py test polls",
    "./tests/runtests.py admin_views.tests.AdminViewBasicTest",
    "cd /testbed/tests && python runtests.py queries --parallel 1",
    "python3 tests/runtests.py --settings=test_sqlite model_fields",
    "tox",
    "tox -e py39 -- tests/test_io.py",
    "nox -s tests-3.11",
    "python -m tox -e py",
    "python -m nox -s lint",
    "python -m pytest",
    "python3 -m pytest tests/test_core.py::test_parse -x -q 2>&1 | tail -20",
    "python3.11 -m pytest -rA tests/",
    "python -bb -m pytest tests",
    "python -X dev -m pytest tests",
    "python -W error::DeprecationWarning -m pytest tests/test_a.py",
    "python -W error -m pytest tests/test_a.py",
    "python -u -m pytest -k 'not slow'",
    "PYTHONPATH=src timeout 600 python -m pytest -p no:cacheprovider",
    "coverage run -m pytest tests/",
    "python -m coverage run -m pytest tests/",
    "coverage run --source=pkg -m pytest",
    "pytest-3 tests/",
    "py.test -x tests/test_b.py",
    "python -m unittest tests.test_models -v",
    "python -m xmlrunner discover -s tests",
    "bin/test sympy/core/tests/test_basic.py",
    "python bin/test sympy/printing",
    "python setup.py test",
    "echo 'select id from tbl;;' | sqlfluff lint - 2>&1",  # a project's linter by its subcommand
    "yamllint .github/workflows/ci.yml",
]


@pytest.mark.parametrize("command", TEST_RUNNERS)
def test_test_runners_beyond_pytest_are_verification(command: str) -> None:
    decision = classify_shell_command(command)
    assert decision.role == RV and not decision.ambiguous, decision.reason


SCRIPT_OUTPUTS = {
    "a traceback": (
        'Traceback (most recent call last):\n  File "/testbed/reproduce.py", line 4, in <module>\n'
        "    print(parse('2024-13-01'))\nValueError: month must be in 1..12\n"
    ),
    "an exception line alone": "django.core.exceptions.ImproperlyConfigured: Requested setting DEBUG\n",
    "an assertion failure": "AssertionError: expected 3, got 2\n",
    "hand-written verdicts": "Test 1: PASS\nTest 2: PASS\nAll tests passed!\n",
    "a unittest summary": "...\n" + "-" * 70 + "\nRan 3 tests in 0.002s\n\nOK\n",
    "check marks": "✓ empty input\n✓ unicode input\n",
    "a failing verdict": "FAIL: result was 2, expected 3\n",
}


@pytest.mark.parametrize("output", SCRIPT_OUTPUTS.values(), ids=SCRIPT_OUTPUTS.keys())
@pytest.mark.parametrize(
    "command",
    ["python reproduce.py", "cd /testbed && python /tmp/check_fix.py", "python3 -c 'import m; m.run()'", "node t.js"],
)
def test_a_script_whose_output_holds_test_results_or_a_traceback_is_verification(command: str, output: str) -> None:
    for result in (output, wrapped(output, 1)):
        decision = classify_tool_call("bash", {"command": command}, result)
        assert decision.role == RV and not decision.ambiguous, decision.reason


@pytest.mark.parametrize(
    "output", ["Inserted 5000 rows\n", "2024-01-01 00:00:00+00:00\n", "Error count: 0\n", "Failed requests: none\n"]
)
def test_a_script_whose_output_checks_nothing_stays_undecided(output: str) -> None:
    # a script the trajectory did not write and whose name says nothing: its output decides, and
    # this output checks nothing (a reproduction or check script is RV whatever it prints)
    assert classify_tool_call("bash", {"command": "python tools/seed_db.py"}, output).ambiguous


SUBMISSIONS = [
    "git diff > patch.txt",
    "cd /testbed && git diff -- src/a.py > patch.txt",
    "git diff HEAD > /tmp/fix.patch",
    "git add -A && git diff --cached > model.patch",
    "git format-patch -1 --stdout > fix.diff",
]


@pytest.mark.parametrize("command", SUBMISSIONS)
def test_saving_the_diff_is_not_an_edit(command: str) -> None:
    decision = classify_shell_command(command)
    assert decision.role != AE, decision.reason


@pytest.mark.parametrize(
    "command",
    [
        "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git add -A && git diff --cached",
        "echo MINI_SWE_AGENT_FINAL_OUTPUT && cat patch.txt",
    ],
)
def test_the_harness_submission_step_has_no_role_of_its_own(command: str) -> None:
    decision = classify_shell_command(command)
    assert decision.no_role, decision.reason


@pytest.mark.parametrize(
    ("command", "role"),
    [
        ("echo 'x = 1' > settings_local.py", AE),  # text the command line authors is an edit
        ("cat <<'EOF' > reproduce.py\nprint(1)\nEOF", AE),
        ("cat > /testbed/fix.py", AE),
        ("cat a.py > b.py", AE),  # a copy into a source file
        ("echo 'requests>=2' >> requirements.txt", AE),
        ("git diff > src/changes.py", AE),  # into a source file: an edit all the same
        ("grep -rn foo --include='*.py' . > hits.txt", IG),  # a read saved into a text file
        ("pytest -q > /tmp/log.txt 2>&1", RV),
    ],
)
def test_redirections_that_stay_edits_and_those_that_do_not(command: str, role: str) -> None:
    decision = classify_shell_command(command)
    assert decision.role == role and not decision.ambiguous, decision.reason


def test_a_script_run_saving_its_output_is_not_an_edit() -> None:
    decision = classify_tool_call("bash", {"command": "python reproduce.py > out.txt 2>&1"}, "")
    assert decision.role == RV and not decision.ambiguous  # a reproduction run, not an edit of out.txt
    decision = classify_tool_call("bash", {"command": "python tools/seed_db.py > out.txt 2>&1"}, "")
    assert decision.role is None and decision.ambiguous  # an unknown program run: still not an edit


def django_run() -> list[dict]:
    """Read, reproduce (traceback), edit, Django's own runner, save the patch, submit."""
    return [
        {"role": "system", "content": "You are a helpful assistant that can interact with a computer."},
        {"role": "user", "content": "QuerySet.bulk_create crashes on SQLite with large batches"},
        *bash("c0", "sed -n '1190,1215p' django/db/models/query.py", wrapped("    batch_size = batch_size or max\n")),
        *bash(
            "c1",
            "cat <<'EOF' > reproduce.py\nfrom app.models import Row\nRow.objects.bulk_create([Row()] * 5000)\nEOF\n"
            "python reproduce.py",
            wrapped(
                'Traceback (most recent call last):\n  File "/testbed/django/db/models/query.py", line 1205\n'
                "django.db.utils.OperationalError: too many SQL variables\n",
                1,
            ),
        ),
        *bash(
            "c2",
            "sed -i 's/batch_size = batch_size or max/batch_size = min(batch_size or max, max)/' "
            "django/db/models/query.py",
            wrapped(""),
        ),
        *bash("c3", "python reproduce.py", wrapped("Inserted 5000 rows\n")),
        *bash(
            "c4",
            "cd tests && python runtests.py bulk_create --parallel 1",
            wrapped("Ran 41 tests in 0.502s\n\nOK\n"),
        ),
        *bash("c5", "git diff -- django/db/models/query.py > patch.txt", wrapped("")),
        *bash("c6", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat patch.txt", wrapped("diff --git a/...")),
    ]


def test_django_run_roles_and_graph() -> None:
    facts = analyze_calls(Trajectory.from_messages(django_run()))
    roles = [f.role for f in facts]
    # c1 writes reproduce.py and runs it: an edit and a run in one line stays undecided (prior)
    assert roles[0] == IG and roles[2] == AE and roles[4] == RV
    assert roles[5] == IG and not facts[5].ambiguous  # the saved diff is a read, not an edit
    assert facts[6].source == "default"  # the submission has no role of its own: IG by default
    graph = build_call_graph(Trajectory.from_messages(django_run()))
    edges = edges_of(graph)
    assert (0, 2, "IG->AE") in edges  # the read of query.py supports its edit
    assert (2, 4, "AE->RV") in edges  # Django's own runner verifies the edit
    assert not {e for e in edges if e[1] in (5, 6)}  # nothing flows into the submission
    assert not {e for e in edges if e[0] in (5, 6)}


# -- item 11: globs and empty reads -----------------------------------------------------------
def glob_run(search: str, search_output: str) -> list[dict]:
    """A search over every .py file, a read of one, then edits of two others and of the one read."""
    return [
        {"role": "user", "content": "the CSV export drops the header row"},
        *bash("s", search, search_output),
        *bash("r", "cat src/export/csv_writer.py", wrapped("def write(rows):\n    for row in rows[1:]:\n")),
        *bash("e1", "sed -i 's/rows\\[1:\\]/rows/' src/export/csv_writer.py", wrapped("")),
        *bash("e2", "sed -i 's/old/new/' src/unrelated/models.py", wrapped("")),
        *bash("e3", "echo 'VERSION = 2' > src/version.py", wrapped("")),
    ]


GLOB_SEARCHES = {
    "find -name": ("find . -name '*.py' -path '*export*'", "./src/export/csv_writer.py\n"),
    "grep --include": ("grep -rn 'rows\\[1:\\]' --include='*.py' .", "./src/export/csv_writer.py:2:    for row in\n"),
    "grep --include=": ('grep -rln "header" --include="*.py" src/', "src/export/csv_writer.py\n"),
    "a recursive glob": ("ls src/**/*.py | grep export", "src/export/csv_writer.py\n"),
    "rg -g": ("rg -n 'rows\\[1:\\]' -g '*.py'", "src/export/csv_writer.py:2:    for row in rows[1:]:\n"),
}


@pytest.mark.parametrize(("search", "output"), GLOB_SEARCHES.values(), ids=GLOB_SEARCHES.keys())
def test_a_glob_in_a_read_names_no_file(search: str, output: str) -> None:
    graph = build_call_graph(Trajectory.from_messages(glob_run(search, wrapped(output))))
    assert graph.roles[:3] == (IG, IG, AE)
    from_search = {(src, dst) for src, dst, kind in edges_of(graph) if kind == "IG->AE" and src == 0}
    # the search found csv_writer.py (its output names it): it supports that edit, and only that one
    assert from_search == {(0, 2)}


def test_a_read_that_returned_nothing_supports_nothing() -> None:
    def run(output: str) -> CallGraph:
        messages = [
            {"role": "user", "content": "handle empty CSV files"},
            *bash("g", "grep -n 'if not rows' src/export/csv_writer.py", output),
            *bash(
                "e",
                "sed -i 's/def write(rows):/def write(rows):\\n    if not rows: return/' src/export/csv_writer.py",
                wrapped(""),
            ),
        ]
        return build_call_graph(Trajectory.from_messages(messages))

    for nothing in ("", wrapped("", 1), "(no output)", "Your command ran successfully and did not produce any output."):
        graph = run(nothing)
        assert graph.roles == (IG, AE) and edges_of(graph) == set(), repr(nothing)
    assert edges_of(run(wrapped("3:    if not rows:\n"))) == {(0, 1, "IG->AE")}


def test_a_failed_read_supports_nothing() -> None:
    messages = [
        {"role": "user", "content": "add a CLI"},
        *bash("r", "cat src/cli.py", wrapped("cat: src/cli.py: No such file or directory\n", 1)),
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                tc("w", "str_replace_editor", {"command": "create", "path": "/testbed/src/cli.py", "file_text": "x"})
            ],
        },
        {"role": "tool", "tool_call_id": "w", "content": "File created successfully at: /testbed/src/cli.py"},
    ]
    graph = build_call_graph(Trajectory.from_messages(messages))
    assert graph.roles == (IG, AE) and edges_of(graph) == set()


def test_search_tool_globs_and_no_match_notices() -> None:
    # SWE-agent's search tools: "No matches found" is nothing; an include glob is no path
    messages = [
        {"role": "user", "content": "fix the parser"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [tc("a", "search_dir", {"search_term": "tokenize", "dir": "*.py"})],
        },
        {"role": "tool", "tool_call_id": "a", "content": 'No matches found for "tokenize" in /repo'},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [tc("b", "edit", {"path": "src/parser.py", "old": "a", "new": "b"})],
        },
        {"role": "tool", "tool_call_id": "b", "content": "File updated."},
    ]
    graph = build_call_graph(Trajectory.from_messages(messages))
    assert graph.roles == (IG, AE) and edges_of(graph) == set()


def test_glob_and_nothing_helpers() -> None:
    assert is_glob("*.py") and is_glob("src/**/*.ts") and is_glob("test_?.py") and not is_glob("src/a.py")
    assert returned_nothing("") and returned_nothing("<returncode>1</returncode>\n<output>\n</output>")
    assert returned_nothing('No matches found for "x" in /repo')
    assert returned_nothing("ls: cannot access 'x': No such file or directory")
    assert not returned_nothing("src/a.py:3: raise KeyError('not found')")
    assert not returned_nothing(wrapped("x = 1\n"))


def test_an_edit_over_a_glob_still_links_to_the_reads_of_its_files() -> None:
    # a glob in an *edit* does touch files: sed -i over src/*.py edits the file the read saw
    messages = [
        {"role": "user", "content": "rename foo to bar"},
        *bash("r", "cat src/a.py", wrapped("foo = 1\n")),
        *bash("e", "sed -i 's/foo/bar/g' src/*.py", wrapped("")),
    ]
    assert edges_of(build_call_graph(Trajectory.from_messages(messages))) == {(0, 1, "IG->AE")}


# -- what mini-swe-agent runs do most: scripts written and run in one command line -------------
SCAFFOLDS = {
    "a test script written and run": (
        "cd /testbed && cat > test_fix.py << 'EOF'\nfrom pkg import parse\nassert parse('1') == 1\nEOF\n"
        "python test_fix.py",
        RV,
    ),
    "a fix applied by a script it writes": (
        "cat > fix_header.py << 'EOF'\nwith open('pkg/io/header.py') as f:\n    text = f.read()\n"
        "with open('pkg/io/header.py', 'w') as f:\n    f.write(text.replace('a', 'b'))\nEOF\npython fix_header.py",
        AE,
    ),
    "a multi-line python -c that rewrites a file": (
        "cd /testbed && python3 -c \"\nsrc = open('pkg/io/header.py').read()\n"
        "open('pkg/io/header.py', 'w').write(src.replace('a', 'b'))\n\"",
        AE,
    ),
    "an install before a test script": ("pip install sqlparse -q && python test_sqlmigrate.py", RV),
    "find -exec grep, then xargs": (
        "find tests -name '*.py' -exec grep -l 'Http404' {} \\; | xargs grep -l to_python",
        IG,
    ),
    "find -exec rm": ("find . -name '*.pyc' -exec rm -f {} +", AE),
    "a for loop of reads": ('for n in 575 933; do echo "Line $n:"; sed -n "${n}p" pkg/a.py; done', IG),
    "python --version": ("python3 --version", IG),
}


@pytest.mark.parametrize(("command", "role"), SCAFFOLDS.values(), ids=SCAFFOLDS.keys())
def test_command_lines_mini_swe_agent_writes(command: str, role: str) -> None:
    decision = classify_shell_command(command)
    assert decision.role == role and not decision.ambiguous, decision.reason


def test_a_scratch_script_that_only_prints_is_left_to_its_output() -> None:
    command = "cat > trace.py << 'EOF'\nprint('tracing')\nEOF\npython trace.py"
    assert classify_tool_call("bash", {"command": command}, wrapped("tracing\n")).ambiguous
    assert classify_tool_call("bash", {"command": command}, wrapped("AssertionError: 1 != 2\n")).role == RV


def test_a_script_fix_edits_the_files_it_rewrites_and_a_backup_copy_edits_none() -> None:
    messages = [
        {"role": "user", "content": "fix the header parser"},
        *bash("r", "sed -n '10,20p' pkg/io/header.py", wrapped("def parse(line):\n")),
        *bash("b", "cp pkg/io/header.py pkg/io/header.py.backup", wrapped("")),
        *bash("f", SCAFFOLDS["a fix applied by a script it writes"][0], wrapped("")),
    ]
    facts = analyze_calls(Trajectory.from_messages(messages))
    assert facts[1].role == AE and facts[1].edited_paths == {"pkg/io/header.py.backup"}
    assert facts[2].role == AE and "pkg/io/header.py" in facts[2].edited_paths
    edges = edges_of(build_call_graph(Trajectory.from_messages(messages)))
    assert (0, 2, "IG->AE") in edges and (0, 1, "IG->AE") not in edges  # the backup used nothing read


def test_ls_names_its_files_inside_the_listed_directory() -> None:
    def run(listed: str) -> set[tuple[int, int, str]]:
        messages = [
            {"role": "user", "content": "fix the query compiler"},
            *bash("l", f"ls -la {listed}", wrapped("compiler.py\nquery.py\n__init__.py\n")),
            *bash("e", "sed -i 's/a/b/' django/db/models/sql/query.py", wrapped("")),
        ]
        return edges_of(build_call_graph(Trajectory.from_messages(messages)))

    assert run("/testbed/django/db/models/") == set()  # that listing's query.py is models/query.py
    assert run("/testbed/django/db/models/sql") == {(0, 1, "IG->AE")}
