"""One gateway-log line -> a :class:`ModelCall` (or a reward annotation).

Log line (JSONL; every key but ``request`` optional)::

    {"session_id": "s1", "request_id": "r7", "timestamp": 1717000000.5,
     "format": "openai" | "anthropic",
     "request":  {...the API request body...},
     "response": {...the API response body...}      # or
     "stream":   [...SSE events: objects or "data: {...}" strings...],
     "status": 200, "error": null,
     "reward": 1.0, "uid": "task-3"}                  # optional outcome of the session

A line without ``request`` but with ``reward`` (``{"session_id": "s1", "reward": 1.0}``) sets the
outcome of a session. The session id is looked up in ``session_id``, ``metadata.session_id``,
``headers`` (``x-session-id``, ``session-id``, ``x-claude-code-session-id``) and the request's
``metadata.session_id``, in that order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from verl_credit.ingest.anthropic_messages import (
    anthropic_response_message,
    anthropic_usage,
    assemble_anthropic_stream,
    normalize_anthropic_messages,
)
from verl_credit.ingest.model_call import ModelCall, RecordError, render_messages
from verl_credit.ingest.openai_chat import (
    assemble_openai_stream,
    normalize_openai_messages,
    openai_response_message,
    openai_usage,
)
from verl_credit.trajectory import whitespace_token_count

__all__ = ["FORMATS", "RewardRecord", "detect_format", "parse_record"]

FORMATS: tuple[str, ...] = ("auto", "openai", "anthropic")
_SESSION_HEADERS = ("x-session-id", "session-id", "session_id", "x-claude-code-session-id", "x-codex-session-id")


@dataclass(frozen=True)
class RewardRecord:
    session_id: str
    reward: float
    uid: str | None = None


def _session_id(record: dict[str, Any], request: dict[str, Any] | None) -> str | None:
    candidates = [record.get("session_id"), (record.get("metadata") or {}).get("session_id")]
    headers = record.get("headers")
    if isinstance(headers, dict):
        lowered = {str(k).lower(): v for k, v in headers.items()}
        candidates.extend(lowered.get(h) for h in _SESSION_HEADERS)
    if isinstance(request, dict) and isinstance(request.get("metadata"), dict):
        candidates.append(request["metadata"].get("session_id"))
    for value in candidates:
        if isinstance(value, str | int) and str(value):
            return str(value)
    return None


def _stream_events(raw: Any) -> list[dict[str, Any]]:
    """SSE events as objects: accepts objects, ``"data: {...}"`` strings, and ``"[DONE]"``."""
    if not isinstance(raw, list):
        raise RecordError("stream", f"expected a list of events, got {type(raw).__name__}")
    events = []
    for k, item in enumerate(raw):
        if isinstance(item, dict):
            events.append(item)
            continue
        if not isinstance(item, str):
            raise RecordError(f"stream[{k}]", f"expected an object or an SSE line, got {type(item).__name__}")
        for line in item.splitlines():
            line = line.strip()
            if not line.startswith("data:"):
                continue  # "event: ..." lines, comments, blank lines
            payload = line[len("data:") :].strip()
            if payload == "[DONE]":
                continue
            try:
                events.append(json.loads(payload))
            except json.JSONDecodeError as exc:
                raise RecordError(f"stream[{k}]", f"bad JSON in SSE data: {exc.msg}") from None
    return events


def detect_format(record: dict[str, Any]) -> str:
    """``anthropic`` or ``openai`` from the shapes of the request, response or stream."""
    explicit = record.get("format")
    if explicit in ("openai", "anthropic"):
        return explicit
    request = record.get("request") or {}
    response = record.get("response")
    if isinstance(response, dict):
        if response.get("type") == "message" or isinstance(response.get("content"), list):
            return "anthropic"
        if "choices" in response:
            return "openai"
    stream = record.get("stream")
    if isinstance(stream, list) and stream:
        first = stream[0]
        text = first if isinstance(first, str) else json.dumps(first)
        if '"message_start"' in text or '"content_block_' in text:
            return "anthropic"
        if '"choices"' in text:
            return "openai"
    if isinstance(request, dict):
        if "system" in request and "messages" in request:
            return "anthropic"
        for message in request.get("messages") or []:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, list) and any(
                isinstance(b, dict) and b.get("type") in ("tool_use", "tool_result") for b in content
            ):
                return "anthropic"
    return "openai"


def parse_record(record: Any, line: int, api_format: str = "auto") -> ModelCall | RewardRecord:
    """Parse one log object; raises :class:`RecordError` naming the bad field."""
    if not isinstance(record, dict):
        raise RecordError("<record>", f"expected a JSON object, got {type(record).__name__}")
    if api_format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {api_format!r}")
    request = record.get("request")
    if request is None:
        session = _session_id(record, None)
        if "reward" in record and session is not None:
            return RewardRecord(session, _reward(record["reward"]), _optional_str(record.get("uid")))
        raise RecordError("request", "missing (a reward line needs 'session_id' and 'reward')")
    if not isinstance(request, dict):
        raise RecordError("request", f"expected an object, got {type(request).__name__}")
    kind = detect_format(record) if api_format == "auto" else api_format
    messages = normalize_openai_messages(request) if kind == "openai" else normalize_anthropic_messages(request)
    status = record.get("status", 200)
    failed = bool(record.get("error")) or (isinstance(status, int) and not 200 <= status < 300)
    body = record.get("response")
    streamed = False
    if body is None and record.get("stream") is not None:
        events = _stream_events(record["stream"])
        body = assemble_openai_stream(events) if kind == "openai" else assemble_anthropic_stream(events)
        streamed = True
    response = None
    usage: tuple[int | None, int | None] = (None, None)
    if body is not None and not failed:
        if not isinstance(body, dict):
            raise RecordError("response", f"expected an object, got {type(body).__name__}")
        response = openai_response_message(body) if kind == "openai" else anthropic_response_message(body)
        usage = openai_usage(body.get("usage")) if kind == "openai" else anthropic_usage(body.get("usage"))
    timestamp = record.get("timestamp")
    prompt, completion = usage
    token_source = "usage" if completion is not None else "whitespace"
    if prompt is None:
        prompt = whitespace_token_count(render_messages(messages))
    if completion is None:
        completion = whitespace_token_count(render_messages([response])) if response is not None else 0
    tools = request.get("tools")
    return ModelCall(
        line=line,
        order=float(timestamp)
        if isinstance(timestamp, int | float) and not isinstance(timestamp, bool)
        else float(line),
        format=kind,
        request_messages=messages,
        response=response,
        tools=list(tools) if isinstance(tools, list) else [],
        session_id=_session_id(record, request),
        request_id=_optional_str(record.get("request_id") or (body.get("id") if isinstance(body, dict) else None)),
        ok=response is not None,
        streamed=streamed,
        prompt_tokens=int(prompt),
        completion_tokens=int(completion),
        token_source=token_source,
        reward=_reward(record["reward"]) if record.get("reward") is not None else None,
        uid=_optional_str(record.get("uid") or (record.get("metadata") or {}).get("uid")),
    )


def _reward(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RecordError("reward", f"expected a number, got {value!r}")
    return float(value)


def _optional_str(value: Any) -> str | None:
    return None if value is None else str(value)
