"""Coding sandbox environment (registered as ``"coding"``): bug-fix tasks in jailed temporary git repos.

* :mod:`.task_spec` -- the shipped tasks (``tasks/<name>/``: repo, hidden tests, solution, wrong edits);
* :mod:`.sandbox` -- one episode: tools, snapshot/restore, hidden-test reward;
* :mod:`.jail` -- the command jail (Linux namespaces, or a documented best-effort fallback), with
  :mod:`.namespace` (the jail's view), :mod:`.reaper` (kills the whole tree; socket filter),
  :mod:`.cgroups` (process and memory limits), :mod:`.process_runner` (deadline, output budget);
* :mod:`.paths` / :mod:`.beneath` -- path arguments resolved race-free beneath the sandbox root;
* :mod:`.workspace` -- size-limited workspace directories (the disk quota during a call);
* :mod:`.host_git` -- the trainer's git, blind to the agent's ``.git``;
* :mod:`.timing` -- what the isolation costs (``python -m verl_credit.envs.coding.timing``);
* :mod:`.replay` -- counterfactual replay of a trajectory with one call replaced;
* :mod:`.environment` -- the async :class:`~verl_credit.envs.base.Environment` adapter.
"""

from verl_credit.envs.coding.environment import SYSTEM_PROMPT, CodingEnvironment
from verl_credit.envs.coding.jail import JailResult, JailSetupError, namespace_jail_available, run_jailed
from verl_credit.envs.coding.paths import SandboxPathError, resolve_sandbox_path
from verl_credit.envs.coding.sandbox import CodingSandbox, SandboxLimits, SandboxState, TestReport
from verl_credit.envs.coding.sandbox_replay import ReplayOutcome, replay_trajectory, tool_calls_of
from verl_credit.envs.coding.task_spec import TASKS_DIR, CodingTask, FileEdit, WrongEdit, list_tasks, load_task
from verl_credit.envs.coding.tools import TOOL_NAMES, TOOL_SCHEMAS

__all__ = [
    "SYSTEM_PROMPT",
    "TASKS_DIR",
    "TOOL_NAMES",
    "TOOL_SCHEMAS",
    "CodingEnvironment",
    "CodingSandbox",
    "CodingTask",
    "FileEdit",
    "JailResult",
    "JailSetupError",
    "ReplayOutcome",
    "SandboxLimits",
    "SandboxPathError",
    "SandboxState",
    "TestReport",
    "WrongEdit",
    "list_tasks",
    "load_task",
    "namespace_jail_available",
    "replay_trajectory",
    "resolve_sandbox_path",
    "run_jailed",
    "tool_calls_of",
]
