"""Run tau2 episodes with a policy served behind an OpenAI-compatible endpoint (evaluation).

The episode loop is the one the ``credit_agent`` loop runs in training (``verl_credit.envs.base``):
system prompt, the agent's greeting (``EpisodeStart.info["greeting"]``: tau2's orchestrator puts it
into the agent's own history) and the simulated user's first message, then per assistant turn either the tool calls
(each executed by the environment, results appended as ``tool`` messages) or, for a text turn, the
simulated user's reply; the episode ends when the user stops, when the environment ends it (tau2's
``max_steps`` / ``max_errors``, checked after every step: :mod:`verl_credit.envs.tau2.termination`)
or after ``max_turns`` assistant turns.

As in verl's ``ToolAgentLoop`` (``multi_turn.max_parallel_calls``), only the first
``max_parallel_calls`` tool calls of an assistant turn are executed and kept in its message; the
others are dropped and counted (``EpisodeResult.dropped_tool_calls``). The calls of one turn are one
tau2 environment step (:func:`~verl_credit.envs.tau2.termination.tool_step`).

The policy is asked with the domain's tools and ``chat_template_kwargs.enable_thinking=false``
(Qwen3 thinking off, as in training); tool-call arguments that are not a JSON object come back
to the policy as an error result without touching the environment, as verl's tool loop does (tau2's
error count still includes them: its environment fails such a call).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from verl_credit.envs.base import Environment
from verl_credit.envs.tau2.termination import episode_over, tool_step
from verl_credit.openai_chat import ChatCompletionError, RetryPolicy, first_message, post_chat_completion

__all__ = ["DEFAULT_MAX_PARALLEL_CALLS", "EpisodeResult", "PolicyClient", "PolicyConfig", "run_episode"]

DEFAULT_MAX_PARALLEL_CALLS = 16
"""verl's ``actor_rollout_ref.rollout.multi_turn.max_parallel_calls`` as the training recipes set it."""


@dataclass(frozen=True)
class PolicyConfig:
    """The evaluated policy's endpoint (e.g. ``vllm serve CKPT --enable-auto-tool-choice``)."""

    base_url: str
    model: str
    temperature: float = 0.0
    max_tokens: int = 4096
    timeout_s: float = 600.0
    max_retries: int = 4
    api_key: str = "EMPTY"
    extra_body: Mapping[str, Any] = field(default_factory=lambda: {"chat_template_kwargs": {"enable_thinking": False}})

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"policy base_url must be an http(s) URL, got {self.base_url!r}")
        if not self.model:
            raise ValueError("policy model must be a non-empty served model name")
        if self.temperature < 0 or self.max_tokens < 1:
            raise ValueError(
                f"policy temperature must be >= 0 and max_tokens >= 1, got {self.temperature}, {self.max_tokens}"
            )


class PolicyClient:
    """Chat completions with tools against the policy endpoint (retries on connection errors, timeouts, 408,
    429, 5xx; :func:`verl_credit.openai_chat.post_chat_completion`); failures raise ``RuntimeError`` naming the URL."""

    def __init__(self, config: PolicyConfig, client: httpx.AsyncClient) -> None:
        self.config = config
        self._client = client
        self._url = config.base_url.rstrip("/") + "/chat/completions"

    async def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], seed: int | None = None
    ) -> dict[str, Any]:
        """The assistant message (``content`` and/or ``tool_calls``) for ``messages``."""
        body: dict[str, Any] = {
            "model": self.config.model,
            "messages": messages,
            "temperature": self.config.temperature,
            "max_tokens": self.config.max_tokens,
            **dict(self.config.extra_body),
        }
        if tools:
            body["tools"] = tools
            body["tool_choice"] = "auto"
        if seed is not None:
            body["seed"] = seed
        try:
            response = await post_chat_completion(
                self._client,
                self._url,
                body,
                retry=RetryPolicy(max_retries=self.config.max_retries),
                timeout_s=self.config.timeout_s,
                headers={"Authorization": f"Bearer {self.config.api_key}"},
            )
        except ChatCompletionError as error:
            raise RuntimeError(f"policy {error}") from error
        try:
            return first_message(response)
        except ChatCompletionError as error:
            raise RuntimeError(f"policy {self._url} {error}") from error


