"""OpenAI chat-completions bodies -> normalized messages (requests, responses, streamed chunks)."""

from __future__ import annotations

import json
from typing import Any

from verl_credit.ingest.model_call import RecordError, message_text

__all__ = ["assemble_openai_stream", "normalize_openai_messages", "openai_response_message", "openai_usage"]

_ROLE_MAP = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
    "function": "tool",
}


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


def _normalize_message(message: Any, where: str) -> dict[str, Any]:
    if not isinstance(message, dict):
        raise RecordError(where, f"expected a message object, got {type(message).__name__}")
    role = _ROLE_MAP.get(message.get("role"))
    if role is None:
        raise RecordError(f"{where}.role", f"unknown role {message.get('role')!r}")
    content = message.get("content")
    if content is not None and not isinstance(content, str | list):
        raise RecordError(f"{where}.content", f"expected a string or a list of parts, got {type(content).__name__}")
    normalized: dict[str, Any] = {"role": role, "content": message_text(content)}
    if role == "assistant":
        calls = _tool_calls(message.get("tool_calls"), f"{where}.tool_calls")
        if calls:
            normalized["tool_calls"] = calls
        if isinstance(message.get("reasoning_content"), str) and message["reasoning_content"]:
            normalized["reasoning_content"] = message["reasoning_content"]
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
        if "input" in request:
            raise RecordError(
                "request.messages",
                "missing (an OpenAI Responses API body? only chat completions and Anthropic messages are supported)",
            )
        raise RecordError("request.messages", "missing or not a list")
    return [_normalize_message(m, f"request.messages[{k}]") for k, m in enumerate(messages)]


def openai_response_message(response: dict[str, Any]) -> dict[str, Any]:
    """The assistant message of the first choice of a chat completion."""
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices:
        raise RecordError("response.choices", "missing or empty")
    message = choices[0].get("message") if isinstance(choices[0], dict) else None
    if not isinstance(message, dict):
        raise RecordError("response.choices[0].message", "missing")
    return _normalize_message({**message, "role": message.get("role") or "assistant"}, "response.choices[0].message")


def openai_usage(usage: Any) -> tuple[int | None, int | None]:
    """``(prompt_tokens, completion_tokens)`` from a usage object (``None`` when absent)."""
    if not isinstance(usage, dict):
        return None, None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return (int(prompt) if isinstance(prompt, int) else None, int(completion) if isinstance(completion, int) else None)


def assemble_openai_stream(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """Assemble ``chat.completion.chunk`` objects into one chat-completion body.

    Content and reasoning deltas are concatenated; tool calls are merged by their ``index``
    (id and name from the first delta that has them, arguments concatenated); the usage of the
    last chunk that carries one is kept.
    """
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    usage = None
    finish_reason = None
    for k, chunk in enumerate(chunks):
        where = f"stream[{k}]"
        if not isinstance(chunk, dict):
            raise RecordError(where, f"expected a chunk object, got {type(chunk).__name__}")
        if chunk.get("usage"):
            usage = chunk["usage"]
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
            if isinstance(delta.get("reasoning_content"), str):
                reasoning.append(delta["reasoning_content"])
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
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": usage,
    }
