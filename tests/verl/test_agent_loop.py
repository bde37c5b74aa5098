"""``credit_agent`` on CPU: a real tiny Qwen2 behind a server manager that runs it, verl's own
Continuous-Token builder and hermes parser, a scripted environment and simulated user.

Checked: recorded spans hold exactly the tokens the model generated for each request and parse
back to the transcript's assistant messages; user/tool tokens are masked; the assistant message
verl drops on a turn-limit or length cut is restored; per_request rows hold the same tokens;
the annotation runs in the loop and lands in ``extra_fields``.
"""

from __future__ import annotations

import asyncio
import time
from typing import ClassVar

import pytest
from verl_helpers import (
    DEFAULT_PLANS,
    TOOL_PLAN,
    FixedGraphAnnotator,
    SleepyAnnotator,
    TinyModelServer,
    compose_credit_config,
    make_agent_loop,
    run_session,
)

from verl_credit.annotate.base import ANNOTATORS, Annotator
from verl_credit.graph import validate_graph

#: slow: verl's agent loop on a tiny model
pytestmark = pytest.mark.slow

TASK = {"user_replies": ["card", "yes please"], "reward": 1.0}


def _config(*overrides: str):
    return compose_credit_config(
        [
            "actor_rollout_ref.rollout.prompt_length=512",
            "actor_rollout_ref.rollout.response_length=256",
            "credit.env.name=test_orders",
            "credit.annotator.in_rollout=false",
            *overrides,
        ]
    )


def _session_calls(server: TinyModelServer) -> list[dict]:
    assert len({call["request_id"] for call in server.calls}) == 1
    return server.calls


async def _parse(loop_parser, token_ids):
    return await loop_parser.extract_tool_calls(token_ids, [])


