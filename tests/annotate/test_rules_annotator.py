"""Rule annotator (docs/design.md section 5 ``rules``): exact edges, errors and direct inputs on hand-written
transcripts, the uncertainty criteria, malformed content, and routing of its graphs through IAPO.

The transcripts with their hand-derived expectations live in ``tests/data/rules/*.json``; each file's
``expected.notes`` spells out the derivation (which source covers which unit, why an edge has its sign).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verl_credit.annotate import rules as rules_module
from verl_credit.annotate.base import AnnotationStats
from verl_credit.annotate.factory import build_annotator
from verl_credit.annotate.rules import RULES_VERSION, RuleAnnotator, annotate_rules, trace_rules
from verl_credit.annotate.rules_dialog import (
    error_evidence,
    is_affirmation,
    is_generic_offer,
    is_proposal,
    is_rejection,
    ordinal_choice,
    parse_options,
)
from verl_credit.annotate.rules_values import atomize, canonical_call_signature, extract_units
from verl_credit.batch_credit import compute_batch_credit
from verl_credit.config import CreditConfig
from verl_credit.graph import validate_graph
from verl_credit.trajectory import Trajectory

DATA = Path(__file__).parents[1] / "data" / "rules"
CASES = sorted(DATA.glob("*.json"))


def load_case(name: str) -> tuple[Trajectory, dict[str, Any]]:
    case = json.loads((DATA / f"{name}.json").read_text())
    return Trajectory.from_record(case["record"]), case["expected"]


def codes(reasons: list[str]) -> set[str]:
    return {reason.split()[0] for reason in reasons}


def call(call_id: str, name: str, args: Any) -> dict[str, Any]:
    arguments = args if isinstance(args, str) else json.dumps(args)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def tool_action(call_id: str, name: str, args: Any, result: Any, content: str = "") -> list[dict[str, Any]]:
    return [
        {"role": "assistant", "content": content, "tool_calls": [call(call_id, name, args)]},
        {"role": "tool", "tool_call_id": call_id, "content": result if isinstance(result, str) else json.dumps(result)},
    ]


def edge_set(graph_json: dict[str, Any]) -> set[tuple[int, int, str, str]]:
    return {(e["src"], e["dst"], e["sign"], e["type"]) for e in graph_json["edges"]}


# ---------------------------------------------------------------------------------------------
# Hand-written transcripts
# ---------------------------------------------------------------------------------------------


def test_there_are_at_least_eight_transcripts() -> None:
    assert len(CASES) >= 8


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_transcript_gives_exactly_the_expected_graph(path: Path) -> None:
    trajectory, expected = load_case(path.stem)
    graph, validation, uncertain = annotate_rules(trajectory)
    got = graph.to_json()

    expected_edges = {(e["src"], e["dst"], e["sign"], e["type"]) for e in expected["edges"]}
    assert edge_set(got) == expected_edges
    units = {(e["src"], e["dst"], e["sign"]): e["unit"] for e in got["edges"]}
    for edge in expected["edges"]:
        assert edge["unit_contains"] in units[(edge["src"], edge["dst"], edge["sign"])]
    assert {(m["action"], m["kind"]) for m in got["errors"]} == {(m["action"], m["kind"]) for m in expected["errors"]}
    assert got["direct_user_inputs"] == expected["direct_user_inputs"]
    assert uncertain is expected["uncertain"]
    assert codes(trace_rules(trajectory).uncertain_reasons) == set(expected["uncertain_codes"])
    # the rules emit a graph the validator accepts untouched
    assert not validation.fallback
    assert validation.repaired_edges == 0
    assert validation.errors_added == 0


def test_design_section8_example_edges_in_detail() -> None:
    # docs/design.md section 8: a0 asks "To card or store credit?", the user answers "card" (source_action 0);
    # a1 get_order(#W12); a2 refund(#W12, card).
    # Expected: 0->2 + input unit method=card; 1->2 + success_utilization unit order_id=#W12; u_1 = 1.
    trajectory, _ = load_case("design_section8_refund")
    graph, _, uncertain = annotate_rules(trajectory)
    by_pair = {(e.src, e.dst): e for e in graph.edges}
    assert set(by_pair) == {(0, 2), (1, 2)}
    assert by_pair[(0, 2)].type == "input"
    assert by_pair[(0, 2)].unit.startswith("method=card")
    assert by_pair[(1, 2)].unit == "order_id=#W12"
    assert graph.direct_user_inputs == ((1, 1),)
    assert graph.errors == ()
    d_plus, d_minus, d_in = graph.degrees()
    assert d_plus.tolist() == [1, 1, 0]
    assert d_minus.tolist() == [0, 0, 0]
    assert d_in.tolist() == [0, 1, 2]  # u_1 = 1; two + edges into a2
    assert not uncertain


def test_greeting_reply_is_direct_input() -> None:
    # "How can I help you today?" is a generic offer, not a question (trajectory.asks_user), so the
    # reply is unelicited; the rules agree (docs/design.md: greetings have no edges).
    trajectory, _ = load_case("greeting_closing_no_edges")
    replies = [o for o in trajectory.observations if o.role == "user"]
    assert replies[0].source_action is None
    graph, _, _ = annotate_rules(trajectory)
    assert graph.edges == ()
    assert graph.direct_user_inputs == ((1, 1),)


# ---------------------------------------------------------------------------------------------
# Rules exercised one at a time on small transcripts
# ---------------------------------------------------------------------------------------------


def test_reusing_a_value_named_in_an_error_gives_a_failed_use_edge() -> None:
    # a0 get_order(#W99) -> "order #W99 not found" (names the value); a1 refund(#W99, card) reuses it.
    # -> e_0 = 1, 0->1 '-' failed_utilization unit order_id=#W99; "card" is in no earlier message -> U1.
    messages = [
        {"role": "user", "content": "refund #W99"},
        *tool_action("c1", "get_order", {"order_id": "#W99"}, "Error: order #W99 not found"),
        *tool_action("c2", "refund", {"order_id": "#W99", "method": "card"}, {"status": "refunded"}),
    ]
    trace = trace_rules(Trajectory.from_messages(messages))
    assert edge_set(trace.raw_graph) == {(0, 1, "-", "failed_utilization")}
    assert trace.raw_graph["edges"][0]["unit"] == "order_id=#W99"
    assert trace.raw_graph["errors"] == [{"action": 0, "kind": "tool_error", "evidence": "Error: order #W99 not found"}]
    assert trace.raw_graph["direct_user_inputs"] == {"0": 1}  # a1's #W99 is a failed use, not counted again
    assert codes(trace.uncertain_reasons) == {"U1"}


def test_value_resupplied_by_the_user_after_the_error_is_not_a_failed_use() -> None:
    # Same error, but a1 asks and the user repeats "#W99" -> a2 get_order(#W99) is a repeat of the
    # failing call (0->2 '-'); the reply only restates what the opening request gave, so #W99 is
    # a direct input of a2, not a '+' edge from a1 (the earliest supply wins, docs/design.md 2.1).
    messages = [
        {"role": "user", "content": "status of #W99?"},
        *tool_action("c1", "get_order", {"order_id": "#W99"}, "Error: order #W99 not found"),
        {"role": "assistant", "content": "I could not find #W99. Could you confirm the order id?"},
        {"role": "user", "content": "It is definitely #W99."},
        *tool_action("c2", "get_order", {"order_id": "#W99"}, {"order_id": "#W99", "status": "pending"}),
    ]
    graph = trace_rules(Trajectory.from_messages(messages)).raw_graph
    assert edge_set(graph) == {(0, 2, "-", "failed_utilization")}
    assert graph["direct_user_inputs"] == {"0": 1, "2": 1}


def test_generic_error_on_a_multi_argument_call_is_uncertain_when_reused() -> None:
    # a0 update(order, address) -> "Error: request failed" names neither value -> which one was wrong
    # is unknown; a1 reuses the order id -> U6 (and no '-' edge).
    messages = [
        {"role": "user", "content": "ship #W5 to 1 Main St"},
        *tool_action("c1", "update_address", {"order_id": "#W5", "address1": "1 Main St"}, "Error: request failed"),
        *tool_action("c2", "get_order", {"order_id": "#W5"}, {"order_id": "#W5"}),
    ]
    trace = trace_rules(Trajectory.from_messages(messages))
    assert [e["sign"] for e in trace.raw_graph["edges"]] == []
    assert trace.raw_graph["direct_user_inputs"] == {"0": 2, "1": 1}
    assert codes(trace.uncertain_reasons) == {"U6"}


def test_equally_good_sources_are_uncertain_and_tie_to_the_earliest() -> None:
    # "gift_card_1" comes from a0's elicited reply and, independently, from a1's tool result (not an
    # echo of a1's arguments). Set cover: one unit each -> tie -> earliest (a0) and U2.
    messages = [
        {"role": "user", "content": "I want a refund."},
        {"role": "assistant", "content": "Which payment method should receive it?"},
        {"role": "user", "content": "gift_card_1 please"},
        *tool_action("c1", "list_payment_methods", {}, {"methods": ["gift_card_1", "paypal_2"]}),
        *tool_action("c2", "refund", {"payment_method_id": "gift_card_1"}, {"status": "ok"}),
    ]
    trace = trace_rules(Trajectory.from_messages(messages))
    assert edge_set(trace.raw_graph) == {(0, 2, "+", "input")}
    assert codes(trace.uncertain_reasons) == {"U2"}


def test_confirmation_binds_to_the_write_call_not_an_intervening_read() -> None:
    # a0 proposes, "yes" -> a1 is a read (get_order), a2 the write (cancel_order): edge 0->2 only.
    messages = [
        {"role": "user", "content": "cancel #W8"},
        {"role": "assistant", "content": "I will cancel order #W8. Shall I proceed?"},
        {"role": "user", "content": "Yes, go ahead."},
        *tool_action("c1", "get_order", {"order_id": "#W8"}, {"order_id": "#W8", "status": "pending"}),
        *tool_action("c2", "cancel_order", {"order_id": "#W8"}, {"status": "cancelled"}),
    ]
    graph = trace_rules(Trajectory.from_messages(messages)).raw_graph
    # a1: #W8 from the opening request -> u_1 = 1; a2: #W8 from a1's result -> 1->2; confirmation 0->2.
    assert edge_set(graph) == {(0, 2, "+", "input"), (1, 2, "+", "success_utilization")}
    assert graph["direct_user_inputs"] == {"1": 1}
    confirm = next(e for e in graph["edges"] if e["src"] == 0)
    assert confirm["unit"] == "confirmation"


def test_declined_proposal_is_a_rejection_and_gets_no_confirmation_edge() -> None:
    messages = [
        {"role": "user", "content": "cancel #W8"},
        {"role": "assistant", "content": "Would you like me to cancel order #W8 now?"},
        {"role": "user", "content": "No."},
        *tool_action("c1", "cancel_order", {"order_id": "#W8"}, {"status": "cancelled"}),
    ]
    graph = trace_rules(Trajectory.from_messages(messages)).raw_graph
    assert graph["errors"] == [{"action": 0, "kind": "user_rejection", "evidence": "No."}]
    assert graph["edges"] == []
    assert graph["direct_user_inputs"] == {"1": 1}


def test_choice_by_description_resolves_through_the_tool_record() -> None:
    # Options name no id ("Red" / "Green"); "the green one" -> the smallest record holding "green"
    # is variant 22 of a0's result -> the call using 22 gets 1->2 (choice) while 22 traces to a0.
    messages = [
        {"role": "user", "content": "exchange my mug"},
        *tool_action(
            "c1",
            "get_product",
            {"product_id": "P1"},
            {"variants": {"21": {"item_id": "21", "color": "red"}, "22": {"item_id": "22", "color": "green"}}},
        ),
        {"role": "assistant", "content": "Available colours:\n- Red\n- Green\nWhich one would you like?"},
        {"role": "user", "content": "the green one"},
        *tool_action("c2", "exchange_item", {"new_item_id": "22"}, {"status": "ok"}),
    ]
    trace = trace_rules(Trajectory.from_messages(messages))
    assert edge_set(trace.raw_graph) == {(0, 2, "+", "success_utilization"), (1, 2, "+", "input")}
    choice = next(e for e in trace.raw_graph["edges"] if e["src"] == 1)
    assert choice["unit"] == "choice=Green"
    assert codes(trace.uncertain_reasons) == {"U1"}  # "P1" appears nowhere before a0


def test_choice_is_not_bound_to_a_call_that_ignores_it() -> None:
    # The user picks "gift card"; the agent refunds to credit_card_55 anyway. "card" is shared by both
    # options, so only "gift" is distinctive: the credit card call does not act on the choice -> no
    # choice edge, U5. (credit_card_55 itself traces to a0's result.)
    messages = [
        {"role": "user", "content": "refund #W1"},
        *tool_action("c1", "get_order", {"order_id": "#W1"}, {"order_id": "#W1", "payment": "credit_card_55"}),
        {"role": "assistant", "content": "Refund to your credit card or to a gift card?"},
        {"role": "user", "content": "The gift card, please."},
        *tool_action("c2", "refund_order", {"order_id": "#W1", "payment_method_id": "credit_card_55"}, {"ok": True}),
    ]
    trace = trace_rules(Trajectory.from_messages(messages))
    assert edge_set(trace.raw_graph) == {(0, 2, "+", "success_utilization")}
    assert codes(trace.uncertain_reasons) == {"U5"}


def test_choice_that_no_call_uses_is_uncertain() -> None:
    messages = [
        {"role": "user", "content": "help with #W1"},
        {"role": "assistant", "content": "Would you like a refund or an exchange?"},
        {"role": "user", "content": "An exchange."},
        *tool_action("c1", "get_order", {"order_id": "#W1"}, {"order_id": "#W1"}),
    ]
    trace = trace_rules(Trajectory.from_messages(messages))
    assert trace.raw_graph["edges"] == []
    assert codes(trace.uncertain_reasons) == {"U5"}


def test_choice_names_the_branch_through_the_tool_name() -> None:
    # "exchange" is the chosen option; the first later call whose tool name holds it acts on the choice.
    messages = [
        {"role": "user", "content": "help with #W1"},
        {"role": "assistant", "content": "Would you like a refund or an exchange?"},
        {"role": "user", "content": "An exchange."},
        *tool_action("c1", "get_order", {"order_id": "#W1"}, {"order_id": "#W1"}),
        *tool_action("c2", "exchange_items", {"order_id": "#W1"}, {"status": "ok"}),
    ]
    trace = trace_rules(Trajectory.from_messages(messages))
    assert edge_set(trace.raw_graph) == {(0, 2, "+", "input"), (1, 2, "+", "success_utilization")}
    assert not trace.uncertain


def test_schema_checks_against_the_tool_list() -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_order",
                "parameters": {
                    "type": "object",
                    "properties": {"order_id": {"type": "string"}},
                    "required": ["order_id"],
                },
            },
        }
    ]
    messages = [
        {"role": "user", "content": "status of #W3"},
        *tool_action("c1", "get_order", {"id": "#W3"}, {"order_id": "#W3"}),
        *tool_action("c2", "get_ordr", {"order_id": "#W3"}, {"order_id": "#W3"}),
    ]
    trajectory = Trajectory.from_messages(messages)
    graph, _, _ = annotate_rules(trajectory, tools=tools)
    assert [(m.action, m.kind) for m in graph.errors] == [(0, "schema_error"), (1, "schema_error")]
    assert "missing required argument(s) order_id" in graph.errors[0].evidence
    assert "unknown tool 'get_ordr'" in graph.errors[1].evidence
    # without a tool list neither call is an error (both results look fine)
    graph_no_tools, _, _ = annotate_rules(trajectory)
    assert graph_no_tools.errors == ()
    # the record's own "tools" field is used when the option is not given
    record = {"id": "x", "reward": 0.0, "messages": messages, "tools": tools}
    graph_from_record, _, _ = annotate_rules(Trajectory.from_record(record))
    assert [m.kind for m in graph_from_record.errors] == ["schema_error", "schema_error"]


def test_is_error_flag_on_a_tool_message_marks_a_tool_error() -> None:
    messages = [
        {"role": "user", "content": "status of #W3"},
        {"role": "assistant", "content": "", "tool_calls": [call("c1", "get_order", {"order_id": "#W3"})]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"detail": "timeout"}', "is_error": True},
    ]
    graph, _, _ = annotate_rules(Trajectory.from_messages(messages))
    assert [(m.action, m.kind) for m in graph.errors] == [(0, "tool_error")]


# ---------------------------------------------------------------------------------------------
# Malformed content never raises
# ---------------------------------------------------------------------------------------------


ORPHAN_TOOL_AND_PARTS = [
    {"role": "tool", "content": "orphan result"},
    {"role": "assistant", "content": [{"type": "text", "text": "x"}]},
]
EMPTY_ARGUMENTS = [
    {"role": "user", "content": "#W1"},
    {"role": "assistant", "content": "", "tool_calls": [call("c", "f", "")]},
]
DEEP_AND_LONG = [
    {"role": "assistant", "content": "", "tool_calls": [call("c", "f", {"a": {"b": [None, True, 1e308, "x" * 5000]}})]}
]


@pytest.mark.parametrize(
    "messages, num_actions",
    [
        ([], 0),
        ([{"role": "assistant", "content": "Hello!"}, {"role": "assistant", "content": "Anyone there?"}], 2),
        ([{"role": "assistant", "content": None, "tool_calls": [call("c", "f", "[1, 2]")]}], 1),
        (ORPHAN_TOOL_AND_PARTS, 1),
        (EMPTY_ARGUMENTS, 1),
        (DEEP_AND_LONG, 1),
    ],
    ids=["empty", "assistant-only", "list-arguments", "orphan-tool-and-parts", "empty-arguments", "deep-and-long"],
)
def test_malformed_transcripts_give_a_valid_graph(messages: list[dict[str, Any]], num_actions: int) -> None:
    trajectory = Trajectory.from_messages(messages)
    graph, validation, _ = annotate_rules(trajectory)
    assert graph.num_actions == num_actions
    assert not validation.fallback
    assert validation.repaired_edges == 0
    again, _ = validate_graph(graph.to_json(), num_actions)
    assert again == graph


_WORDS = st.sampled_from(
    [
        "#W12",
        "W12",
        "card",
        "store_credit",
        "yes",
        "no",
        "Error:",
        "not found",
        "the second one",
        "1.",
        "2.",
        "?",
        "or",
        "42",
        "3pm",
        "a@b.co",
        "don't do that",
        "Actually",
        "instead",
        "Hello!",
        "anything else",
        "{",
        "}",
        ":",
        "\n",
        "shall I proceed",
        "gift_card_7",
        "1,204.50",
        "'",
        '"',
        "-",
        "#",
        "$",
    ]
)
_TEXT = st.lists(_WORDS, max_size=12).map(" ".join)
_ARGS = st.one_of(
    _TEXT,  # usually not JSON
    st.dictionaries(
        st.sampled_from(["order_id", "method", "item_ids", "x"]),
        st.one_of(_TEXT, st.integers(-20, 5000), st.lists(_TEXT, max_size=3), st.none()),
        max_size=3,
    ).map(json.dumps),
)


@st.composite
def chat_transcripts(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Random role sequences with random text, tool calls (valid or broken JSON), and tool results
    whose ``tool_call_id`` may or may not match a call. Always a well-formed chat structure."""
    messages: list[dict[str, Any]] = []
    call_ids: list[str] = []
    for position in range(draw(st.integers(0, 14))):
        role = draw(st.sampled_from(["user", "assistant", "assistant_call", "tool", "system"]))
        if role == "assistant_call":
            call_id = f"c{position}"
            call_ids.append(call_id)
            name = draw(st.sampled_from(["get_order", "refund", "exchange_items", "find_user"]))
            messages.append(
                {"role": "assistant", "content": draw(_TEXT), "tool_calls": [call(call_id, name, draw(_ARGS))]}
            )
        elif role == "tool":
            call_id = draw(st.sampled_from([*call_ids, "unknown"])) if call_ids else "unknown"
            messages.append({"role": "tool", "tool_call_id": call_id, "content": draw(_TEXT)})
        else:
            messages.append({"role": role, "content": draw(_TEXT)})
    return messages


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chat_transcripts())
def test_random_transcripts_never_break_the_rules(messages: list[dict[str, Any]]) -> None:
    trajectory = Trajectory.from_messages(messages)
    trace = trace_rules(trajectory)  # the raw rules themselves do not raise (no fallback needed)
    graph, validation = validate_graph(trace.raw_graph, trajectory.num_actions)
    assert not validation.fallback
    assert validation.repaired_edges == 0  # the rules emit only valid edges
    assert all(edge.src < edge.dst for edge in graph.edges)
    assert all(0 <= mark.action < trajectory.num_actions for mark in graph.errors)
    # every failed-use source is an error (the rules mark it themselves; the validator adds nothing)
    assert validation.errors_added == 0


