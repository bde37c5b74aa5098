"""The coding sandbox against a policy that attacks the trainer's side of it, in both jail modes.

Each section is one way out that a hostile policy found: host code execution through the
trainer's ``git``, trainer-side file writes racing a jailed symlink swap, processes that outlive
their deadline, tool arguments that disable a cap, trees that crash the reward, a readable grader,
host unix sockets, and memory and disk limits that held only per process or only after a call.
Where a guarantee holds in one jail mode only, the test says so in its skip reason.
"""

from __future__ import annotations

import base64
import errno
import json
import math
import os
import re
import shlex
import shutil
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from verl_credit.envs.coding import CodingEnvironment, CodingSandbox, SandboxLimits, load_task, namespace_jail_available
from verl_credit.envs.coding import jail as jail_module
from verl_credit.envs.coding import namespace as namespace_module
from verl_credit.envs.coding.task_spec import TASKS_DIR

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
NAMESPACE_ONLY = pytest.mark.skipif(
    not namespace_jail_available(),
    reason="only the namespace jail hides the host's files (the fallback mode is no boundary: docs/sandbox.md)",
)
PROJECT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(
    os.environ.get("VERL_CREDIT_REQUIRE_NAMESPACE_JAIL") != "1",
    reason="set VERL_CREDIT_REQUIRE_NAMESPACE_JAIL=1 (CI does) to require the namespace-jail cases",
)
def test_the_namespace_jail_cases_run_here_when_required():
    """CI sets the variable: without it, a machine that lost user namespaces (or mount rights) would
    turn every namespace-mode escape test into a skip, and the hostile suite would pass on the
    fallback mode alone."""
    assert namespace_jail_available(), "the namespace jail is not usable here: its escape tests would be skipped"


@pytest.fixture
def sandbox(request: pytest.FixtureRequest) -> Iterator[CodingSandbox]:
    mode = getattr(request, "param", "fallback")
    with CodingSandbox(TASK, jail=mode, limits=SandboxLimits(bash_timeout_s=20, test_timeout_s=60)) as box:
        yield box


@pytest.fixture
def outside_dir() -> Iterator[Path]:
    """A host directory outside the sandbox and outside /tmp (the namespace jail's /tmp is private)."""
    base = "/var/tmp" if os.access("/var/tmp", os.W_OK) else None
    path = Path(tempfile.mkdtemp(prefix="vc-outside-", dir=base))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _bash(box: CodingSandbox, command: str, **arguments: object) -> str:
    result = box.call("bash", {"command": command, **arguments})
    return result.content


def _write_via_bash(box: CodingSandbox, path: str, text: str, executable: bool = False) -> None:
    """Write ``text`` to ``path`` from inside the jail (base64: the fallback pre-check sees no path)."""
    encoded = base64.b64encode(text.encode()).decode()
    command = f"mkdir -p \"$(dirname '{path}')\" && echo {encoded} | base64 -d > '{path}'"
    if executable:
        command += f" && chmod +x '{path}'"
    output = _bash(box, command)
    assert output.startswith("exit code 0"), output


# --------------------------------------------------------------------------- 1. the trainer's git

