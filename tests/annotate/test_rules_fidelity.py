"""Rule annotator fidelity: the classes of error found on real service transcripts,
each shown on a small dialogue written for this project (invented customers, ids and tools).

1. false user rejections; 2. free-text arguments bind nothing, a day inside a date in prose is not a
number; 3. dates and amounts in words; 4. confirmations and choices go to the action that proposed or
listed exactly that; 5. branches (transfer, refusal) and recoveries after an observed mismatch; 6. the
``annotate`` command reports the uncertain flag and its reasons; 7. annotation time is linear.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from verl_credit.annotate.rules import annotate_rules, trace_rules, uncertainty_reasons
from verl_credit.annotate.rules_dialog import is_affirmation, is_proposal, is_rejection
from verl_credit.annotate.rules_values import DateContext, IndexedText, extract_units, is_free_text_argument
from verl_credit.cli.main import main
from verl_credit.trajectory import Trajectory

SYSTEM = {
    "role": "system",
    "content": "You are the support agent of Skyline Air. The current time is 2031-03-02 09:00.",
}


def call(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def act(call_id: str, name: str, args: dict[str, Any], result: Any, content: str = "") -> list[dict[str, Any]]:
    return [
        {"role": "assistant", "content": content, "tool_calls": [call(call_id, name, args)]},
        {"role": "tool", "tool_call_id": call_id, "content": result if isinstance(result, str) else json.dumps(result)},
    ]


def say(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def graph_of(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    graph, validation, _ = annotate_rules(Trajectory.from_messages(messages), tools=tools)
    assert not validation.fallback
    return graph.to_json()


def pairs(graph: dict[str, Any], sign: str = "+") -> set[tuple[int, int]]:
    return {(e["src"], e["dst"]) for e in graph["edges"] if e["sign"] == sign}


def units_into(graph: dict[str, Any], dst: int) -> str:
    return "; ".join(e["unit"] for e in graph["edges"] if e["dst"] == dst)


def rejections(graph: dict[str, Any]) -> set[int]:
    return {m["action"] for m in graph["errors"] if m["kind"] == "user_rejection"}


# ---------------------------------------------------------------------------------------------
# 1. False user rejections
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reply",
    [
        "Yes, that sounds correct. Please go ahead, and don't charge it to the gift card, use the card on file.",
        "Thanks. I'm willing to add the 3 GB top-up to get back online. I don't want to change my plan, though.",
        "I looked: battery saver is off and nothing is blocked. That's not the issue, so what should I try next?",
        "I don't have it on me right now, can you find the booking from my profile?",
    ],
)
def test_agreements_partial_declines_and_reports_are_not_rejections(reply: str) -> None:
    assert not is_rejection(reply, True)
    assert not is_rejection(reply, False)


def test_opening_complaint_after_a_greeting_rejects_nothing() -> None:
    messages = [
        SYSTEM,
        say("Welcome to Skyline Air! How can I help you today?"),
        user("I'm really not happy with how my last trip went, and I don't think that was fair at all."),
        *act("c1", "get_booking", {"booking_id": "QX7TR2"}, {"booking_id": "QX7TR2", "status": "flown"}),
    ]
    assert rejections(graph_of(messages)) == set()


def test_agreement_to_a_proposal_is_no_rejection_but_a_confirmation() -> None:
    messages = [
        SYSTEM,
        user("Please add a checked bag to booking QX7TR2."),
        *act("c1", "get_booking", {"booking_id": "QX7TR2"}, {"booking_id": "QX7TR2", "bags": 0}),
        say("I can add 1 checked bag to QX7TR2 for $35. Shall I proceed?"),
        user("Yes, that sounds correct, and that's not too expensive. Please go ahead."),
        *act("c2", "add_bags", {"booking_id": "QX7TR2", "bags": 1}, {"ok": True}),
    ]
    graph = graph_of(messages)
    assert rejections(graph) == set()
    assert (1, 2) in pairs(graph)
    assert "confirmation" in units_into(graph, 2)


def test_real_refusals_stay_rejections() -> None:
    assert is_rejection("No, don't do that, I never asked for a cancellation.", True)
    assert is_rejection("That's not what I asked for.", False)
    assert is_rejection("No, $480 extra is still far too much for me.", True)
    # "don't transfer me" rejects a transfer the agent made, not one nobody mentioned
    assert is_rejection("Please don't transfer me!", False, "YOU ARE BEING TRANSFERRED TO A HUMAN AGENT.")
    assert not is_rejection("Please don't transfer me to anyone, just fix it.", False, "Let me check your booking.")
    # answering "cancel it or keep it?" with yes-and-don't is a choice, not a rejection
    assert not is_rejection("Yes, cancel QX7TR2. Please don't touch MZ44PL.", True, "Cancel QX7TR2 or keep MZ44PL?")


# ---------------------------------------------------------------------------------------------
# 2. Free-text arguments bind nothing; a day inside a date is not a number
# ---------------------------------------------------------------------------------------------

HANDOFF_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "handoff_to_human",
            "parameters": {"type": "object", "properties": {"summary": {"type": "string"}}, "required": ["summary"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_booking",
            "parameters": {"type": "object", "properties": {"booking_id": {"type": "string"}}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "cancel_booking",
            "parameters": {
                "type": "object",
                "properties": {
                    "booking_id": {"type": "string"},
                    "reason": {"type": "string", "enum": ["change_of_plans", "airline_cancelled"]},
                },
            },
        },
    },
]


def test_a_handoff_summary_restating_known_values_binds_nothing() -> None:
    messages = [
        SYSTEM,
        user("My booking QX7TR2 was downgraded and I want compensation."),
        *act("c1", "get_booking", {"booking_id": "QX7TR2"}, {"booking_id": "QX7TR2", "user": "lena_ortiz_31"}),
        say("I see the booking under lena_ortiz_31. Compensation for a downgrade needs a human agent."),
        user("Fine."),
        *act(
            "c2",
            "handoff_to_human",
            {"summary": "User lena_ortiz_31 (booking QX7TR2, flown 2031-02-11) asks compensation of $120."},
            "Transfer successful",
        ),
    ]
    graph = graph_of(messages, HANDOFF_TOOLS)
    assert all("summary=" not in e["unit"] for e in graph["edges"])
    assert 0 not in {e["src"] for e in graph["edges"] if e["dst"] == 2}  # the lookup does not feed the report
    assert not any(
        r.startswith("U1")
        for r in trace_rules(Trajectory.from_messages(messages), tools=HANDOFF_TOOLS).uncertain_reasons
    )


def test_free_text_is_decided_by_name_and_schema() -> None:
    assert is_free_text_argument("summary", {"type": "string"})
    assert is_free_text_argument("cancel_reason", {"type": "string"})
    assert not is_free_text_argument("reason", {"type": "string", "enum": ["change_of_plans"]})
    assert not is_free_text_argument("note", {"type": "string", "format": "date"})
    assert not is_free_text_argument("booking_id", {"type": "string"})
    # no schema: only prose counts (a short reason may be an enum the schema would name)
    assert not is_free_text_argument("reason", None, "change_of_plans")
    assert is_free_text_argument("note", None, "Customer called twice about QX7TR2 and was promised a callback.")
    units = extract_units(
        {"booking_id": "QX7TR2", "reason": "change_of_plans", "description": "anything at all"},
        properties={"reason": {"type": "string", "enum": ["change_of_plans"]}, "description": {"type": "string"}},
    )
    assert [u.label for u in units] == ["booking_id=QX7TR2", "reason=change_of_plans"]


def test_a_day_inside_a_date_in_prose_is_not_that_number() -> None:
    messages = [
        SYSTEM,
        user("I fly out on May 15 and want to add bags."),
        *act("c1", "add_bags", {"booking_id": "QX7TR2", "bags": 15}, {"ok": True}),
    ]
    trace = trace_rules(Trajectory.from_messages(messages))
    assert trace.raw_graph["direct_user_inputs"] == {}  # "May 15" supplied no 15
    assert any(r.startswith("U1") and "bags=15" in r for r in trace.uncertain_reasons)
    assert "15" in IndexedText("May 15, and 15 bags").atom_set  # a number that also stands alone stays


# ---------------------------------------------------------------------------------------------
# 3. Dates and amounts in words
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "said, iso",
    [
        ("I'd like to leave on May 26.", "2031-05-26"),
        ("Return on October 5th please.", "2031-10-05"),
        ("the 3rd of June works", "2031-06-03"),
        ("sometime around 7/14", "2031-07-14"),
        ("on March 9, 2032", "2032-03-09"),
    ],
)
def test_dates_in_words_trace_to_iso_arguments_when_the_year_is_fixed(said: str, iso: str) -> None:
    messages = [
        SYSTEM,
        say("Which date would you like to travel?"),
        user(said),
        *act("c1", "search_flights", {"origin": "DEN", "destination": "BOS", "date": iso}, []),
    ]
    graph = graph_of(messages)
    assert (0, 1) in pairs(graph) and f"date={iso}" in units_into(graph, 1)


def test_a_bare_ordinal_day_takes_the_month_of_the_latest_date() -> None:
    messages = [
        SYSTEM,
        user("I'm flying DEN to BOS on April 19 and coming back on the 23rd."),
        *act("c1", "search_flights", {"origin": "DEN", "destination": "BOS", "date": "2031-04-19"}, []),
        *act("c2", "search_flights", {"origin": "BOS", "destination": "DEN", "date": "2031-04-23"}, []),
    ]
    trace = trace_rules(Trajectory.from_messages(messages))
    assert not any(r.startswith("U1") for r in trace.uncertain_reasons)
    assert trace.raw_graph["direct_user_inputs"] == {"0": 3, "1": 3}


def test_without_a_year_in_the_conversation_a_date_in_words_stays_untraced() -> None:
    context = DateContext()
    assert "2031-05-26" not in IndexedText("May 26", context).atom_set
    context.year = 2031
    assert "2031-05-26" in IndexedText("May 26", context).atom_set


def test_spelled_amounts_trace_to_numbers() -> None:
    messages = [
        SYSTEM,
        say("How much travel credit should I issue?"),
        user("Two hundred fifty dollars, as your colleague promised."),
        *act("c1", "issue_credit", {"user_id": "lena_ortiz_31", "amount": 250}, {"ok": True}),
    ]
    graph = graph_of(messages)
    assert "amount=250" in units_into(graph, 1) and (0, 1) in pairs(graph)


# ---------------------------------------------------------------------------------------------
# 4. Confirmations and choices go to the action that proposed / listed exactly that
# ---------------------------------------------------------------------------------------------


def test_confirmation_credits_the_proposal_of_exactly_that_write_not_an_earlier_mention() -> None:
    # a1 first floats the $60 fee; a3 proposes exactly the write (fee $60 on the card ending 9990).
    messages = [
        SYSTEM,
        user("Change booking QX7TR2 to the later flight."),
        *act("c1", "get_booking", {"booking_id": "QX7TR2"}, {"booking_id": "QX7TR2", "card": "card_9990"}),
        say("The change is possible; there may be a change fee of about $60. What date?"),
        user("Same day, the 18:00 flight."),
        *act("c2", "search_flights", {"origin": "DEN", "destination": "BOS"}, [{"flight": "SK118", "time": "18:00"}]),
        say(
            "I can move QX7TR2 to SK118 at 18:00 and charge the $60 fee to the card ending 9990. "
            "Please confirm (yes/no)."
        ),
        user("Yes, please go ahead with SK118 and the card ending 9990."),
        *act(
            "c3",
            "change_flight",
            {"booking_id": "QX7TR2", "flight": "SK118", "fee": 60, "payment_id": "card_9990"},
            {"ok": True},
        ),
    ]
    graph = graph_of(messages)
    into = {(e["src"], e["unit"]) for e in graph["edges"] if e["dst"] == 4}
    assert (3, "fee=60; confirmation") in into or any(src == 3 and "fee=60" in unit for src, unit in into)
    assert all(not (src == 1 and "fee" in unit) for src, unit in into)  # not the earlier mention
    assert any(src == 3 and "confirmation" in unit for src, unit in into)


def test_every_write_executing_a_confirmed_proposal_gets_the_confirmation() -> None:
    messages = [
        SYSTEM,
        user("Upgrade QX7TR2 to business and add 2 bags."),
        say("I can upgrade QX7TR2 to business and add 2 checked bags. Would you like me to proceed?"),
        user("Yes."),
        *act("c1", "upgrade_cabin", {"booking_id": "QX7TR2", "cabin": "business"}, {"ok": True}),
        *act("c2", "add_bags", {"booking_id": "QX7TR2", "bags": 2}, {"ok": True}),
    ]
    graph = graph_of(messages)
    assert {(0, 1), (0, 2)} <= pairs(graph)


def test_a_reply_choosing_among_listed_records_supports_the_call_that_acts_on_it() -> None:
    # a0's tool result lists the user's bookings; a1 restates them and asks which; the reply names
    # one -> the tool call that produced the id stays its source (0->2), and the choice supports
    # the call through the action that elicited it (1->2, unit choice=...); no U2 doubt.
    messages = [
        SYSTEM,
        user("I want to cancel one of my trips. I'm lena_ortiz_31."),
        *act(
            "c1",
            "get_user",
            {"user_id": "lena_ortiz_31"},
            {"user_id": "lena_ortiz_31", "bookings": ["QX7TR2", "MZ44PL"]},
        ),
        say("You have two bookings, QX7TR2 and MZ44PL. Which one should I cancel?"),
        user("MZ44PL, the Boston one."),
        *act("c2", "cancel_booking", {"booking_id": "MZ44PL"}, {"ok": True}),
    ]
    trace = trace_rules(Trajectory.from_messages(messages))
    assert pairs(trace.raw_graph) >= {(0, 2), (1, 2)}
    assert "booking_id=MZ44PL" in units_into(trace.raw_graph, 2)
    assert "choice=" in units_into(trace.raw_graph, 2)
    assert not any(r.startswith("U2") for r in trace.uncertain_reasons)


def test_examples_in_a_question_are_not_options() -> None:
    messages = [
        SYSTEM,
        say("What's the reason for the cancellation (e.g., change of plans, illness, or other)?"),
        user("Just a change of plans."),
        *act("c1", "cancel_booking", {"booking_id": "QX7TR2"}, {"ok": True}),
    ]
    assert not any(r.startswith("U5") for r in trace_rules(Trajectory.from_messages(messages)).uncertain_reasons)


def test_proposal_and_affirmation_phrasings() -> None:
    assert is_proposal('If everything looks right, reply with "yes" to confirm.')
    assert is_proposal("Do you approve these changes (yes/no)?")
    assert is_affirmation("Thanks for checking. Yes, please go ahead.")
    assert is_affirmation("That all looks correct, please proceed with the booking.")
    assert not is_affirmation("No, that looks wrong.")


# ---------------------------------------------------------------------------------------------
# 5. Branches and recoveries
# ---------------------------------------------------------------------------------------------


def test_a_reply_that_asks_for_a_human_is_the_source_of_the_transfer() -> None:
    messages = [
        SYSTEM,
        user("My flight QX7TR2 was cancelled."),
        *act("c1", "get_booking", {"booking_id": "QX7TR2"}, {"booking_id": "QX7TR2", "status": "cancelled"}),
        say("I see QX7TR2 was cancelled by us. I can rebook you on the next flight. Would that work?"),
        user("No thanks, I'd rather speak to a supervisor about this."),
        *act(
            "c2",
            "handoff_to_human",
            {"summary": "Customer wants a supervisor about cancelled QX7TR2."},
            "Transfer successful",
        ),
    ]
    graph = graph_of(messages, HANDOFF_TOOLS)
    assert pairs(graph) == {(1, 2)}
    assert "branch=transfer" in units_into(graph, 2)


def test_a_refusal_answering_a_request_is_a_branch_edge() -> None:
    messages = [
        SYSTEM,
        say("Hello! How can I help you today?"),
        user("Hi, it's lena_ortiz_31."),
        *act("c1", "get_user", {"user_id": "lena_ortiz_31"}, {"user_id": "lena_ortiz_31", "tier": "basic"}),
        say("Thanks, Lena. What would you like to change on your booking?"),
        user("Move my basic fare to a different destination."),
        say("I'm sorry, but I can't change the destination of a basic fare under our policy."),
    ]
    graph = graph_of(messages)
    assert (2, 3) in pairs(graph) and "branch=refusal" in units_into(graph, 3)


def test_a_correction_after_an_observed_mismatch_is_an_edge() -> None:
    messages = [
        SYSTEM,
        user("Please suspend line 555-0142 on account acct_77."),
        *act(
            "c1",
            "get_line",
            {"account_id": "acct_77"},
            {"account_id": "acct_77", "line": "555-0199", "line_id": "ln_9"},
        ),
        say(
            "The number you gave doesn't match the line I retrieved for acct_77 (555-0199). Could you double-check it?"
        ),
        user("Sorry, yes, it's 555-0199."),
        *act("c2", "suspend_line", {"line_id": "ln_9"}, {"ok": True}),
    ]
    graph = graph_of(messages)
    assert (0, 1) in pairs(graph)
    assert "mismatch" in units_into(graph, 1)


# ---------------------------------------------------------------------------------------------
# 6. `verl-credit annotate` reports the uncertain flag and its reasons
# ---------------------------------------------------------------------------------------------


def test_annotate_writes_uncertain_flags_and_counts_them_by_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sure = [
        SYSTEM,
        user("Cancel booking QX7TR2."),
        *act("c1", "cancel_booking", {"booking_id": "QX7TR2"}, {"ok": True}),
    ]
    unsure = [SYSTEM, user("Cancel my booking."), *act("c1", "cancel_booking", {"booking_id": "ZZ00ZZ"}, {"ok": True})]
    rollouts = tmp_path / "r.jsonl"
    rollouts.write_text(
        "".join(
            json.dumps({"id": name, "uid": "g", "reward": 1.0, "messages": messages}) + "\n"
            for name, messages in (("sure", sure), ("unsure", unsure))
        )
    )
    out = tmp_path / "g.jsonl"
    assert main(["annotate", "--input", str(rollouts), "--out", str(out)]) == 0
    lines = {json.loads(line)["id"]: json.loads(line) for line in out.read_text().splitlines()}
    assert lines["sure"]["uncertain"] is False and lines["sure"]["uncertain_reasons"] == []
    assert lines["unsure"]["uncertain"] is True
    assert [r.split(":")[0] for r in lines["unsure"]["uncertain_reasons"]] == ["U1 untraced"]
    assert uncertainty_reasons(Trajectory.from_messages(unsure)) == lines["unsure"]["uncertain_reasons"]
    printed = capsys.readouterr().out
    assert "uncertain       1 (50.0%)" in printed
    assert "U1 untraced" in printed and printed.rstrip().endswith("1")


# ---------------------------------------------------------------------------------------------
# 7. Linear time
# ---------------------------------------------------------------------------------------------


def long_session(turns: int) -> Trajectory:
    """A long support session: every turn looks up the same customer and acts on a new booking."""
    messages: list[dict[str, Any]] = [SYSTEM, user("I'm lena_ortiz_31 and I have many bookings to fix.")]
    for turn in range(turns):
        booking = f"BK{turn:05d}"
        messages += act(
            f"a{turn}", "get_user", {"user_id": "lena_ortiz_31"}, {"user_id": "lena_ortiz_31", "next": booking}
        )
        messages.append(say(f"Next is {booking} on May {turn % 28 + 1}. Shall I cancel it or keep it?"))
        messages.append(user("Yes, cancel it." if turn % 2 else "Keep that one, please."))
        messages += act(f"b{turn}", "cancel_booking", {"booking_id": booking}, {"ok": True, "booking_id": booking})
    return Trajectory.from_messages(messages)


@pytest.mark.slow
def test_annotation_time_grows_linearly_with_the_session() -> None:
    # 8x the actions: linear is 8x the time; the old rescans took about 140x here. The bound (16x,
    # n^1.33) leaves room for noise. CPU time of this process (a shared machine's load inflates wall
    # time, not this), best of 3 each.
    def seconds(trajectory: Trajectory) -> float:
        best = float("inf")
        for _ in range(3):
            started = time.process_time()
            annotate_rules(trajectory)
            best = min(best, time.process_time() - started)
        return best

    small, large = long_session(50), long_session(400)  # 150 and 1200 actions
    seconds(small)
    ratio = seconds(large) / seconds(small)
    assert ratio < 16, f"8x the actions took {ratio:.1f}x the time"
