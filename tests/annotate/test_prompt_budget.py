"""The annotator prompt fits the server's context: token estimate, middle cuts, every action kept,
the budget from ``max_model_len`` (given, or read from ``/v1/models``), context-length errors.

The server side is the local stub (tests/openai_stub_server.py); a subclass reports
``max_model_len`` on ``/v1/models`` as vLLM does.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest
from openai_stub_server import OpenAIStubServer, Reply, uniform_graph_responder

from verl_credit.annotate.base import AnnotationStats
from verl_credit.annotate.hybrid import HybridAnnotator
from verl_credit.annotate.llm import FALLBACK_MAX_MODEL_LEN, PROMPT_TOKEN_MARGIN, LLMAnnotator, is_context_length_error
from verl_credit.annotate.prompt import (
    ARGUMENT_FLOOR_CHARS,
    TEXT_FLOOR_CHARS,
    build_annotation_messages,
    build_annotation_prompt,
    estimate_prompt_tokens,
    estimate_tokens,
)
from verl_credit.trajectory import Trajectory

pytestmark = pytest.mark.timeout(60)

VLLM_CONTEXT_ERROR = (
    "This model's maximum context length is 8000 tokens. However, you requested 9000 tokens "
    "(8000 in the messages, 1000 in the completion). Please reduce the length of the messages or completion."
)


def long_trajectory(actions: int = 30, output_chars: int = 6000, argument_chars: int = 50) -> Trajectory:
    """``actions`` tool calls, each with a long tool result whose head and tail are distinctive."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing test in calc/ops.py, the repo is at /work."},
    ]
    for i in range(actions):
        arguments = {"cmd": f"cat part{i}.log", "blob": "b" * argument_chars}
        messages.append(
            {
                "role": "assistant",
                "content": f"Step {i}: reading part {i}.",
                "tool_calls": [
                    {
                        "id": f"c{i}",
                        "type": "function",
                        "function": {"name": "shell", "arguments": json.dumps(arguments)},
                    }
                ],
            }
        )
        body = ("log line with some words and 12 numbers\n" * (output_chars // 40))[: output_chars - 40]
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"HEAD-{i} " + body + f" TAIL-{i}"})
    return Trajectory.from_messages(messages, id=f"long-{actions}", reward=1.0)


def user_text(messages: list[dict[str, str]]) -> str:
    return messages[1]["content"]


# -- the estimate ------------------------------------------------------------------------------
def test_estimate_counts_words_digits_and_non_ascii() -> None:
    assert estimate_tokens("") == 0
    assert estimate_tokens("hello world") == 3  # two words + 10 letters / 10
    assert estimate_tokens("2024") == 4  # one token per digit (Qwen splits numbers)
    assert estimate_tokens("日本語") == 3  # one per non-ASCII character
    assert estimate_tokens("a" * 40) > estimate_tokens("a" * 12) + 5  # long runs cost more
    text = "refund order #W12 please, to the card ending 4242."
    assert estimate_tokens(text * 10) >= 10 * estimate_tokens(text) - 10  # about additive
    messages = [{"role": "user", "content": text}]
    assert estimate_prompt_tokens(messages) > estimate_tokens(text)  # plus the chat template


# -- fitting the prompt ------------------------------------------------------------------------
def test_under_the_budget_the_prompt_is_unchanged() -> None:
    trajectory = long_trajectory(actions=3, output_chars=500)
    plain = build_annotation_messages(trajectory)
    prompt = build_annotation_prompt(trajectory, 4000, max_prompt_tokens=100_000)
    assert prompt.messages == plain and not prompt.truncated and prompt.fits
    assert build_annotation_prompt(trajectory, 4000, None).messages == plain


def test_over_the_budget_texts_are_cut_in_the_middle_and_every_action_stays() -> None:
    trajectory = long_trajectory()
    full = build_annotation_prompt(trajectory, 4000)
    budget = full.tokens // 3
    prompt = build_annotation_prompt(trajectory, 4000, max_prompt_tokens=budget)
    assert prompt.truncated and prompt.fits and prompt.tokens <= budget
    assert prompt.tokens == estimate_prompt_tokens(prompt.messages)
    text = user_text(prompt.messages)
    assert "30 long texts were shortened to fit the context" in text
    assert prompt.cuts == 30 and prompt.omitted_chars > 0
    for i in range(30):
        assert f"[A{i}] assistant text:" in text and f"[tool result of A{i}]" in text
        assert f'"HEAD-{i} ' in text and f' TAIL-{i}"' in text  # head and tail kept, the middle cut
        assert f'shell {{"cmd": "cat part{i}.log"' in text  # arguments untouched
    assert len(re.findall(r"\.\.\.\[\d+ characters omitted\]\.\.\.", text)) == 30
    assert text.count("<transcript>") == 1 and text.count("</transcript>") == 1
    # the short texts (the user's request, the assistant's notes) were not touched
    assert '"Fix the failing test in calc/ops.py, the repo is at /work."' in text


