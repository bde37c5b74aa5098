"""Coding sandbox: shipped tasks, tools, jail, reward and replay (verl_credit.envs.coding)."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from verl_credit.envs.base import build_environment
from verl_credit.envs.coding import (
    CodingEnvironment,
    CodingSandbox,
    SandboxLimits,
    list_tasks,
    load_task,
    namespace_jail_available,
    replay_trajectory,
    run_jailed,
)
from verl_credit.envs.coding.jail import check_command_paths
from verl_credit.envs.coding_agent import plan_calls, run_scripted_agent, run_scripted_agent_async, switch_edit

#: slow: every test runs commands in the coding sandbox
pytestmark = pytest.mark.slow

TASKS = list_tasks()
JAIL_MODES = [
    pytest.param(
        "namespace",
        marks=pytest.mark.skipif(not namespace_jail_available(), reason="Linux namespaces not usable here"),
    ),
    "fallback",
]


@pytest.fixture
def outside_dir() -> Iterator[Path]:
    """A host directory outside both the sandbox and /tmp (the namespace jail makes /tmp private)."""
    base = "/var/tmp" if os.access("/var/tmp", os.W_OK) else None
    path = Path(tempfile.mkdtemp(prefix="vc-outside-", dir=base))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _edit_args(task_name: str, which: str) -> dict[str, str]:
    task = load_task(task_name)
    edit = task.solution[0] if which == "solution" else task.wrong_edits[0].edits[0]
    return edit.to_arguments()


# --------------------------------------------------------------------------- the shipped task set


def test_at_least_six_tasks_with_distinct_bugs() -> None:
    assert len(TASKS) >= 6
    for name in TASKS:
        task = load_task(name)
        assert task.statement and task.hidden_test_files()
        assert len(task.wrong_edits) >= 2
        # every wrong edit rewrites the solution's site, so an agent can switch between them
        for wrong in task.wrong_edits:
            assert (wrong.edits[0].path, wrong.edits[0].old) == (task.solution[0].path, task.solution[0].old)
        assert any(w.visible_passes for w in task.wrong_edits), "one wrong edit should fool the visible tests"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", TASKS)
def test_task_reference_passes_and_unmodified_and_wrong_edits_fail(name: str) -> None:
    task = load_task(name)
    with CodingSandbox(task) as sandbox:
        pristine = sandbox.snapshot()
        unmodified = sandbox.evaluate()
        assert not unmodified.hidden_all_pass and sandbox.reward() == 0.0
        assert not unmodified.visible_all_pass  # the visible test reproduces the bug

        for edit in task.solution:
            assert not sandbox.call("read_file", {"path": edit.path}).is_error
            assert not sandbox.call("edit_file", edit.to_arguments()).is_error
        fixed = sandbox.evaluate()
        assert fixed.hidden_all_pass and fixed.visible_all_pass
        assert sandbox.reward() == 1.0

        for wrong in task.wrong_edits:
            sandbox.restore(pristine)
            sandbox.call("read_file", {"path": wrong.edits[0].path})
            for edit in wrong.edits:
                assert not sandbox.call("edit_file", edit.to_arguments()).is_error
            report = sandbox.evaluate()
            assert not report.hidden_all_pass, wrong.name
            assert sandbox.reward() == 0.0
            assert report.visible_all_pass == wrong.visible_passes, wrong.name


def test_task_spec_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown coding task 'no_such_task'"):
        load_task("no_such_task")
    bad = tmp_path / "broken"
    bad.mkdir()
    (bad / "task.json").write_text('{"name": "broken"}')
    with pytest.raises(ValueError, match="missing or malformed key 'statement'"):
        load_task(bad)


# --------------------------------------------------------------------------- scripted agent + reward


@pytest.mark.timeout(60)
def test_scripted_agent_solves_a_task_and_edit_result_holds_a_diff() -> None:
    episode = run_scripted_agent("pagination_offset", "correct")
    assert episode.reward == 1.0
    roles = [m["role"] for m in episode.messages]
    # system, user, (assistant, tool) x 3 [read, edit, run_tests], final assistant answer
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant", "tool", "assistant"]
    read, edit, tests = (m["content"] for m in episode.messages if m["role"] == "tool")
    assert "start = page * per_page" in read
    assert "--- a/pager/core.py" in edit and "+++ b/pager/core.py" in edit
    assert "-    start = page * per_page" in edit and "+    start = (page - 1) * per_page" in edit
    assert tests.startswith("pytest exit code 0") and "1 passed" in tests


@pytest.mark.timeout(60)
def test_wrong_edit_scores_zero_even_when_visible_tests_pass() -> None:
    task = load_task("median_even")
    fooling = next(w.name for w in task.wrong_edits if w.visible_passes)
    episode = run_scripted_agent(task, "wrong_edit", wrong_edit=fooling)
    test_output = episode.messages[-2]["content"]
    assert "1 passed" in test_output  # the visible test is fooled ...
    assert episode.reward == 0.0  # ... the hidden tests are not


@pytest.mark.timeout(60)
def test_fraction_reward_counts_hidden_tests() -> None:
    # median_even, always_average_middles: 6 hidden tests; only test_median_odd_count fails -> 5/6
    episode = run_scripted_agent(
        "median_even", "wrong_edit", wrong_edit="always_average_middles", reward_mode="fraction"
    )
    assert episode.reward == pytest.approx(5 / 6)


@pytest.mark.timeout(90)
@pytest.mark.parametrize(("variant", "reward"), [("skip_tests", 1.0), ("extra_reads", 1.0), ("self_correct", 1.0)])
def test_scripted_variants(variant: str, reward: float) -> None:
    episode = run_scripted_agent("roman_numerals", variant)
    assert episode.reward == reward
    tool_names = [m["name"] for m in episode.messages if m["role"] == "tool"]
    if variant == "skip_tests":
        assert "run_tests" not in tool_names
    if variant == "extra_reads":
        assert tool_names[:4] == ["list_dir", "read_file", "read_file", "search"]
    if variant == "self_correct":
        outputs = [m["content"] for m in episode.messages if m["role"] == "tool" and m["name"] == "run_tests"]
        assert outputs[0].startswith("pytest exit code 1") and "failed" in outputs[0]
        assert outputs[1].startswith("pytest exit code 0")


@pytest.mark.timeout(60)
def test_editing_tests_or_adding_conftest_earns_nothing() -> None:
    task = load_task("slugify_dashes")
    with CodingSandbox(task) as sandbox:
        sandbox.call("read_file", {"path": "tests/test_slug.py"})
        sandbox.call("write_file", {"path": "tests/test_slug.py", "content": "def test_ok():\n    assert True\n"})
        sandbox.call(
            "write_file",
            {
                "path": "conftest.py",
                "content": "import pytest\n\n@pytest.hookimpl\ndef pytest_collection_modifyitems(items):\n"
                "    items.clear()\n",
            },
        )
        assert "1 passed" not in sandbox.call("run_tests", {}).content  # the agent's own run is fooled or empty
        assert sandbox.reward() == 0.0


@pytest.mark.timeout(60)
def test_environment_interface_runs_an_episode() -> None:
    async def play() -> tuple[float, dict, list[str]]:
        env = build_environment("coding")
        assert isinstance(env, CodingEnvironment)
        start = await env.start({"task": "lru_eviction"})
        names = [tool["function"]["name"] for tool in start.tools]
        await env.close()
        episode = await run_scripted_agent_async(env, "lru_eviction", "correct")
        info = {"task": env.task.name if env.task else None}
        await env.close()
        return episode.reward, info, names

    reward, info, names = asyncio.run(play())
    assert reward == 1.0 and info["task"] == "lru_eviction"
    assert names == ["read_file", "search", "list_dir", "edit_file", "write_file", "run_tests", "bash"]


# --------------------------------------------------------------------------- replay


@pytest.mark.timeout(90)
def test_replay_with_replaced_edit_changes_the_reward() -> None:
    name = "merge_intervals"
    correct = run_scripted_agent(name, "correct")
    wrong = run_scripted_agent(name, "wrong_edit")
    assert (correct.reward, wrong.reward) == (1.0, 0.0)
    edit_call = 1  # model calls: 0 read_file, 1 edit_file, 2 run_tests, 3 answer
    # correct -> wrong: R(tau') = 0, Delta = 1
    assert replay_trajectory(name, correct.messages, edit_call, _edit_args(name, "wrong")).reward == 0.0
    # wrong -> correct: R(tau') = 1, Delta = -1
    assert replay_trajectory(name, wrong.messages, edit_call, _edit_args(name, "solution")).reward == 1.0
    # removing the edit leaves the bug in place
    assert replay_trajectory(name, correct.messages, edit_call, None).reward == 0.0
    # replaying unchanged reproduces the original reward
    assert replay_trajectory(name, correct.messages, 0, {"path": "intervals/merge.py"}).reward == 1.0


@pytest.mark.timeout(90)
def test_replay_sees_counterfactual_state_and_environment_replay() -> None:
    name = "binary_search_bounds"
    task = load_task(name)
    episode = run_scripted_agent(name, "self_correct")
    assert episode.reward == 1.0
    # calls: 0 read, 1 wrong edit, 2 run_tests, 3 repair edit, 4 run_tests, 5 answer.
    # Dropping the read makes the first edit fail (read-before-edit), and the repair's `old` text
    # (the wrong edit's new text) then does not exist: the bug stays -> 0.
    outcome = replay_trajectory(name, episode.messages, 0, None)
    assert outcome.reward == 0.0
    assert [r.is_error for _, r in outcome.results] == [True, True]
    # replacing the first (wrong) edit by the reference fix: the repair edit no longer matches, reward 1
    env = CodingEnvironment()
    asyncio.run(env.start({"task": name}))
    try:
        assert env.replay(episode.messages, 1, task.solution[0].to_arguments()) == 1.0
    finally:
        asyncio.run(env.close())
    with pytest.raises(ValueError, match="call_index 9 is out of range"):
        replay_trajectory(name, episode.messages, 9, None)
    with pytest.raises(ValueError, match="model call 5 has no tool call"):
        replay_trajectory(name, episode.messages, 5, None)


@pytest.mark.timeout(90)
def test_environment_satisfies_the_replay_protocol_of_counterfactual_calibration() -> None:
    from verl_credit.counterfactual_replay import AlternativeEdit, ReplayEnvironment, ReplayRequest, run_replays
    from verl_credit.trajectory import Trajectory

    name = "roman_numerals"
    task = load_task(name)
    episode = run_scripted_agent(name, "correct")
    trajectory = Trajectory.from_messages(episode.messages, id="t0", uid=name, reward=episode.reward)

    class WrongEditProposer:
        def propose(self, trajectory: Trajectory, call_index: int) -> AlternativeEdit:
            return AlternativeEdit(task.wrong_edits[0].edits[0].to_arguments(), source="task wrong edit")

    env = CodingEnvironment()
    assert isinstance(env, ReplayEnvironment)
    asyncio.run(env.start({"task": name}))
    try:
        request = ReplayRequest(0, 1, trajectory, WrongEditProposer().propose(trajectory, 1), trajectory.reward)

        async def replay(request: ReplayRequest) -> float:  # CodingEnvironment.replay is synchronous
            return env.replay(request.trajectory.messages, request.call_index, request.alternative.arguments)

        results, failures = asyncio.run(run_replays([request], replay))
        assert failures == []
    finally:
        asyncio.run(env.close())
    # Delta_k = R(tau) - R(tau') = 1 - 0 for the edit that fixed the bug
    assert [(r.call_index, r.reward, r.counterfactual_reward, r.delta) for r in results] == [(1, 1.0, 0.0, 1.0)]


def test_switch_edit_requires_the_same_site() -> None:
    task = load_task("slugify_dashes")
    wrong, reference = task.wrong_edits[0].edits[0], task.solution[0]
    assert switch_edit(task, wrong, reference).old == wrong.new
    other = type(reference)("textutil/titles.py", "x", "y")
    with pytest.raises(ValueError, match="different sites"):
        switch_edit(task, wrong, other)
    with pytest.raises(ValueError, match="unknown scripted-agent variant"):
        plan_calls(task, "teleport")


# --------------------------------------------------------------------------- file tools: paths


def test_file_tools_reject_traversal_and_symlink_escape(outside_dir: Path) -> None:
    secret = outside_dir / "secret.txt"
    secret.write_text("top secret\n")
    with CodingSandbox("pagination_offset") as sandbox:
        escaping = [
            ("read_file", {"path": "../../../../../etc/passwd"}),
            ("read_file", {"path": "/etc/passwd"}),
            ("read_file", {"path": str(secret)}),
            ("list_dir", {"path": ".."}),
            ("search", {"pattern": "secret", "path": str(outside_dir)}),
            ("write_file", {"path": "../escape.txt", "content": "x"}),
            ("write_file", {"path": str(outside_dir / "new.txt"), "content": "x"}),
            ("edit_file", {"path": "pager/../../x.py", "old": "a", "new": "b"}),
            ("run_tests", {"path": "../.."}),
        ]
        # a symlink planted inside the sandbox that points out of it
        os.symlink(outside_dir, sandbox.root / "link")
        os.symlink(secret, sandbox.root / "pager" / "innocent.py")
        escaping += [
            ("read_file", {"path": "link/secret.txt"}),
            ("write_file", {"path": "link/planted.txt", "content": "x"}),
            ("read_file", {"path": "pager/innocent.py"}),
            ("edit_file", {"path": "pager/innocent.py", "old": "top", "new": "bottom"}),
            ("list_dir", {"path": "link"}),
        ]
        for name, arguments in escaping:
            result = sandbox.call(name, arguments)
            assert result.is_error, (name, arguments)
            assert "outside the sandbox" in result.content, (name, arguments, result.content)
        assert sandbox.call("write_file", {"path": ".git/config", "content": "x"}).is_error
        assert "top secret" not in sandbox.call("search", {"pattern": "secret"}).content  # symlinks are not followed
        # '..' that stays inside is fine
        assert not sandbox.call("read_file", {"path": "pager/../pager/core.py"}).is_error
    assert secret.read_text() == "top secret\n"
    assert sorted(p.name for p in outside_dir.iterdir()) == ["secret.txt"]


def test_tool_argument_and_edit_errors() -> None:
    with CodingSandbox("median_even") as sandbox:
        assert "unknown tool 'rm_rf'" in sandbox.call("rm_rf", {}).content
        assert "missing required argument(s) path" in sandbox.call("read_file", {}).content
        assert "must be of type string" in sandbox.call("read_file", {"path": 3}).content
        assert "unknown argument(s) mode" in sandbox.call("list_dir", {"mode": "x"}).content
        edit = _edit_args("median_even", "solution")
        refused = sandbox.call("edit_file", edit)
        assert refused.is_error and "has not been read yet" in refused.content
        sandbox.call("read_file", {"path": "stats/central.py"})
        assert "not found" in sandbox.call("edit_file", {**edit, "old": "no such text"}).content
        ambiguous = sandbox.call("edit_file", {"path": "stats/central.py", "old": "values", "new": "xs"})
        assert "occurs" in ambiguous.content and ambiguous.is_error
        assert "identical" in sandbox.call("edit_file", {**edit, "new": edit["old"]}).content
        created = sandbox.call("write_file", {"path": "stats/new_module.py", "content": "X = 1\n"})
        assert not created.is_error and "--- /dev/null" in created.content and "+X = 1" in created.content
        assert "No matches" in sandbox.call("search", {"pattern": "zzz_not_there"}).content
        assert "invalid regular expression" in sandbox.call("search", {"pattern": "("}).content
        assert sandbox.call("list_dir", {}).content.split("\n") == ["pytest.ini", "stats/", "tests/"]


# --------------------------------------------------------------------------- bash jail


@pytest.mark.timeout(60)
@pytest.mark.parametrize("jail", JAIL_MODES)
def test_bash_cannot_write_outside_the_sandbox(jail: str, outside_dir: Path) -> None:
    marker = uuid.uuid4().hex[:12]
    with CodingSandbox("slugify_dashes", jail=jail) as sandbox:
        parent = sandbox.root.parent
        attempts = [
            f"echo x > /tmp/outside_{marker}",
            f"cd .. && touch escape_{marker}",
            f"touch {outside_dir}/abs_{marker}",
            f"echo x > {parent}/abs2_{marker}",
            f"ln -s {outside_dir} link_{marker} && echo x > link_{marker}/via_link_{marker}",
        ]
        for command in attempts:
            sandbox.call("bash", {"command": command})
        inside = sandbox.call("bash", {"command": f"echo ok > inside_{marker}.txt && cat inside_{marker}.txt"})
        assert not inside.is_error and "ok" in inside.content
        assert (sandbox.root / f"inside_{marker}.txt").read_text() == "ok\n"
        home = sandbox.call("bash", {"command": "echo $HOME; pwd"}).content
        assert home.split("\n")[1:3] == [str(sandbox.root), str(sandbox.root)]
        assert not Path(f"/tmp/outside_{marker}").exists()
        assert not (parent / f"escape_{marker}").exists() and not (parent.parent / f"escape_{marker}").exists()
        assert not (parent / f"abs2_{marker}").exists()
    assert list(outside_dir.iterdir()) == []


@pytest.mark.timeout(90)
@pytest.mark.parametrize("jail", JAIL_MODES)
def test_bash_time_and_output_limits(jail: str) -> None:
    limits = SandboxLimits(bash_timeout_s=2.0, max_output_bytes=1000)
    with CodingSandbox("slugify_dashes", jail=jail, limits=limits) as sandbox:
        # killed at the limit (the test's own timeout is the hang guard against waiting 100 s)
        result = sandbox.call("bash", {"command": "sleep 100"})
        assert result.is_error and "timed out after 2 s" in result.content
        # the agent can lower the limit, never raise it
        raised = sandbox.call("bash", {"command": "sleep 100", "timeout": 500})
        assert raised.is_error and "timed out after 2 s" in raised.content
        lowered = sandbox.call("bash", {"command": "sleep 100", "timeout": 1})
        assert lowered.is_error and "timed out after 1 s" in lowered.content
    # output capped at max_output_bytes (a limit loose enough that a loaded machine does not time it out)
    with CodingSandbox(
        "slugify_dashes", jail=jail, limits=SandboxLimits(bash_timeout_s=30.0, max_output_bytes=1000)
    ) as sandbox:
        flood = sandbox.call("bash", {"command": "yes | head -c 1000000"})
        assert not flood.is_error and "bytes of output omitted" in flood.content
        assert len(flood.content) < 1200  # 1000 kept bytes + the notice + the exit code line


@pytest.mark.timeout(30)
@pytest.mark.parametrize("jail", JAIL_MODES)
def test_command_that_closes_its_output_before_exiting_keeps_its_exit_code(jail: str) -> None:
    # GNU tools close stdout in an exit handler, so end-of-output comes a moment before the exit;
    # on a loaded machine the runner once SIGKILLed them in that gap (``exit code -9`` for ``ls``).
    limits = SandboxLimits(bash_timeout_s=5.0)
    with CodingSandbox("slugify_dashes", jail=jail, limits=limits) as sandbox:
        result = sandbox.call("bash", {"command": "echo done; exec >&- 2>&-; sleep 0.5; exit 3"})
        assert result.content.startswith("exit code 3"), result.content
        assert "done" in result.content
        # still bounded by the time limit when it never exits
        # (the test's own timeout is the hang guard: a runner that waited would take 100 s)
        result = sandbox.call("bash", {"command": "exec >&- 2>&-; sleep 100", "timeout": 1})
        assert result.is_error and "timed out after 1 s" in result.content


@pytest.mark.skipif(not namespace_jail_available(), reason="Linux namespaces not usable here")
@pytest.mark.timeout(30)
def test_namespace_jail_has_no_network_no_survivors_and_hides_task_data(tmp_path: Path) -> None:
    marker = f"{uuid.uuid4().int % 10_000}.5"
    network = run_jailed(
        "python -c \"import socket; socket.create_connection(('1.1.1.1', 80), timeout=2)\"", tmp_path, mode="namespace"
    )
    assert network.exit_code != 0 and "unreachable" in network.output.lower()
    background = run_jailed(f"sleep {marker} & echo started", tmp_path, mode="namespace", timeout_s=5)
    assert background.exit_code == 0  # not timed out: the run did not wait for the background sleep
    time.sleep(0.2)
    survivors = [
        p for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline(p).endswith(f"sleep\x00{marker}\x00")
    ]
    assert survivors == []
    task = load_task("median_even")
    hidden = task.hidden_test_files()[0]
    peek = run_jailed(f"cat {hidden}", tmp_path, mode="namespace", hide_paths=[task.directory])
    assert peek.exit_code != 0 and "No such file" in peek.output
    remount = run_jailed("mount -o remount,rw /", tmp_path, mode="namespace")
    assert remount.exit_code != 0


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def test_fallback_precheck_is_lexical(tmp_path: Path) -> None:
    assert check_command_paths("echo x > /tmp/elsewhere", tmp_path) is not None
    assert check_command_paths("cd .. && touch x", tmp_path) is not None
    assert check_command_paths(f"cat {tmp_path}/a.txt > /dev/null", tmp_path) is None
    assert check_command_paths("python -m pytest -q tests", tmp_path) is None
    assert check_command_paths("echo 'unbalanced", tmp_path) is not None
