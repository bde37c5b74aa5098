"""Simulated users: scripted, environment-backed, and an LLM behind an OpenAI-compatible endpoint
(``httpx.MockTransport`` answers in-process)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from verl_credit.envs.base import UserTurn
from verl_credit.verl.settings import UserSettings
from verl_credit.verl.users import LLMUser, ScriptedUser, UserSimulatorError, build_user, flip_roles

TRANSCRIPT = [
    {"role": "system", "content": "You are a support agent."},
    {"role": "user", "content": "refund order #W12 please"},
    {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_order", "arguments": "{}"}}]},
    {"role": "tool", "content": '{"status": "delivered"}'},
    {"role": "assistant", "content": "To card or store credit?"},
]


def test_flip_roles_shows_the_user_side_only():
    assert flip_roles(TRANSCRIPT) == [
        {"role": "assistant", "content": "refund order #W12 please"},
        {"role": "user", "content": "To card or store credit?"},
    ]


def test_scripted_user_replies_in_order_then_ends():
    user = ScriptedUser(["card", UserTurn("thanks, bye", done=True)])
    turns = [asyncio.run(user.reply(TRANSCRIPT)) for _ in range(3)]
    assert turns == [UserTurn("card", False), UserTurn("thanks, bye", True), UserTurn(None, True)]
    assert len(user.seen) == 3 and user.seen[0][-1]["content"] == "To card or store credit?"


def _completion(text: str) -> dict:
    return {"choices": [{"message": {"role": "assistant", "content": text}}]}


def test_llm_user_request_and_stop_token():
    requests = []

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(json.loads(request.content))
        text = "card please" if len(requests) == 1 else "All good, thanks. ###STOP###"
        return httpx.Response(200, json=_completion(text))

    user = LLMUser(
        "http://sim:8001/v1/", "user-model", "You want a refund to your card.", transport=httpx.MockTransport(handler)
    )
    first = asyncio.run(user.reply(TRANSCRIPT))
    second = asyncio.run(user.reply(TRANSCRIPT))
    asyncio.run(user.aclose())
    assert first == UserTurn("card please", False)
    assert second == UserTurn("All good, thanks.", True)  # stop token stripped, closing line kept
    body = requests[0]
    assert body["model"] == "user-model" and body["temperature"] == 0.0 and body["max_tokens"] == 512
    assert (
        body["messages"][0]["role"] == "system" and "You want a refund to your card." in body["messages"][0]["content"]
    )
    assert body["messages"][1:] == flip_roles(TRANSCRIPT)


def test_llm_user_retries_server_errors_then_fails_with_the_url():
    calls = {"n": 0}

    def flaky(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        return httpx.Response(503) if calls["n"] < 3 else httpx.Response(200, json=_completion("ok"))

    user = LLMUser("http://sim:8001/v1", "m", max_retries=2, backoff_s=0.0, transport=httpx.MockTransport(flaky))
    assert asyncio.run(user.reply(TRANSCRIPT)) == UserTurn("ok", False) and calls["n"] == 3

    down = LLMUser(
        "http://sim:8001/v1",
        "m",
        max_retries=1,
        backoff_s=0.0,
        transport=httpx.MockTransport(lambda r: httpx.Response(500)),
    )
    with pytest.raises(
        UserSimulatorError, match=r"http://sim:8001/v1/chat/completions failed after 2 attempts \(HTTP 500\)"
    ):
        asyncio.run(down.reply(TRANSCRIPT))
    bad = LLMUser(
        "http://sim:8001/v1", "m", transport=httpx.MockTransport(lambda r: httpx.Response(200, json={"x": 1}))
    )
    with pytest.raises(UserSimulatorError, match="no message content"):
        asyncio.run(bad.reply(TRANSCRIPT))


def test_build_user_follows_settings_and_row():
    class Env:
        async def user_turn(self, messages):
            return UserTurn("from env")

    env = Env()
    assert asyncio.run(build_user(UserSettings(), env).reply([])) == UserTurn("from env")
    assert build_user(UserSettings(), None) is None and build_user(UserSettings(name="none"), env) is None
    scripted = build_user(UserSettings(name="scripted", script=("a",)), env, {"user_script": ["row"]})
    assert asyncio.run(scripted.reply([])) == UserTurn("row", False)
    llm = build_user(
        UserSettings(name="llm", base_url="http://u/v1", model="m", instructions="default"),
        env,
        {"user_instructions": "from the row"},
    )
    assert isinstance(llm, LLMUser) and "from the row" in llm.system_prompt
    asyncio.run(llm.aclose())


def test_llm_user_reply_in_reasoning_content_over_http(stub_server):
    """vLLM with a reasoning parser (Qwen3): the whole reply in ``reasoning_content`` / ``reasoning``,
    ``content`` empty or null. The reasoning text, ``<think>`` removed, is the reply; counted."""
    from openai_stub_server import Reply

    stub_server.script(
        Reply.completion(None, reasoning_content="<think>They ask card or credit.</think>\nTo my card, please."),
        Reply.completion("", reasoning="All good, thanks. ###STOP###"),
        Reply.completion("store credit", reasoning_content="hmm"),
    )

    async def play(user: LLMUser) -> list[UserTurn]:
        try:  # one event loop: the client's pooled connection belongs to it
            return [await user.reply(TRANSCRIPT) for _ in range(3)]
        finally:
            await user.aclose()

    user = LLMUser(stub_server.base_url, "user-model", max_retries=0)
    turns = asyncio.run(play(user))
    assert turns == [
        UserTurn("To my card, please.", False),
        UserTurn("All good, thanks.", True),
        UserTurn("store credit", False),
    ]
    assert user.reasoning_fallbacks == 2  # the third reply had content


def test_llm_user_ignores_proxy_variables_unless_asked(stub_server, monkeypatch):
    from openai_stub_server import Reply, unused_port

    dead_proxy = f"http://127.0.0.1:{unused_port()}"
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.setenv(name, dead_proxy)
    stub_server.script(Reply.completion("card"))

    async def reply(**options) -> UserTurn:
        user = LLMUser(stub_server.base_url, "m", max_retries=0, **options)
        try:
            return await user.reply(TRANSCRIPT)
        finally:
            await user.aclose()

    assert asyncio.run(reply()) == UserTurn("card", False)  # straight to the in-cluster endpoint
    with pytest.raises(UserSimulatorError, match="failed after 1 attempts"):
        asyncio.run(reply(trust_env=True))  # opted in: the (dead) proxy is used