@dataclass
class EpisodeResult:
    """One trial of one task (a line of the results JSONL)."""

    domain: str
    task_id: str
    trial: int
    reward: float
    termination: str | None
    """tau2's termination reason, or ``max_turns`` when the runner's turn cap stopped the episode."""
    assistant_turns: int
    messages: list[dict[str, Any]] = field(default_factory=list)
    reward_info: dict[str, Any] | None = None
    dropped_tool_calls: int = 0
    """Tool calls past ``max_parallel_calls`` in one assistant turn: not executed, not in the transcript."""
    steps: int | None = None
    """tau2 steps of the episode (messages delivered, a tool-call batch counting as one)."""
    num_errors: int | None = None
    """Failed tool calls of the episode (the agent's and the simulated user's)."""
    user_reasoning_fallbacks: int = 0
    """Simulated-user replies taken from ``reasoning_content`` because ``content`` was empty."""

    def to_record(self, with_messages: bool = False) -> dict[str, Any]:
        record = {
            "domain": self.domain,
            "task_id": self.task_id,
            "trial": self.trial,
            "reward": self.reward,
            "termination": self.termination,
            "assistant_turns": self.assistant_turns,
            "reward_info": self.reward_info,
            "dropped_tool_calls": self.dropped_tool_calls,
            "steps": self.steps,
            "num_errors": self.num_errors,
            "user_reasoning_fallbacks": self.user_reasoning_fallbacks,
        }
        if with_messages:
            record["messages"] = self.messages
        return record


def _assistant_message(reply: Mapping[str, Any], max_parallel_calls: int) -> tuple[dict[str, Any], int]:
    """The transcript's assistant message for ``reply`` and how many of its tool calls were dropped.

    verl's ``ToolAgentLoop`` keeps only ``tool_calls[:max_parallel_calls]`` in the message
    (``_build_assistant_message``) and executes only those (``_handle_processing_tools_state``).
    """
    message: dict[str, Any] = {"role": "assistant", "content": reply.get("content") or ""}
    calls = list(reply.get("tool_calls") or [])
    kept = calls[:max_parallel_calls]
    if kept:
        message["tool_calls"] = [
            {
                "id": call.get("id") or f"call_{index}",
                "type": "function",
                "function": {
                    "name": (call.get("function") or {}).get("name", ""),
                    "arguments": (call.get("function") or {}).get("arguments") or "{}",
                },
            }
            for index, call in enumerate(kept)
        ]
    return message, len(calls) - len(kept)


def _parse_arguments(raw: Any) -> dict[str, Any] | None:
    if isinstance(raw, Mapping):
        return dict(raw)
    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        return None
    return value if isinstance(value, dict) else None


async def run_episode(
    env: Environment,
    task: Mapping[str, Any],
    policy: PolicyClient,
    *,
    trial: int = 0,
    max_turns: int = 30,
    seed: int | None = None,
    max_parallel_calls: int = DEFAULT_MAX_PARALLEL_CALLS,
) -> EpisodeResult:
    """Play one episode of ``task`` (``{"domain", "task_id"}``) and return tau2's reward for it."""
    if max_parallel_calls < 1:
        raise ValueError(f"max_parallel_calls must be >= 1, got {max_parallel_calls}")
    start = await env.start(task)
    messages: list[dict[str, Any]] = [{"role": "system", "content": start.system_prompt}]
    if start.info.get("greeting"):  # what the first user message answers, as in tau2's agent history
        messages.append({"role": "assistant", "content": str(start.info["greeting"])})
    messages.append({"role": "user", "content": start.first_user_message})
    turns = dropped = 0
    done = bool(start.info.get("user_done")) or episode_over(env)
    while not done and turns < max_turns:
        reply = await policy.complete(messages, start.tools, seed=seed)
        message, cut = _assistant_message(reply, max_parallel_calls)
        dropped += cut
        messages.append(message)
        turns += 1
        if message.get("tool_calls"):
            messages.extend(await _run_tool_calls(env, message["tool_calls"]))
            done = episode_over(env)  # tau2 checks its limits right after the tool results
            continue
        turn = await env.user_turn(messages)
        if turn.content:
            messages.append({"role": "user", "content": turn.content})
        done = turn.done or not turn.content
    reward = float(await env.reward())
    info = getattr(env, "reward_info", None)
    termination = getattr(env, "termination", None) or ("max_turns" if not done else None)
    limits = getattr(env, "limits", None)
    return EpisodeResult(
        domain=str(task["domain"]),
        task_id=str(task["task_id"]),
        trial=trial,
        reward=reward,
        termination=termination,
        assistant_turns=turns,
        messages=messages,
        reward_info=info.model_dump(mode="json") if hasattr(info, "model_dump") else None,
        dropped_tool_calls=dropped,
        steps=getattr(limits, "step_count", None),
        num_errors=getattr(limits, "num_errors", None),
        user_reasoning_fallbacks=int(getattr(env, "user_reasoning_fallbacks", 0)),
    )


async def _run_tool_calls(env: Environment, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Execute one assistant turn's (kept) calls as one tau2 step; their ``tool`` messages, in order."""
    results: list[dict[str, Any]] = []
    with tool_step(env, len(calls)):
        for call in calls:
            arguments = _parse_arguments(call["function"]["arguments"])
            if arguments is None:
                content = "Error: tool arguments must be a JSON object"
            else:
                content = (await env.call_tool(call["function"]["name"], arguments)).content
            results.append({"role": "tool", "tool_call_id": call["id"], "content": content})
    return results
