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

Failure handling. Fatal (:class:`RecordError`, the reader adds file and line): a line that is not
an object, a malformed request, a request of an unsupported API (Gemini ``contents``, Responses
``input``, completions ``prompt``), a record in the wrong format (a stream in which the format
recognizes no event, a body without ``choices`` / ``content``). Counted, the run goes on: a
*failed attempt* for an error status or ``error`` field, an error body or in-stream error
(``event: error``, ``{"error": ...}``, ``type: error``, ``object: error``), or a response that
cannot be parsed; a *flagged call* (kept) for tool arguments that are not JSON (raw text kept,
e.g. cut off at ``max_tokens``) or a stream that ended without a stop reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from verl_credit.ingest.anthropic_messages_log import (
    anthropic_response_message,
    anthropic_stop_reason,
    anthropic_usage,
    assemble_anthropic_stream,
    is_anthropic_event,
    normalize_anthropic_messages,
)
from verl_credit.ingest.model_call import FormatError, ModelCall, RecordError, render_messages
from verl_credit.ingest.openai_chat_log import (
    assemble_openai_stream,
    is_openai_chunk,
    normalize_openai_messages,
    openai_response_message,
    openai_stop_reason,
    openai_usage,
)
from verl_credit.trajectory import whitespace_token_count

__all__ = [
    "FORMATS",
    "ApiError",
    "RewardRecord",
    "StreamEvent",
    "detect_format",
    "in_stream_error",
    "parse_record",
    "stream_events",
]

FORMATS: tuple[str, ...] = ("auto", "openai", "anthropic")
_SESSION_HEADERS = ("x-session-id", "session-id", "session_id", "x-claude-code-session-id", "x-codex-session-id")
_WHAT = {"openai": "an OpenAI chat.completion.chunk", "anthropic": "an Anthropic messages event"}
_CUT_OFF = ("max_tokens", "length", "model_context_window_exceeded")
_ERROR_TEXT_LIMIT = 300


class ApiError(RecordError):
    """The API answered with an error (an error body, or an error inside an HTTP-200 stream)."""


@dataclass(frozen=True)
class RewardRecord:
    session_id: str
    reward: float
    uid: str | None = None


@dataclass(frozen=True)
class StreamEvent:
    """One SSE event: where it was logged (``stream[k]``), its ``event:`` name, its JSON data."""

    where: str
    name: str | None
    data: Any


@dataclass
class _Reply:
    """What the response side of a log line gave (a message, or why there is none)."""

    streamed: bool = False
    message: dict[str, Any] | None = None
    usage: tuple[int | None, int | None] = (None, None)
    response_id: str | None = None
    model: str | None = None
    failure: str | None = None
    failure_kind: str | None = None
    flags: list[str] = field(default_factory=list)


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


def stream_events(raw: Any) -> list[StreamEvent]:
    """SSE events: accepts objects, ``"data: {...}"`` strings (with or without their ``event:``
    line, in one string or split over several), and ``"[DONE]"``. The ``event:`` name is kept
    because some servers mark an error only there (``event: error``)."""
    if not isinstance(raw, list):
        raise RecordError("stream", f"expected a list of events, got {type(raw).__name__}")
    events: list[StreamEvent] = []
    name: str | None = None  # the pending "event:" name, for the next data line
    for k, item in enumerate(raw):
        where = f"stream[{k}]"
        if isinstance(item, dict):
            events.append(StreamEvent(where, None, item))
            continue
        if not isinstance(item, str):
            raise RecordError(where, f"expected an object or an SSE line, got {type(item).__name__}")
        for line in item.splitlines():
            line = line.strip()
            if not line:
                name = None  # a blank line ends an SSE event
            elif line.startswith("event:"):
                name = line[len("event:") :].strip() or None
            elif line.startswith("data:"):
                payload = line[len("data:") :].strip()
                if payload != "[DONE]":
                    try:
                        events.append(StreamEvent(where, name, json.loads(payload)))
                    except json.JSONDecodeError as exc:
                        raise RecordError(where, f"bad JSON in SSE data: {exc}") from None
                name = None
    return events


def _error_text(error: Any) -> str:
    """``code: message`` of an API error object (OpenAI, Anthropic, Groq and OpenRouter shapes)."""
    if isinstance(error, dict):
        inner = error.get("error")
        if isinstance(inner, dict | str) and inner and "message" not in error:
            return _error_text(inner)
        code = error.get("code") or error.get("type")
        message = error.get("message")
        text = f"{code}: {message}" if code and message else str(message or code or json.dumps(error))
    else:
        text = str(error)
    return text if len(text) <= _ERROR_TEXT_LIMIT else text[: _ERROR_TEXT_LIMIT - 3] + "..."