def test_list_arguments_are_a_schema_error_and_uncertain() -> None:
    trajectory = Trajectory.from_messages(
        [{"role": "assistant", "content": "", "tool_calls": [call("c", "get_order", '["#W1"]')]}]
    )
    graph, _, uncertain = annotate_rules(trajectory)
    assert [m.kind for m in graph.errors] == ["schema_error"]
    assert uncertain


def test_an_exception_inside_the_rules_falls_back_to_uniform_and_is_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    trajectory, _ = load_case("delayed_use")

    def boom(self: Any) -> None:
        raise RuntimeError("odd content")

    monkeypatch.setattr(rules_module._Tracer, "run", boom)
    graph, validation, uncertain = annotate_rules(trajectory)
    assert graph.is_uniform and graph.num_actions == trajectory.num_actions
    assert validation.fallback and uncertain
    assert validation.problems == ["U7 exception: rules failed: RuntimeError: odd content"]

    annotator = RuleAnnotator()
    results = annotator.annotate([trajectory, trajectory])
    assert [r.source for r in results] == ["fallback:uniform", "fallback:uniform"]
    assert annotator.failures == 2
    stats = AnnotationStats()
    for result in results:
        stats.add(result)
    assert stats.fallbacks == 2 and stats.fallback_rate == 1.0
    assert results[0].to_record("delayed_use", "rules")["graph"] is None


