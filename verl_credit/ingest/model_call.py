"""One model call as the gateway saw it: request messages, tools, the assistant response, usage.

Messages are normalized to the OpenAI chat format of docs/design.md section 8 (``system``/``user``/
``assistant``/``tool``; tool calls as ``{"id", "type": "function", "function": {"name",
"arguments"}}``), whatever API the call used, so that sessions can be chained by prefix
continuity and written as rollouts.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "FormatError",
    "ModelCall",
    "RecordError",
    "canonical_message",
    "loose_canonical_message",
    "message_text",
    "render_messages",
    "strip_reasoning_text",
]


class RecordError(ValueError):
    """A malformed part of one log record; ``field`` names it (the reader adds file and line)."""

    def __init__(self, field_name: str, message: str):
        super().__init__(f"field '{field_name}': {message}")
        self.field = field_name


class FormatError(RecordError):
    """The record is not in the chosen (or detected) API format, or uses an unsupported API.

    Unlike a broken response (a failed attempt, counted), this is always fatal: it means the
    whole log is being misread, and going on would silently drop replies.
    """


@dataclass(slots=True)  # no per-call __dict__: a log may hold millions of calls
class ModelCall:
    """One API request/response pair (one line of the gateway log).

    ``prompt_tokens`` / ``completion_tokens`` come from the response's usage when present
    (``token_source == "usage"``), otherwise from a whitespace count of the rendered request and
    response (``"whitespace"``). ``ok`` is False for failed attempts (error status, in-stream
    error, no or unparseable response); ``failure`` says why and ``failure_kind`` is one of
    ``http`` / ``api_error`` / ``unparseable``. ``flags`` lists problems of a call that is kept
    (e.g. tool arguments cut off by ``max_tokens``: the raw text is kept as the arguments).
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
    model: str | None = None
    response_id: str | None = None
    timestamp: float | None = None
    failure: str | None = None
    failure_kind: str | None = None
    flags: list[str] = field(default_factory=list)

    def request_key(self) -> str:
        """Hash of the canonical request messages (identical requests = retries or group siblings)."""
        return _digest(canonical_message(m) for m in self.request_messages)

    def response_key(self) -> str:
        return _digest([canonical_message(self.response)] if self.response is not None else [])

    def identity(self) -> tuple[str | None, str | None, float | None]:
        """What tells two calls with the same request and reply apart: the model, the response
        (or request) id and the logged timestamp. Equal identities = the same call logged twice;
        different ones = separate generations (e.g. identical GRPO rollouts), never merged."""
        return self.model, self.response_id or self.request_id, self.timestamp


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


# Clients that drop the structured reasoning field re-send it inline, as <think>...</think>
# (also how chat templates of reasoning models render it); an unclosed <think> at the start is
# reasoning cut off by the client.
_THINK = re.compile(r"<think>.*?(</think>|\Z)", re.DOTALL)


def strip_reasoning_text(text: str) -> str:
    """``text`` without inline ``<think>...</think>`` reasoning, stripped."""
    return _THINK.sub("", text).strip() if "<think>" in text else text.strip()


def _canonical_arguments(arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            return json.dumps(json.loads(arguments), sort_keys=True, ensure_ascii=False)
        except json.JSONDecodeError:
            return arguments.strip()
    return json.dumps(arguments, sort_keys=True, ensure_ascii=False)


def canonical_message(message: dict[str, Any] | None) -> str:
    """A string identifying a message for prefix matching: role, stripped text, tool calls by name
    and parsed arguments. Ids, serialization details (key order, whitespace) and reasoning (the
    ``reasoning_content`` field or inline ``<think>`` text of assistant messages) are ignored, so a
    reply re-sent by the client in another shape still continues the call that generated it."""
    if message is None:
        return "null"
    calls = [
        (str((c.get("function") or {}).get("name")), _canonical_arguments((c.get("function") or {}).get("arguments")))
        for c in message.get("tool_calls") or []
        if isinstance(c, dict)
    ]
    text = message_text(message.get("content"))
    text = strip_reasoning_text(text) if message.get("role") == "assistant" else text.strip()
    return json.dumps([message.get("role"), text, calls], ensure_ascii=False)


def loose_canonical_message(message: dict[str, Any] | None) -> str:
    """Like :func:`canonical_message`, but an assistant message whose tool calls all carry ids is
    identified by those ids and names alone: the second chance to link a call to the reply it
    continues when the client re-sent that reply with other text or re-encoded arguments."""
    if message is not None and message.get("role") == "assistant":
        calls = [c for c in message.get("tool_calls") or [] if isinstance(c, dict)]
        ids = [(c.get("id"), (c.get("function") or {}).get("name")) for c in calls]
        if ids and all(isinstance(i, str) and i for i, _ in ids):
            return json.dumps(["assistant", "tool-call-ids", ids], ensure_ascii=False)
    return canonical_message(message)


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
        for call in message.get("server_tool_calls") or []:  # generated by the model too; results are not
            parts.append(f"{call.get('name')}({call.get('arguments')})")
    return "\n".join(p for p in parts if p)
