"""The shared chat-completions POST with retries (``verl_credit.openai_chat``), over a real loopback socket."""

from __future__ import annotations

import asyncio
import email.utils
import math
import random
import re
from pathlib import Path

import httpx
import pytest
from openai_stub_server import OpenAIStubServer, Reply, unused_port

from verl_credit.envs.base import UserTurn
from verl_credit.openai_chat import (
    RETRY_TABLE,
    ChatCompletionError,
    RetryPolicy,
    first_message,
    make_async_client,
    make_client,
    message_content,
    parse_retry_after,
    post_chat_completion,
    post_chat_completion_sync,
    status_failure,
    transport_failure,
)
from verl_credit.verl.users import LLMUser, UserSimulatorError

BODY = {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}


def _post(url: str, **options) -> dict:
    """One ``post_chat_completion`` call on a fresh client (the test's own event loop)."""

    async def go() -> dict:
        async with httpx.AsyncClient(timeout=5.0) as client:
            return await post_chat_completion(client, url, BODY, **options)

    return asyncio.run(go())


def _gap(server: OpenAIStubServer, i: int) -> float:
    """Seconds between chat request ``i`` and ``i + 1`` as the server received them."""
    requests = server.chat_requests
    return requests[i + 1].received_at - requests[i].received_at


@pytest.mark.timeout(30)
def test_success_returns_the_json_and_sends_body_and_headers(stub_server: OpenAIStubServer) -> None:
    stub_server.script(Reply.completion("hello"))
    url = stub_server.base_url + "/chat/completions"
    data = _post(
        url, retry=RetryPolicy(max_retries=2, backoff_s=0.0), timeout_s=5.0, headers={"Authorization": "Bearer k"}
    )
    assert message_content(data) == "hello"
    assert first_message(data) == {"role": "assistant", "content": "hello"}
    (request,) = stub_server.chat_requests
    assert request.json == BODY and request.headers["authorization"] == "Bearer k"


@pytest.mark.timeout(30)
def test_server_error_is_retried_after_the_backoff(stub_server: OpenAIStubServer) -> None:
    stub_server.script(Reply.error(500), Reply.completion("second time"))
    data = _post(stub_server.base_url + "/chat/completions", retry=RetryPolicy(max_retries=2, backoff_s=0.2))
    assert message_content(data) == "second time"
    assert len(stub_server.chat_requests) == 2
    assert _gap(stub_server, 0) >= 0.2  # retry 1 waits backoff_s * 2**0 = 0.2 s


@pytest.mark.timeout(30)
def test_server_errors_exhaust_the_retries_and_name_the_url(stub_server: OpenAIStubServer) -> None:
    stub_server.script(Reply.error(503, "overloaded"), Reply.error(503, "overloaded"), Reply.error(503, "overloaded"))
    url = stub_server.base_url + "/chat/completions"
    with pytest.raises(
        ChatCompletionError, match=rf"^{re.escape(url)} failed after 3 attempts \(HTTP 503: .*overloaded"
    ) as info:
        _post(url, retry=RetryPolicy(max_retries=2, backoff_s=0.01))
    assert info.value.kind == "http_5xx" and info.value.status == 503
    assert len(stub_server.chat_requests) == 3
    # waits 0.01 then 0.02 s: exponential, the second gap is the larger nominal one
    assert _gap(stub_server, 0) >= 0.01 and _gap(stub_server, 1) >= 0.02


@pytest.mark.timeout(30)
def test_429_waits_for_retry_after(stub_server: OpenAIStubServer) -> None:
    stub_server.script(Reply.error(429, headers={"Retry-After": "1"}), Reply.completion("ok"))
    data = _post(stub_server.base_url + "/chat/completions", retry=RetryPolicy(max_retries=1, backoff_s=0.0))
    assert message_content(data) == "ok"
    # the backoff alone would be 0 s; Retry-After: 1 makes the client wait a full second
    assert _gap(stub_server, 0) >= 1.0


@pytest.mark.timeout(30)
def test_retry_after_is_capped(stub_server: OpenAIStubServer) -> None:
    stub_server.script(Reply.error(429, headers={"Retry-After": "120"}), Reply.completion("ok"))
    data = _post(
        stub_server.base_url + "/chat/completions",
        retry=RetryPolicy(max_retries=1, backoff_s=0.0, retry_after_max_s=0.3),
    )
    assert message_content(data) == "ok"
    assert 0.3 <= _gap(stub_server, 0) < 5.0  # min(120, 0.3) s, not two minutes


@pytest.mark.timeout(30)
def test_client_error_is_not_retried(stub_server: OpenAIStubServer) -> None:
    stub_server.script(Reply.error(400, "bad schema"), Reply.completion("never asked"))
    url = stub_server.base_url + "/chat/completions"
    with pytest.raises(ChatCompletionError, match=rf"^{re.escape(url)} answered HTTP 400: .*bad schema") as info:
        _post(url, retry=RetryPolicy(max_retries=3, backoff_s=0.0))
    assert info.value.kind == "http_4xx" and info.value.status == 400
    assert len(stub_server.chat_requests) == 1 and stub_server.pending == 1