@pytest.mark.timeout(120)
def test_merged_spans_decode_to_messages(chatml_tokenizer, tiny_model, orders_env_cls):
    """Plans: tool call -> tool result; free sample -> user "card"; text -> user "yes please";
    free sample -> script exhausted, episode ends. 4 actions, one merged row."""
    tok = chatml_tokenizer
    server = TinyModelServer(tiny_model, tok, DEFAULT_PLANS)

    async def go():
        outputs, _ = await run_session(_config(), server, tok, "u1", 0, TASK)
        from verl.experimental.agent_loop.tool_parser import ToolParser

        parser = ToolParser.get_tool_parser("hermes", tok)
        parsed = []
        for _, start, end in outputs[0].extra_fields["credit"]["spans"]:
            parsed.append(await _parse(parser, outputs[0].response_ids[start:end]))
        return outputs, parsed

    outputs, parsed = asyncio.run(go())
    assert len(outputs) == 1
    out = outputs[0]
    credit = out.extra_fields["credit"]
    calls = _session_calls(server)
    assert len(calls) == 4 and credit["num_actions"] == 4
    assert credit["stop_reason"] == "user_done" and credit["truncated_action"] is None
    assert out.reward_score == 1.0 and out.extra_fields["reward_extra_info"] == {"env_reward": 1.0}
    # verl's server extra fields still reach the row (TQ tags need min/max_global_steps)
    assert out.extra_fields["min_global_steps"] == 1 and out.extra_fields["max_global_steps"] == 1

    spans = credit["spans"]
    assert [a for a, _, _ in spans] == [0, 1, 2, 3]
    mask = out.response_mask
    for (action, start, end), call in zip(spans, calls, strict=True):
        # the span is exactly the tokens the model returned for that request, all trainable
        assert out.response_ids[start:end] == call["token_ids"]
        assert mask[start:end] == [1] * (end - start)
        assert credit["action_lengths"][action] == end - start
    # nothing outside the spans is trainable, and the gaps hold the observations
    inside = {i for _, s, e in spans for i in range(s, e)}
    assert all(mask[i] == 0 for i in range(len(mask)) if i not in inside)
    gaps = [tok.decode(out.response_ids[spans[k][2] : spans[k + 1][1]]) for k in range(3)]
    assert '"status": "delivered"' in gaps[0] and "<tool_response>" in gaps[0]
    assert "card" in gaps[1] and "yes please" in gaps[2]
    assert sum(mask) == sum(e - s for _, s, e in spans)

    # each span parses (verl's hermes parser) to the transcript's assistant message
    assistants = [m for m in credit["messages"] if m["role"] == "assistant"]
    assert len(assistants) == 4
    eos = tok.eos_token
    for message, (content, tool_calls) in zip(assistants, parsed, strict=True):
        assert message["content"] == content.removesuffix(eos)
        assert [c["function"]["name"] for c in message.get("tool_calls", [])] == [c.name for c in tool_calls]
    assert assistants[0]["tool_calls"][0]["function"]["arguments"] == {"order_id": "#W12"}
    assert assistants[2]["content"] == "Refund to card done."
    roles = [m["role"] for m in credit["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user", "assistant", "user", "assistant"]
    # the user saw the transcript without chat markup (the EOS text verl's parser leaves in content)
    shown = orders_env_cls.shown[-3:]  # after actions 1, 2 and 3
    assert shown[1][-1] == {"role": "assistant", "content": "Refund to card done."}
    assert all(not str(m.get("content")).endswith(eos) for m in shown[-1])
    # the free turns really came from the model (greedy decoding of the random model)
    assert calls[1]["plan"] is None and len(calls[1]["token_ids"]) > 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("layout", ["merged", "per_request"])
def test_turn_limit_cut_restores_last_message(chatml_tokenizer, tiny_model, orders_env_cls, layout):
    """max_assistant_turns=2: verl stops after the 2nd generation without appending its message
    (verl's agent loop ends there); credit_agent appends it, so 2 spans <-> 2 assistant messages."""
    tok = chatml_tokenizer
    server = TinyModelServer(tiny_model, tok, [TOOL_PLAN, "Let me check that for you."])
    config = _config("actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2", f"credit.layout={layout}")
    outputs, _ = asyncio.run(run_session(config, server, tok, "u2", 0, TASK))
    final = outputs[-1].extra_fields["credit"]
    assert final["stop_reason"] == "max_assistant_turns" and final["truncated_action"] == 1
    assistants = [m for m in final["messages"] if m["role"] == "assistant"]
    assert [m["content"] for m in assistants] == ["", "Let me check that for you."]
    assert final["action_lengths"] == [len(call["token_ids"]) for call in server.calls]
    if layout == "merged":
        assert len(outputs) == 1 and [a for a, _, _ in final["spans"]] == [0, 1]
    else:
        assert len(outputs) == 2
        for row, (output, call) in enumerate(zip(outputs, server.calls, strict=True)):
            # per_request row: prompt = exactly the context the model saw, response = its tokens
            assert output.prompt_ids == call["prompt_ids"]
            assert output.response_ids == call["token_ids"] and output.response_mask == [1] * len(call["token_ids"])
            assert output.extra_fields["credit"]["spans"] == [[row, 0, len(call["token_ids"])]]
        assert outputs[0].reward_score is None and outputs[1].reward_score == 1.0


@pytest.mark.timeout(120)
def test_length_cut_clips_last_span(chatml_tokenizer, tiny_model, orders_env_cls):
    """response_length cuts the 2nd turn: its span is clipped to the response and its message is
    rebuilt from the tokens that remain (not from the full generation)."""
    tok = chatml_tokenizer
    long_text = "Refund to card done. " * 6
    server = TinyModelServer(tiny_model, tok, [TOOL_PLAN, long_text])
    probe = TinyModelServer(tiny_model, tok, [TOOL_PLAN, long_text])
    full, _ = asyncio.run(run_session(_config(), probe, tok, "probe", 0, TASK))
    full_spans = full[0].extra_fields["credit"]["spans"]
    limit = full_spans[1][1] + 10  # 10 tokens into the second action
    outputs, _ = asyncio.run(
        run_session(_config(f"actor_rollout_ref.rollout.response_length={limit}"), server, tok, "u3", 0, TASK)
    )
    out = outputs[0]
    credit = out.extra_fields["credit"]
    assert credit["stop_reason"] == "length" and credit["truncated_action"] == 1
    assert len(out.response_ids) == limit
    (_, s0, e0), (_, s1, e1) = credit["spans"]
    assert (s0, e0) == tuple(full_spans[0][1:]) and (s1, e1) == (full_spans[1][1], limit)
    assert out.response_ids[s1:e1] == server.calls[1]["token_ids"][:10]
    last = [m for m in credit["messages"] if m["role"] == "assistant"][-1]
    assert last["content"] == tok.decode(server.calls[1]["token_ids"][:10])
    assert credit["action_lengths"] == [e0 - s0, 10]


class HalfSecondAnnotator(FixedGraphAnnotator):
    """Takes 0.5 s and records when it ran (wall-clock intervals)."""

    delay_s = 0.5
    intervals: ClassVar[list[tuple[float, float]]] = []

    async def annotate_one(self, trajectory):
        started = time.perf_counter()
        result = await super().annotate_one(trajectory)
        HalfSecondAnnotator.intervals.append((started, time.perf_counter()))
        return result


@pytest.mark.timeout(120)
def test_annotation_runs_in_the_loop_while_others_generate(chatml_tokenizer, tiny_model, orders_env_cls, monkeypatch):
    """A session is annotated as soon as it ends, inside the rollout's event loop, while the
    other sessions keep generating: session 0 (2 requests) finishes first; the model requests of
    sessions 1-2 (4 requests each) run during its 0.5 s annotation. Every graph lands in
    extra_fields."""
    monkeypatch.setitem(ANNOTATORS, "test_half_second", HalfSecondAnnotator)
    monkeypatch.setattr(HalfSecondAnnotator, "intervals", [])
    tok = chatml_tokenizer
    server = TinyModelServer(tiny_model, tok, DEFAULT_PLANS)
    config = _config("credit.annotator.in_rollout=true", "credit.annotator.name=test_half_second")
    tasks = [{"user_replies": [], "reward": 0.0}, TASK, TASK]

    async def go():
        return await asyncio.gather(*(run_session(config, server, tok, "u4", i, t) for i, t in enumerate(tasks)))

    results = asyncio.run(go())
    first_start, first_end = min(HalfSecondAnnotator.intervals)
    session0 = server.calls[0]["request_id"]
    assert sum(1 for call in server.calls if call["request_id"] == session0) == 2
    overlapping = [c for c in server.calls if c["request_id"] != session0 and first_start < c["time"] < first_end]
    assert overlapping, "no generation ran while the first finished session was being annotated"
    for outputs, _ in results:
        credit = outputs[0].extra_fields["credit"]
        graph, validation = validate_graph(credit["graph"], credit["num_actions"])
        assert not validation.fallback and len(graph.edges) == 1 and graph.errors[0].action == 1
        assert credit["annotation"]["source"] == "test_fixed" and credit["annotation"]["seconds"] >= 0.5


@pytest.mark.timeout(60)
def test_annotation_failure_leaves_graph_to_trainer(chatml_tokenizer, tiny_model, orders_env_cls, monkeypatch):
    class Broken(Annotator):
        async def annotate_one(self, trajectory):
            raise RuntimeError("annotator down")

    monkeypatch.setitem(ANNOTATORS, "test_broken", Broken)
    server = TinyModelServer(tiny_model, chatml_tokenizer, DEFAULT_PLANS)
    config = _config("credit.annotator.in_rollout=true", "credit.annotator.name=test_broken")
    outputs, _ = asyncio.run(run_session(config, server, chatml_tokenizer, "u5", 0, TASK))
    credit = outputs[0].extra_fields["credit"]
    assert "graph" not in credit and "annotator down" in credit["annotation_error"]
    assert credit["messages"]  # the trainer can still annotate it


@pytest.mark.timeout(60)
def test_scripted_user_from_config(chatml_tokenizer, tiny_model, orders_env_cls):
    """credit.user.name=scripted: replies come from credit.user.script, then the user ends."""
    server = TinyModelServer(tiny_model, chatml_tokenizer, DEFAULT_PLANS)
    config = _config("credit.user.name=scripted", "credit.user.script=[store credit]")
    outputs, _ = asyncio.run(run_session(config, server, chatml_tokenizer, "u7", 0, TASK))
    credit = outputs[0].extra_fields["credit"]
    users = [m["content"] for m in credit["messages"] if m["role"] == "user"]
    assert users == ["refund order #W12 please", "store credit"] and credit["stop_reason"] == "user_done"
    assert credit["num_actions"] == 3


@pytest.mark.timeout(60)
def test_env_is_closed_and_unknown_env_is_named(chatml_tokenizer, tiny_model, orders_env_cls):
    server = TinyModelServer(tiny_model, chatml_tokenizer, DEFAULT_PLANS)
    with pytest.raises(ValueError, match="unknown environment 'nope'"):
        asyncio.run(run_session(_config("credit.env.name=nope"), server, chatml_tokenizer, "u6", 0, TASK))


@pytest.mark.timeout(120)
def test_demo_service_env_with_rule_annotator(chatml_tokenizer, tiny_model):
    """The demo service world (scripted customer) + the built-in rule annotator in the loop."""
    plans = [
        '<tool_call>\n{"name": "get_order_details", "arguments": {"order_id": "#W1001"}}\n</tool_call>',
        "Which order would you like to refund, and to which payment method?",
        None,
    ]
    server = TinyModelServer(tiny_model, chatml_tokenizer, plans)
    config = _config("credit.env.name=service", "credit.annotator.in_rollout=true", "credit.annotator.name=rules")
    outputs, _ = asyncio.run(run_session(config, server, chatml_tokenizer, "svc", 0, {"seed": 3}))
    out = outputs[0]
    credit = out.extra_fields["credit"]
    assert credit["env"] == "service" and out.reward_score in (0.0, 1.0)
    assert credit["annotation"]["source"] in ("rules", "fallback:uniform")
    graph, validation = validate_graph(credit["graph"], credit["num_actions"])
    assert not validation.fallback and graph.num_actions == credit["num_actions"] == len(server.calls)
    assert {t["function"]["name"] for t in credit["tools"]} >= {"get_order_details"}
    assert sum(out.response_mask) == sum(e - s for _, s, e in credit["spans"])
    roles = [m["role"] for m in credit["messages"]]
    assert roles[:4] == ["system", "user", "assistant", "tool"] and "user" in roles[4:]


@pytest.mark.timeout(120)
def test_call_credit_call_graph_built_in_the_loop(chatml_tokenizer, tiny_model, orders_env_cls):
    """call_credit: the rule call classifier (verl_credit.annotate.roles) runs when the episode
    ends; the call graph (one call per action) travels in extra_fields."""
    from verl_credit.call_graph import CallGraph

    server = TinyModelServer(tiny_model, chatml_tokenizer, DEFAULT_PLANS)
    config = _config("algorithm.adv_estimator=call_credit", "credit.annotator.in_rollout=true")
    outputs, _ = asyncio.run(run_session(config, server, chatml_tokenizer, "cc", 0, TASK))
    credit = outputs[0].extra_fields["credit"]
    graph = CallGraph.from_json(credit["call_graph"])
    assert graph.num_calls == credit["num_actions"] == 4
    assert set(graph.roles) <= {"IG", "AE", "RV"} and credit["annotation"]["source"] == "roles"


# ---------------------------------------------------------------- cluster readiness

NESTED_TOOL = {
    "type": "function",
    "function": {
        "name": "book",
        "description": "Book a reservation.",
        "parameters": {
            "$defs": {
                "Passenger": {
                    "type": "object",
                    "properties": {"first_name": {"type": "string"}, "dob": {"type": "string", "format": "date"}},
                    "required": ["first_name"],
                }
            },
            "type": "object",
            "properties": {
                "passengers": {"type": "array", "items": {"$ref": "#/$defs/Passenger"}},
                "item_ids": {"type": "array", "items": {"type": "string"}},
                "payment": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
                "flight": {"type": "object", "properties": {"number": {"type": "string"}}},
            },
            "required": ["passengers"],
        },
    },
}


def _nested_env_cls(orders_env_cls):
    from verl_credit.envs.base import ENVIRONMENTS, EpisodeStart, register_environment

    if "test_orders_nested" not in ENVIRONMENTS:

        @register_environment("test_orders_nested")
        class NestedOrdersEnv(orders_env_cls):
            async def start(self, task):
                start = await super().start(task)
                return EpisodeStart(start.system_prompt, [*start.tools, NESTED_TOOL], start.first_user_message, {})

    return ENVIRONMENTS["test_orders_nested"]


@pytest.mark.timeout(120)
def test_prompt_and_annotator_get_the_full_tool_schemas(chatml_tokenizer, tiny_model, orders_env_cls):
    """verl's OpenAIFunctionToolSchema keeps only type/description/enum per property; the prompt
    the policy sees and the schemas the annotator checks against must be the environment's own."""
    import json

    _nested_env_cls(orders_env_cls)
    tok = chatml_tokenizer
    server = TinyModelServer(tiny_model, tok, ["Done."])
    config = _config("credit.env.name=test_orders_nested", "actor_rollout_ref.rollout.prompt_length=2048")
    outputs, _ = asyncio.run(run_session(config, server, tok, "schema", 0, {"user_replies": [], "reward": 1.0}))
    credit = outputs[0].extra_fields["credit"]
    assert credit["tools"][1] == NESTED_TOOL
    prompt = tok.decode(server.calls[0]["prompt_ids"])
    for piece in ('"$ref": "#/$defs/Passenger"', '"anyOf"', '"format": "date"', '"items": {"type": "string"}'):
        assert piece in prompt, piece
    # exactly the chat template's rendering of the full schemas (what evaluation shows)
    expected = tok.apply_chat_template(
        [
            {"role": "system", "content": "You are a support agent."},
            {"role": "user", "content": "refund order #W12 please"},
        ],
        tools=credit["tools"],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert prompt == expected and json.dumps(NESTED_TOOL["function"]["parameters"]["$defs"]) in prompt


def test_tau2_schemas_reach_the_prompt_unchanged():
    """All of tau2's agent tool schemas (airline's book_reservation with its $defs, retail's
    item_ids arrays ...) survive EnvironmentTool; verl's schema dump would change them."""
    from verl_credit.envs.tau2.domains import agent_tool_schemas
    from verl_credit.verl.agent_loop import EnvironmentTool, prompt_tool_schema

    schemas = [s for d in ("airline", "retail", "telecom") for s in agent_tool_schemas(d)]
    tools = [EnvironmentTool(schema) for schema in schemas]
    assert [prompt_tool_schema(tool) for tool in tools] == schemas
    stripped = [t.tool_schema.model_dump(exclude_unset=True, exclude_none=True) for t in tools]
    assert sum(a != b for a, b in zip(stripped, schemas, strict=True)) > 0  # the defect this guards against


TWO_CALLS_PLAN = TOOL_PLAN + "\n" + TOOL_PLAN.replace("#W12", "#W99")


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("max_parallel", "executed", "dropped"), [(1, 1, 1), (4, 2, 0)])
def test_parallel_tool_calls_executed_or_counted(
    chatml_tokenizer, tiny_model, orders_env_cls, max_parallel, executed, dropped
):
    """Two calls in one turn: verl runs the first max_parallel_calls; what it drops is counted."""
    tok = chatml_tokenizer
    server = TinyModelServer(tiny_model, tok, [TWO_CALLS_PLAN, "Done."])
    config = _config(f"actor_rollout_ref.rollout.multi_turn.max_parallel_calls={max_parallel}")
    outputs, _ = asyncio.run(run_session(config, server, tok, f"par{max_parallel}", 0, {"user_replies": []}))
    credit = outputs[0].extra_fields["credit"]
    assert credit["dropped_tool_calls"] == dropped
    first = next(m for m in credit["messages"] if m["role"] == "assistant")
    assert len(first["tool_calls"]) == executed
    assert sum(1 for m in credit["messages"] if m["role"] == "tool") == executed


@pytest.mark.timeout(60)
@pytest.mark.parametrize("in_validation", [False, True])
def test_validation_episodes_are_not_annotated(chatml_tokenizer, tiny_model, orders_env_cls, in_validation):
    """Rows the credit trainer tags credit_validate skip annotation unless annotator.in_validation."""
    server = TinyModelServer(tiny_model, chatml_tokenizer, DEFAULT_PLANS)
    config = _config("credit.annotator.in_rollout=true", f"credit.annotator.in_validation={in_validation}")
    kwargs = {
        "raw_prompt": [{"role": "user", "content": "unused"}],
        "extra_info": {"task": TASK},
        "uid": "val",
        "session_id": 0,
        "credit_validate": True,
    }

    async def go():  # verl's agent loop binds to the running event loop
        return await make_agent_loop(config, server, chatml_tokenizer).run({"temperature": 0.0}, **kwargs)

    credit = asyncio.run(go()).extra_fields["credit"]
    assert ("graph" in credit) is in_validation and credit.get("validation", False) is (not in_validation)
    assert credit["messages"] and credit["num_actions"] == 4


@pytest.mark.timeout(60)
def test_annotation_deadline_marks_the_session(chatml_tokenizer, tiny_model, orders_env_cls, monkeypatch):
    """An annotation slower than credit.annotator.deadline leaves the session marked (the trainer
    gives it the fallback) instead of holding the episode."""
    monkeypatch.setitem(ANNOTATORS, "test_sleepy", SleepyAnnotator)
    server = TinyModelServer(tiny_model, chatml_tokenizer, DEFAULT_PLANS)
    config = _config(
        "credit.annotator.in_rollout=true", "credit.annotator.name=test_sleepy", "credit.annotator.deadline=0.05"
    )
    outputs, _ = asyncio.run(run_session(config, server, chatml_tokenizer, "late", 0, TASK))
    credit = outputs[0].extra_fields["credit"]
    assert credit["annotation_timeout"] is True and "graph" not in credit and "deadline" in credit["annotation_error"]


@pytest.mark.timeout(60)
def test_rule_annotation_and_call_roles_leave_the_event_loop_free(
    chatml_tokenizer, tiny_model, orders_env_cls, monkeypatch
):
    """The rule annotator and the call classifier run in worker threads: while they are blocked,
    another coroutine on the same loop runs (and is what unblocks them). On the loop, the wait
    would block that coroutine and time out."""
    import threading

    import verl_credit.annotate.rules as rules
    import verl_credit.verl.annotation as annotation

    released = threading.Event()
    blocked_on_loop: list[str] = []

    def blocking(original, name):
        def wrapper(*args, **kwargs):
            if not released.wait(timeout=10):
                blocked_on_loop.append(name)
            return original(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(rules, "annotate_rules", blocking(rules.annotate_rules, "rules"))
    monkeypatch.setattr(annotation, "build_call_graph", blocking(annotation.build_call_graph, "roles"))
    server = TinyModelServer(tiny_model, chatml_tokenizer, DEFAULT_PLANS)
    config = _config("credit.annotator.in_rollout=true", "credit.annotator.name=rules")

    async def release_soon():
        for _ in range(20):  # let the session reach its annotation first
            await asyncio.sleep(0.05)
        released.set()

    async def go():
        outputs, _ = (
            await asyncio.gather(run_session(config, server, chatml_tokenizer, "free", 0, TASK), release_soon())
        )[0]
        return outputs

    credit = asyncio.run(go())[0].extra_fields["credit"]
    assert not blocked_on_loop and "graph" in credit and "call_graph" in credit


@pytest.mark.timeout(60)
def test_tool_turn_is_one_environment_step_and_the_env_can_end_it(chatml_tokenizer, tiny_model, orders_env_cls):
    """The calls of one turn run inside the environment's tool step (tau2 counts one step per
    message and fails the calls verl answered itself); an environment that ends the episode there
    (tau2's max_errors) stops the loop at once: no further generation."""
    from verl_credit.envs.base import ENVIRONMENTS, register_environment

    steps: list[tuple[str, int]] = []
    if "test_orders_limited" not in ENVIRONMENTS:

        @register_environment("test_orders_limited")
        class LimitedOrdersEnv(orders_env_cls):
            over = False

            def begin_tool_step(self) -> None:
                steps.append(("begin", len(self.tool_calls)))

            def end_tool_step(self, num_calls: int) -> None:
                steps.append(("end", num_calls))
                self.over = True  # e.g. the error limit was reached by this message

            @property
            def episode_over(self) -> bool:
                return self.over

    server = TinyModelServer(tiny_model, chatml_tokenizer, [TWO_CALLS_PLAN, "Done."])
    config = _config("credit.env.name=test_orders_limited", "actor_rollout_ref.rollout.multi_turn.max_parallel_calls=4")
    outputs, _ = asyncio.run(run_session(config, server, chatml_tokenizer, "lim", 0, {"user_replies": ["more"]}))
    credit = outputs[0].extra_fields["credit"]
    assert steps == [("begin", 0), ("end", 2)]
    assert credit["stop_reason"] == "env_done" and credit["num_actions"] == 1 and len(server.calls) == 1


#: one call verl's hermes parser decodes and two it drops (bad JSON; no "arguments")
MALFORMED_PLAN = (
    TOOL_PLAN
    + '\n<tool_call>\n{"name": "get_order", "arguments": {"order_id": }\n</tool_call>'
    + '\n<tool_call>\n{"name": "get_order"}\n</tool_call>'
)


@pytest.mark.timeout(120)
def test_malformed_tool_calls_are_counted_per_session(chatml_tokenizer, tiny_model, orders_env_cls):
    """verl's parser drops a tool call it cannot decode and only logs it; the loop counts them per
    session (the payload's malformed_tool_calls, summed by the trainer into a metric), and only the
    session that wrote them: two sessions run concurrently on one event loop."""
    tok = chatml_tokenizer
    config = _config("actor_rollout_ref.rollout.multi_turn.max_parallel_calls=4")

    async def both():
        bad = run_session(config, TinyModelServer(tiny_model, tok, [MALFORMED_PLAN, "Done."]), tok, "bad", 0, TASK)
        good = run_session(config, TinyModelServer(tiny_model, tok, DEFAULT_PLANS), tok, "good", 0, TASK)
        return await asyncio.gather(bad, good)

    (bad_outputs, _), (good_outputs, _) = asyncio.run(both())
    bad = bad_outputs[-1].extra_fields["credit"]
    good = good_outputs[-1].extra_fields["credit"]
    assert bad["malformed_tool_calls"] == 2
    assert good["malformed_tool_calls"] == 0
    first = next(m for m in bad["messages"] if m["role"] == "assistant")
    assert len(first["tool_calls"]) == 1  # the one call that decoded was executed