def in_stream_error(event: StreamEvent) -> str | None:
    """The error an HTTP-200 stream event carries, if any: an ``error`` object in the data
    (Groq ``tool_use_failed``, OpenRouter mid-stream errors, Anthropic ``type: error``), vLLM's
    ``object: "error"``, an ``event: error`` line, or an OpenRouter ``finish_reason: "error"``."""
    data = event.data
    if not isinstance(data, dict):
        return None
    if data.get("error"):
        return _error_text(data["error"])
    if event.name == "error" or data.get("type") == "error" or data.get("object") == "error":  # vLLM: object
        return _error_text(data)
    for choice in data.get("choices") or []:
        if isinstance(choice, dict) and choice.get("finish_reason") == "error":
            return "finish_reason 'error' (no error object sent)"
    return None


def _check_stream_format(events: list[StreamEvent], kind: str) -> None:
    """A stream in which ``kind`` recognizes no event is read in the wrong format: fatal."""
    objects = [e.data for e in events if isinstance(e.data, dict)]
    recognize = is_openai_chunk if kind == "openai" else is_anthropic_event
    if not objects or any(recognize(o) for o in objects):
        return
    other = "anthropic" if kind == "openai" else "openai"
    other_recognizes = is_anthropic_event if other == "anthropic" else is_openai_chunk
    if any(other_recognizes(o) for o in objects):
        hint = f"they are {other} events: wrong --format?"
    else:
        hint = f"first event: {json.dumps(objects[0], ensure_ascii=False)[:120]}"
    raise FormatError("stream", f"none of its {len(events)} events is {_WHAT[kind]} ({hint})")


def _supported_api(request: dict[str, Any]) -> None:
    """Name the API of a request body that is neither chat completions nor Anthropic messages."""
    if isinstance(request.get("messages"), list):
        return
    for key, what in (
        ("contents", "a Gemini generateContent request (contents/parts)"),
        ("input", "an OpenAI Responses API request (input)"),
        ("prompt", "a legacy completions request (prompt)"),
    ):
        if key in request:
            raise FormatError(
                f"request.{key}",
                f"unsupported API: {what}; only OpenAI chat completions and Anthropic messages are supported",
            )


def _http_failure(record: dict[str, Any]) -> str | None:
    status = record.get("status", 200)
    if isinstance(status, str) and status.strip().isdigit():
        status = int(status)
    error = record.get("error")
    if error:
        return f"error: {_error_text(error)}" + (f" (status {status})" if status != 200 else "")
    if isinstance(status, int) and not isinstance(status, bool) and not 200 <= status < 300:
        return f"status {status}"
    return None


def _json_error(arguments: Any) -> str | None:
    """Why tool-call arguments are not JSON (message with the position), ``None`` when they are."""
    if not isinstance(arguments, str) or not arguments.strip():
        return None
    try:
        json.loads(arguments)
    except json.JSONDecodeError as exc:
        return str(exc)
    return None


def _argument_flags(message: dict[str, Any], stop_reason: str | None) -> list[str]:
    """A flag per tool call (client or server side) whose arguments do not parse; the raw text
    stays in the message, so nothing is lost and the trainer sees what the model produced."""
    why = ""
    if stop_reason in _CUT_OFF:
        why = f"; stop_reason {stop_reason!r}: the reply was cut off"
    elif stop_reason:
        why = f"; stop_reason {stop_reason!r}"
    flags = []
    for key, suffix in (("tool_calls", ".function.arguments"), ("server_tool_calls", ".arguments")):
        for k, call in enumerate(message.get(key) or []):
            function = call.get("function") or call
            error = _json_error(function.get("arguments"))
            if error:
                flags.append(
                    f"field 'response.{key}[{k}]{suffix}': tool call {function.get('name')!r} has arguments "
                    f"that are not valid JSON ({error}){why}; raw arguments kept"
                )
    return flags


def _reply_body(record: dict[str, Any], kind: str, streamed: bool) -> dict[str, Any] | None:
    """The response body (streams assembled); errors raise :class:`ApiError`/:class:`RecordError`."""
    if streamed:
        events = stream_events(record["stream"])
        if not events:
            raise RecordError("stream", "no events (nothing was received)")
        for event in events:
            error = in_stream_error(event)
            if error:
                raise ApiError(event.where, f"in-stream error: {error}")
        _check_stream_format(events, kind)
        data = [e.data for e in events]
        return assemble_openai_stream(data) if kind == "openai" else assemble_anthropic_stream(data)
    body = record.get("response")
    if body is None:
        return None
    if not isinstance(body, dict):
        raise RecordError("response", f"expected an object, got {type(body).__name__}")
    if body.get("error") or body.get("type") == "error" or body.get("object") == "error":
        raise ApiError("response.error", f"error response: {_error_text(body.get('error') or body)}")
    return body


