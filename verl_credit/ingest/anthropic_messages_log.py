"""Anthropic messages bodies -> normalized OpenAI-format messages (requests, responses, streams).

``tool_use`` blocks become assistant ``tool_calls`` (``input`` serialized as the arguments JSON);
``tool_result`` blocks become ``tool`` messages (placed before the rest of their user turn, as the
API requires them first); ``thinking`` blocks become ``reasoning_content``; server-side tools
(``server_tool_use`` + ``*_tool_result``, e.g. web search) become ``server_tool_calls`` of the
assistant message that ran them; the top-level ``system`` becomes the first message.
"""

from __future__ import annotations

import json
from typing import Any

from verl_credit.ingest.model_call import FormatError, RecordError

__all__ = [
    "RAW_INPUT",
    "anthropic_response_message",
    "anthropic_usage",
    "assemble_anthropic_stream",
    "is_anthropic_event",
    "normalize_anthropic_messages",
]

SERVER_TOOL_USE = ("server_tool_use", "mcp_tool_use")
# key under which the assembler keeps a streamed tool input whose JSON does not parse
RAW_INPUT = "_raw_input"
_EVENT_TYPES = frozenset(
    (
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
        "ping",
        "error",
    )
)


def _block_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RecordError(where, f"expected a string or a list of blocks, got {type(content).__name__}")
    texts = []
    for k, block in enumerate(content):
        if not isinstance(block, dict):
            raise RecordError(f"{where}[{k}]", "expected a content block object")
        if block.get("type") == "text":
            texts.append(str(block.get("text", "")))
        elif block.get("type") in ("image", "document"):
            texts.append(f"[{block['type']}]")
    return "\n".join(texts)