# ---------------------------------------------------------------------------------------------
# Annotator interface
# ---------------------------------------------------------------------------------------------


async def test_registered_annotator_wraps_annotate_rules() -> None:
    annotator = build_annotator("rules")
    assert isinstance(annotator, RuleAnnotator)
    assert annotator.version == RULES_VERSION
    for path in CASES:
        trajectory, expected = load_case(path.stem)
        result = await annotator.annotate_one(trajectory)
        graph, validation, uncertain = annotate_rules(trajectory)
        assert result.source == "rules"
        assert result.graph == graph
        assert result.uncertain is uncertain is expected["uncertain"]
        assert result.validation.repaired_edges == validation.repaired_edges == 0
        assert result.error is None


def test_constructor_takes_keyword_options_only() -> None:
    with pytest.raises(TypeError):
        RuleAnnotator([])  # type: ignore[misc]
    assert RuleAnnotator(tools=[], concurrency=2).concurrency == 2


def test_deterministic_and_fast() -> None:
    trajectories = [load_case(path.stem)[0] for path in CASES]
    first = [annotate_rules(t)[0].to_json() for t in trajectories]
    started = time.perf_counter()
    for _ in range(20):
        again = [annotate_rules(t)[0].to_json() for t in trajectories]
        assert again == first
    elapsed = time.perf_counter() - started
    per_trajectory = elapsed / (20 * len(trajectories))
    assert per_trajectory < 0.05, f"{per_trajectory * 1000:.1f} ms per trajectory"