@pytest.mark.timeout(30)
def test_connection_refused_names_the_url() -> None:
    url = f"http://127.0.0.1:{unused_port()}/v1/chat/completions"
    with pytest.raises(ChatCompletionError, match=rf"^{re.escape(url)} failed after 2 attempts \(ConnectError") as info:
        _post(url, retry=RetryPolicy(max_retries=1, backoff_s=0.0))
    assert info.value.kind == "connect" and info.value.status is None


@pytest.mark.timeout(30)
def test_timeout_is_retried_then_reported(stub_server: OpenAIStubServer) -> None:
    url = stub_server.base_url + "/chat/completions"
    # a slow answer (2 s > timeout 0.3 s), then a fast one: the retry succeeds
    stub_server.script(Reply.completion("late", delay=2.0), Reply.completion("fast"))
    assert message_content(_post(url, retry=RetryPolicy(max_retries=1, backoff_s=0.0), timeout_s=0.3)) == "fast"
    stub_server.clear()
    stub_server.script(Reply.completion("late", delay=2.0), Reply.completion("late", delay=2.0))
    with pytest.raises(ChatCompletionError, match=rf"^{re.escape(url)} failed after 2 attempts \(ReadTimeout") as info:
        _post(url, retry=RetryPolicy(max_retries=1, backoff_s=0.0), timeout_s=0.3)
    assert info.value.kind == "timeout"


@pytest.mark.timeout(30)
def test_truncated_body_is_retried(stub_server: OpenAIStubServer) -> None:
    stub_server.script(Reply.raw('{"choices": [{"mess'), Reply.completion("whole"))
    assert (
        message_content(
            _post(stub_server.base_url + "/chat/completions", retry=RetryPolicy(max_retries=1, backoff_s=0.0))
        )
        == "whole"
    )
    assert len(stub_server.chat_requests) == 2


@pytest.mark.timeout(30)
def test_sync_twin_retries_and_fails_alike(stub_server: OpenAIStubServer) -> None:
    url = stub_server.base_url + "/chat/completions"
    stub_server.script(Reply.error(502), Reply.completion("sync ok"), Reply.error(422, "no"))
    with httpx.Client(timeout=5.0) as client:
        data = post_chat_completion_sync(client, url, BODY, retry=RetryPolicy(max_retries=1, backoff_s=0.0))
        assert message_content(data) == "sync ok"
        with pytest.raises(ChatCompletionError, match=rf"^{re.escape(url)} answered HTTP 422") as info:
            post_chat_completion_sync(client, url, BODY, retry=RetryPolicy(max_retries=1, backoff_s=0.0))
    assert info.value.kind == "http_4xx" and len(stub_server.chat_requests) == 3


@pytest.mark.timeout(30)
def test_llm_user_over_the_wire_wraps_errors(stub_server: OpenAIStubServer) -> None:
    url = stub_server.base_url + "/chat/completions"
    stub_server.script(Reply.error(429, headers={"Retry-After": "0"}), Reply.completion("My order is 42."))
    stub_server.script(Reply.error(401, "bad key"))

    async def play() -> tuple[UserTurn, str]:
        user = LLMUser(stub_server.base_url, "stub-model", max_retries=1, backoff_s=0.0, timeout=5.0)
        try:
            turn = await user.reply([{"role": "assistant", "content": "Which order?"}])
            with pytest.raises(UserSimulatorError) as info:
                await user.reply([{"role": "assistant", "content": "Which order?"}])
            return turn, str(info.value)
        finally:
            await user.aclose()

    turn, error = asyncio.run(play())
    assert turn == UserTurn("My order is 42.", False)
    assert error.startswith(f"user LLM at {url} answered HTTP 401") and "bad key" in error


