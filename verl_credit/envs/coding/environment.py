"""The coding sandbox as an agent-loop :class:`Environment` (registered as ``"coding"``).

``start(task)`` takes ``{"task": "<shipped task name>"}`` (also ``name`` or ``task_dir``) and checks
the task out into a fresh :class:`CodingSandbox`. Tool calls and the reward run in worker threads
(``asyncio.to_thread``) so concurrent episodes do not block the event loop. Calls of one episode
run one at a time (an ``asyncio.Lock``): verl runs one message's tool calls concurrently, and a
file tool must never run while the same sandbox's ``bash`` does; waiting happens on the event
loop, not in a worker thread. The episode ends when the agent answers without a tool call
(``user_turn`` returns ``done``); there is no simulated user.

``replay(messages, call_index, replacement_arguments) -> float`` re-runs a finished trajectory of
the current task in a fresh sandbox with one call's tool call replaced (``None``: removed) -- the
replay interface of counterfactual calibration.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from verl_credit.envs.base import Environment, EpisodeStart, ToolResult, UserTurn, register_environment
from verl_credit.envs.coding.jail import JAIL_MODES, fallback_count
from verl_credit.envs.coding.sandbox import REWARD_MODES, WORKSPACE_MODES, CodingSandbox, SandboxLimits
from verl_credit.envs.coding.sandbox_replay import replay_trajectory
from verl_credit.envs.coding.task_spec import CodingTask, load_task
from verl_credit.envs.coding.tools import TOOL_SCHEMAS

__all__ = ["SYSTEM_PROMPT", "CodingEnvironment"]

SYSTEM_PROMPT = """You are a software engineer fixing a bug in a small Python repository.
Tools: read_file, search, list_dir (look around), edit_file / write_file (change files; read a file
before editing it), run_tests (the repository's visible tests), bash (a jailed shell in the repository
root: no network, nothing outside the repository is writable, commands are time-limited).
When you are done, reply with a short summary and no tool call. Your fix is graded by hidden tests."""


@register_environment("coding")
class CodingEnvironment(Environment):
    """Options: ``jail`` (auto|namespace|fallback), ``limits`` (:class:`SandboxLimits` or a mapping),
    ``reward_mode`` (binary|fraction), ``require_read_before_edit``, ``base_dir``, ``workspace``
    (auto|tmpfs|directory)."""

    def __init__(
        self,
        jail: str = "auto",
        limits: SandboxLimits | Mapping[str, Any] | None = None,
        reward_mode: str = "binary",
        require_read_before_edit: bool = True,
        base_dir: str | None = None,
        workspace: str = "auto",
    ) -> None:
        # ``credit.env.options`` arrives as plain yaml values: check them here, where the trainer's
        # start-up builds the environment once, so a typo fails before any worker starts instead of
        # in every episode (and a string "false" never reads as true)
        _check_choice("jail", jail, JAIL_MODES)
        _check_choice("reward_mode", reward_mode, REWARD_MODES)
        _check_choice("workspace", workspace, WORKSPACE_MODES)
        if not isinstance(require_read_before_edit, bool):
            raise ValueError(
                f"coding environment option require_read_before_edit must be true or false, "
                f"got {require_read_before_edit!r}"
            )
        if base_dir is not None and not isinstance(base_dir, str):
            raise ValueError(f"coding environment option base_dir must be a path or null, got {base_dir!r}")
        self.options: dict[str, Any] = {
            "jail": jail,
            "limits": _limits(limits),
            "reward_mode": reward_mode,
            "require_read_before_edit": require_read_before_edit,
            "base_dir": base_dir,
            "workspace": workspace,
        }
        self.sandbox: CodingSandbox | None = None
        self.task: CodingTask | None = None
        self._turn = asyncio.Lock()  # one call at a time on the sandbox (see the module docstring)

    async def start(self, task: Mapping[str, Any]) -> EpisodeStart:
        spec = task.get("task") or task.get("name") or task.get("task_dir")
        if not spec:
            raise ValueError(f"coding task spec needs 'task' (a shipped task name) or 'task_dir'; keys: {sorted(task)}")
        await self.close()
        self.task = load_task(spec)
        self.sandbox = await asyncio.to_thread(CodingSandbox, self.task, **self.options)
        return EpisodeStart(
            system_prompt=SYSTEM_PROMPT,
            tools=TOOL_SCHEMAS,
            first_user_message=self.task.statement,
            info={
                "task": self.task.name,
                "jail": self.sandbox.jail_mode,
                "jail_fallbacks": fallback_count(),  # process-wide count of auto -> fallback (alert if > 0)
                "domain": "coding",
            },
        )

    async def call_tool(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        async with self._turn:
            return await asyncio.to_thread(self._require_sandbox().call, name, arguments)

    async def user_turn(self, messages: list[dict[str, Any]]) -> UserTurn:
        return UserTurn(content=None, done=True)

    async def reward(self) -> float:
        async with self._turn:
            return await asyncio.to_thread(self._require_sandbox().reward)

    async def close(self) -> None:
        async with self._turn:
            if self.sandbox is not None:
                sandbox, self.sandbox = self.sandbox, None
                await asyncio.to_thread(sandbox.close)

    def replay(
        self,
        trajectory_messages: Sequence[Mapping[str, Any]],
        call_index: int,
        replacement_arguments: Mapping[str, Any] | None,
    ) -> float:
        """Reward of the current task's trajectory with call ``call_index``'s tool call replaced/removed."""
        if self.task is None:
            raise RuntimeError("replay needs a task: call start(task) first")
        return replay_trajectory(
            self.task, trajectory_messages, call_index, replacement_arguments, **self.options
        ).reward

    def _require_sandbox(self) -> CodingSandbox:
        if self.sandbox is None:
            raise RuntimeError("the coding environment has no episode: call start(task) first")
        return self.sandbox


def _check_choice(name: str, value: Any, allowed: Sequence[str]) -> None:
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"coding environment option {name} must be one of {list(allowed)}, got {value!r}")


def _limits(limits: SandboxLimits | Mapping[str, Any] | None) -> SandboxLimits | None:
    """``limits`` as :class:`SandboxLimits` (which checks every value), unknown keys named."""
    if limits is None or isinstance(limits, SandboxLimits):
        return limits
    if not isinstance(limits, Mapping):
        raise ValueError(f"coding environment option limits must be a table of limits, got {limits!r}")
    known = set(SandboxLimits.__dataclass_fields__)
    unknown = sorted(str(key) for key in limits if key not in known)
    if unknown:
        raise ValueError(f"unknown coding environment limit(s) {unknown}; known: {sorted(known)}")
    return SandboxLimits(**{str(key): value for key, value in limits.items()})
