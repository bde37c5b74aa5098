"""Every HTTP body the clients read is size-capped: a gzip bomb or an oversized answer from the
server stops at ``MAX_BODY_BYTES`` (a failed attempt), never grows memory past it.

Over a real loopback socket (``tests/openai_stub_server.py``): the shared chat-completions POST
(async and blocking) and the LLM annotator's ``GET /v1/models`` context-length probe. Memory is
the traced peak (``tracemalloc``) while the request runs.
"""

from __future__ import annotations

import asyncio
import tracemalloc
import zlib
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from openai_stub_server import OpenAIStubServer, Reply

from verl_credit.annotate.llm import FALLBACK_MAX_MODEL_LEN, LLMAnnotator
from verl_credit.openai_chat import (
    MAX_BODY_BYTES,
    ChatCompletionError,
    RetryPolicy,
    decode_body,
    post_chat_completion,
    post_chat_completion_sync,
)

pytestmark = pytest.mark.timeout(60)

BODY = {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}]}
NO_RETRY = RetryPolicy(max_retries=0)
BOMB_MIB = 256  # decoded size: 8x the cap
#: what a capped read may hold at once: the cap itself plus slack for the client's own objects
PEAK_LIMIT = MAX_BODY_BYTES + 16 * 2**20


def _gzip_bomb(decoded_mib: int) -> bytes:
    """``decoded_mib`` MiB of zeros, gzip-compressed (about 1/1000 of that on the wire)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = b"\0" * 2**20
    return b"".join([compressor.compress(block) for _ in range(decoded_mib)] + [compressor.flush()])


BOMB = _gzip_bomb(BOMB_MIB)


def _traced_peak(run: Callable[[], Any]) -> tuple[Any, int]:
    """``(run()'s result or the exception it raised, the traced peak in bytes)``."""
    tracemalloc.start()
    try:
        try:
            result: Any = run()
        except Exception as exc:  # the outcome is checked by the caller
            result = exc
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _post_async(url: str) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=20.0) as client:
            return await post_chat_completion(client, url, BODY, retry=NO_RETRY)

    return asyncio.run(go())


def _post_sync(url: str) -> dict[str, Any]:
    with httpx.Client(timeout=20.0) as client:
        return post_chat_completion_sync(client, url, BODY, retry=NO_RETRY)


@pytest.mark.parametrize("post", [_post_async, _post_sync], ids=["async", "sync"])
def test_a_gzip_bomb_answer_stops_at_the_cap(stub_server: OpenAIStubServer, post) -> None:
    stub_server.script(Reply.raw(BOMB, headers={"Content-Encoding": "gzip"}))
    outcome, peak = _traced_peak(lambda: post(stub_server.base_url + "/chat/completions"))
    assert isinstance(outcome, ChatCompletionError), outcome
    assert outcome.kind == "transport" and "over" in str(outcome)  # a failed attempt, retried per the table
    assert peak < PEAK_LIMIT, f"traced peak {peak / 2**20:.0f} MiB for a {BOMB_MIB} MiB bomb"


@pytest.mark.parametrize("post", [_post_async, _post_sync], ids=["async", "sync"])
def test_an_oversized_plain_answer_is_a_failed_attempt(stub_server: OpenAIStubServer, post) -> None:
    stub_server.script(Reply.raw(b" " * (MAX_BODY_BYTES + 2**20)))
    with pytest.raises(ChatCompletionError, match="over") as caught:
        post(stub_server.base_url + "/chat/completions")
    assert caught.value.kind == "transport"


def test_a_compressed_answer_within_the_cap_still_works(stub_server: OpenAIStubServer) -> None:
    answer = b'{"choices": [{"message": {"role": "assistant", "content": "ok"}}]}'
    stub_server.script(Reply.raw(zlib.compress(answer), headers={"Content-Encoding": "deflate"}))
    assert _post_async(stub_server.base_url + "/chat/completions")["choices"][0]["message"]["content"] == "ok"
    # and the client asks only for encodings whose decoded size it can bound
    assert stub_server.chat_requests[0].headers["accept-encoding"] == "gzip, deflate"


def test_decode_body_refuses_unknown_encodings_and_bombs() -> None:
    with pytest.raises(httpx.DecodingError, match="unsupported Content-Encoding 'br'"):
        decode_body(b"x", "br")
    with pytest.raises(httpx.DecodingError, match="over 1024 bytes"):
        decode_body(_gzip_bomb(1), "gzip", limit=1024)
    assert decode_body(zlib.compress(b"abc"), "deflate") == b"abc"


def _probe(base_url: str) -> int | None:
    annotator = LLMAnnotator(base_urls=base_url, model="stub-model", fallback="uniform", timeout=20.0)

    async def go() -> int | None:
        try:
            return await annotator.context_length()
        finally:
            await annotator.aclose()

    return asyncio.run(go())


def test_the_models_probe_reads_a_gzip_bomb_no_further_than_the_cap(stub_server: OpenAIStubServer) -> None:
    stub_server.models_reply = Reply.raw(BOMB, headers={"Content-Encoding": "gzip"})
    length, peak = _traced_peak(lambda: _probe(stub_server.base_url))
    assert length == FALLBACK_MAX_MODEL_LEN  # no usable answer: the documented fallback
    assert peak < PEAK_LIMIT, f"traced peak {peak / 2**20:.0f} MiB for a {BOMB_MIB} MiB bomb"
    assert any(r.path == "/v1/models" for r in stub_server.requests)


def test_the_models_probe_still_reads_a_normal_answer(stub_server: OpenAIStubServer) -> None:
    body = b'{"data": [{"id": "stub-model", "max_model_len": 8192}]}'
    stub_server.models_reply = Reply.raw(zlib.compress(body), headers={"Content-Encoding": "deflate"})
    assert _probe(stub_server.base_url) == 8192