# ---------------------------------------------------------------------------------------------
# Through the shared routing path
# ---------------------------------------------------------------------------------------------


def test_rule_graph_routes_through_iapo_support_action_gets_more_than_one() -> None:
    # Greeting transcript alone (a group of one: mu = 0, sigma = 1 -> A = R = 1 > 0, positive branch).
    # Rules: only u_1 = 1 -> phi+ = log(1 + d+ + din) = [0, log 2, 0, 0]; no errors -> psi- = 0.
    # Equal lengths 10: mean = log2/4 = 0.1733, std = 0.3001 -> z = [-0.577, 1.732, -0.577, -0.577]
    # -> clip to +-0.25 -> exp = [0.7788, 1.2840, 0.7788, 0.7788], mean 0.9051
    # -> w = [0.8604, 1.4186, 0.8604, 0.8604]  (sum L_i w_i = 10 * 4.0 = L).
    trajectory, _ = load_case("greeting_closing_no_edges")
    graph = annotate_rules(trajectory)[0]
    credit = compute_batch_credit(
        torch.tensor([1.0]), ["g"], [[10] * 4], CreditConfig.from_mapping({"estimator": "iapo"}), graphs=[graph]
    )
    assert credit.weights_of(0) == pytest.approx([0.8604, 1.4186, 0.8604, 0.8604], abs=1e-4)
    assert float((credit.lengths[0] * credit.weight[0]).sum()) == pytest.approx(40.0, rel=1e-5)


