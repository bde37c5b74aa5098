"""The environment interface every multi-turn task world implements.

The agent loop (``verl_credit.verl.agent_loop``) drives one episode like this::

    start = await env.start(task)                   # system prompt, tools, opening user turn
    messages = [system, user(start.first_user_message)]
    loop:
        assistant = <policy generates>
        if assistant has tool calls:
            for call: result = await env.call_tool(call.name, call.arguments)  -> role "tool" message
        else:
            turn = await env.user_turn(messages)     # the simulated user answers (or ends)
            if turn.done: break
            messages.append(user(turn.content))
    reward = await env.reward()
    await env.close()

Implementations: the demo service world (``envs/service``), tau2-bench (``envs/tau2``), the coding
sandbox (``envs/coding``). Each registers itself with :func:`register_environment` and is
built by name (``build_environment``), so the agent loop never branches on the environment.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ENVIRONMENTS",
    "Environment",
    "EpisodeStart",
    "ToolResult",
    "UserTurn",
    "build_environment",
    "episode_over",
    "episode_task",
    "register_environment",
    "tool_step",
]


@dataclass
class EpisodeStart:
    system_prompt: str
    tools: list[dict[str, Any]]  # OpenAI function-tool schemas: {"type": "function", "function": {...}}
    first_user_message: str
    info: dict[str, Any] = field(default_factory=dict)  # task id, domain, ... (for logs)


@dataclass
class ToolResult:
    content: str
    is_error: bool = False


@dataclass
class UserTurn:
    content: str | None
    done: bool = False  # the user ended the conversation (content may hold a closing line)


class Environment(ABC):
    """One episode of one task. Not shared between concurrent episodes."""

    name: str = "base"

    @abstractmethod
    async def start(self, task: Mapping[str, Any]) -> EpisodeStart:
        """Reset to ``task`` (a row's ``extra_info`` / task spec) and return the opening."""

    @abstractmethod
    async def call_tool(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        """Execute one agent tool call against the environment state."""

    @abstractmethod
    async def user_turn(self, messages: list[dict[str, Any]]) -> UserTurn:
        """The user's reply to the conversation so far (last message: the assistant's text)."""

    @abstractmethod
    async def reward(self) -> float:
        """Outcome reward of the finished episode."""

    async def close(self) -> None:
        """Release resources (temp dirs, clients)."""


@contextmanager
def tool_step(env: Any, num_calls: int) -> Iterator[None]:
    """Run one assistant message's tool calls as one environment step (an optional hook pair:
    tau2's orchestrator counts the whole message as one step, see ``envs/tau2/termination.py``).

    Inside the block the driver sends the message's calls to ``env.call_tool``; ``num_calls`` is how
    many the message has (after any ``max_parallel_calls`` cut), so calls the driver answered itself
    (bad JSON arguments, an unknown tool) still count as failed calls, as tau2's environment counts
    them. Environments without ``begin_tool_step`` / ``end_tool_step`` are driven as before.
    """
    begin = getattr(env, "begin_tool_step", None)
    if begin is None:
        yield
        return
    begin()
    try:
        yield
    finally:  # also on an exception, so the next message can open its own step
        env.end_tool_step(num_calls)


def take_turn_reward(env: Any) -> float | None:
    """The per-turn reward of the action that just finished (an optional ``turn_reward()`` hook,
    verl's ``turn_scores``; the service world's ``turn_rewards=true``), or None when ``env`` gives
    none. The driver calls it once per assistant action, after the action's tool calls."""
    hook = getattr(env, "turn_reward", None)
    return None if hook is None else float(hook())


def episode_over(env: Any) -> bool:
    """Whether ``env`` has ended the episode on its own (an optional ``episode_over`` property; tau2:
    a step hit ``max_steps`` / ``max_errors``): the driver stops generating."""
    return bool(getattr(env, "episode_over", False))


def episode_task(extra_info: Mapping[str, Any]) -> Mapping[str, Any]:
    """The task mapping a dataset row gives :meth:`Environment.start`: ``extra_info["task"]`` when
    it is a mapping, otherwise the whole ``extra_info`` (so ``{"env": "coding", "task":
    "median_even"}`` works as well as ``{"task": {...}}``)."""
    task = extra_info.get("task")
    return task if isinstance(task, Mapping) else extra_info


ENVIRONMENTS: dict[str, Callable[..., Environment]] = {}


def register_environment(name: str) -> Callable[[type[Environment]], type[Environment]]:
    def decorator(cls: type[Environment]) -> type[Environment]:
        existing = ENVIRONMENTS.get(name)
        if existing is not None and existing is not cls:
            raise ValueError(f"environment {name!r} is already registered to {existing}")
        ENVIRONMENTS[name] = cls
        cls.name = name
        return cls

    return decorator


_BUILTIN = {
    "service": "verl_credit.envs.service",
    "tau2": "verl_credit.envs.tau2",
    "coding": "verl_credit.envs.coding",
}


def build_environment(name: str, **options: Any) -> Environment:
    """Instantiate a registered environment by name (built-ins are imported on first use)."""
    if name not in ENVIRONMENTS and name in _BUILTIN:
        import importlib

        importlib.import_module(_BUILTIN[name])
    if name not in ENVIRONMENTS:
        raise ValueError(f"unknown environment {name!r}; registered: {sorted(set(ENVIRONMENTS) | set(_BUILTIN))}")
    return ENVIRONMENTS[name](**options)
