"""Anthropic messages bodies -> normalized OpenAI-format messages (requests, responses, streams).

``tool_use`` blocks become assistant ``tool_calls`` (``input`` serialized as the arguments JSON);
``tool_result`` blocks become ``tool`` messages (placed before the rest of their user turn, as the
API requires them first); ``thinking`` blocks become ``reasoning_content``; the top-level
``system`` becomes the first message.
"""

from __future__ import annotations

import json
from typing import Any

from verl_credit.ingest.model_call import RecordError

__all__ = ["anthropic_response_message", "anthropic_usage", "assemble_anthropic_stream", "normalize_anthropic_messages"]


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


def _assistant_from_blocks(content: Any, where: str) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    if not isinstance(content, list):
        raise RecordError(where, f"expected a list of content blocks, got {type(content).__name__}")
    texts, thinking, calls = [], [], []
    for k, block in enumerate(content):
        if not isinstance(block, dict):
            raise RecordError(f"{where}[{k}]", "expected a content block object")
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "thinking":
            thinking.append(str(block.get("thinking", "")))
        elif kind in ("tool_use", "server_tool_use"):
            if not isinstance(block.get("name"), str):
                raise RecordError(f"{where}[{k}].name", "missing")
            calls.append(
                {
                    "id": block.get("id"),
                    "type": "function",
                    "function": {
                        "name": block["name"],
                        "arguments": json.dumps(block.get("input") or {}, ensure_ascii=False),
                    },
                }
            )
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        message["tool_calls"] = calls
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
        raise RecordError("response.content", "missing")
    return _assistant_from_blocks(response["content"], "response.content")


def anthropic_usage(usage: Any) -> tuple[int | None, int | None]:
    """``(prompt_tokens, completion_tokens)``: input tokens include cache reads and writes."""
    if not isinstance(usage, dict):
        return None, None
    parts = [usage.get(k) for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")]
    prompt = sum(p for p in parts if isinstance(p, int)) if isinstance(parts[0], int) else None
    completion = usage.get("output_tokens")
    return prompt, int(completion) if isinstance(completion, int) else None


def assemble_anthropic_stream(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Assemble messages-API stream events into one response body (``type: message``)."""
    blocks: dict[int, dict[str, Any]] = {}
    partial_json: dict[int, list[str]] = {}
    usage: dict[str, Any] = {}
    stop_reason = None
    for k, event in enumerate(events):
        where = f"stream[{k}]"
        if not isinstance(event, dict):
            raise RecordError(where, f"expected an event object, got {type(event).__name__}")
        kind = event.get("type")
        if kind == "message_start":
            usage.update((event.get("message") or {}).get("usage") or {})
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
        except json.JSONDecodeError as exc:
            raise RecordError(f"stream.content[{index}].input", f"tool input JSON does not parse: {exc.msg}") from None
    content = [blocks[i] for i in sorted(blocks)]
    return {"type": "message", "role": "assistant", "content": content, "stop_reason": stop_reason, "usage": usage}