def test_rule_graphs_route_through_iapo_in_a_group() -> None:
    # Group of two rollouts of one task: the account lookup (R = 1) and the identical-retry transcript
    # (R = 0). GRPO: mean 0.5, Bessel std 0.7071 -> A = +0.7071 and -0.7071.
    good, _ = load_case("account_lookup_email")
    bad, _ = load_case("identical_retry")
    graphs = [annotate_rules(good)[0], annotate_rules(bad)[0]]
    lengths = [[10] * good.num_actions, [10] * bad.num_actions]
    credit = compute_batch_credit(
        torch.tensor([1.0, 0.0]),
        ["task", "task"],
        lengths,
        CreditConfig.from_mapping({"estimator": "iapo"}),
        graphs=graphs,
    )
    assert credit.trajectory_advantage.tolist() == pytest.approx([0.7071, -0.7071], abs=1e-4)

    # Positive branch, good rollout: phi+ = [log2, log3, log3, log2, log3, 0, 0] (a0..a4 carry support
    # edges, a5/a6 are the closing turns); no errors, so w+ = m(phi+) is increasing in phi+.
    # mean phi+ = 0.669: the hubs (log3 = 1.099) get w > 1, the closings w < 1, and a0/a3 (log2 = 0.693,
    # barely above the mean, z clipped relative to the hubs) sit just under 1 -- support edges raise a
    # weight relative to the other actions, not above 1 in absolute terms.
    weights = credit.weights_of(0)
    phi_plus = [float(x) for x in credit.extras["phi_plus"][0, : good.num_actions]]
    assert phi_plus == pytest.approx([0.6931, 1.0986, 1.0986, 0.6931, 1.0986, 0.0, 0.0], abs=1e-4)
    for i in range(good.num_actions):
        for k in range(good.num_actions):
            if phi_plus[i] > phi_plus[k]:
                assert weights[i] > weights[k]
    assert all(weights[i] > 1.0 for i in (1, 2, 4))
    assert all(weights[i] < 1.0 for i in (5, 6))
    # Negative branch, bad rollout: w- = m(phi-), phi- = log(1 + e(1 + d- + din)) is positive only on
    # the two failing calls a0 and a1 -> they take more than their share of the blame.
    weights_bad = credit.weights_of(1)
    errors = graphs[1].error_indicator()
    for action, weight in enumerate(weights_bad):
        assert (weight > 1.0) == bool(errors[action]), (action, weights_bad)
    # mass conservation: sum_i L_i w_i = L on both rows
    for row, graph in enumerate(graphs):
        total = float((credit.lengths[row] * credit.weight[row]).sum())
        assert total == pytest.approx(10.0 * graph.num_actions, rel=1e-5)


