"""The coding sandbox against a hostile agent: reward faking, trainer hangs, resource limits."""

from __future__ import annotations

import errno
import logging
import os
import shlex
from collections.abc import Iterator

import pytest

from verl_credit.envs.coding import CodingSandbox, SandboxLimits, load_task, namespace_jail_available
from verl_credit.envs.coding import jail as jail_module
from verl_credit.envs.coding.reward_channel import parse_channel

#: slow: every test runs commands in the coding sandbox's jail
pytestmark = pytest.mark.slow

TASK = "slugify_dashes"
MODULE = "textutil/__init__.py"
JAIL_MODES = [
    pytest.param(
        "namespace",
        marks=pytest.mark.skipif(not namespace_jail_available(), reason="Linux namespaces not usable here"),
    ),
    "fallback",
]

# An edited module that, once imported by the hidden tests, fakes a perfect JUnit report at exit
# and prints a fake pytest summary (an attack that once returned 1.0 with the bug unfixed).
ATEXIT_ATTACK = """
import atexit, glob, os

def _fake_report():
    cases = "".join(f'<testcase classname="tests.test_hidden_slug" name="t{i}"/>' for i in range(5))
    for name in glob.glob("*.xml") + glob.glob(".*.xml") + ["report.xml"]:
        with open(name, "w") as handle:
            handle.write(f"<testsuites><testsuite>{cases}</testsuite></testsuites>")
    print("===== 5 passed in 0.01s =====")

atexit.register(_fake_report)
"""

# Agent code that writes a forged verdict to every open descriptor at import time.
FD_FORGERY = """
import json, os
for _fd in range(3, 256):
    for _rec in ({"kind": "test", "nodeid": "tests/test_hidden_slug.py::t", "when": "call", "outcome": "passed"},
                 {"kind": "done", "exit": 0}):
        try:
            os.write(_fd, (json.dumps(_rec) + "\\n").encode())
        except OSError:
            pass
"""


@pytest.fixture
def sandbox(request: pytest.FixtureRequest) -> Iterator[CodingSandbox]:
    mode = getattr(request, "param", "fallback")
    with CodingSandbox(TASK, jail=mode, limits=SandboxLimits(bash_timeout_s=5, test_timeout_s=30)) as box:
        yield box


def _append_to_module(box: CodingSandbox, code: str) -> None:
    box.call("read_file", {"path": MODULE})
    original = (box.root / MODULE).read_text()
    result = box.call("write_file", {"path": MODULE, "content": original + code})
    assert not result.is_error, result.content


def _apply_solution(box: CodingSandbox) -> None:
    edit = load_task(TASK).solution[0]
    box.call("read_file", {"path": edit.path})
    assert not box.call("edit_file", edit.to_arguments()).is_error


# --------------------------------------------------------------------------- 1. reward integrity


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sandbox", JAIL_MODES, indirect=True)
def test_atexit_hook_cannot_fake_the_reward(sandbox: CodingSandbox) -> None:
    _append_to_module(sandbox, ATEXIT_ATTACK)
    assert sandbox.reward() == 0.0  # bug unfixed: the fake report must not count (was 1.0)
    _apply_solution(sandbox)
    assert sandbox.reward() == 1.0  # the true reward of a real fix, attack still in place
    assert sandbox.evaluate().integrity is None


@pytest.mark.timeout(60)
def test_forged_records_and_early_exit_score_zero(sandbox: CodingSandbox) -> None:
    _apply_solution(sandbox)
    _append_to_module(sandbox, FD_FORGERY)
    report = sandbox.evaluate()
    assert sandbox.reward() == 0.0  # the forged lines reach the agent server's pipe, never the verdict
    assert report.hidden_passed == 0
    # leaving the process before the tests finish (os._exit(0) at import) is no pass either
    original = (sandbox.root / MODULE).read_text().replace(FD_FORGERY, "")
    sandbox.call("write_file", {"path": MODULE, "content": original + "\nimport os\nos._exit(0)\n"})
    report = sandbox.evaluate()
    assert report.hidden_passed == 0 and sandbox.reward() == 0.0


