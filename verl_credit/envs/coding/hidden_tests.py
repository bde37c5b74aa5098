"""Run the hidden tests without the agent's code in their process (the reward path).

Two processes, two pipes (:mod:`.remote_objects`)::

    trainer side, outside the jail                     inside the jail (run_jailed)
    python -I -B -c <remote_objects + runner>          python -I -B -c <remote_objects + serve>
      pytest on a private copy of the hidden tests  <->  imports the agent's modules from the
      (their imports of the agent's packages are         evaluation tree, answers calls with data
      proxies), verdict over the reward channel          or handles

The test process's verdict travels over the trainer-held reward channel (:mod:`.reward_channel`);
its directory is a private temporary directory the jail cannot see (namespace mode), holding only
the hidden tests and an empty ``pytest.ini``, so neither the agent's ``conftest.py`` nor its pytest
configuration is read. The agent server gets only the agent's sources; the task directory with the
hidden tests stays hidden from it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import stat
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from verl_credit.envs.coding.beneath import walk
from verl_credit.envs.coding.jail import JailResult, high_pipe, run_host, scrubbed_environment
from verl_credit.envs.coding.reward_channel import RUNNER_SOURCE, ChannelVerdict, new_nonce, parse_channel

__all__ = ["HiddenRun", "agent_module_names", "run_hidden_tests"]

_REMOTE_SOURCE = (Path(__file__).with_name("remote_objects.py")).read_text(encoding="utf-8")
TEST_PROCESS_SOURCE = _REMOTE_SOURCE + "\ninstall_from_environment()\n" + RUNNER_SOURCE
SERVER_SOURCE = _REMOTE_SOURCE + "\nserve_from_environment()\n"
_PYTEST_ARGS = ("-q", "--tb=line", "-p", "no:cacheprovider", "-p", "no:junitxml", "--rootdir=.", "-c", "pytest.ini")


class HiddenRun:
    """Outcome of one hidden-test run: the trusted verdict and both processes' results."""

    def __init__(self, verdict: ChannelVerdict, tests: JailResult, server: JailResult | None) -> None:
        self.verdict = verdict
        self.tests = tests
        self.server = server

    @property
    def output(self) -> str:
        return self.tests.output

    @property
    def timed_out(self) -> bool:
        return self.tests.timed_out


def agent_module_names(tree: Path, exclude: Sequence[str] = ()) -> list[str]:
    """Top-level importable names of the agent's tree: packages (directories holding ``.py``
    files, at most :data:`~.beneath.MAX_DEPTH` levels down) and ``*.py`` modules, without
    ``tests`` and the names in ``exclude``. Symlinks are not followed; the walk is iterative."""
    names: set[str] = set()
    top = os.open(tree, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for _, entry in walk(top):
            first = entry.rel[0]
            if first.startswith(".") or first == "tests" or not stat.S_ISREG(entry.mode):
                continue
            if not entry.name.endswith(".py"):
                continue
            stem = first[: -len(".py")] if len(entry.rel) == 1 else first
            if stem.isidentifier():
                names.add(stem)
    finally:
        os.close(top)
    return sorted(names - set(exclude))


def run_hidden_tests(
    hidden_files: Sequence[Path],
    tree: Path,
    run_server: Callable[..., JailResult],
    *,
    timeout_s: float,
    max_output_bytes: int,
    host_env: Mapping[str, str] | None = None,
    task_tree: Path | None = None,
) -> HiddenRun:
    """Run ``hidden_files`` against the agent's modules in ``tree``.

    Args:
        hidden_files: the task's hidden test files (copied into a private directory).
        tree: the evaluation copy of the agent's sources (the server's working directory).
        run_server: ``run_server(command, child_fds=...)`` runs ``command`` in the jail with cwd
            ``tree`` and returns its :class:`JailResult` (the sandbox's jail settings).
        timeout_s: wall-clock limit of each process.
        max_output_bytes: output kept of the test process.
        host_env: extra environment of the test process (e.g. ``PYTEST_DISABLE_PLUGIN_AUTOLOAD``).
        task_tree: the task's original repository: its packages are served even where a package
            of the same name is installed on the host.
    """
    private = Path(tempfile.mkdtemp(prefix="vc-hidden-"))
    try:
        (private / "tests").mkdir()
        for hidden in hidden_files:
            shutil.copyfile(hidden, private / "tests" / hidden.name)
        (private / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
        names = agent_module_names(tree, exclude=[Path(h).stem for h in hidden_files])
        requests_read, requests_write = high_pipe()
        replies_read, replies_write = high_pipe()
        server_result: list[JailResult] = []
        server_failure: list[BaseException] = []

        def serve() -> None:
            try:
                server_result.append(
                    run_server(
                        f"{shlex.quote(sys.executable)} -I -B -c {shlex.quote(SERVER_SOURCE)}",
                        child_fds={"VC_RPC_IN": requests_read, "VC_RPC_OUT": replies_write},
                    )
                )
            except BaseException as exc:  # reported through the test process's failed calls
                server_failure.append(exc)

        server = threading.Thread(target=serve, name="vc-hidden-server", daemon=True)
        server.start()
        nonce = new_nonce()
        env = scrubbed_environment(private, private, host_env)
        env["VC_RPC_MODULES"] = ",".join(names)
        if task_tree is not None:
            env["VC_RPC_TASK_MODULES"] = ",".join(agent_module_names(task_tree))
        env["VC_RPC_SECONDS"] = str(timeout_s)
        tests = run_host(
            [sys.executable, "-I", "-B", "-c", TEST_PROCESS_SOURCE, *_PYTEST_ARGS, "tests"],
            private,
            env,
            timeout_s=timeout_s,
            max_output_bytes=max_output_bytes,
            channel_input=nonce.encode(),
            child_fds={"VC_RPC_OUT": requests_write, "VC_RPC_IN": replies_read},
        )
        server.join(timeout=timeout_s + 5)
        if server_failure:
            raise server_failure[0]
        hidden_ids = [f"tests/{Path(h).name}" for h in hidden_files]
        verdict = parse_channel(tests.channel, nonce, hidden_ids, overflow=tests.channel_overflow)
        return HiddenRun(verdict, tests, server_result[0] if server_result else None)
    finally:
        shutil.rmtree(private, ignore_errors=True)