# ---------------------------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------------------------


def test_atoms_normalise_spellings() -> None:
    assert atomize("Order #W12, $1,204.50 at 3 PM or 15:30; store-credit & credit_card_7.") == [
        "order",
        "w12",
        "1204.5",
        "at",
        "15:00",
        "or",
        "15:30",
        "store_credit",
        "credit_card_7",
    ]
    assert atomize("54.00") == ["54"]
    units = extract_units({"order_id": "#W12", "qty": 1, "ok": True, "method": "store_credit", "note": "x"})
    assert [(u.key, u.label) for u in units] == [("w12", "order_id=#W12"), ("store_credit", "method=store_credit")]
    assert units[1].variants == (("store_credit",), ("store", "credit"))
    signature = canonical_call_signature("f", {"id": "#W1"}, "", True)
    assert canonical_call_signature("f", {"id": " w1 "}, "", True) == signature
    assert canonical_call_signature("f", {"id": "#W2"}, "", True) != signature


@pytest.mark.parametrize(
    "reply, preceding_is_proposal, expected",
    [
        ("No, don't do that!", False, True),
        ("That's not what I asked for.", False, True),
        ("I didn't want the whole order cancelled.", False, True),
        ("No.", True, True),
        ("Nope, cancel that.", True, True),
        ("No.", False, False),  # a plain "no" answering a question is an answer, not a rejection
        ("Actually, make it an exchange instead.", True, False),  # goal revision
        ("No thanks.", True, False),  # polite decline of an offer
        ("No, that's all.", True, False),
        ("Yes, go ahead.", True, False),
        ("I received the wrong size.", False, False),
    ],
)
def test_rejection_versus_revision(reply: str, preceding_is_proposal: bool, expected: bool) -> None:
    assert is_rejection(reply, preceding_is_proposal) is expected