# In-process attacks on the grader: each made the unfixed task score 1.0 while
# the agent's modules were imported into the hidden-test pytest process.
PYTEST_PATCH = """
try:
    import _pytest.reports as _reports
    _make = _reports.TestReport.from_item_and_call.__func__
    def _forged(cls, item, call):
        report = _make(cls, item, call)
        report.outcome, report.longrepr = "passed", None
        return report
    _reports.TestReport.from_item_and_call = classmethod(_forged)
except Exception:
    pass
"""
ALWAYS_EQUAL = """
from textutil import slug as _slug

class _Anything:
    def __eq__(self, other):
        return True
    __hash__ = object.__hash__

_slug.slugify = lambda text: _Anything()
"""
FORGED_STR = """
from textutil import slug as _slug

class _Agreeable(str):
    def __eq__(self, other):
        return True
    __hash__ = str.__hash__

_real = _slug.slugify
_slug.slugify = lambda text: _Agreeable(_real(text))
"""
CALLER_PEEK = """
import sys
from textutil import slug as _slug

def _peek(text):
    frame = sys._getframe(1)  # the hidden test: return the constant it compares with
    strings = [c for c in frame.f_code.co_consts if isinstance(c, str) and c != text]
    return strings[0] if strings else text

_slug.slugify = _peek
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("attack", [PYTEST_PATCH, ALWAYS_EQUAL, FORGED_STR, CALLER_PEEK])
@pytest.mark.parametrize("sandbox", JAIL_MODES, indirect=True)
def test_agent_code_never_runs_in_the_hidden_test_process(sandbox: CodingSandbox, attack: str) -> None:
    _append_to_module(sandbox, attack)
    report = sandbox.evaluate()
    assert sandbox.reward() == 0.0, report.output  # bug unfixed: every attack scored 1.0 before
    assert report.hidden_passed < report.hidden_total


@pytest.mark.timeout(60)
def test_a_real_fix_still_scores_with_a_pytest_patch_in_place(sandbox: CodingSandbox) -> None:
    _append_to_module(sandbox, PYTEST_PATCH)
    _apply_solution(sandbox)
    assert sandbox.reward() == 1.0
    assert sandbox.evaluate().integrity is None


def test_parse_channel_rejects_duplicates_and_trailing_records() -> None:
    def line(**record: object) -> bytes:
        import json

        return (json.dumps({**record, "nonce": "n"}) + "\n").encode()

    ok = line(kind="test", nodeid="tests/h.py::a", when="call", outcome="passed") + line(kind="done", exit=0)
    assert parse_channel(ok, "n", ["tests/h.py"]).hidden == (1, 1)
    assert parse_channel(ok + ok, "n", ["tests/h.py"]).problem is not None
    twice = line(kind="test", nodeid="tests/h.py::a", when="call", outcome="passed") + ok
    assert "twice" in (parse_channel(twice, "n", ["tests/h.py"]).problem or "")
    assert parse_channel(ok, "other", ["tests/h.py"]).problem is not None
    assert parse_channel(ok[:-1], "n", ["tests/h.py"]).problem is not None


# --------------------------------------------------------------------------- 2. no trainer hangs


@pytest.mark.timeout(30)
def test_fifo_does_not_hang_search_snapshot_reward_or_file_tools(sandbox: CodingSandbox) -> None:
    result = sandbox.call("bash", {"command": "mkfifo textutil/pipe && mkfifo pipe2 && ls -l textutil/pipe"})
    assert "exit code 0" in result.content, result.content
    assert "No matches" in sandbox.call("search", {"pattern": "zzz_not_there"}).content
    assert sandbox.call("search", {"pattern": "x", "path": "textutil/pipe"}).content.startswith("No matches")
    assert sandbox.call("read_file", {"path": "textutil/pipe"}).is_error
    assert sandbox.call("write_file", {"path": "pipe2", "content": "x"}).is_error
    state = sandbox.snapshot()
    assert "textutil/pipe" not in dict(state.files)
    assert sandbox.reward() == 0.0  # unfixed task, evaluated without blocking on the FIFO
    sandbox.restore(state)
    assert not (sandbox.root / "textutil" / "pipe").exists()


@pytest.mark.timeout(30)
def test_catastrophic_regex_in_search_is_cut_off() -> None:
    limits = SandboxLimits(tool_timeout_s=1.0)
    with CodingSandbox(TASK, jail="fallback", limits=limits) as box:
        (box.root / "long.txt").write_text("a" * 60 + "b\n")
        result = box.call("search", {"pattern": "(a+)+$"})
        assert result.is_error and "timed out" in result.content
        box.limits = SandboxLimits()  # the default limit: no flake from a loaded machine's startup time
        assert "textutil/slug.py" in box.call("search", {"pattern": "def slugify"}).content


# --------------------------------------------------------------------------- 3. limits


@pytest.mark.timeout(30)
@pytest.mark.skipif(jail_module.pids_cgroup_root() is None, reason="no writable pids cgroup on this machine")
@pytest.mark.parametrize("mode", JAIL_MODES)
def test_fork_bomb_is_bounded_by_the_pids_limit(mode: str, tmp_path: os.PathLike) -> None:
    bomb = "import os, time\nn = 0\ntry:\n    while n < 500:\n        if os.fork() == 0:\n"
    bomb += "            time.sleep(5)\n            os._exit(0)\n        n += 1\nexcept OSError as e:\n"
    bomb += "    print('forks', n, 'errno', e.errno)\n"
    command = f"python -c {shlex.quote(bomb)}"
    result = jail_module.run_jailed(command, tmp_path, mode=mode, timeout_s=10, max_processes=20)
    assert not result.timed_out, result.output
    words = result.output.split()
    assert words[:1] == ["forks"] and int(words[1]) < 20 and words[3] == str(errno.EAGAIN), result.output


@pytest.mark.timeout(30)
@pytest.mark.parametrize("sandbox", JAIL_MODES, indirect=True)
def test_file_size_limit_and_workspace_quota(sandbox: CodingSandbox) -> None:
    too_big = sandbox.call("bash", {"command": "head -c 70M /dev/zero > big.bin; echo rc=$?; ls -l big.bin"})
    assert "rc=0" not in too_big.content  # ulimit -f: 64 MiB per file
    object.__setattr__(sandbox.limits, "max_workspace_bytes", 8 * 1024 * 1024)
    result = sandbox.call("bash", {"command": "head -c 3M /dev/zero > a.bin; head -c 6M /dev/zero > b.bin"})
    assert result.is_error and "disk quota" in result.content and "b.bin" in result.content
    assert not (sandbox.root / "b.bin").exists() and (sandbox.root / "a.bin").exists()


# --------------------------------------------------------------------------- 4. fallback is loud


def test_auto_fallback_warns_once_and_is_counted(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(jail_module, "namespace_jail_available", lambda: False)
    monkeypatch.setattr(jail_module, "_FALLBACK_WARNED", False)
    before = jail_module.FALLBACK_COUNT
    with caplog.at_level(logging.WARNING, logger=jail_module.__name__):
        assert jail_module.resolve_jail_mode("auto") == "fallback"
        assert jail_module.resolve_jail_mode("auto") == "fallback"
    assert jail_module.FALLBACK_COUNT == before + 2
    warnings = [r for r in caplog.records if "fallback" in r.getMessage()]
    assert len(warnings) == 1 and "--security-opt" in warnings[0].getMessage()
    with pytest.raises(jail_module.JailSetupError, match="--security-opt"):
        CodingSandbox(TASK, jail="namespace")


def test_os_environ_untouched() -> None:  # the runner pops its channel variables in the child only
    assert "VC_CHANNEL_OUT" not in os.environ


# --------------------------------------------------------------------------- 5. an unprivileged jail user

NAMESPACE_AS_ROOT = pytest.mark.skipif(
    not namespace_jail_available() or os.geteuid() != 0,
    reason="needs the namespace jail and a root trainer (the jail drops root to an unprivileged user)",
)


@NAMESPACE_AS_ROOT
@pytest.mark.timeout(60)
def test_namespace_jail_runs_as_an_unprivileged_host_user(tmp_path: os.PathLike) -> None:
    """Root outside is nobody inside (it was root mapped to root: ``/etc/shadow`` and ``/root``
    readable): root-only files are refused, and what the command creates is the jail user's."""
    root = os.path.join(tmp_path, "work")
    os.mkdir(root)
    jail_module.give_to_jail(root, "namespace")
    command = (
        "id -u; id -g; id -G; cat /etc/shadow > /dev/null; echo shadow=$?; ls /root/.bashrc /root/.ssh 2>&1; "
        "grep CapEff /proc/self/status; echo made > made.txt"
    )
    result = jail_module.run_jailed(command, jail_module.Path(root), mode="namespace", timeout_s=30)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    uid, gid = str(jail_module.JAIL_UID), str(jail_module.JAIL_GID)
    assert lines[:3] == [uid, gid, gid], result.output  # no supplementary groups
    assert "Permission denied" in result.output and "shadow=1" in result.output
    assert "CapEff:\t0000000000000000" in result.output
    made = os.stat(os.path.join(root, "made.txt"))
    assert (made.st_uid, made.st_gid) == (jail_module.JAIL_UID, jail_module.JAIL_GID)


