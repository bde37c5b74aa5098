"""Simulated users inside the agent loop (verl 0.9 removed ``verl/interactions``).

When the policy answers without a tool call, the agent loop asks a :class:`SimulatedUser` for
the next user turn:

* :class:`EnvironmentUser` -- the environment's own user (tau2's user simulator, the demo
  service world's scripted customer);
* :class:`LLMUser` -- a model behind an OpenAI-compatible ``/chat/completions`` endpoint (vLLM),
  role-flipped transcript, ends the conversation with a stop token;
* :class:`ScriptedUser` -- fixed replies, for tests and demos.

``build_user`` picks one from ``credit.user.name``; a user is created per episode.

The llm user's reply is ``content``, or -- when that is empty -- the text of ``reasoning_content`` /
``reasoning`` with ``<think>`` blocks removed (vLLM's reasoning parser puts a Qwen3 answer there when
thinking is on or the parser misfires); such replies are counted (``LLMUser.reasoning_fallbacks``)
and logged (:func:`verl_credit.openai_chat.reply_text`, shared with tau2's simulated user).
Its HTTP client ignores ``HTTP(S)_PROXY`` unless ``trust_env=True`` (in-cluster endpoint).
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from verl_credit.envs.base import Environment, UserTurn
from verl_credit.openai_chat import (
    ChatCompletionError,
    RetryPolicy,
    first_message,
    log_reasoning_fallback,
    make_async_client,
    post_chat_completion,
    reply_text,
)
from verl_credit.verl.settings import UserSettings

__all__ = [
    "DEFAULT_INSTRUCTIONS",
    "EnvironmentUser",
    "LLMUser",
    "ScriptedUser",
    "SimulatedUser",
    "UserSimulatorError",
    "build_user",
    "flip_roles",
]

DEFAULT_INSTRUCTIONS = "You need help from the assistant with your request. Answer its questions briefly."

_SYSTEM_TEMPLATE = (
    "You are a user talking to an AI assistant. Stay in character and never act as the assistant.\n"
    "Your instructions:\n{instructions}\n\n"
    "Write one short message per turn, giving only the information the assistant asks for. "
    "When your request is fully handled, or cannot be handled, reply with {stop_token} and nothing else."
)


class UserSimulatorError(RuntimeError):
    """The simulated user could not produce a turn (endpoint down after all retries, bad reply)."""


class SimulatedUser(ABC):
    """Produces the next user turn of one episode."""

    @abstractmethod
    async def reply(self, messages: list[dict[str, Any]]) -> UserTurn:
        """The user's answer to the conversation so far (last message: the assistant's text)."""

    async def aclose(self) -> None:
        """Release clients (default: nothing)."""


class EnvironmentUser(SimulatedUser):
    """Delegates to ``Environment.user_turn``."""

    def __init__(self, env: Environment):
        self.env = env

    async def reply(self, messages: list[dict[str, Any]]) -> UserTurn:
        return await self.env.user_turn(messages)


class ScriptedUser(SimulatedUser):
    """Replies from a script, in order; when the script is exhausted the user ends the episode.

    Each entry is a string (a reply) or a :class:`UserTurn` (e.g. a closing line with ``done``).
    ``seen`` keeps the transcripts the user was shown, for tests.
    """

    def __init__(self, script: Sequence[str | UserTurn]):
        self.script = list(script)
        self.seen: list[list[dict[str, Any]]] = []

    async def reply(self, messages: list[dict[str, Any]]) -> UserTurn:
        self.seen.append([dict(m) for m in messages])
        if len(self.seen) > len(self.script):
            return UserTurn(content=None, done=True)
        entry = self.script[len(self.seen) - 1]
        return entry if isinstance(entry, UserTurn) else UserTurn(content=str(entry), done=False)


def flip_roles(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """The transcript from the user's side: assistant text -> ``user``, user text -> ``assistant``.

    System prompts, tool results and tool-call-only assistant turns are not shown to the user
    (the user does not see the agent's tools).
    """
    flipped: list[dict[str, str]] = []
    for message in messages:
        role, content = message.get("role"), message.get("content")
        text = content if isinstance(content, str) else ""
        if not text.strip():
            continue
        if role == "assistant":
            flipped.append({"role": "user", "content": text})
        elif role == "user":
            flipped.append({"role": "assistant", "content": text})
    return flipped


class LLMUser(SimulatedUser):
    """A user simulated by a chat model behind an OpenAI-compatible endpoint.

    Request: ``POST {base_url}/chat/completions`` with ``[system: instructions] + flip_roles(transcript)``.
    The reply ends the episode (``done=True``) when it contains ``stop_token``; the token is
    stripped from the content (a closing line before it is kept). Transport errors, timeouts and
    408/429/5xx answers are retried ``max_retries`` times with exponential backoff
    (:func:`verl_credit.openai_chat.post_chat_completion`), then :class:`UserSimulatorError`
    naming the URL is raised (verl marks that prompt group failed). An empty ``content`` falls back
    to the reasoning text (module docstring); ``trust_env`` lets httpx read proxy variables.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        instructions: str = DEFAULT_INSTRUCTIONS,
        *,
        temperature: float = 0.0,
        max_tokens: int = 512,
        timeout: float = 60.0,
        max_retries: int = 3,
        stop_token: str = "###STOP###",
        api_key: str | None = None,
        backoff_s: float = 0.5,
        transport: httpx.AsyncBaseTransport | None = None,
        trust_env: bool = False,
    ):
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.system_prompt = _SYSTEM_TEMPLATE.format(instructions=instructions, stop_token=stop_token)
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.retry = RetryPolicy(max_retries=max_retries, backoff_s=backoff_s)
        self.stop_token = stop_token
        self.reasoning_fallbacks = 0
        """Replies taken from ``reasoning_content`` / ``reasoning`` because ``content`` was empty."""
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = make_async_client(timeout=timeout, headers=headers, transport=transport, trust_env=trust_env)

    def request_body(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": [{"role": "system", "content": self.system_prompt}, *flip_roles(messages)],
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }

    async def reply(self, messages: list[dict[str, Any]]) -> UserTurn:
        try:
            response = await post_chat_completion(
                self.client,
                self.url,
                self.request_body(messages),
                retry=self.retry,
            )
        except ChatCompletionError as exc:
            raise UserSimulatorError(f"user LLM at {exc}") from exc
        text = self._reply_text(response)
        if self.stop_token in text:
            closing = text.replace(self.stop_token, "").strip()
            return UserTurn(content=closing or None, done=True)
        return UserTurn(content=text.strip(), done=False)

    def _reply_text(self, response: dict[str, Any]) -> str:
        """``content``, else the reasoning text (counted, logged); a reply with neither field raises."""
        try:
            message = first_message(response)
        except ChatCompletionError as exc:
            raise UserSimulatorError(f"user LLM at {self.url} returned no message content: {exc}") from exc
        if not any(key in message for key in ("content", "reasoning_content", "reasoning")):
            raise UserSimulatorError(f"user LLM at {self.url} returned no message content: {str(message)[:300]}")
        text = reply_text(message)
        if text.from_reasoning:
            self.reasoning_fallbacks += 1
            log_reasoning_fallback(f"llm user {self.url}")
        return text.text

    async def aclose(self) -> None:
        await self.client.aclose()