# Each attack plants, from inside the jail, a way for the *trainer's* git to run a command; the
# command touches a host file (the marker) that only a process outside the jail could create.
GIT_ATTACKS = {
    "core.fsmonitor": {".git/config": "[core]\n\tfsmonitor = {hook}\n"},
    "diff.external": {".git/config": "[diff]\n\texternal = {hook}\n"},
    "textconv driver": {".git/config": '[diff "evil"]\n\ttextconv = {hook}\n', ".gitattributes": "*.py diff=evil\n"},
    "clean filter": {".git/config": '[filter "evil"]\n\tclean = {hook}\n', ".gitattributes": "* filter=evil\n"},
    "post-index-change hook": {".git/hooks/post-index-change": "#!/bin/sh\n{hook}\n"},
    "core.hooksPath": {
        ".git/config": "[core]\n\thooksPath = /proc/self/cwd/planted\n",
        "planted/post-index-change": "#!/bin/sh\n{hook}\n",
    },
    "include.path": {".git/config": "[include]\n\tpath = ../evil.cfg\n", "evil.cfg": "[core]\n\tfsmonitor = {hook}\n"},
    "gitdir file": {"evil.git/config": "[core]\n\tfsmonitor = {hook}\n"},
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("attack", sorted(GIT_ATTACKS))
@pytest.mark.parametrize("sandbox", JAIL_MODES, indirect=True)
def test_trainer_git_never_runs_what_the_agent_planted(sandbox: CodingSandbox, attack: str, tmp_path: Path) -> None:
    marker = tmp_path / f"git-ran-{uuid.uuid4().hex[:8]}"
    hook = f"touch {marker}"
    if attack == "gitdir file":  # replace .git by a file pointing at a repository the agent made
        _bash(sandbox, "cp -r .git evil.git && rm -rf .git && echo 'gitdir: evil.git' > .git")
    for path, text in GIT_ATTACKS[attack].items():
        executable = "hook" in path or path.startswith("planted/")
        _write_via_bash(sandbox, path, text.replace("{hook}", hook), executable=executable)
    # one changed file, and one touched but unchanged (a stat-only change makes git refresh and
    # rewrite its index, which is when a post-index-change hook runs)
    _bash(sandbox, "echo '# changed' >> textutil/slug.py && sleep 1 && touch textutil/titles.py")
    diff = sandbox.git_diff()
    assert not marker.exists(), f"{attack}: the trainer's git ran the agent's command"
    assert "+# changed" in diff  # and the trainer's git still sees the agent's change
    assert sandbox.reward() == 0.0  # the task is unfixed; nothing on the way crashed


# Plants beside the work tree, where the trainer built its own repository and HOME: in the fallback
# mode a jailed command runs as the trainer's user with the host's file system, so it can reach
# them by a path built at run time (the lexical pre-check sees no "..").
PLANT_BESIDE = """python -c '
import base64, os, sys
parent = os.path.dirname(os.getcwd())
for relative, encoded in zip(sys.argv[1::2], sys.argv[2::2]):
    path = os.path.join(parent, relative)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as handle:
            handle.write(base64.b64decode(encoded).decode())
        if "/hooks/" in path:
            os.chmod(path, 0o755)
        print("planted", relative)
    except OSError as error:
        print("refused", relative, error.errno)
'"""

BESIDE_ATTACKS = {
    "host.git config": {"host.git/config": "[core]\n\tfsmonitor = {hook}\n[diff]\n\texternal = {hook}\n"},
    "host.git filter": {
        "host.git/config": '[filter "evil"]\n\tclean = {hook}\n\tsmudge = {hook}\n',
        "host.git/info/attributes": "* filter=evil\n",
    },
    "host.git hook": {"host.git/hooks/post-index-change": "#!/bin/sh\n{hook}\n"},
    "trainer HOME": {
        "home/.gitconfig": "[core]\n\tfsmonitor = {hook}\n",
        "home/git/config": "[core]\n\tfsmonitor = {hook}\n",
        "home/git/attributes": "* filter=evil\n",
    },
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("attack", sorted(BESIDE_ATTACKS))
@pytest.mark.parametrize("sandbox", JAIL_MODES, indirect=True)
def test_trainer_git_never_runs_what_the_agent_planted_beside_the_work_tree(
    sandbox: CodingSandbox, attack: str, tmp_path: Path
) -> None:
    marker = tmp_path / f"git-ran-{uuid.uuid4().hex[:8]}"
    arguments = []
    for relative, text in BESIDE_ATTACKS[attack].items():
        arguments += [relative, base64.b64encode(text.replace("{hook}", f"touch {marker}").encode()).decode()]
    output = _bash(sandbox, PLANT_BESIDE + " " + " ".join(arguments))
    assert output.startswith("exit code 0"), output
    planted = output.count("planted ")
    if sandbox.jail_mode == "fallback":  # nothing stops the plant itself here: the trainer's git must
        assert planted == len(BESIDE_ATTACKS[attack]), output
    else:  # the namespace jail sees the sandbox's parent read-only
        assert planted == 0, output
    _bash(sandbox, "echo '# changed' >> textutil/slug.py && sleep 1 && touch textutil/titles.py")
    diff = sandbox.git_diff()
    assert not marker.exists(), f"{attack}: the trainer's git ran the agent's command"
    assert "+# changed" in diff
    assert sandbox.git_diff() == diff  # every diff runs on a fresh copy of the trainer's repository


# --------------------------------------------------------------------------- 2. races and path errors

# Swaps ``d`` (a real directory) and ``s`` (a symlink to the host directory) atomically
# (renameat2 RENAME_EXCHANGE), as fast as it can: ``d`` is never missing, only ever one or the other.
SWAPPER = """python -c '
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
os.makedirs("d", exist_ok=True)
os.symlink(os.environ["OUTSIDE"], "s")
swaps = 0
while not os.path.exists("stop"):
    swaps += libc.renameat2(-100, b"d", -100, b"s", 2) == 0
if os.path.islink("d"):
    libc.renameat2(-100, b"d", -100, b"s", 2)
print("swaps", swaps)
'"""


@pytest.mark.timeout(240)
@pytest.mark.parametrize("sandbox", JAIL_MODES, indirect=True)
def test_symlink_swap_race_never_lands_a_write_or_a_read_outside(sandbox: CodingSandbox, tmp_path: Path) -> None:
    """A jailed loop swaps directory ``d`` for a symlink to a host directory while the trainer's
    file tools write into and read from ``d`` (the swapper runs beside the sandbox's lock, as a
    leftover process would): not one of 2,000 writes or reads may touch the host directory."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("TOP SECRET\n")
    swaps: list[str] = []

    def swap() -> None:
        options = {"mode": sandbox.jail_mode, "timeout_s": 200, "env_extra": {"OUTSIDE": str(outside)}}
        swaps.append(jail_module.run_jailed(SWAPPER, sandbox.root, **options).output)

    swapper = threading.Thread(target=swap, daemon=True)
    swapper.start()
    deadline = time.monotonic() + 30
    while not (sandbox.root / "s").is_symlink() and time.monotonic() < deadline:
        time.sleep(0.05)
    leaked = crashed = written = 0
    try:
        for attempt in range(2000):
            try:
                wrote = sandbox.call("write_file", {"path": f"d/planted_{attempt}.txt", "content": "x"})
                written += not wrote.is_error
                read = sandbox.call("read_file", {"path": "d/secret.txt"})
                leaked += "TOP SECRET" in read.content
            except Exception:  # a crash of the tool call is what this counts
                crashed += 1
    finally:
        (sandbox.root / "stop").touch()
        swapper.join(timeout=60)
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert leaked == 0 and crashed == 0
    assert written > 0  # the race really ran against writes that went through ...
    assert int(swaps[0].split()[-1]) > 2000, swaps  # ... and against a swapper that kept swapping


@pytest.mark.timeout(60)
def test_one_sandbox_runs_one_call_at_a_time() -> None:
    """verl runs one message's tool calls concurrently: a write_file issued while bash runs waits
    for it (through the environment, and on the sandbox itself from two threads)."""
    import asyncio

    async def through_environment() -> list[tuple[str, float]]:
        env = CodingEnvironment(jail="fallback")
        await env.start({"task": TASK})
        finished: list[tuple[str, float]] = []

        async def timed(name: str, arguments: dict) -> None:
            await env.call_tool(name, arguments)
            finished.append((name, time.monotonic()))

        try:
            await asyncio.gather(
                timed("bash", {"command": "sleep 1"}),
                timed("write_file", {"path": "notes.txt", "content": "x"}),
            )
        finally:
            await env.close()
        return finished

    order = [name for name, _ in asyncio.run(through_environment())]
    assert order == ["bash", "write_file"]
    with CodingSandbox(TASK, jail="fallback") as box:
        done: dict[str, float] = {}

        def slow_bash() -> None:
            box.call("bash", {"command": "sleep 1"})
            done["bash"] = time.monotonic()

        bash = threading.Thread(target=slow_bash)
        bash.start()
        time.sleep(0.2)
        box.call("write_file", {"path": "notes.txt", "content": "x"})
        done["write_file"] = time.monotonic()
        bash.join()
        assert done["write_file"] >= done["bash"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sandbox", JAIL_MODES, indirect=True)
def test_paths_the_file_system_refuses_are_tool_errors(sandbox: CodingSandbox) -> None:
    _bash(sandbox, "ln -s loop loop && ln -s textutil/slug.py/x through_file && mkfifo fifo")
    weird = [
        "a" * 300,  # one component over NAME_MAX
        "/".join(["d"] * 3000),  # over PATH_MAX
        "loop",  # a symlink loop
        "through_file",  # a symlink through a regular file
        "textutil/slug.py/x",  # a file used as a directory
        "fifo/x",
        "/".join(["n"] * 200) + "/f.txt",  # deeper than the walks go
    ]
    for path in weird:
        for name, arguments in (
            ("read_file", {"path": path}),
            ("write_file", {"path": path, "content": "x"}),
            ("list_dir", {"path": path}),
            ("search", {"pattern": "x", "path": path}),
            ("edit_file", {"path": path, "old": "a", "new": "b"}),
            ("run_tests", {"path": path}),
        ):
            result = sandbox.call(name, arguments)
            assert result.is_error, (name, path[:40], result.content)
            assert result.content.startswith("Error:"), (name, path[:40], result.content)


# --------------------------------------------------------------------------- 3. no survivors


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


SURVIVOR_COMMANDS = {
    "setsid as the shell, killed at the deadline": ("exec setsid sleep {marker}", 1),
    "setsid in the background, killed at the deadline": ("setsid sleep {marker} & sleep 60", 1),
    "setsid -f, the shell exits": ("setsid -f sleep {marker}; echo started", 10),
    "double fork + setsid in python, the shell exits": (
        "python -c 'import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        '        os.execvp("sleep", ["sleep", "{marker}"])\n    os._exit(0)\n'
        "time.sleep(0.2)'",
        10,
    ),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("with_cgroup", [True, False], ids=["cgroup", "no-cgroup"])
@pytest.mark.parametrize("case", sorted(SURVIVOR_COMMANDS))
@pytest.mark.parametrize("mode", JAIL_MODES)
def test_no_process_outlives_its_command(
    mode: str, case: str, with_cgroup: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not with_cgroup:  # the kill must not depend on a pids cgroup sweeping leftovers
        monkeypatch.setattr(jail_module, "new_run_cgroup", lambda *args: None, raising=False)
        monkeypatch.setattr(jail_module, "pids_cgroup_root", lambda: None, raising=False)
    jail_module.give_to_jail(tmp_path, mode)
    marker = f"{uuid.uuid4().int % 10_000_000}.5"
    command, timeout = SURVIVOR_COMMANDS[case]
    try:
        jail_module.run_jailed(command.replace("{marker}", marker), tmp_path, mode=mode, timeout_s=timeout)
        time.sleep(0.3)
        survivors = _processes_with(f"sleep\x00{marker}")
        assert survivors == [], f"{case}: {len(survivors)} process(es) survived"
    finally:
        for pid in _processes_with(f"sleep\x00{marker}"):  # never leave one behind, even on failure
            os.kill(pid, 9)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sandbox", JAIL_MODES, indirect=True)
def test_a_command_that_fakes_a_setup_failure_is_an_ordinary_result(sandbox: CodingSandbox) -> None:
    """Printing the jail's setup-failure line and exiting 125 must not raise JailSetupError."""
    result = sandbox.call("bash", {"command": "echo 'verl-credit-jail: setup failed: fake'; exit 125"})
    assert result.content.startswith("exit code 125"), result.content


# --------------------------------------------------------------------------- 4. numeric arguments

BAD_TIMEOUTS = [math.nan, math.inf, -math.inf, 10**400, 1e300, -1, 0, True, "5", [3]]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sandbox", JAIL_MODES, indirect=True)
def test_bad_numbers_in_tool_arguments_are_tool_errors(sandbox: CodingSandbox) -> None:
    for timeout in BAD_TIMEOUTS:
        result = sandbox.call("bash", {"command": "echo ran", "timeout": timeout})
        assert result.is_error and "'timeout'" in result.content, (timeout, result.content)
        assert "ran" not in result.content
    # what a model's JSON can hold: NaN and Infinity parse to floats, 1e999 to inf
    for text in ('{"command": "echo ran", "timeout": NaN}', '{"command": "echo ran", "timeout": 1e999}'):
        result = sandbox.call("bash", json.loads(text))
        assert result.is_error and "finite" in result.content, result.content
    for line in (0, -5, 10**400):
        result = sandbox.call("read_file", {"path": MODULE, "start_line": line})
        assert result.is_error and "'start_line'" in result.content, result.content
    assert sandbox.call("bash", {"command": "echo a\x00b"}).is_error
    assert "surrogate" in sandbox.call("write_file", {"path": "x.py", "content": "\ud800"}).content
    # the cap still holds for an in-range value, and the sandbox still works
    capped = sandbox.call("bash", {"command": "sleep 30", "timeout": 1})
    assert capped.is_error and "timed out after 1 s" in capped.content


def test_limits_and_the_jail_refuse_numbers_that_disable_a_cap(tmp_path: Path) -> None:
    for value in (math.nan, math.inf, -1.0, 0, True, "10"):
        with pytest.raises(ValueError, match="bash_timeout_s"):
            SandboxLimits(bash_timeout_s=value)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_workspace_bytes"):
        SandboxLimits(max_workspace_bytes=0)
    # a limit too large to be one is refused too, naming the allowed range
    with pytest.raises(ValueError, match=r"bash_timeout_s must be in \(0, 86400\] seconds"):
        SandboxLimits(bash_timeout_s=1e12)
    for name in ("max_output_bytes", "max_processes", "max_workspace_bytes", "max_jail_memory_bytes"):
        with pytest.raises(ValueError, match=rf"{name} must be an integer in \[1, \d+\]"):
            SandboxLimits(**{name: 1 << 62})
    assert SandboxLimits(bash_timeout_s=86400, max_workspace_bytes=1 << 40).max_workspace_bytes == 1 << 40
    for value in (math.nan, math.inf, 0, -3):
        with pytest.raises(ValueError, match="timeout_s"):
            jail_module.run_jailed("true", tmp_path, mode="fallback", timeout_s=value)


# --------------------------------------------------------------------------- 5. trees that crash the reward

DEEP_TREE = (
    "python -c 'import os\n"
    "for _ in range(1100):\n"
    '    os.mkdir("{name}")\n'
    '    os.chdir("{name}")\n'
    'open("deep.py", "w").write("X = 1\\n")\''
)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", ["d", "n" * 200], ids=["short-names", "past-PATH_MAX"])
@pytest.mark.parametrize("mode", JAIL_MODES)
def test_a_1100_level_tree_crashes_nothing_and_leaks_nothing(mode: str, name: str) -> None:
    box = CodingSandbox(TASK, jail=mode, limits=SandboxLimits(bash_timeout_s=60, test_timeout_s=60))
    tmp = box.root.parent
    try:
        made = box.call("bash", {"command": DEEP_TREE.replace("{name}", name)})
        # a size-limited workspace lets the command finish; the watchdog of a plain one stops it
        assert "exit code 0" in made.content or "deeper than" in made.content, made.content
        assert "nested deeper than" in made.content  # the too-deep part was deleted after the call
        state = box.snapshot()
        assert box.reward() == 0.0  # the task is unfixed
        box.restore(state)
        assert box.call("search", {"pattern": "X = 1"}).content.startswith("No matches")
        box.call("bash", {"command": DEEP_TREE.replace("{name}", name).replace("deep.py", "again.py")})
        agent_code = f"\nimport os as _os\n_here = _os.getcwd()\n{DEEP_TREE.split(chr(39))[1]}\n_os.chdir(_here)\n"
        box.call("read_file", {"path": MODULE})
        original = (box.root / MODULE).read_text()
        assert not box.call("write_file", {"path": MODULE, "content": original + agent_code}).is_error
        assert box.reward() == 0.0  # agent code that builds the tree in the evaluation copy
        assert box.reward() == 0.0
    finally:
        box.close()
    assert not tmp.exists(), "the sandbox directory leaked"


NON_UTF8 = (
    "python -c 'import os\n"
    'open(b"caf\\xe9.py", "w").write("Y = 2\\n")\n'
    'os.mkdir(b"\\xff\\xfe")\n'
    'open(b"\\xff\\xfe/mod.py", "w").write("Z = 3\\n")\''
)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sandbox", JAIL_MODES, indirect=True)
def test_file_names_that_are_not_utf8_crash_nothing(sandbox: CodingSandbox) -> None:
    made = sandbox.call("bash", {"command": NON_UTF8})
    assert "exit code 0" in made.content, made.content
    listing = sandbox.call("list_dir", {}).content
    assert "caf\\xe9.py" in listing and "\\xff\\xfe/" in listing
    listing.encode("utf-8")  # every tool result can go to a tokenizer
    found = sandbox.call("search", {"pattern": "Z = 3"}).content
    assert found == "\\xff\\xfe/mod.py:1:Z = 3", found
    state = sandbox.snapshot()
    names = {os.fsencode(rel) for rel, _ in state.files}
    assert b"caf\xe9.py" in names and b"\xff\xfe/mod.py" in names
    assert sandbox.reward() == 0.0
    planted = os.path.join(os.fsencode(sandbox.root), b"caf\xe9.py")
    os.unlink(planted)
    sandbox.restore(state)
    assert os.path.exists(planted) and sandbox.snapshot().digest == state.digest


# --------------------------------------------------------------------------- 6. the grader is unreadable


# Run in the jail: every path under a top-level directory that is not on the allow-list must be a
# kept directory (the Python installation, the sandbox root) or on the way to one.
UNEXPECTED_PATHS = """
import os, sys
visible = {"usr", "etc", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "proc", "tmp", "dev"}
kept = sys.argv[1:]
def needed(path):
    return any(path == k or k.startswith(path + "/") for k in kept)
for top in sorted(os.listdir("/")):
    if top in visible or os.path.islink("/" + top):
        continue
    for directory, dirnames, filenames in os.walk("/" + top):
        if directory in kept:
            dirnames[:] = []
            continue
        for name in dirnames + filenames:
            path = os.path.join(directory, name)
            if not needed(path):
                print("unexpected", path)
        dirnames[:] = [d for d in dirnames if needed(os.path.join(directory, d))]
"""


@NAMESPACE_ONLY
@pytest.mark.timeout(60)
def test_the_jail_sees_no_copy_of_the_project_or_the_hidden_tests() -> None:
    hidden = load_task(TASK).hidden_test_files()[0]
    package = Path(jail_module.__file__).resolve().parents[2]
    with CodingSandbox(TASK, jail="namespace") as box:
        for command in (
            f"cat {hidden}",
            f"cat {PROJECT / 'pyproject.toml'}",
            f"git -C {PROJECT} log -1 --format=%H",
            "python -c 'import verl_credit'",
        ):
            output = _bash(box, f"{command} 2>&1; echo rc=$?")
            assert "rc=0" not in output, (command, output)
        for directory in (TASKS_DIR, package):  # hidden or absent: nothing to list either way
            output = _bash(box, f"ls -A {directory} 2>/dev/null | wc -l")
            assert output.split("\n")[1] == "0", (directory, output)
        kept = sorted({*namespace_module.python_dirs(), str(box.root)})
        output = _bash(box, f"python -c {shlex.quote(UNEXPECTED_PATHS)} {' '.join(map(shlex.quote, kept))}")
        assert output.startswith("exit code 0") and "unexpected" not in output, output


# --------------------------------------------------------------------------- 7. sockets and limits

CONNECT = """
import base64, socket, sys
results = []
for target in base64.b64decode(sys.argv[1]).decode().split("|"):
    address = "\\0" + target[1:] if target.startswith("@") else target
    try:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(2)
        s.connect(address)
        results.append("connected")
    except OSError as exc:
        results.append(type(exc).__name__)
a, b = socket.socketpair()
a.sendall(b"ok")
results.append("pair:" + b.recv(2).decode())
print(",".join(results))
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sandbox", JAIL_MODES, indirect=True)
def test_no_connection_to_a_host_unix_socket(sandbox: CodingSandbox, outside_dir: Path) -> None:
    path = str(outside_dir / "host.sock")
    abstract = f"vc-test-{uuid.uuid4().hex[:8]}"
    servers = []
    accepted: list[int] = []
    for address in (path, "\0" + abstract):
        server = socket.socket(socket.AF_UNIX)
        server.bind(address)
        server.listen(4)
        server.settimeout(0.2)
        servers.append(server)
    os.chmod(outside_dir, 0o755)  # as open as a host socket's directory can be:
    os.chmod(path, 0o777)  # only the jail itself may stand in the way
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            for server in servers:
                try:
                    connection, _ = server.accept()
                except OSError:
                    continue
                accepted.append(1)
                connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        targets = base64.b64encode(f"{path}|@{abstract}".encode()).decode()
        output = _bash(sandbox, f"python -c {shlex.quote(CONNECT)} {targets}")
    finally:
        stop.set()
        thread.join(timeout=5)
        for server in servers:
            server.close()
    assert accepted == [], output
    assert "connected" not in output and "pair:ok" in output, output  # socketpair (asyncio) still works


@pytest.mark.timeout(120)
@pytest.mark.skipif(jail_module.memory_cgroup_root() is None, reason="no writable memory cgroup on this machine")
@pytest.mark.parametrize("mode", JAIL_MODES)
def test_memory_limit_holds_for_the_whole_jail(mode: str, tmp_path: Path) -> None:
    """Three processes of 150 MB each fit under the per-process address-space limit; together they
    are over a 256 MiB jail: the kernel kills one of them."""
    jail_module.give_to_jail(tmp_path, mode)
    hold = "import time\nb = bytearray(150 << 20)\nb[::4096] = b'x' * len(b[::4096])\n"
    hold += "print('held', flush=True)\ntime.sleep(3)"
    command = f"for i in 1 2 3; do python -c {shlex.quote(hold)} & done; wait"
    result = jail_module.run_jailed(command, tmp_path, mode=mode, timeout_s=60, max_jail_memory_bytes=256 * 1024 * 1024)
    assert result.output.splitlines().count("held") < 3, result.output
    assert result.oom_kills >= 1, result


WRITER = """
import os, sys, time
written = 0
try:
    with open("filler.bin", "wb") as handle:
        for _ in range(200):
            handle.write(b"x" * (1 << 20))
            handle.flush()
            written += 1
            print("written", written, flush=True)
            time.sleep(0.01)
except OSError as exc:
    print("stopped", written, exc.errno, flush=True)
"""


def _last_written(output: str) -> int:
    """The writer's last count (the output's middle may be dropped, cutting a line short)."""
    counts = [int(m.group(2)) for m in re.finditer(r"^(written|stopped) (\d+)", output, re.MULTILINE)]
    return max(counts) if counts else 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workspace", ["tmpfs", "directory"])
@pytest.mark.parametrize("mode", JAIL_MODES)
def test_disk_quota_holds_during_a_call_and_during_the_reward(mode: str, workspace: str) -> None:
    """A writer of 200 MiB against a 16 MiB quota: with a size-limited workspace it gets ENOSPC at
    the quota; without one the watchdog stops it within a fraction of a second. Agent code that
    does the same while the reward's tests import it is stopped the same way."""
    from verl_credit.envs.coding.workspace import size_limited_mounts_available

    if workspace == "tmpfs" and not size_limited_mounts_available():
        pytest.skip("this process cannot mount a size-limited tmpfs (needs root with CAP_SYS_ADMIN)")
    quota = 16
    limits = SandboxLimits(bash_timeout_s=60, test_timeout_s=60, max_workspace_bytes=quota << 20)
    with CodingSandbox(TASK, jail=mode, limits=limits, workspace=workspace) as box:
        result = box.call("bash", {"command": f"python -c {shlex.quote(WRITER)}"})
        assert result.is_error, result.content
        reached = _last_written(result.content)
        if workspace == "tmpfs":
            assert f"stopped {reached} {errno.ENOSPC}" in result.content, result.content
            assert reached <= quota
        else:
            assert "went over its disk quota" in result.content, result.content
            assert reached <= quota + 48, result.content  # the watchdog looks every 0.25 s
        assert not (box.root / "filler.bin").exists() or os.path.getsize(box.root / "filler.bin") <= quota << 20
        box.call("read_file", {"path": MODULE})
        original = (box.root / MODULE).read_text()
        agent_code = "\n" + WRITER
        box.call("write_file", {"path": MODULE, "content": original + agent_code})
        assert box.reward() == 0.0
        used = sum(f.stat().st_size for f in box._eval_dir.rglob("*") if f.is_file())
        assert used <= (quota + 16 + 48) << 20, used  # the evaluation tree's room: quota + 16 MiB


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", JAIL_MODES)
def test_the_quota_watchdog_counts_what_is_written_below_the_walk_depth(mode: str) -> None:
    """The same writer, 70 directory levels down (deeper than the walks go): the watchdog cannot
    count it, so a tree that nests that deep stops the command as if it were over quota."""
    quota = 16
    limits = SandboxLimits(bash_timeout_s=60, test_timeout_s=60, max_workspace_bytes=quota << 20)
    # one file per MiB, so the per-file size limit (64 MiB) does not stop it first
    deep_writer = (
        "import os, time\nfor _ in range(70):\n    os.mkdir('d')\n    os.chdir('d')\n"
        "for written in range(1, 201):\n"
        "    with open(f'filler{written}.bin', 'wb') as handle:\n"
        "        handle.write(b'x' * (1 << 20))\n"
        "    print('written', written, flush=True)\n"
        "    time.sleep(0.01)\n"
    )
    with CodingSandbox(TASK, jail=mode, limits=limits, workspace="directory") as box:
        result = box.call("bash", {"command": f"python -c {shlex.quote(deep_writer)}"})
        assert result.is_error, result.content
        assert "deeper than" in result.content, result.content
        assert _last_written(result.content) <= quota + 48, result.content
        assert "nested deeper than" in result.content  # and the deep part was deleted after the call
        assert not box.root.joinpath(*["d"] * 65).exists()


ORDINARY_CODE = """
import asyncio, multiprocessing, socket
queue = multiprocessing.Queue()
worker = multiprocessing.Process(target=queue.put, args=(7,))
worker.start()
print("multiprocessing", queue.get(timeout=10))
worker.join()
print("asyncio", asyncio.run(asyncio.sleep(0, "ok")))
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sandbox", JAIL_MODES, indirect=True)
def test_the_hardened_jail_still_runs_ordinary_code(sandbox: CodingSandbox) -> None:
    """multiprocessing (semaphores in a private /dev/shm) and asyncio (a socketpair) still work."""
    output = _bash(sandbox, f"python -c {shlex.quote(ORDINARY_CODE)}")
    assert "multiprocessing 7" in output and "asyncio ok" in output, output
