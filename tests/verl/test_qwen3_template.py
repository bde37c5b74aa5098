"""``credit_agent`` under Qwen3's chat template, thinking off and on.

Every test runs twice: with Qwen3's own template (``tests/data/qwen3/chat_template.jinja``, the
``chat_template`` of ``Qwen/Qwen3-0.6B`` as the Qwen team ships it, Apache-2.0; where it comes from
and its sha256 are in ``tests/data/qwen3/NOTICE.md``) and with :data:`verl_helpers.QWEN3_TEMPLATE`, the
rendition written for these tests. The tokenizer (built in code) carries the template. Both
have: tools in ``<tools></tools>``, hermes ``<tool_call>`` blocks, tool responses merged into
one ``user`` turn, an empty ``<think>\\n\\n</think>\\n\\n`` in the generation prompt when
``enable_thinking`` is false, and the reasoning of assistant turns before the last user query
dropped when the history is rendered. ``enable_thinking`` reaches the template the way a run sets
it: ``+data.apply_chat_template_kwargs.enable_thinking=...`` -> ``AgentLoopBase.apply_chat_template_kwargs``
-> the Continuous-Token builder's ``chat_template_kwargs`` (``hf_model_type="qwen3"``: verl's
``QwenContinuousTokenBuilder``).

One episode, scripted token by token (:class:`verl_helpers.ScriptedTokenServer`): two tool calls
in one turn -> two tool results; a question -> the simulated user answers "card"; a final answer
-> the user ends the episode. With thinking on every action starts with a ``<think>`` block.

With thinking on, the annotator reads the transcript without the reasoning
(``verl_credit.verl.annotation.annotation_view``): the same actions and lengths, so the graph's
indices and the spans still line up, but no ``<think>`` text in its prompt.

What verl 0.9.1 does (checked here): it never re-renders the history. Each context message is
rendered against a synthetic prefix and the difference is appended to the running token stream;
the model's tokens are appended as generated. So the stream stays append-only (one output, no new
session) and the model sees its earlier reasoning (thinking on) and the empty think blocks of
its earlier turns (thinking off), where Qwen3's template, re-rendering the same transcript, drops
both. What credit needs holds in both modes: every span is exactly one action's generated tokens,
every generated token is trained exactly once, one assistant message per action.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
from pathlib import Path

import pytest
from verl_helpers import ScriptedTokenServer, compose_credit_config, qwen3_tokenizer, run_session_as

#: slow: full agent-loop sessions under Qwen3's template
pytestmark = pytest.mark.slow

#: Qwen3's own chat template (tests/data/qwen3/NOTICE.md)
OFFICIAL_TEMPLATE = Path(__file__).resolve().parents[1] / "data" / "qwen3" / "chat_template.jinja"
OFFICIAL_SHA256 = "87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5"

TASK = {"user_replies": ["card"], "reward": 1.0}
TOOL_CALLS = (
    '<tool_call>\n{"name": "get_order", "arguments": {"order_id": "#W12"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_order", "arguments": {"order_id": "#W9"}}\n</tool_call>'
)
ANSWERS = (TOOL_CALLS, "Your order #W12 is delivered. Refund to card or store credit?", "Refund to card done.")
REASONING = (
    "The user wants a refund, so I should look up the order first.",
    "The order is delivered; ask how to refund.",
    "The user chose card, so I confirm the refund.",
)
EMPTY_THINK = "<think>\n\n</think>\n\n"


def test_the_official_template_is_the_shipped_file() -> None:
    assert hashlib.sha256(OFFICIAL_TEMPLATE.read_bytes()).hexdigest() == OFFICIAL_SHA256


@pytest.fixture(scope="module", params=["qwen3_official", "rendition"])
def qwen3_tok(request):
    tokenizer = qwen3_tokenizer()
    if request.param == "qwen3_official":
        tokenizer.chat_template = OFFICIAL_TEMPLATE.read_text(encoding="utf-8")
    return tokenizer


def _plans(thinking: bool) -> list[str]:
    if not thinking:
        return list(ANSWERS)
    return [f"<think>\n{why}\n</think>\n\n{text}" for why, text in zip(REASONING, ANSWERS, strict=True)]


def _config(thinking: bool, layout: str = "merged", *overrides: str):
    return compose_credit_config(
        [
            "actor_rollout_ref.rollout.prompt_length=1024",
            "actor_rollout_ref.rollout.response_length=512",
            "actor_rollout_ref.rollout.multi_turn.max_parallel_calls=2",
            "credit.env.name=test_orders",
            "credit.annotator.in_rollout=false",
            f"credit.layout={layout}",
            f"+data.apply_chat_template_kwargs.enable_thinking={thinking}",
            *overrides,
        ]
    )


def _run(tok, thinking: bool, layout: str = "merged", *overrides: str):
    server = ScriptedTokenServer(tok, _plans(thinking))
    outputs, loop = asyncio.run(run_session_as(_config(thinking, layout, *overrides), server, tok, TASK, "qwen3"))
    return outputs, loop, server


def _rerender(tok, messages, tools, thinking: bool) -> list[int]:
    """What Qwen3's template makes of the transcript so far (a chat server's view of the context)."""
    return list(
        tok.apply_chat_template(
            messages,
            tools=tools,
            tokenize=True,
            return_dict=False,
            add_generation_prompt=True,
            enable_thinking=thinking,
        )
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("thinking", [False, True], ids=["thinking_off", "thinking_on"])
def test_spans_exact_under_qwen3_template(qwen3_tok, orders_env_cls, thinking):
    tok = qwen3_tok
    outputs, loop, server = _run(tok, thinking)
    # enable_thinking reached verl's Qwen Continuous-Token builder (and through it the template)
    builder = loop.continuous_token_builder
    assert type(builder).__name__ == "QwenContinuousTokenBuilder"
    assert builder.chat_template_kwargs["enable_thinking"] is thinking

    # one output: verl keeps one append-only stream, it starts no new output or session
    assert len(outputs) == 1
    out = outputs[0]
    credit = out.extra_fields["credit"]
    calls = server.calls
    assert len({call["request_id"] for call in calls}) == 1
    assert credit["stop_reason"] == "user_done" and credit["truncated_action"] is None

    # spans: exact, ordered, disjoint, all ones, covering every 1 of the mask
    spans = credit["spans"]
    mask = out.response_mask
    assert [a for a, _, _ in spans] == [0, 1, 2]
    assert all(prev[2] <= nxt[1] for prev, nxt in itertools.pairwise(spans))
    for (action, start, end), call in zip(spans, calls, strict=True):
        assert mask[start:end] == [1] * (end - start)
        assert out.response_ids[start:end] == call["token_ids"]
        assert tok.decode(out.response_ids[start:end]) == call["plan"] + tok.eos_token
        assert out.response_logprobs[start:end] == pytest.approx(call["log_probs"])
        assert credit["action_lengths"][action] == end - start
        if thinking:  # the reasoning is generated, so it is in the span and trained
            assert tok.decode(out.response_ids[start:end]).startswith(f"<think>\n{REASONING[action]}\n</think>")
    inside = {i for _, s, e in spans for i in range(s, e)}
    assert all(mask[i] == 0 and out.response_logprobs[i] == 0.0 for i in range(len(mask)) if i not in inside)
    # every generated token trained exactly once
    generated = [t for call in calls for t in call["token_ids"]]
    assert sum(mask) == len(generated) == sum(e - s for _, s, e in spans)
    assert [t for _, s, e in spans for t in out.response_ids[s:e]] == generated

    # one assistant message per action
    messages = credit["messages"]
    assistants = [m for m in messages if m["role"] == "assistant"]
    assert credit["num_actions"] == len(assistants) == len(calls) == len(spans) == 3
    roles = [m["role"] for m in messages]
    assert roles == ["system", "user", "assistant", "tool", "tool", "assistant", "user", "assistant"]
    arguments = [c["function"]["arguments"] for c in assistants[0]["tool_calls"]]
    assert arguments == [{"order_id": "#W12"}, {"order_id": "#W9"}]

    # the observations between the spans: both tool results in ONE user turn, then the user's reply;
    # each ends with the next generation prompt (with the empty think block when thinking is off)
    gaps = [tok.decode(out.response_ids[spans[k][2] : spans[k + 1][1]]) for k in range(2)]
    prompt_tail = "<|im_start|>assistant\n" + ("" if thinking else EMPTY_THINK)
    assert gaps[0] == (
        '\n<|im_start|>user\n<tool_response>\n{"order_id": "#W12", "status": "delivered"}\n</tool_response>\n'
        "<tool_response>\norder not found\n</tool_response><|im_end|>\n" + prompt_tail
    )
    assert gaps[1] == "\n<|im_start|>user\ncard<|im_end|>\n" + prompt_tail
    assert tok.decode(out.prompt_ids).endswith("refund order #W12 please<|im_end|>\n" + prompt_tail)
    assert "<tools>\n" in tok.decode(out.prompt_ids) and '"name": "get_order"' in tok.decode(out.prompt_ids)

    # the model's real context is the append-only stream: every request saw a prefix of it
    stream = out.prompt_ids + out.response_ids
    for call in calls:
        assert stream[: len(call["prompt_ids"])] == call["prompt_ids"]
    # ... which is not what Qwen3's template renders for the same transcript: it drops the
    # reasoning (thinking on) or the empty think block (thinking off) of turns before the last query
    tools = credit["tools"]
    last = calls[2]["prompt_ids"]
    rerendered = _rerender(tok, messages[:7], tools, thinking)
    assert rerendered != last and len(rerendered) < len(last)
    seen, template_view = tok.decode(last), tok.decode(rerendered)
    if thinking:
        for why in REASONING[:2]:
            assert why in seen and why not in template_view
        # before any new user query the template keeps the reasoning: there the two agree
        assert _rerender(tok, messages[:5], tools, thinking) == calls[1]["prompt_ids"]
    else:
        assert seen.count(EMPTY_THINK) == 3 and template_view.count(EMPTY_THINK) == 1
        assert _rerender(tok, messages[:5], tools, thinking) != calls[1]["prompt_ids"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("thinking", [False, True], ids=["thinking_off", "thinking_on"])
def test_per_request_rows_under_qwen3_template(qwen3_tok, orders_env_cls, thinking):
    """per_request: each row's prompt is the exact context of its request, its response exactly the
    tokens generated for it (reasoning included), all trained."""
    tok = qwen3_tok
    outputs, _, server = _run(tok, thinking, "per_request")
    assert len(outputs) == len(server.calls) == 3
    for row, (output, call) in enumerate(zip(outputs, server.calls, strict=True)):
        assert output.prompt_ids == call["prompt_ids"]
        assert output.response_ids == call["token_ids"] and output.response_mask == [1] * len(call["token_ids"])
        assert output.response_logprobs == pytest.approx(call["log_probs"])
        assert output.extra_fields["credit"]["spans"] == [[row, 0, len(call["token_ids"])]]
    final = outputs[-1].extra_fields["credit"]
    assert final["num_actions"] == 3 and sum(len(o.response_ids) for o in outputs) == sum(final["action_lengths"])


@pytest.mark.timeout(120)
def test_user_is_not_shown_the_reasoning(qwen3_tok, orders_env_cls):
    """verl's hermes parser leaves a thinking model's <think> block in the assistant content; the
    simulated user (and the environment behind it, e.g. tau2) sees what a chat client of a served
    Qwen3 sees: the answer without the reasoning. The stored transcript keeps it."""
    before = len(orders_env_cls.shown)
    _run(qwen3_tok, True)
    shown = orders_env_cls.shown[before]  # after action 1, the question
    assert shown[-1] == {"role": "assistant", "content": ANSWERS[1]}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("thinking", [False, True], ids=["thinking_off", "thinking_on"])
def test_the_annotator_reads_the_transcript_without_reasoning(qwen3_tok, orders_env_cls, monkeypatch, thinking):
    """In-rollout annotation of the same episode: the annotator gets every action, with the lengths of
    the trained spans, and none of the reasoning; the stored transcript keeps it."""
    from verl_credit.annotate.rules import RuleAnnotator

    seen = []
    original = RuleAnnotator.annotate_batch

    async def recording(self, trajectories):
        seen.extend(trajectories)
        return await original(self, trajectories)

    monkeypatch.setattr(RuleAnnotator, "annotate_batch", recording)
    outputs, _, _ = _run(
        qwen3_tok, thinking, "merged", "credit.annotator.in_rollout=true", "algorithm.adv_estimator=iapo"
    )
    credit = outputs[0].extra_fields["credit"]
    (trajectory,) = seen
    assert [a.length for a in trajectory.actions] == credit["action_lengths"]
    assert [e - s for _, s, e in credit["spans"]] == credit["action_lengths"]  # graph indices = span actions
    assert credit["graph"]["num_actions"] == trajectory.num_actions == 3
    texts = [a.content for a in trajectory.actions]
    assert texts[1:] == list(ANSWERS[1:])  # the answers, whole
    assert [c.name for c in trajectory.actions[0].tool_calls] == ["get_order", "get_order"]
    assert not any("think>" in text or why in text for text in texts for why in REASONING)
    stored = [m["content"] for m in credit["messages"] if m["role"] == "assistant"]
    assert all(("<think>" in text) is thinking for text in stored)


def test_annotation_view_strips_reasoning_and_keeps_actions() -> None:
    from verl_credit.trajectory import Trajectory
    from verl_credit.verl.annotation import annotation_view

    messages = [
        {"role": "user", "content": "refund #W12"},
        {
            "role": "assistant",
            "content": f"<think>\n{REASONING[0]}\n</think>\n\n",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_order", "arguments": '{"order_id": "#W12"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "delivered"},
        {"role": "assistant", "content": "<think>\ncut off by the length limit"},  # unclosed: all reasoning
        {"role": "assistant", "content": f"<think>\n{REASONING[2]}\n</think>\n\n{ANSWERS[2]}"},
    ]
    trajectory = Trajectory.from_messages(messages, id="t", uid="u", reward=1.0, action_token_lengths=[7, 5, 9])
    view = annotation_view(trajectory)
    assert [a.content for a in view.actions] == ["", "", ANSWERS[2]]
    assert [a.length for a in view.actions] == [7, 5, 9] and view.actions[0].tool_calls == trajectory.actions[
        0
    ].tool_calls
    assert (view.id, view.uid, view.reward) == ("t", "u", 1.0)
    plain = Trajectory.from_messages([*messages[:1], {"role": "assistant", "content": "ok"}], id="p")
    assert annotation_view(plain) is plain