def test_dialogue_acts() -> None:
    assert is_generic_offer("Hello! How can I help you today?")
    assert is_generic_offer("Done. Is there anything else I can help you with?")
    assert not is_generic_offer("Hello! Could you please provide your email address?")
    assert is_generic_offer("I have cancelled it. Let me know if you need anything.")
    assert is_proposal("Shall I proceed with the refund?")
    assert is_proposal("Would you like me to cancel it?")
    assert not is_proposal("Which size would you like?")
    assert is_affirmation("Yes, please.") and is_affirmation("go ahead")
    assert not is_affirmation("Yes, but don't cancel it")
    assert parse_options("To card or store credit?") == ["card", "store credit"]
    assert parse_options("Options:\n1. Red\n2. Green\n3. Blue") == ["Red", "Green", "Blue"]
    assert parse_options("Your order is delivered.") == []
    assert ordinal_choice("the second one please", 3) == 1
    assert ordinal_choice("The last option", 3) == 2
    assert ordinal_choice("number 3", 3) == 2
    assert ordinal_choice("2", 2) == 1
    assert ordinal_choice("my first name is Ann", 2) is None
    assert ordinal_choice("the fifth one", 2) is None


@pytest.mark.parametrize(
    "content, expected",
    [
        ("Error: Order not found", "Error: Order not found"),
        ('{"error": "user not found"}', "user not found"),
        ('{"success": false, "message": "insufficient balance"}', "insufficient balance"),
        ('"Invalid payment method"', "Invalid payment method"),
        ('{"order_id": "#W1", "status": "delivered", "note": "invalid address was fixed"}', None),
        ("Your order has shipped.", None),
        ("", None),
    ],
)
def test_error_evidence(content: str, expected: str | None) -> None:
    assert error_evidence(content) == expected


def test_identical_successful_repeat_is_not_supported_by_its_twin() -> None:
    # a0 get_order(#W12) -> {"order_id": "#W12", "status": "delivered"}; a1 repeats the identical call.
    # The repeat learns nothing from a0 (its twin): no 0->1 edge; #W12 came from the opening request,
    # so it is a direct user input of both calls. a2 refund(#W12) uses a0's lookup: 0->2 '+'.
    messages = [
        {"role": "user", "content": "refund order #W12"},
        *tool_action("c1", "get_order", {"order_id": "#W12"}, {"order_id": "#W12", "status": "delivered"}),
        *tool_action("c2", "get_order", {"order_id": "#W12"}, {"order_id": "#W12", "status": "delivered"}),
        *tool_action("c3", "refund", {"order_id": "#W12"}, {"status": "refunded"}),
    ]
    graph, _, _ = annotate_rules(Trajectory.from_messages(messages))
    assert all(edge.dst != 1 for edge in graph.edges)
    assert (0, 2) in {(edge.src, edge.dst) for edge in graph.edges}
