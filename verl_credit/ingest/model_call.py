"""One model call as the gateway saw it: request messages, tools, the assistant response, usage.

Messages are normalized to the OpenAI chat format of DESIGN.md section 8 (``system``/``user``/
``assistant``/``tool``; tool calls as ``{"id", "type": "function", "function": {"name",
"arguments"}}``), whatever API the call used, so that sessions can be chained by prefix
continuity and written as rollouts.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ModelCall", "RecordError", "canonical_message", "message_text", "render_messages"]


class RecordError(ValueError):
    """A malformed part of one log record; ``field`` names it (the reader adds file and line)."""

    def __init__(self, field_name: str, message: str):
        super().__init__(f"field '{field_name}': {message}")
        self.field = field_name


@dataclass
class ModelCall:
    """One API request/response pair (one line of the gateway log).

    ``prompt_tokens`` / ``completion_tokens`` come from the response's usage when present
    (``token_source == "usage"``), otherwise from a whitespace count of the rendered request and
    response (``"whitespace"``). ``ok`` is False for failed attempts (error status, no response).
    """

    line: int
    order: float  # timestamp when logged, else the line number
    format: str  # "openai" | "anthropic"
    request_messages: list[dict[str, Any]]
    response: dict[str, Any] | None
    tools: list[Any] = field(default_factory=list)
    session_id: str | None = None
    request_id: str | None = None
    ok: bool = True
    streamed: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0
    token_source: str = "whitespace"
    reward: float | None = None
    uid: str | None = None

    def request_key(self) -> str:
        """Hash of the canonical request messages (identical requests = retries or group siblings)."""
        return _digest(canonical_message(m) for m in self.request_messages)

    def response_key(self) -> str:
        return _digest([canonical_message(self.response)] if self.response is not None else [])


def message_text(content: Any) -> str:
    """Plain text of OpenAI content (a string or a list of ``{"type": "text", "text"}`` parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            part["text"] if isinstance(part, dict) and isinstance(part.get("text"), str) else str(part)
            for part in content
            if not (isinstance(part, dict) and part.get("type") not in (None, "text", "input_text", "output_text"))
        )
    return str(content)


def _canonical_arguments(arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            return json.dumps(json.loads(arguments), sort_keys=True, ensure_ascii=False)
        except json.JSONDecodeError:
            return arguments.strip()
    return json.dumps(arguments, sort_keys=True, ensure_ascii=False)


def canonical_message(message: dict[str, Any] | None) -> str:
    """A string identifying a message for prefix matching: role, stripped text, tool calls by name
    and parsed arguments. Ids and serialization details (key order, whitespace) are ignored."""
    if message is None:
        return "null"
    calls = [
        (str((c.get("function") or {}).get("name")), _canonical_arguments((c.get("function") or {}).get("arguments")))
        for c in message.get("tool_calls") or []
        if isinstance(c, dict)
    ]
    return json.dumps([message.get("role"), message_text(message.get("content")).strip(), calls], ensure_ascii=False)


def _digest(parts: Any) -> str:
    hasher = hashlib.sha256()
    for part in parts:
        hasher.update(part.encode("utf-8"))
        hasher.update(b"\x00")
    return hasher.hexdigest()


def render_messages(messages: list[dict[str, Any]]) -> str:
    """Text of messages (content plus tool calls) for the whitespace token count."""
    parts = []
    for message in messages:
        parts.append(message_text(message.get("content")))
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            parts.append(f"{function.get('name')}({function.get('arguments')})")
    return "\n".join(p for p in parts if p)