@NAMESPACE_AS_ROOT
@pytest.mark.timeout(120)
def test_jailed_agent_as_nobody_writes_its_workspace_runs_python_pytest_and_git() -> None:
    """The sandbox hands its repository to the jail user: the agent edits files (its own and the
    tools'), runs python and pytest, commits with git; the trainer's reward still works."""
    with CodingSandbox(TASK, jail="namespace", limits=SandboxLimits(bash_timeout_s=20, test_timeout_s=60)) as box:
        created = box.call("write_file", {"path": "notes/todo.txt", "content": "one\n"})
        assert not created.is_error, created.content
        command = (
            "id -u && echo two >> notes/todo.txt && echo x > new.txt && python -c 'print(6 * 7)' "
            "&& git add -A && git -c user.name=a -c user.email=a@b commit -qm wip && git log --oneline | wc -l "
            "&& cat /etc/shadow"
        )
        result = box.call("bash", {"command": command})
        assert f"exit code 1\n{jail_module.JAIL_UID}\n42\n2\n" in result.content, result.content
        assert "Permission denied" in result.content
        for name in ("notes", "notes/todo.txt", "new.txt", ".git"):
            info = os.stat(box.root / name)
            assert (info.st_uid, info.st_gid) == (jail_module.JAIL_UID, jail_module.JAIL_GID), name
        assert (box.root / "notes" / "todo.txt").read_text() == "one\ntwo\n"
        tests = box.call("run_tests", {})
        assert tests.content.startswith("pytest exit code 1") and "1 failed" in tests.content, tests.content
        assert box.reward() == 0.0  # the bug is not fixed
        _apply_solution(box)  # the edit tool rewrites a file of the jail user's; the owner stays
        assert os.stat(box.root / load_task(TASK).solution[0].path).st_uid == jail_module.JAIL_UID
        # visible tests and the hidden tests' agent server run jailed, as nobody
        assert box.reward() == 1.0 and box.evaluate().integrity is None
        assert "textutil/slug.py" in box.git_diff()  # the trainer's git reads the jail user's repository
