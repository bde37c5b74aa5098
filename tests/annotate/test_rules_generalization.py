"""Rule annotator classes that generalise across service agents and domains, each shown on a small
dialogue written for this project (invented store, customers, ids and tools):

1. choice and confirmation replies support the write through the action that elicited them;
2. when the agent restates a tool's values, the tool call stays their source;
3. a decline on grounds the agent found itself is no branch of a reply that asked nothing;
4. a later reply restating ids the opening request gave is not their source;
5. user_rejection only for an explicit refusal of what the preceding action did or proposed;
6. a failed call followed by a corrected retry of the same tool gets its ``-`` edge;
7. a tool_call id reused within a conversation pairs each result with the nearest unanswered call;
8. a request for input worded without a question ("I'll need your ...", "Please enter ...") elicits
   the reply right after it, so the values the reply gives are edges, not direct inputs;
9. a low-entropy value (an enum word, a code, a date) that an unrelated record holds by coincidence
   -- a look-up by an id nobody names, not described by the user, none of whose ids is used -- is
   not sourced to it; a field name is not a value; when only such records hold it: U8.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from verl_credit.annotate.rules import annotate_rules, trace_rules
from verl_credit.annotate.rules_dialog import asks_for_input, is_refusal, is_rejection
from verl_credit.trajectory import Trajectory

SYSTEM = {"role": "system", "content": "You are the support agent of Lumen Home, an online furniture store."}


def call(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def act(call_id: str, name: str, args: dict[str, Any], result: Any) -> list[dict[str, Any]]:
    return [
        {"role": "assistant", "content": "", "tool_calls": [call(call_id, name, args)]},
        {"role": "tool", "tool_call_id": call_id, "content": result if isinstance(result, str) else json.dumps(result)},
    ]


def say(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def graph_of(messages: list[dict[str, Any]]) -> dict[str, Any]:
    graph, validation, _ = annotate_rules(Trajectory.from_messages(messages))
    assert not validation.fallback
    return graph.to_json()


def pairs(graph: dict[str, Any], sign: str = "+") -> set[tuple[int, int]]:
    return {(e["src"], e["dst"]) for e in graph["edges"] if e["sign"] == sign}


def units_into(graph: dict[str, Any], dst: int) -> str:
    return "; ".join(e["unit"] for e in graph["edges"] if e["dst"] == dst)


ORDER = {
    "order_id": "#L7702",
    "status": "delivered",
    "items": [{"item_id": "5120", "name": "Blender"}, {"item_id": "7781", "name": "Toaster"}],
    "payment_history": [{"payment_method_id": "credit_card_5150", "brand": "mastercard", "last_four": "4412"}],
}


# ---------------------------------------------------------------------------------------------
# 1. Choice and confirmation replies
# ---------------------------------------------------------------------------------------------


def test_a_payment_method_chosen_by_description_supports_the_write() -> None:
    messages = [
        SYSTEM,
        user("I want to return the blender from order #L7702."),
        *act("c1", "get_order_details", {"order_id": "#L7702"}, ORDER),
        say(
            "I can return the blender. Where should the refund go?\n"
            "1. The original payment method, the Mastercard ending in 4412\n"
            "2. A new store gift card\nWhich would you like?"
        ),
        user("The original payment method, the Mastercard ending in 4412."),
        *act(
            "c2",
            "return_delivered_order_items",
            {"order_id": "#L7702", "item_ids": ["5120"], "payment_method_id": "credit_card_5150"},
            {"status": "return requested"},
        ),
    ]
    graph = graph_of(messages)
    assert (1, 2) in pairs(graph) and "choice=" in units_into(graph, 2)  # the choice, through its question
    assert (0, 2) in pairs(graph) and "payment_method_id=credit_card_5150" in units_into(graph, 2)  # the id's source


def test_an_agreed_extra_step_supports_the_later_write_that_does_it() -> None:
    messages = [
        SYSTEM,
        user("Please return the blender from order #L7702."),
        *act("c1", "get_order_details", {"order_id": "#L7702"}, ORDER),
        say("I can return the blender (item 5120). Would you also like to return the toaster (item 7781)?"),
        user("Yes, I'd like to return that item as well."),
        say("Understood. Should the refund go to the Mastercard ending in 4412 or to a gift card?"),
        user("The Mastercard, please."),
        *act(
            "c2",
            "return_delivered_order_items",
            {"order_id": "#L7702", "item_ids": ["5120", "7781"], "payment_method_id": "credit_card_5150"},
            {"status": "return requested"},
        ),
    ]
    graph = graph_of(messages)
    assert (1, 3) in pairs(graph) and "confirmation" in units_into(graph, 3)
    assert (2, 3) in pairs(graph)  # the payment choice
    assert (0, 3) in pairs(graph)  # the ids from the order


def test_an_approval_naming_the_proposed_option_is_a_choice() -> None:
    messages = [
        SYSTEM,
        user("Cancel my pending order #L7702."),
        *act("c1", "get_order_details", {"order_id": "#L7702"}, {**ORDER, "status": "pending"}),
        say("The reason can be 'no longer needed' or 'ordered by mistake'. Which one applies?"),
        user("Please proceed with 'ordered by mistake' as the reason."),
        *act("c2", "cancel_pending_order", {"order_id": "#L7702", "reason": "ordered by mistake"}, {"ok": True}),
    ]
    graph = graph_of(messages)
    assert (1, 2) in pairs(graph)


# ---------------------------------------------------------------------------------------------
# 2. Source priority when the agent restates a tool's values
# ---------------------------------------------------------------------------------------------


def test_the_agents_own_listing_of_tool_values_is_not_their_source() -> None:
    messages = [
        SYSTEM,
        user("What's the status of my orders? I'm mira_okafor_18."),
        *act("c1", "get_user_details", {"user_id": "mira_okafor_18"}, {"orders": ["#L7702", "#L8810"]}),
        say("You have two orders, #L7702 and #L8810. I'll check the newer one for you now."),
        *act("c2", "get_order_details", {"order_id": "#L8810"}, {"order_id": "#L8810", "status": "pending"}),
    ]
    graph = graph_of(messages)
    assert pairs(graph) == {(0, 2)}


# ---------------------------------------------------------------------------------------------
# 3. Declines on policy grounds
# ---------------------------------------------------------------------------------------------


def test_a_decline_answering_a_reply_that_asked_nothing_is_no_branch() -> None:
    messages = [
        SYSTEM,
        user("Hello."),
        say("Hi! Could you give me your order number?"),
        user("It's #L7702. The delivery was really late and I'm not happy about it."),
        *act("c1", "get_order_details", {"order_id": "#L7702"}, {**ORDER, "final_sale": True}),
        say("Thanks. What would you like to do about the order?"),
        user("I'm just really disappointed, that's all."),
        say("I'm sorry to hear that. Unfortunately, final-sale orders cannot be returned or exchanged."),
    ]
    graph = graph_of(messages)
    assert not any("branch" in e["unit"] for e in graph["edges"])


def test_a_refusal_is_the_main_act_of_its_message() -> None:
    assert is_refusal("I'm sorry, but final-sale orders cannot be returned.")
    assert is_refusal("Thank you, Mira. I checked the order. Unfortunately, it cannot be modified now.")
    assert not is_refusal(
        "Thank you for the details. Here is the summary of your exchange: the lamp for the floor lamp, "
        "$12 to your gift card. Shall I proceed? Note that after this the order cannot be modified."
    )
    assert not is_refusal("I'm glad to proceed with the refund now. Unfortunately, I can't waive the fee.")


# ---------------------------------------------------------------------------------------------
# 4. Restated values
# ---------------------------------------------------------------------------------------------


def test_a_reply_restating_the_opening_requests_id_is_not_its_source() -> None:
    messages = [
        SYSTEM,
        user("I need help with order #L7702."),
        say("Sure. Could you confirm the order number for me?"),
        user("Yes, it's #L7702."),
        *act("c1", "get_order_details", {"order_id": "#L7702"}, ORDER),
    ]
    graph = graph_of(messages)
    assert pairs(graph) == set()
    assert graph["direct_user_inputs"] == {"1": 1}


def test_a_reply_giving_a_new_id_is_still_its_source() -> None:
    messages = [
        SYSTEM,
        user("I need help with an order."),
        say("Sure. Could you give me the order number?"),
        user("It's #L7702."),
        *act("c1", "get_order_details", {"order_id": "#L7702"}, ORDER),
    ]
    assert pairs(graph_of(messages)) == {(0, 1)}


# ---------------------------------------------------------------------------------------------
# 5. user_rejection only for an explicit refusal
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reply",
    [
        "No, that's okay. Let me try another way.",
        "No need, I'll sort it out myself.",
        "Yes, that's the order. As for the address, it should be 12 Elm Street, not 21.",
        "That doesn't sound right, there were three items in that order. Can you check again?",
        "No, I don't want to cancel the entire order. Could you cancel just the lamp?",
        "###STOP###",
        "Thanks, bye! ###STOP###",
        "###TRANSFER###",
    ],
)
def test_declines_corrections_narrowings_and_end_tokens_are_no_rejection(reply: str) -> None:
    proposal = "Shall I cancel the whole order #L7702 and refund the Mastercard ending in 4412?"
    assert not is_rejection(reply, True, proposal)


@pytest.mark.parametrize(
    "reply",
    [
        "No, don't cancel anything.",
        "No, I never asked you to cancel the whole order.",
        "That's wrong. I didn't want a refund at all.",
        "No. Stop.",
    ],
)
def test_explicit_refusals_stay_rejections(reply: str) -> None:
    proposal = "Shall I cancel the whole order #L7702 and refund the Mastercard ending in 4412?"
    assert is_rejection(reply, True, proposal)


def test_an_end_token_after_a_proposal_marks_nothing() -> None:
    messages = [
        SYSTEM,
        user("Cancel #L7702 please, I ordered it by mistake."),
        *act("c1", "get_order_details", {"order_id": "#L7702"}, {**ORDER, "status": "pending"}),
        say("Shall I cancel order #L7702 for the reason 'ordered by mistake'?"),
        user("###STOP###"),
    ]
    assert graph_of(messages)["errors"] == []


# ---------------------------------------------------------------------------------------------
# 6. Retry after an error
# ---------------------------------------------------------------------------------------------


def test_a_corrected_retry_of_the_failed_tool_gets_a_failed_use_edge() -> None:
    messages = [
        SYSTEM,
        user("Where is my order #L7720?"),
        *act("c1", "get_order_details", {"order_id": "#L7720"}, "Error: order not found"),
        *act("c2", "get_order_details", {"order_id": "#L7702"}, ORDER),  # corrected (digits swapped)
        *act("c3", "get_product_details", {"product_id": "5120"}, {"product_id": "5120", "name": "Blender"}),
    ]
    trace = trace_rules(Trajectory.from_messages(messages))
    assert pairs(trace.raw_graph, "-") == {(0, 1)}
    assert "corrected retry get_order_details" in units_into(trace.raw_graph, 1)
    assert (0, 2) not in pairs(trace.raw_graph, "-")  # another tool is no retry


def test_only_the_next_call_of_the_tool_is_the_retry() -> None:
    messages = [
        SYSTEM,
        user("Check orders #L7720 and #L8810."),
        *act("c1", "get_order_details", {"order_id": "#L7720"}, "Error: order not found"),
        *act("c2", "get_order_details", {"order_id": "#L8810"}, {"order_id": "#L8810"}),
        *act("c3", "get_order_details", {"order_id": "#L7702"}, ORDER),
    ]
    assert pairs(trace_rules(Trajectory.from_messages(messages)).raw_graph, "-") == {(0, 1)}


# ---------------------------------------------------------------------------------------------
# 7. Repeated tool_call ids
# ---------------------------------------------------------------------------------------------


def test_a_reused_call_id_pairs_each_result_with_the_nearest_unanswered_call() -> None:
    messages = [
        SYSTEM,
        user("Where is my order #L7702?"),
        *act("call_0", "get_order_details", {"order_id": "#L7702"}, ORDER),
        *act("call_0", "track_shipment", {"order_id": "#L7702"}, "Error: tracking service unavailable"),
    ]
    trajectory = Trajectory.from_messages(messages)
    results = [o for o in trajectory.observations if o.role == "tool"]
    assert [(o.source_action, o.call_position) for o in results] == [(0, 0), (1, 0)]
    graph = graph_of(messages)
    assert [(m["action"], m["kind"]) for m in graph["errors"]] == [(1, "tool_error")]  # not on action 0


def test_parallel_calls_sharing_an_id_are_answered_in_order() -> None:
    messages = [
        SYSTEM,
        user("Check #L7702 and #L8810."),
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                call("call_0", "get_order_details", {"order_id": "#L7702"}),
                call("call_0", "get_order_details", {"order_id": "#L8810"}),
            ],
        },
        {"role": "tool", "tool_call_id": "call_0", "content": json.dumps(ORDER)},
        {"role": "tool", "tool_call_id": "call_0", "content": "Error: order #L8810 not found"},
        *act("call_1", "get_order_details", {"order_id": "#L8810"}, "Error: order #L8810 not found"),
    ]
    trajectory = Trajectory.from_messages(messages)
    assert [o.call_position for o in trajectory.observations if o.role == "tool"][:2] == [0, 1]
    trace = trace_rules(trajectory)
    # the identical retry of the second call (the one that failed) repeats its error
    assert pairs(trace.raw_graph, "-") == {(0, 1)}
    assert "order_id=#L8810" in units_into(trace.raw_graph, 1) or "retry" in units_into(trace.raw_graph, 1)


# ---------------------------------------------------------------------------------------------
# 8. Requests for input without a question mark
# ---------------------------------------------------------------------------------------------


def test_a_request_worded_as_a_need_elicits_the_reply() -> None:
    messages = [
        SYSTEM,
        user("I'd like to change the delivery address of an order."),
        say("Happy to help. To get started I'll need a few details: your customer ID and the order number."),
        user("My customer ID is mira_okafor_18 and the order is #L7702."),
        *act("c1", "get_order_details", {"order_id": "#L7702"}, ORDER),
    ]
    graph = graph_of(messages)
    assert (0, 1) in pairs(graph) and "order_id=#L7702" in units_into(graph, 1)
    assert graph["direct_user_inputs"] == {}


def test_a_please_enter_request_elicits_the_code_and_the_password() -> None:
    messages = [
        SYSTEM,
        user("I can't get into my store account."),
        say("I've sent a reset code to your email. Please enter the code here."),
        user("It's 418207."),
        say("Thanks. Please enter the new password you'd like."),
        user("lamp-4-Lumen"),
        *act("c1", "reset_password", {"code": "418207", "new_password": "lamp-4-Lumen"}, {"status": "ok"}),
    ]
    graph = graph_of(messages)
    assert {(0, 2), (1, 2)} <= pairs(graph)


@pytest.mark.parametrize(
    ("text", "asks"),
    [
        ("To proceed I will need your order number and the email on the account.", True),
        ("We need you to confirm the shipping address first.", True),
        ("Please enter the verification code we sent.", True),
        ("I need to check the order first.", False),  # the agent's own step, not a request
        ("Your refund has been issued. Anything else I can help with?", False),
        ("The blender is back in stock.", False),
    ],
)
def test_which_statements_ask_for_input(text: str, asks: bool) -> None:
    assert asks_for_input(text) is asks


# ---------------------------------------------------------------------------------------------
# 9. Coincidental records
# ---------------------------------------------------------------------------------------------

CUSTOMER = {"customer_id": "mira_okafor_18", "name": "Mira Okafor", "orders": ["#L7702", "#L7815"]}
OTHER_ORDER = {
    "order_id": "#L7815",
    "status": "delivered",
    "delivery": "express",
    "date": "2024-03-02",
    "items": [{"name": "Floor lamp", "colour": "brass"}],
}
OAK_DESK = [{"product_id": "P-5520", "name": "Oak desk", "stock": 4}]


def scan_then_order(opening: str, delivery: str = "express") -> list[dict[str, Any]]:
    """The agent reads the customer, scans both past orders, searches the product and orders it."""
    return [
        SYSTEM,
        user(opening),
        *act("c1", "get_customer", {"customer_id": "mira_okafor_18"}, CUSTOMER),
        *act("c2", "get_order_details", {"order_id": "#L7702"}, ORDER),
        *act("c3", "get_order_details", {"order_id": "#L7815"}, OTHER_ORDER),
        *act("c4", "search_products", {"query": "oak desk"}, OAK_DESK),
        *act(
            "c5",
            "place_order",
            {"customer_id": "mira_okafor_18", "product_id": "P-5520", "delivery": delivery},
            {"order_id": "#L8001", "status": "placed"},
        ),
    ]


def test_an_enum_an_unrelated_order_holds_by_coincidence_stays_the_openings() -> None:
    messages = scan_then_order("Hi, I'm mira_okafor_18. I want the oak desk, with express delivery please.")
    trace = trace_rules(Trajectory.from_messages(messages))
    graph = graph_of(messages)
    assert (2, 4) not in pairs(graph)  # order #L7815 is no one's topic: its "express" is a coincidence
    assert "delivery=express" not in units_into(graph, 4)
    assert graph["direct_user_inputs"]["4"] == 1  # the opening request's "express"
    assert {(0, 4), (3, 4)} <= pairs(graph)
    assert not trace.uncertain_reasons


def test_a_record_the_user_names_stays_the_source() -> None:
    messages = scan_then_order(
        "Hi, I'm mira_okafor_18. I want the oak desk, delivered the same way as my order #L7815."
    )
    graph = graph_of(messages)
    assert (2, 4) in pairs(graph) and "delivery=express" in units_into(graph, 4)


def test_a_value_only_unrelated_records_hold_is_uncertain() -> None:
    # "the fastest way" is no literal "express": the one holder is an order nobody talks about
    messages = scan_then_order("Hi, I'm mira_okafor_18. I want the oak desk, shipped the fastest way you have.")
    reasons = trace_rules(Trajectory.from_messages(messages)).uncertain_reasons
    assert any(reason.startswith("U8 coincidental source") for reason in reasons)
    assert annotate_rules(Trajectory.from_messages(messages))[2] is True


def test_a_field_name_is_no_value() -> None:
    messages = [
        SYSTEM,
        user("I'd like express delivery for the oak desk, product P-5520."),
        *act(
            "c1",
            "get_delivery_prices",
            {"product_id": "P-5520"},
            {"product_id": "P-5520", "standard": 5, "express": 12},
        ),
        *act("c2", "place_order", {"product_id": "P-5520", "delivery": "express"}, {"status": "placed"}),
    ]
    graph = graph_of(messages)
    assert (0, 1) in pairs(graph)  # the product id the price look-up returned
    assert "delivery=express" not in units_into(graph, 1)
    assert graph["direct_user_inputs"]["1"] == 1  # the opening request's "express"


def test_a_field_name_does_not_tie_with_the_reply_that_gave_the_value() -> None:
    messages = [
        SYSTEM,
        user("I'd like to order the oak desk, product P-5520."),
        say("Sure. Would you like standard or express delivery?"),
        user("Express, please."),
        *act(
            "c1",
            "get_delivery_prices",
            {"product_id": "P-5520"},
            {"product_id": "P-5520", "standard": 5, "express": 12},
        ),
        *act("c2", "place_order", {"product_id": "P-5520", "delivery": "express"}, {"status": "placed"}),
    ]
    trace = trace_rules(Trajectory.from_messages(messages))
    assert not [reason for reason in trace.uncertain_reasons if reason.startswith("U2")]
    graph = graph_of(messages)
    assert {(0, 2), (1, 2)} <= pairs(graph)


def test_a_record_the_user_describes_stays_the_source() -> None:
    # two of the order's values ("Leeds", "express") are the user's own description of it
    described = {**OTHER_ORDER, "city": "Leeds"}
    messages = [
        SYSTEM,
        user("Hi, I'm mira_okafor_18. Send the oak desk to Leeds by express, like my last order."),
        *act("c1", "get_customer", {"customer_id": "mira_okafor_18"}, CUSTOMER),
        *act("c2", "get_order_details", {"order_id": "#L7702"}, ORDER),
        *act("c3", "get_order_details", {"order_id": "#L7815"}, described),
        *act("c4", "search_products", {"query": "oak desk"}, OAK_DESK),
        *act(
            "c5",
            "place_order",
            {"customer_id": "mira_okafor_18", "product_id": "P-5520", "city": "Leeds", "delivery": "express"},
            {"order_id": "#L8001", "status": "placed"},
        ),
    ]
    graph = graph_of(messages)
    assert (2, 4) in pairs(graph) and "delivery=express" in units_into(graph, 4)
    assert not trace_rules(Trajectory.from_messages(messages)).uncertain_reasons
