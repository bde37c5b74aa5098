"""OpenAI chat-completions bodies -> normalized messages (requests, responses, streamed chunks).

Reasoning is read from ``reasoning_content`` (DeepSeek, older vLLM) and ``reasoning`` (Groq,
OpenRouter, newer vLLM) and written as ``reasoning_content``.
"""

from __future__ import annotations

import json
from typing import Any

from verl_credit.ingest.model_call import FormatError, RecordError, message_text

__all__ = [
    "assemble_openai_stream",
    "is_openai_chunk",
    "normalize_openai_messages",
    "openai_response_message",
    "openai_usage",
]

_ROLE_MAP = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
    "function": "tool",
}
_REASONING_KEYS = ("reasoning_content", "reasoning")
# content blocks only the Anthropic messages API has: an Anthropic request read as OpenAI would
# otherwise lose its tool calls and results without a word
_ANTHROPIC_BLOCKS = ("tool_use", "tool_result", "server_tool_use", "thinking", "redacted_thinking")


def _reasoning(message: dict[str, Any]) -> str:
    for key in _REASONING_KEYS:
        if isinstance(message.get(key), str) and message[key]:
            return message[key]
    return ""


def _tool_calls(raw: Any, where: str) -> list[dict[str, Any]] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise RecordError(where, f"expected a list of tool calls, got {type(raw).__name__}")
    calls = []
    for k, call in enumerate(raw):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise RecordError(f"{where}[{k}].function.name", "missing")
        arguments = function.get("arguments", "")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        calls.append(
            {"id": call.get("id"), "type": "function", "function": {"name": function["name"], "arguments": arguments}}
        )
    return calls or None


def _check_parts(content: list[Any], where: str) -> None:
    for k, part in enumerate(content):
        if isinstance(part, dict) and part.get("type") in _ANTHROPIC_BLOCKS:
            raise FormatError(
                f"{where}[{k}].type",
                f"{part['type']!r} is an Anthropic messages block, not an OpenAI content part "
                "(an Anthropic request read as --format openai?)",
            )


def _normalize_message(message: Any, where: str) -> dict[str, Any]:
    if not isinstance(message, dict):
        raise RecordError(where, f"expected a message object, got {type(message).__name__}")
    role = _ROLE_MAP.get(message.get("role"))
    if role is None:
        raise RecordError(f"{where}.role", f"unknown role {message.get('role')!r}")
    content = message.get("content")
    if content is not None and not isinstance(content, str | list):
        raise RecordError(f"{where}.content", f"expected a string or a list of parts, got {type(content).__name__}")
    if isinstance(content, list):
        _check_parts(content, f"{where}.content")
    normalized: dict[str, Any] = {"role": role, "content": message_text(content)}
    if role == "assistant":
        calls = _tool_calls(message.get("tool_calls"), f"{where}.tool_calls")
        if calls:
            normalized["tool_calls"] = calls
        reasoning = _reasoning(message)
        if reasoning:
            normalized["reasoning_content"] = reasoning
    if role == "tool":
        if message.get("tool_call_id") is not None:
            normalized["tool_call_id"] = str(message["tool_call_id"])
        if message.get("name"):
            normalized["name"] = str(message["name"])
    return normalized


def normalize_openai_messages(request: dict[str, Any]) -> list[dict[str, Any]]:
    """``request["messages"]`` in the section 8 format (``developer`` -> system, parts -> text)."""
    messages = request.get("messages")
    if not isinstance(messages, list):
        raise RecordError("request.messages", "missing or not a list")
    return [_normalize_message(m, f"request.messages[{k}]") for k, m in enumerate(messages)]


def openai_response_message(response: dict[str, Any]) -> dict[str, Any]:
    """The assistant message of the first choice of a chat completion."""
    if "choices" not in response:
        raise FormatError(
            "response.choices",
            "missing: not an OpenAI chat completion"
            + (" (an Anthropic message read as --format openai?)" if "content" in response else ""),
        )
    choices = response["choices"]
    if not isinstance(choices, list) or not choices:
        raise RecordError("response.choices", "missing or empty")
    message = choices[0].get("message") if isinstance(choices[0], dict) else None
    if not isinstance(message, dict):
        raise RecordError("response.choices[0].message", "missing")
    return _normalize_message({**message, "role": message.get("role") or "assistant"}, "response.choices[0].message")


def openai_stop_reason(response: dict[str, Any]) -> str | None:
    choices = response.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        reason = choices[0].get("finish_reason")
        return str(reason) if reason else None
    return None


def openai_usage(usage: Any) -> tuple[int | None, int | None]:
    """``(prompt_tokens, completion_tokens)`` from a usage object (``None`` when absent)."""
    if not isinstance(usage, dict):
        return None, None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return (int(prompt) if isinstance(prompt, int) else None, int(completion) if isinstance(completion, int) else None)


def is_openai_chunk(event: dict[str, Any]) -> bool:
    """Whether a stream event is a ``chat.completion.chunk`` (used to catch a wrong ``--format``)."""
    return isinstance(event.get("choices"), list) or str(event.get("object", "")).startswith("chat.completion")


def assemble_openai_stream(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """Assemble ``chat.completion.chunk`` objects into one chat-completion body.

    Content and reasoning deltas are concatenated; tool calls are merged by their ``index``
    (id and name from the first delta that has them, arguments concatenated); the usage of the
    last chunk that carries one is kept, and the id and model of the first that carries them.
    """
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    usage = None
    finish_reason = None
    body_id, model = None, None
    for k, chunk in enumerate(chunks):
        where = f"stream[{k}]"
        if not isinstance(chunk, dict):
            raise RecordError(where, f"expected a chunk object, got {type(chunk).__name__}")
        if chunk.get("usage"):
            usage = chunk["usage"]
        body_id = body_id or chunk.get("id")
        model = model or chunk.get("model")
        choices = chunk.get("choices")
        if choices is None:
            continue
        if not isinstance(choices, list):
            raise RecordError(f"{where}.choices", "expected a list")
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                raise RecordError(f"{where}.choices[0].delta", "expected an object")
            if isinstance(delta.get("content"), str):
                content.append(delta["content"])
            for key in _REASONING_KEYS:  # a server sends one of the two names
                if isinstance(delta.get(key), str):
                    reasoning.append(delta[key])
            for position, call in enumerate(delta.get("tool_calls") or []):
                if not isinstance(call, dict):
                    raise RecordError(f"{where}.choices[0].delta.tool_calls[{position}]", "expected an object")
                slot = calls.setdefault(int(call.get("index", position)), {"id": None, "name": "", "arguments": []})
                slot["id"] = slot["id"] or call.get("id")
                function = call.get("function") or {}
                slot["name"] = slot["name"] or function.get("name") or ""
                if isinstance(function.get("arguments"), str):
                    slot["arguments"].append(function["arguments"])
            finish_reason = choice.get("finish_reason") or finish_reason
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content)}
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = [
            {
                "id": slot["id"],
                "type": "function",
                "function": {"name": slot["name"], "arguments": "".join(slot["arguments"])},
            }
            for _, slot in sorted(calls.items())
        ]
        for k, call in enumerate(message["tool_calls"]):
            if not call["function"]["name"]:
                raise RecordError(f"stream.tool_calls[{k}].function.name", "never sent")
    return {
        "id": body_id,
        "model": model,
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": usage,
    }
