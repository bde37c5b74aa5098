"""Coding sandbox environment (registered as ``"coding"``): bug-fix tasks in jailed temporary git repos.

* :mod:`.task_spec` -- the shipped tasks (``tasks/<name>/``: repo, hidden tests, solution, wrong edits);
* :mod:`.sandbox` -- one episode: tools, snapshot/restore, hidden-test reward;
* :mod:`.jail` -- the command jail (Linux namespaces, or a documented best-effort fallback);
* :mod:`.paths` -- path arguments resolved inside the sandbox or rejected;
* :mod:`.replay` -- counterfactual replay of a trajectory with one call replaced;
* :mod:`.environment` -- the async :class:`~verl_credit.envs.base.Environment` adapter.
"""

from verl_credit.envs.coding.environment import SYSTEM_PROMPT, CodingEnvironment
from verl_credit.envs.coding.jail import JailResult, JailSetupError, namespace_jail_available, run_jailed
from verl_credit.envs.coding.paths import SandboxPathError, resolve_sandbox_path
from verl_credit.envs.coding.replay import ReplayOutcome, replay_trajectory, tool_calls_of
from verl_credit.envs.coding.sandbox import CodingSandbox, SandboxLimits, SandboxState, TestReport
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
