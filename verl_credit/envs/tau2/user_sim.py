"""tau2's user simulator, driven by an LLM behind an OpenAI-compatible endpoint (vLLM), asynchronously.

The prompt is tau2's own: ``tau2.user.user_simulator.UserSimulator`` builds the system prompt (its
simulation guidelines, the tool variant when the user has tools, and the task's user scenario) and
the state (``UserState.flip_roles``: the agent's texts become ``user`` turns, the simulator's own
turns become ``assistant`` turns, the results of its own tool calls stay ``tool`` turns). Only the
transport differs from tau2's ``generate`` (litellm, blocking): one ``httpx.AsyncClient`` POST to
``{base_url}/chat/completions`` per turn, so hundreds of concurrent episodes do not hold threads.
Like tau2, an empty reply (no text, no tool call) is asked again up to ``max_empty_retries`` times.

A reply whose ``content`` is empty but whose ``reasoning_content`` (or ``reasoning``) holds text is
taken from there, ``<think>`` blocks removed (:func:`reply_text`): Qwen3 served by vLLM with a
reasoning parser puts the whole answer there when thinking is on or the parser misfires. Such
replies are counted (``OpenAIUserSimulator.reasoning_fallbacks``) and logged.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import httpx

from verl_credit.envs.tau2._deps import require_tau2
from verl_credit.openai_chat import (
    ChatCompletionError,
    ReplyText,
    RetryPolicy,
    first_message,
    log_reasoning_fallback,
    post_chat_completion,
    reply_text,
    strip_thinking,
)

__all__ = [
    "OpenAIUserSimulator",
    "ReplyText",
    "UserSimConfig",
    "UserSimulatorError",
    "log_reasoning_fallback",
    "reply_text",
    "strip_thinking",
]

logger = logging.getLogger(__name__)

_ROUND_ROBIN = itertools.count()


class UserSimulatorError(RuntimeError):
    """The user-simulator endpoint failed after all retries (an infrastructure problem, not a reward)."""


@dataclass(frozen=True)
class UserSimConfig:
    """The tau2 simulated user, Hydra node ``credit.env.options.user`` (all keys optional)."""

    base_urls: tuple[str, ...] = ("http://127.0.0.1:8000/v1",)
    """OpenAI-compatible endpoints (``.../v1``); episodes are spread over them round-robin."""
    model: str = "Qwen/Qwen3-32B"
    """Model name the endpoint serves."""
    temperature: float = 0.0
    """Sampling temperature of the simulated user (tau2's default: 0)."""
    api_key: str = "EMPTY"
    """Bearer token (vLLM ignores it unless started with ``--api-key``)."""
    timeout_s: float = 300.0
    """Per-request timeout."""
    max_retries: int = 4
    """Retries of a failed request (connection error, timeout, 408, 429, 5xx) with exponential backoff."""
    max_empty_retries: int = 3
    """Re-asks after an empty reply (tau2's ``DEFAULT_MAX_RETRIES``)."""
    max_tool_steps: int | None = None
    """Cap on the user's tool-call messages (telecom's dual control) inside one user turn; past it the
    episode ends (``max_steps``). ``None``: no cap of our own, tau2's ``max_steps`` bounds it as in tau2."""
    seed: int | None = None
    """Sampling seed sent with each request (tau2 sets one per trial)."""
    max_tokens: int | None = None
    """Cap on each simulated-user reply (``None``: the server's default, as tau2 sends none)."""
    extra_body: Mapping[str, Any] = field(default_factory=lambda: {"chat_template_kwargs": {"enable_thinking": False}})
    """Extra request fields (vLLM: ``chat_template_kwargs``); thinking off by default."""
    trust_env: bool = False
    """Let the HTTP client read ``HTTP(S)_PROXY`` / ``NO_PROXY`` from the environment (off: the
    simulator is an in-cluster endpoint, and a login node's proxy must not reroute it)."""

    def __post_init__(self) -> None:
        if isinstance(self.base_urls, str):
            object.__setattr__(self, "base_urls", (self.base_urls,))
        object.__setattr__(self, "base_urls", tuple(str(url).rstrip("/") for url in self.base_urls))
        if not self.base_urls or any(not url.startswith(("http://", "https://")) for url in self.base_urls):
            raise ValueError(f"credit.env.options.user.base_urls must be http(s) URLs, got {self.base_urls!r}")
        if not self.model:
            raise ValueError("credit.env.options.user.model must be a non-empty model name")
        if self.temperature < 0:
            raise ValueError(f"credit.env.options.user.temperature must be >= 0, got {self.temperature}")
        if self.timeout_s <= 0:
            raise ValueError(f"credit.env.options.user.timeout_s must be > 0, got {self.timeout_s}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"credit.env.options.user.max_tokens must be >= 1, got {self.max_tokens}")
        for key in ("max_retries", "max_empty_retries", "max_tool_steps"):
            if getattr(self, key) is not None and getattr(self, key) < 0:
                raise ValueError(f"credit.env.options.user.{key} must be >= 0, got {getattr(self, key)}")

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any] | None) -> UserSimConfig:
        """Build from a (Hydra) mapping; unknown keys raise ``ValueError`` naming them."""
        raw = dict(raw or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"unknown credit.env.options.user keys {unknown}; known: {sorted(known)}")
        if raw.get("base_urls") is not None and not isinstance(raw["base_urls"], str):
            raw["base_urls"] = tuple(raw["base_urls"])
        if raw.get("extra_body") is not None:
            raw["extra_body"] = _plain(raw["extra_body"])
        return cls(**{k: v for k, v in raw.items() if v is not None})