def _read_reply(record: dict[str, Any], kind: str) -> _Reply:
    """The response side of a line. A reply that cannot be read is a failed attempt (with the
    reason, file position added by the reader); only a wrong format is fatal."""
    streamed = record.get("response") is None and record.get("stream") is not None
    failure = _http_failure(record)
    if failure is not None:
        return _Reply(streamed, failure=failure, failure_kind="http")
    try:
        body = _reply_body(record, kind, streamed)
        if body is None:
            return _Reply(streamed, failure="field 'response': not logged", failure_kind="http")
        message = openai_response_message(body) if kind == "openai" else anthropic_response_message(body)
    except FormatError:
        raise
    except ApiError as exc:
        return _Reply(streamed, failure=str(exc), failure_kind="api_error")
    except RecordError as exc:
        return _Reply(streamed, failure=str(exc), failure_kind="unparseable")
    stop_reason = openai_stop_reason(body) if kind == "openai" else anthropic_stop_reason(body)
    flags = _argument_flags(message, stop_reason)
    if streamed and stop_reason is None:
        flags.append("field 'stream': ended without a finish/stop reason (the stream was cut off?)")
    usage = openai_usage(body.get("usage")) if kind == "openai" else anthropic_usage(body.get("usage"))
    model = body.get("model")
    return _Reply(
        streamed,
        message=message,
        usage=usage,
        response_id=_optional_str(body.get("id")),
        model=str(model) if model else None,
        flags=flags,
    )


def _stream_format(stream: Any) -> str | None:
    """The format of the first stream event that shows one (a stream may open with pings)."""
    for item in stream if isinstance(stream, list) else []:
        text = item if isinstance(item, str) else json.dumps(item)
        if '"message_start"' in text or '"content_block_' in text:
            return "anthropic"
        if '"choices"' in text:
            return "openai"
    return None


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
    streamed = _stream_format(record.get("stream"))
    if streamed is not None:
        return streamed
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
    """Parse one log object.

    A malformed request, a wrong format or an unsupported API raises :class:`RecordError`
    (:class:`FormatError`) naming the field: the log cannot be read as asked. A response that
    cannot be used gives a failed :class:`ModelCall` (``ok=False``, ``failure`` says why); one
    with unparseable tool arguments gives a flagged call (``flags``), kept with the raw text.
    """
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
    _supported_api(request)
    kind = detect_format(record) if api_format == "auto" else api_format
    messages = normalize_openai_messages(request) if kind == "openai" else normalize_anthropic_messages(request)
    reply = _read_reply(record, kind)
    timestamp = record.get("timestamp")
    logged_time = float(timestamp) if isinstance(timestamp, int | float) and not isinstance(timestamp, bool) else None
    prompt, completion = reply.usage
    token_source = "usage" if completion is not None else "whitespace"
    if prompt is None:
        prompt = whitespace_token_count(render_messages(messages))
    if completion is None:
        completion = whitespace_token_count(render_messages([reply.message])) if reply.message is not None else 0
    tools = request.get("tools")
    model = reply.model or (str(request["model"]) if request.get("model") else None)
    return ModelCall(
        line=line,
        order=logged_time if logged_time is not None else float(line),
        format=kind,
        request_messages=messages,
        response=reply.message,
        tools=list(tools) if isinstance(tools, list) else [],
        session_id=_session_id(record, request),
        request_id=_optional_str(record.get("request_id") or reply.response_id),
        ok=reply.message is not None,
        streamed=reply.streamed,
        prompt_tokens=int(prompt),
        completion_tokens=int(completion),
        token_source=token_source,
        reward=_reward(record["reward"]) if record.get("reward") is not None else None,
        uid=_optional_str(record.get("uid") or (record.get("metadata") or {}).get("uid")),
        model=model,
        response_id=reply.response_id,
        timestamp=logged_time,
        failure=reply.failure,
        failure_kind=reply.failure_kind,
        flags=reply.flags,
    )


def _reward(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RecordError("reward", f"expected a number, got {value!r}")
    return float(value)


def _optional_str(value: Any) -> str | None:
    return None if value is None else str(value)