def build_user(
    settings: UserSettings,
    env: Environment | None,
    extra_info: Mapping[str, Any] | None = None,
    episode_info: Mapping[str, Any] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> SimulatedUser | None:
    """The episode's user per ``credit.user.name``; ``None`` means: no user, the episode ends at
    the first assistant turn without a tool call (verl's ToolAgentLoop behaviour).

    Instructions / script come from the row (``extra_info.user_instructions`` /
    ``extra_info.user_script``), then the environment's episode info, then the settings.
    """
    extra_info = extra_info or {}
    episode_info = episode_info or {}
    if settings.name == "none":
        return None
    if settings.name == "env":
        return EnvironmentUser(env) if env is not None else None
    if settings.name == "scripted":
        script = extra_info.get("user_script") or episode_info.get("user_script") or settings.script
        return ScriptedUser([str(s) for s in script])
    instructions = (
        extra_info.get("user_instructions")
        or episode_info.get("user_instructions")
        or settings.instructions
        or DEFAULT_INSTRUCTIONS
    )
    api_key = os.environ.get(settings.api_key_env) if settings.api_key_env else None
    if not settings.base_url or not settings.model:
        raise ValueError("credit.user.base_url and credit.user.model must be set for the llm user")
    return LLMUser(
        settings.base_url,
        settings.model,
        str(instructions),
        temperature=settings.temperature,
        max_tokens=settings.max_tokens,
        timeout=settings.timeout,
        max_retries=settings.max_retries,
        stop_token=settings.stop_token,
        api_key=api_key,
        transport=transport,
        # credit.user.trust_env, once the settings have it (default off: in-cluster endpoint)
        trust_env=bool(getattr(settings, "trust_env", False)),
    )
