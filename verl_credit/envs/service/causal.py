"""Ground-truth causal actions of any service-world transcript, the scripted agent's or a model's.

The scripted agent knows which of its actions its correct writes depended on because it tracked
where every value came from while it played (:class:`~verl_credit.envs.service.agent.DialogueState`).
A transcript written by a policy model (a verl rollout) has no such record, so this module replays
the transcript through the same tracker -- each customer message is attributed to the assistant
message it answers, each tool result to the call that produced it -- and recovers, for every write
call, which tracked values its arguments are (an order id the customer typed, an item id the
order lookup returned, the gift card the user lookup listed plus the customer's choice of refund
method). The causal set of a *successful* episode is the union of its successful writes and the
actions their arguments came from, followed back through the lookups' own arguments; a failed
episode has no causal action. On the scripted agent's own episodes this equals its tracked ground
truth (tested), so "credit precision" -- the share of an estimator's positive advantage mass that
lands on causal actions -- means the same for the in-process benchmarks and for verl's trainer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from verl_credit.envs.service.agent import DialogueState, Known
from verl_credit.envs.service.world import WRITE_TOOLS

__all__ = ["causal_actions"]


def _sources_of(known: Known | None, value: Any) -> frozenset[int] | None:
    return known.sources if known is not None and known.value == value else None


def _argument_sources(state: DialogueState, name: str, arguments: Mapping[str, Any]) -> frozenset[int]:
    """The actions the call's argument values came from, as far as the tracker knows them."""
    sources: frozenset[int] = frozenset()
    order = state.order
    for key, value in arguments.items():
        found: frozenset[int] | None = None
        if key == "order_id":
            found = _sources_of(state.order_id, value)
        elif key == "item_id" and order is not None and any(i["item_id"] == value for i in order["items"]):
            found = state.order_sources
        elif key == "user_id" and order is not None and order.get("user_id") == value:
            found = state.order_sources
        elif key == "product" and order is not None and any(i["product"] == value for i in order["items"]):
            found = state.order_sources
        elif key == "new_item_id":
            found = _sources_of(state.variant_id, value)
        elif key == "payment_method_id":
            method = state.method.sources if state.method is not None else frozenset()
            gift = _sources_of(state.gift_id, value)
            if gift is not None:
                found = gift | method
            elif order is not None and order.get("payment_method_id") == value:
                found = state.order_sources | method
        if found is not None:
            sources = sources | found
    if name == "exchange_item" and state.option is not None:
        sources = sources | state.option.sources
    return sources


def _parse_arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, Mapping):
        return dict(raw)
    try:
        parsed = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def causal_actions(messages: Sequence[Mapping[str, Any]], reward: float) -> list[bool]:
    """One flag per assistant message of ``messages`` (OpenAI chat format): True for the actions a
    successful episode's writes depended on (see the module doc). A tool result is matched to its
    call by ``tool_call_id``; without one (verl's agent loop writes neither call ids nor
    ``tool_call_id``), to the oldest call still waiting for its result, the order tools answer in."""
    state = DialogueState()
    action = -1
    asked: int | None = None  # the action a customer message answers: the last text-only action
    # calls waiting for their result, in the order they were written (dicts keep insertion order)
    calls: dict[str, tuple[int, str, dict[str, Any], frozenset[int]]] = {}
    writes: list[tuple[int, frozenset[int]]] = []
    for message in messages:
        role = message.get("role")
        if role == "assistant":
            action += 1
            calls.clear()  # results answer the message just before them; older calls got none
            tool_calls = message.get("tool_calls") or []
            asked = None if tool_calls else action
            for position, call in enumerate(tool_calls):
                function = call.get("function", call)
                name = str(function.get("name", ""))
                arguments = _parse_arguments(function.get("arguments"))
                # the arguments' sources as the state stood when the call was written
                call_id = call.get("id") or f"unnamed call {action}.{position}"
                calls[str(call_id)] = (action, name, arguments, _argument_sources(state, name, arguments))
        elif role == "tool":
            call_id = message.get("tool_call_id")
            if call_id is None:
                call_id = next(iter(calls), None)
            if call_id is None or str(call_id) not in calls:
                continue  # a result no call is waiting for carries no value
            known = calls.pop(str(call_id))
            source, name, arguments, argument_sources = known
            content = str(message.get("content") or "")
            is_error = content.startswith("Error")
            try:
                state.observe_tool(name, arguments, content, is_error, source, argument_sources)
            except (ValueError, KeyError, TypeError):
                continue  # a result the tracker cannot read carries no value
            if not is_error and name in WRITE_TOOLS:
                writes.append((source, argument_sources))
        elif role == "user" and action >= 0:
            state.observe_user(str(message.get("content") or ""), asked)
    flags = [False] * (action + 1)
    if reward > 0:
        for source, argument_sources in writes:
            for index in (*argument_sources, source):
                if 0 <= index < len(flags):
                    flags[index] = True
    return flags