def _plain(value: Any) -> Any:
    """OmegaConf containers -> plain dicts/lists (JSON-serialisable)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return [_plain(v) for v in value]
    return value


def _to_openai_messages(messages: list[Any]) -> list[dict[str, Any]]:
    """tau2 messages -> chat-completions messages (tau2's ``to_litellm_messages``, minus null fields)."""
    from tau2.utils.llm_utils import to_litellm_messages

    out = []
    for message in to_litellm_messages(messages):
        if message.get("tool_calls") is None:
            message.pop("tool_calls", None)
        else:
            message["tool_calls"] = [
                {"id": call["id"], "type": "function", "function": call["function"]} for call in message["tool_calls"]
            ]
        out.append(message)
    return out


class OpenAIUserSimulator:
    """One episode's simulated user: tau2's prompt and state, an async OpenAI-compatible transport.

    Args:
        instructions: the task's user scenario (``str(task.user_scenario)``), as tau2's runner passes it.
        tools: the user's own tools (``tau2.environment.tool.Tool``; telecom only) or ``None``.
        config: endpoint and sampling settings.
        client: the HTTP client (tests inject one with ``httpx.MockTransport``).
    """

    def __init__(
        self, instructions: str, tools: list[Any] | None, config: UserSimConfig, client: httpx.AsyncClient
    ) -> None:
        require_tau2()
        from tau2.user.user_simulator import UserSimulator

        self._tau2_user = UserSimulator(tools=tools or None, instructions=instructions)
        self.tools = tools or None
        self._tool_schemas = [tool.openai_schema for tool in self.tools] if self.tools else None
        self.config = config
        self.state = self._tau2_user.get_init_state()
        self.reasoning_fallbacks = 0
        """Replies of this episode taken from ``reasoning_content`` / ``reasoning`` (no ``content``)."""
        self._client = client
        self._base_url = config.base_urls[next(_ROUND_ROBIN) % len(config.base_urls)]

    @property
    def system_prompt(self) -> str:
        return self._tau2_user.system_prompt

    def is_stop(self, message: Any) -> bool:
        """tau2's stop test: ``###STOP###``, ``###TRANSFER###`` or ``###OUT-OF-SCOPE###`` in a text reply."""
        return (not message.is_tool_call()) and message.has_text_content() and self._tau2_user.is_stop(message)

    async def respond(self, incoming: Any) -> Any:
        """The user's next message (``tau2 UserMessage``) to ``incoming`` (agent text or user tool results).

        Mirrors ``UserSimulator._generate_next_message``: ``incoming`` joins the state, the flipped state
        is sent, the reply (tool calls re-tagged ``requestor="user"``) joins the state and is returned.
        """
        from tau2.data_model.message import MultiToolMessage, ToolCall, UserMessage

        if isinstance(incoming, MultiToolMessage):
            self.state.messages.extend(incoming.tool_messages)
        else:
            self.state.messages.append(incoming)
        payload = self._payload(_to_openai_messages(self.state.system_messages + self.state.flip_roles()))
        content: str | None = None
        tool_calls: list[Any] | None = None
        from_reasoning = False
        for _ in range(self.config.max_empty_retries + 1):
            content, tool_calls, from_reasoning = _parse_choice(await self._post(payload))
            if (content is not None and content.strip()) or tool_calls:
                break
        if from_reasoning:
            self.reasoning_fallbacks += 1
            log_reasoning_fallback(f"tau2 user simulator {self._base_url}")
        message = UserMessage(role="user", content=content)
        if tool_calls:
            message.tool_calls = [
                ToolCall(id=call["id"], name=call["name"], arguments=call["arguments"], requestor="user")
                for call in tool_calls
            ]
        self.state.messages.append(message)
        return message

    def _payload(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "model": self.config.model,
            "messages": messages,
            "temperature": self.config.temperature,
        }
        if self._tool_schemas:
            payload["tools"] = self._tool_schemas
            payload["tool_choice"] = "auto"
        if self.config.seed is not None:
            payload["seed"] = self.config.seed
        if self.config.max_tokens is not None:
            payload["max_tokens"] = self.config.max_tokens
        payload.update(_plain(self.config.extra_body))
        return payload

    async def _post(self, payload: dict[str, Any]) -> dict[str, Any]:
        try:
            return await post_chat_completion(
                self._client,
                f"{self._base_url}/chat/completions",
                payload,
                retry=RetryPolicy(max_retries=self.config.max_retries),
                timeout_s=self.config.timeout_s,
                headers={"Authorization": f"Bearer {self.config.api_key}"},
            )
        except ChatCompletionError as error:
            raise UserSimulatorError(f"user simulator {error}") from error


def _parse_choice(body: Mapping[str, Any]) -> tuple[str | None, list[dict[str, Any]] | None, bool]:
    """``(content, tool calls, from_reasoning)`` of the first choice; a call with unparseable arguments
    voids the reply. A text reply is :func:`reply_text` (``content``, else the reasoning text)."""
    try:
        message = first_message(body)
    except ChatCompletionError as error:
        raise UserSimulatorError(f"user simulator {error}") from None
    content, from_reasoning = _reply_content(message)
    calls = []
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") or {}
        raw = function.get("arguments") or "{}"
        try:
            arguments = json.loads(raw) if isinstance(raw, str) else dict(raw)
        except (ValueError, TypeError):
            return None, None, False
        if not isinstance(arguments, dict) or not function.get("name"):
            return None, None, False
        calls.append({"id": call.get("id") or f"user_call_{index}", "name": function["name"], "arguments": arguments})
    return content, (calls or None), from_reasoning


def _reply_content(message: Mapping[str, Any]) -> tuple[str | None, bool]:
    """The text of a user reply: with tool calls the ``content`` as sent (thinking removed), since the
    reasoning is then the thinking before the call; without, :func:`reply_text`."""
    if message.get("tool_calls"):
        content = message.get("content")
        return (strip_thinking(content) if isinstance(content, str) else None), False
    text = reply_text(message)
    return (text.text or None), text.from_reasoning