def test_retry_schedule_and_retry_after_parsing() -> None:
    policy = RetryPolicy(max_retries=5, backoff_s=0.5, backoff_max_s=8.0, retry_after_max_s=60.0)
    # no Retry-After: 0.5 * 2**(k-1) -> 0.5, 1, 2, 4, then capped at 8
    assert [policy.delay(k) for k in (1, 2, 3, 4, 5, 6)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0]
    assert policy.delay(1, retry_after=3.0) == 3.0  # Retry-After wins over the backoff
    assert policy.delay(1, retry_after=300.0) == 60.0  # ... up to its cap
    jittered = RetryPolicy(backoff_s=1.0, backoff_max_s=8.0, jitter=True)
    rng = random.Random(0)
    draws = [jittered.delay(3, rng=rng) for _ in range(200)]  # nominal 4 s: drawn from [2, 4]
    assert min(draws) >= 2.0 and max(draws) <= 4.0 and max(draws) - min(draws) > 1.0
    for bad in ({"max_retries": -1}, {"backoff_s": math.nan}, {"retry_after_max_s": math.inf}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            RetryPolicy(**bad)
    assert parse_retry_after("2") == 2.0 and parse_retry_after("-1") == 0.0
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    date = email.utils.formatdate(1000.0 + 7.0, usegmt=True)  # 7 s after "now" = 1000
    assert parse_retry_after(date, now=1000.0) == 7.0


def test_message_helpers_reject_replies_without_a_message() -> None:
    assert message_content({"choices": [{"message": {"content": None, "tool_calls": []}}]}) == ""
    for bad in ({"x": 1}, {"choices": []}, {"choices": [{"message": "text"}]}):
        with pytest.raises(ChatCompletionError, match=r"no choices\[0\]\.message") as info:
            first_message(bad)
        assert info.value.kind == "no_message"
    with pytest.raises(ChatCompletionError, match="has no content"):
        message_content({"choices": [{"message": {"role": "assistant"}}]})
    with pytest.raises(ChatCompletionError, match="not text"):
        message_content({"choices": [{"message": {"content": [{"type": "text"}]}}]})


def _dead_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = f"http://127.0.0.1:{unused_port()}"
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.setenv(name, proxy)
        monkeypatch.setenv(name.lower(), proxy)


@pytest.mark.timeout(30)
def test_clients_ignore_proxy_variables_unless_asked(
    stub_server: OpenAIStubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    _dead_proxy(monkeypatch)
    url = stub_server.base_url + "/chat/completions"
    stub_server.script(Reply.completion("async"), Reply.completion("sync"))

    async def go(trust_env: bool) -> dict:
        async with make_async_client(timeout=5.0, trust_env=trust_env) as client:
            return await post_chat_completion(client, url, BODY, retry=RetryPolicy(max_retries=0, backoff_s=0.0))

    assert message_content(asyncio.run(go(False))) == "async"
    with make_client(timeout=5.0, headers={"Authorization": "Bearer k"}) as client:
        assert (
            message_content(
                post_chat_completion_sync(client, url, BODY, retry=RetryPolicy(max_retries=0, backoff_s=0.0))
            )
            == "sync"
        )
    assert stub_server.chat_requests[1].headers["authorization"] == "Bearer k"
    # trust_env=True: the requests go to the proxy (dead here), not to the local server
    with pytest.raises(ChatCompletionError) as caught:
        asyncio.run(go(True))
    assert caught.value.kind == "connect"
    with make_client(timeout=5.0, trust_env=True) as client, pytest.raises(ChatCompletionError):
        post_chat_completion_sync(client, url, BODY, retry=RetryPolicy(max_retries=0, backoff_s=0.0))
    assert len(stub_server.chat_requests) == 2


def test_one_retry_table_names_every_failure_and_says_what_is_retried() -> None:
    assert [status_failure(code) for code in (200, 204, 400, 401, 404, 408, 422, 429, 500, 503, 599)] == [
        None, None, "http_4xx", "http_4xx", "http_4xx", "http_408", "http_4xx", "http_429", "http_5xx", "http_5xx",
        "http_5xx",
    ]  # fmt: skip
    request = httpx.Request("POST", "http://h/v1/chat/completions")
    errors = {
        "timeout": httpx.ReadTimeout("slow", request=request),
        "connect": httpx.ConnectError("refused", request=request),
        "transport": httpx.RemoteProtocolError("dropped", request=request),
    }
    assert {kind: transport_failure(error) for kind, error in errors.items()} == {k: k for k in errors}
    assert transport_failure(TimeoutError()) == "timeout"  # asyncio.wait_for's deadline
    retried = {kind for kind, (again, _) in RETRY_TABLE.items() if again}
    assert retried == {"timeout", "connect", "transport", "http_408", "http_429", "http_5xx", "bad_response"}
    assert not RetryPolicy.retried("http_4xx") and not RetryPolicy.retried("unknown kind")
    assert RetryPolicy.endpoint_unwell("http_5xx") and not RetryPolicy.endpoint_unwell("http_4xx")
    assert not RetryPolicy.endpoint_unwell("schema")  # a content failure says nothing about the endpoint


def test_the_annotator_and_the_small_clients_share_the_table() -> None:
    """The LLM annotator counts its failed attempts by the table's kinds and retries exactly the
    table's retried ones; its backoff is the shared schedule (jittered)."""
    from verl_credit.annotate import llm as llm_module

    source = Path(llm_module.__file__).read_text(encoding="utf-8")
    assert "RETRY_TABLE" in source and "status_failure(" in source and "transport_failure(" in source
    assert "RetryPolicy.endpoint_unwell(" in source
    annotator = llm_module.LLMAnnotator("http://h:1", max_retries=2, backoff_base=1.0, backoff_max=4.0)
    assert annotator.retry == RetryPolicy(2, 1.0, 4.0, annotator.retry.retry_after_max_s, jitter=True)