def test_arguments_are_cut_only_after_every_text_is_at_its_floor() -> None:
    trajectory = long_trajectory(actions=20, output_chars=2000, argument_chars=5000)
    full = build_annotation_prompt(trajectory, 4000)
    budget = full.tokens // 4
    prompt = build_annotation_prompt(trajectory, 4000, max_prompt_tokens=budget)
    assert prompt.fits and prompt.truncated
    text = user_text(prompt.messages)
    blobs = re.findall(r'"blob": "(b*)(?:\.\.\.\[(\d+) characters omitted\]\.\.\.)?(b*)"', text)
    assert len(blobs) == 20 and all(count for _, count, _ in blobs)  # every long argument string cut
    assert all(len(head) + len(tail) >= ARGUMENT_FLOOR_CHARS for head, _, tail in blobs)
    outputs = re.findall(r"\[tool result of A\d+\] (\".*\")", text)
    assert len(outputs) == 20
    for output in outputs:  # the texts went to their floor first
        shown = json.loads(output)
        assert len(re.sub(r"\.\.\.\[\d+ characters omitted\]\.\.\.", "", shown)) == TEXT_FLOOR_CHARS


def test_many_actions_go_below_the_floors_and_a_prompt_that_cannot_fit_says_so() -> None:
    trajectory = long_trajectory(actions=60, output_chars=1000, argument_chars=1000)
    at_floors = build_annotation_prompt(trajectory, 4000, max_prompt_tokens=12_000)  # > every floor
    assert at_floors.fits
    tight = build_annotation_prompt(trajectory, 4000, max_prompt_tokens=9000)  # only below the floors
    assert tight.fits and tight.tokens <= 9000
    shown = [json.loads(m) for m in re.findall(r"\[tool result of A\d+\] (\".*\")", user_text(tight.messages))]
    assert len(shown) == 60 and all(len(text) < 40 + 40 for text in shown)  # below TEXT_FLOOR_CHARS
    impossible = build_annotation_prompt(trajectory, 4000, max_prompt_tokens=500)
    assert not impossible.fits and impossible.tokens > 500
    assert all(f"[A{i}]" in user_text(impossible.messages) for i in range(60))


# -- the annotator's budget ----------------------------------------------------------------------
class ModelLenServer(OpenAIStubServer):
    """The stub, with vLLM's ``max_model_len`` in ``GET /v1/models``; counts those requests."""

    def __init__(self, max_model_len: int, **options: Any):
        super().__init__(uniform_graph_responder, **options)
        self.max_model_len = max_model_len
        self.model_requests = 0

    async def _dispatch(self, writer: Any, method: str, target: str, headers: dict[str, str], body: bytes) -> bool:
        if method == "GET" and target.split("?", 1)[0] == "/v1/models":
            self.model_requests += 1
            card = {"id": self.model, "object": "model", "owned_by": "vllm", "max_model_len": self.max_model_len}
            data = json.dumps({"object": "list", "data": [card]}).encode()
            await self._send(writer, 200, data, {}, "application/json")
            return True
        return await super()._dispatch(writer, method, target, headers, body)


def make_llm(url: str, **options: Any) -> LLMAnnotator:
    defaults: dict[str, Any] = {"model": "stub-model", "timeout": 5.0, "max_retries": 0, "fallback": "uniform"}
    defaults.update(options)
    return LLMAnnotator(url, **defaults)


def sent_prompt_tokens(server: OpenAIStubServer, number: int = -1) -> int:
    return estimate_prompt_tokens(server.chat_requests[number].json["messages"])


def test_the_budget_comes_from_v1_models_and_long_prompts_are_truncated_and_counted() -> None:
    with ModelLenServer(8000) as server:
        llm = make_llm(server.base_url, max_tokens=1000)
        short, long = long_trajectory(actions=2, output_chars=300), long_trajectory()
        results = llm.annotate([short, long])
        results += llm.annotate([long])  # a second event loop: the length is not asked again
        assert [r.source for r in results] == ["llm"] * 3
        assert [r.prompt_truncated for r in results] == [False, True, True]
        assert server.model_requests == 1 and llm.stats.max_model_len == 8000
        assert llm.stats.truncated_prompts == 2 and llm.stats.failures == {}
        budget = 8000 - 1000 - PROMPT_TOKEN_MARGIN
        assert all(sent_prompt_tokens(server, n) <= budget for n in range(3))
        sizes = [
            r.json["response_format"]["json_schema"]["schema"]["properties"]["num_actions"]["enum"]
            for r in server.chat_requests
        ]
        assert sorted(sizes) == [[2], [30], [30]]  # the truncated prompts still ask for all 30 actions
        stats = AnnotationStats()
        for result in results:
            stats.add(result)
        assert stats.truncated_prompts == 2 and stats.fallbacks == 0
        assert results[1].to_record("t", "llm")["prompt_truncated"] is True
        assert "prompt_truncated" not in results[0].to_record("t", "llm")


