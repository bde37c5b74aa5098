"""The demo service world behind the :class:`~verl_credit.envs.base.Environment` interface.

:class:`ServiceEpisode` is the synchronous core (the demo and the learning benchmark drive it
directly, millions of steps); :class:`ServiceEnvironment` wraps it for the asynchronous agent
loop and is registered as ``"service"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from verl_credit.envs.base import Environment, EpisodeStart, ToolResult, UserTurn, register_environment
from verl_credit.envs.service.tasks import ServiceTask, build_task, expected_database
from verl_credit.envs.service.tools import SYSTEM_PROMPT, TOOL_SCHEMAS
from verl_credit.envs.service.user import OPENING_MESSAGE, ScriptedUser, UserReply
from verl_credit.envs.service.world import execute_tool

__all__ = ["ServiceEnvironment", "ServiceEpisode"]


@lru_cache(maxsize=4096)
def _task_and_expected(variant: str, seed: int, max_turns: int | None) -> tuple[ServiceTask, dict[str, Any]]:
    spec: dict[str, Any] = {"variant": variant, "seed": seed}
    if max_turns is not None:
        spec["max_turns"] = max_turns
    task = build_task(spec)
    return task, expected_database(task).snapshot()


class ServiceEpisode:
    """One episode: a private copy of the task's database, the scripted customer, the reward."""

    def __init__(self, task: ServiceTask | Mapping[str, Any]):
        if isinstance(task, ServiceTask):
            self.task, self._expected = task, expected_database(task).snapshot()
        else:
            self.task, self._expected = _task_and_expected(
                task.get("variant", "mixed"), task.get("seed", 0), task.get("max_turns")
            )
        self.database = self.task.database.copy()
        self.user = ScriptedUser(self.task)

    def call_tool(self, name: str, arguments: Mapping[str, Any]) -> tuple[str, bool]:
        """``(content, is_error)`` of one tool call (write tools change this episode's database)."""
        return execute_tool(self.database, name, arguments)

    def user_reply(self, assistant_text: str) -> UserReply:
        return self.user.reply(assistant_text)

    def reward(self) -> float:
        """1.0 when the final database equals the expected one, else 0.0."""
        return 1.0 if self.database.snapshot() == self._expected else 0.0

    def mismatches(self) -> int:
        """Order fields (status, refund target, refund amount, items) that differ from the expected
        database: 0 exactly when :meth:`reward` is 1."""
        current = self.database.snapshot()
        return sum(
            current.get(order_id, {}).get(name) != value
            for order_id, fields in self._expected.items()
            for name, value in fields.items()
        )


@register_environment("service")
class ServiceEnvironment(Environment):
    """The demo service world for the agent loop. ``task``: ``{"variant": ..., "seed": ...}``."""

    def __init__(self, **options: Any):
        unknown = set(options) - {"variant", "turn_rewards"}
        if unknown:
            raise ValueError(
                f"unknown service environment option(s) {sorted(unknown)}; known: ['turn_rewards', 'variant']"
            )
        self.default_variant = options.get("variant", "mixed")
        turn_rewards = options.get("turn_rewards", False)
        if not isinstance(turn_rewards, bool):
            raise ValueError(f"service environment option turn_rewards must be true or false, got {turn_rewards!r}")
        if turn_rewards:  # an instance attribute: drivers look the hook up with getattr
            self.turn_reward = self._turn_reward
        self.episode: ServiceEpisode | None = None
        self._open_mismatches = 0
        self._last_mismatches = 0

    async def start(self, task: Mapping[str, Any]) -> EpisodeStart:
        spec = {"variant": self.default_variant, **dict(task)}
        self.episode = ServiceEpisode(build_task(spec))
        self._open_mismatches = self._last_mismatches = self.episode.mismatches()
        return EpisodeStart(
            system_prompt=SYSTEM_PROMPT,
            tools=TOOL_SCHEMAS,
            first_user_message=OPENING_MESSAGE,
            info={
                "task_id": self.episode.task.task_id,
                "domain": "service",
                "variant": self.episode.task.variant,
                "max_turns": self.episode.task.max_turns,
            },
        )

    def _require_episode(self) -> ServiceEpisode:
        if self.episode is None:
            raise RuntimeError("ServiceEnvironment: call start(task) before using the episode")
        return self.episode

    async def call_tool(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        content, is_error = self._require_episode().call_tool(name, arguments)
        return ToolResult(content, is_error)

    async def user_turn(self, messages: list[dict[str, Any]]) -> UserTurn:
        last = next((m for m in reversed(messages) if m.get("role") == "assistant"), None)
        text = (last or {}).get("content") or ""
        if not isinstance(text, str):
            text = " ".join(part.get("text", "") for part in text if isinstance(part, dict))
        reply = self._require_episode().user_reply(text)
        return UserTurn(reply.content, reply.done)

    async def reward(self) -> float:
        return self._require_episode().reward()

    def _turn_reward(self) -> float:
        """``turn_rewards=true``: the share of the task's required database changes that the
        action just finished made (negative when it undid some). The turn rewards of an episode
        sum to ``1 - mismatches at the end / mismatches at the start``."""
        now = self._require_episode().mismatches()
        earned = (self._last_mismatches - now) / max(self._open_mismatches, 1)
        self._last_mismatches = now
        return float(earned)

    async def close(self) -> None:
        self.episode = None