def _tool_call(block: dict[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(block.get("name"), str):
        raise RecordError(f"{where}.name", "missing")
    raw = block.get(RAW_INPUT)  # a streamed input that did not parse: kept as it came
    arguments = raw if isinstance(raw, str) else json.dumps(block.get("input") or {}, ensure_ascii=False)
    return {"id": block.get("id"), "type": "function", "function": {"name": block["name"], "arguments": arguments}}


def _result_text(content: Any) -> str:
    """Readable text of a server tool result (search hits, fetched text, code output, an error)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(t for t in (_result_text(item) for item in content) if t)
    if isinstance(content, dict):
        if content.get("error_code") is not None:
            return f"error: {content['error_code']}"
        found = " ".join(str(content[k]) for k in ("title", "url", "text") if isinstance(content.get(k), str))
        ran = [f"{k}: {content[k]}" for k in ("stdout", "stderr", "return_code") if content.get(k) not in (None, "")]
        nested = _result_text(content["content"]) if "content" in content else ""
        return "\n".join(p for p in [found, *ran, nested] if p)
    return str(content)


def _assistant_from_blocks(content: Any, where: str) -> dict[str, Any]:
    """An assistant turn of blocks -> one message.

    Client ``tool_use`` blocks become ``tool_calls``. Server-side tools (``server_tool_use`` /
    ``mcp_tool_use`` and their ``*_tool_result`` blocks, e.g. web search) ran inside this one
    model call, so they are no client tool calls (no tool message will answer them): they go to
    ``server_tool_calls`` as ``{"id", "name", "arguments", "result_type", "result"}``. Adjacent text
    blocks (a reply split by citations) are joined as they are; text on either side of another
    block is separated by a blank line, not glued together.
    """
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    if not isinstance(content, list):
        raise RecordError(where, f"expected a list of content blocks, got {type(content).__name__}")
    runs: list[list[str]] = [[]]
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    server: dict[str, dict[str, Any]] = {}
    for k, block in enumerate(content):
        if not isinstance(block, dict):
            raise RecordError(f"{where}[{k}]", "expected a content block object")
        kind = str(block.get("type"))
        if kind == "text":
            runs[-1].append(str(block.get("text", "")))
            continue
        if runs[-1]:
            runs.append([])
        if kind == "thinking":
            thinking.append(str(block.get("thinking", "")))
        elif kind == "tool_use":
            calls.append(_tool_call(block, f"{where}[{k}]"))
        elif kind in SERVER_TOOL_USE:
            call = _tool_call(block, f"{where}[{k}]")
            key = str(block.get("id") or f"#{k}")
            entry = server.setdefault(key, {"id": block.get("id"), "result_type": None, "result": None})
            entry.update(name=call["function"]["name"], arguments=call["function"]["arguments"])
        elif kind.endswith("_tool_result"):
            key = str(block.get("tool_use_id") or f"#{k}")
            entry = server.setdefault(key, {"id": block.get("tool_use_id"), "name": None, "arguments": None})
            entry.update(result_type=kind, result=_result_text(block.get("content")))
    text = "\n\n".join(joined for joined in ("".join(run) for run in runs) if joined)
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = calls
    if server:
        message["server_tool_calls"] = [
            {k: entry.get(k) for k in ("id", "name", "arguments", "result_type", "result")} for entry in server.values()
        ]
    if thinking:
        message["reasoning_content"] = "".join(thinking)
    return message


def normalize_anthropic_messages(request: dict[str, Any]) -> list[dict[str, Any]]:
    """``system`` + ``messages`` of a messages-API request in the section 8 format."""
    out: list[dict[str, Any]] = []
    system = request.get("system")
    if system:
        out.append({"role": "system", "content": _block_text(system, "request.system")})
    messages = request.get("messages")
    if not isinstance(messages, list):
        raise RecordError("request.messages", "missing or not a list")
    for k, message in enumerate(messages):
        where = f"request.messages[{k}]"
        if not isinstance(message, dict):
            raise RecordError(where, "expected a message object")
        role, content = message.get("role"), message.get("content")
        if role == "assistant":
            out.append(_assistant_from_blocks(content, f"{where}.content"))
        elif role == "user":
            if isinstance(content, list):
                rest = []
                for j, block in enumerate(content):
                    if isinstance(block, dict) and block.get("type") == "tool_result":
                        text = _block_text(block.get("content"), f"{where}.content[{j}].content")
                        if block.get("is_error"):
                            text = f"Error: {text}" if not text.startswith("Error") else text
                        out.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id")), "content": text})
                    else:
                        rest.append(block)
                text = _block_text(rest, f"{where}.content")
                if text or not any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content):
                    out.append({"role": "user", "content": text})
            else:
                out.append({"role": "user", "content": _block_text(content, f"{where}.content")})
        else:
            raise RecordError(f"{where}.role", f"expected 'user' or 'assistant', got {role!r}")
    return out


def anthropic_response_message(response: dict[str, Any]) -> dict[str, Any]:
    if response.get("type") == "error":
        raise RecordError("response", f"is an error: {response.get('error')}")
    if "content" not in response:
        raise FormatError(
            "response.content",
            "missing: not an Anthropic message"
            + (" (an OpenAI chat completion read as --format anthropic?)" if "choices" in response else ""),
        )
    return _assistant_from_blocks(response["content"], "response.content")


def anthropic_stop_reason(response: dict[str, Any]) -> str | None:
    reason = response.get("stop_reason")
    return str(reason) if reason else None


def anthropic_usage(usage: Any) -> tuple[int | None, int | None]:
    """``(prompt_tokens, completion_tokens)``: input tokens include cache reads and writes."""
    if not isinstance(usage, dict):
        return None, None
    parts = [usage.get(k) for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")]
    prompt = sum(p for p in parts if isinstance(p, int)) if isinstance(parts[0], int) else None
    completion = usage.get("output_tokens")
    return prompt, int(completion) if isinstance(completion, int) else None


def is_anthropic_event(event: dict[str, Any]) -> bool:
    """Whether a stream event is a messages-API event (used to catch a wrong ``--format``)."""
    return event.get("type") in _EVENT_TYPES


def assemble_anthropic_stream(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Assemble messages-API stream events into one response body (``type: message``).

    A tool input whose ``input_json_delta`` pieces do not parse (a reply cut off by
    ``max_tokens``) is kept as its raw text under :data:`RAW_INPUT`; the caller flags the call.
    Error events are the caller's business (a failed attempt); here they are an error.
    """
    blocks: dict[int, dict[str, Any]] = {}
    partial_json: dict[int, list[str]] = {}
    usage: dict[str, Any] = {}
    stop_reason = None
    body_id, model = None, None
    for k, event in enumerate(events):
        where = f"stream[{k}]"
        if not isinstance(event, dict):
            raise RecordError(where, f"expected an event object, got {type(event).__name__}")
        kind = event.get("type")
        if kind == "message_start":
            start = event.get("message") or {}
            usage.update(start.get("usage") or {})
            body_id, model = start.get("id"), start.get("model")
        elif kind == "content_block_start":
            block = event.get("content_block")
            if not isinstance(block, dict):
                raise RecordError(f"{where}.content_block", "missing")
            blocks[int(event.get("index", len(blocks)))] = dict(block)
        elif kind == "content_block_delta":
            index = int(event.get("index", 0))
            if index not in blocks:
                raise RecordError(f"{where}.index", f"delta for block {index} before its content_block_start")
            delta = event.get("delta") or {}
            dtype = delta.get("type")
            if dtype == "text_delta":
                blocks[index]["text"] = blocks[index].get("text", "") + str(delta.get("text", ""))
            elif dtype == "thinking_delta":
                blocks[index]["thinking"] = blocks[index].get("thinking", "") + str(delta.get("thinking", ""))
            elif dtype == "input_json_delta":
                partial_json.setdefault(index, []).append(str(delta.get("partial_json", "")))
        elif kind == "message_delta":
            usage.update(event.get("usage") or {})
            stop_reason = (event.get("delta") or {}).get("stop_reason") or stop_reason
        elif kind == "error":
            raise RecordError(where, f"stream error: {event.get('error')}")
    for index, pieces in partial_json.items():
        text = "".join(pieces)
        try:
            blocks[index]["input"] = json.loads(text) if text.strip() else {}
        except json.JSONDecodeError:
            blocks[index][RAW_INPUT] = text
    content = [blocks[i] for i in sorted(blocks)]
    return {
        "id": body_id,
        "model": model,
        "type": "message",
        "role": "assistant",
        "content": content,
        "stop_reason": stop_reason,
        "usage": usage,
    }