def test_without_a_reported_length_the_fallback_length_applies(stub_server: OpenAIStubServer) -> None:
    stub_server.responder = uniform_graph_responder
    llm = make_llm(stub_server.base_url)
    assert llm.annotate([long_trajectory(actions=2)])[0].source == "llm"
    assert llm.stats.max_model_len == FALLBACK_MAX_MODEL_LEN
    assert [r.path for r in stub_server.requests] == ["/v1/models", "/v1/chat/completions"]


def test_given_lengths_and_caps(stub_server: OpenAIStubServer) -> None:
    stub_server.responder = uniform_graph_responder
    long = long_trajectory()
    given = make_llm(stub_server.base_url, max_model_len=8000, max_tokens=1000)
    assert given.annotate([long])[0].prompt_truncated
    assert sent_prompt_tokens(stub_server) <= 8000 - 1000 - PROMPT_TOKEN_MARGIN
    capped = make_llm(stub_server.base_url, max_model_len=0, max_prompt_tokens=7000)
    assert capped.annotate([long])[0].prompt_truncated and sent_prompt_tokens(stub_server) <= 7000
    unlimited = make_llm(stub_server.base_url, max_model_len=0)
    result = unlimited.annotate([long])[0]
    assert not result.prompt_truncated and unlimited.stats.max_model_len == 0
    assert stub_server.chat_requests[-1].json["messages"] == build_annotation_messages(long)
    assert [r.path for r in stub_server.requests].count("/v1/models") == 0  # never asked: given
    with pytest.raises(ValueError, match="max_model_len"):
        make_llm(stub_server.base_url, max_model_len=1000, max_tokens=1000)
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        make_llm(stub_server.base_url, max_prompt_tokens=0)


def test_a_context_length_error_is_final_counted_and_lowers_the_budget(stub_server: OpenAIStubServer) -> None:
    stub_server.script(Reply.error(400, VLLM_CONTEXT_ERROR), Reply.json({"never": "asked for"}))
    llm = make_llm(stub_server.base_url, max_model_len=32768, max_tokens=1000, max_retries=3)
    long = long_trajectory(actions=30, output_chars=1500)  # fits 32768 by the estimate
    first = llm.annotate([long])[0]
    assert first.source == "fallback:uniform" and first.fallback and not first.prompt_truncated
    assert "context_length" in (first.error or "") and "maximum context length" in (first.error or "")
    assert llm.stats.failures == {"context_length": 1} and llm.stats.requests == 1 and llm.stats.retries == 0
    assert stub_server.pending == 1  # not retried
    # the server said 8000: the next prompt is fitted to that
    stub_server.clear()
    stub_server.responder = uniform_graph_responder
    second = llm.annotate([long])[0]
    assert second.source == "llm" and second.prompt_truncated and llm.stats.max_model_len == 8000
    assert sent_prompt_tokens(stub_server) <= 8000 - 1000 - PROMPT_TOKEN_MARGIN


def test_context_length_error_texts() -> None:
    assert is_context_length_error(400, VLLM_CONTEXT_ERROR)
    assert is_context_length_error(400, '{"error": {"code": "context_length_exceeded"}}')
    assert is_context_length_error(
        400, "The decoder prompt (length 40000) is longer than the maximum model length of 32768."
    )
    assert is_context_length_error(400, "Input prompt (40000 tokens) is too long and exceeds limit of 32768")
    assert not is_context_length_error(400, "response_format is invalid")
    assert not is_context_length_error(500, VLLM_CONTEXT_ERROR)


def test_a_prompt_that_cannot_fit_is_not_sent_and_is_counted(stub_server: OpenAIStubServer) -> None:
    llm = make_llm(stub_server.base_url, max_model_len=0, max_prompt_tokens=500)
    result = llm.annotate([long_trajectory(actions=60, output_chars=1000)])[0]
    assert result.source == "fallback:uniform" and result.graph.num_actions == 60
    assert llm.stats.failures == {"prompt_too_long": 1} and llm.stats.fallbacks == 1
    assert stub_server.chat_requests == []


def test_hybrid_passes_the_budget_options_to_its_llm() -> None:
    hybrid = HybridAnnotator(base_urls="http://h:1", fallback="uniform", max_model_len=9000, max_prompt_tokens=3000)
    assert hybrid.llm.max_model_len == 9000 and hybrid.llm.max_prompt_tokens == 3000
    assert asyncio.run(hybrid.llm.prompt_budget()) == 3000  # the smaller of 3000 and 9000 - 4096 - margin
