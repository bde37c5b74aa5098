"""Ground-truth causal actions recovered from a service-world transcript alone
(``envs.service.causal``): they must equal what the scripted agent tracked while it played."""

from __future__ import annotations

import json

import numpy as np
import pytest

from verl_credit.envs.service.agent import LinearSoftmaxPolicy, run_episode
from verl_credit.envs.service.causal import causal_actions
from verl_credit.envs.service.env import ServiceEpisode


@pytest.mark.parametrize("variant", ["refund", "exchange", "revision", "error_repair", "delayed"])
def test_transcript_replay_equals_the_scripted_agents_tracked_ground_truth(variant):
    policy = LinearSoftmaxPolicy()
    rng = np.random.default_rng(7)
    successes = 0
    for seed in range(30):
        episode = run_episode(
            ServiceEpisode({"variant": variant, "seed": seed}), lambda phi, _: policy.sample(phi, rng)
        )
        successes += episode.reward > 0
        assert causal_actions(episode.messages, episode.reward) == list(episode.causal), (variant, seed)
    assert successes > 0  # the comparison covered successful episodes, not only all-False ones


def _call(call_id: str, name: str, **arguments: str) -> dict:
    function = {"name": name, "arguments": json.dumps(arguments)}
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": call_id, "type": "function", "function": function}],
    }


def _result(call_id: str, payload: dict | str) -> dict:
    content = payload if isinstance(payload, str) else json.dumps(payload)
    return {"role": "tool", "tool_call_id": call_id, "content": content}


ORDER = {
    "order_id": "#W1234567",
    "user_id": "user_a_1",
    "status": "delivered",
    "payment_method_id": "credit_card_1",
    "items": [{"item_id": "111", "product": "Backpack", "option": "color grey", "price": 10.0, "returned": False}],
}
USER = {
    "user_id": "user_a_1",
    "payment_methods": [{"id": "credit_card_1", "kind": "credit_card"}, {"id": "gift_card_9", "kind": "gift_card"}],
}


def _model_transcript() -> list[dict]:
    """A model's episode: a greeting, a failed guess, the question, a lookup, a redundant lookup,
    the refund-method question, the user lookup, the writes and a closing."""
    return [
        {"role": "system", "content": "..."},
        {"role": "user", "content": "Hi, I need some help with one of my orders."},
        {"role": "assistant", "content": "Hello!"},  # 0
        {"role": "user", "content": "Okay, thanks."},
        _call("c1", "get_order_details", order_id="unknown"),  # 1: a failed guess
        _result("c1", "Error: order unknown not found"),
        {"role": "assistant", "content": "Which order is this about?"},  # 2
        {"role": "user", "content": "I'd like to return the item from order #W1234567 and get a refund."},
        _call("c3", "get_order_details", order_id="#W1234567"),  # 3
        _result("c3", ORDER),
        _call("c4", "get_order_details", order_id="#W1234567"),  # 4: the same lookup again
        _result("c4", ORDER),
        {"role": "assistant", "content": "Original payment method or gift card?"},  # 5
        {"role": "user", "content": "Please refund it to my gift card."},
        _call("c6", "get_user_details", user_id="user_a_1"),  # 6
        _result("c6", USER),
        _call("c7", "return_item", order_id="#W1234567", item_id="111"),  # 7
        _result("c7", {"order_id": "#W1234567", "item_id": "111", "returned": True}),
        _call("c8", "refund_order", order_id="#W1234567", payment_method_id="gift_card_9"),  # 8
        _result("c8", {"order_id": "#W1234567", "status": "refunded"}),
        {"role": "assistant", "content": "Anything else?"},  # 9
        {"role": "user", "content": "No, that's all. Thank you!"},
    ]


def test_a_model_transcript_credits_the_chain_behind_the_writes():
    flags = causal_actions(_model_transcript(), reward=1.0)
    assert [i for i, flag in enumerate(flags) if flag] == [2, 4, 5, 6, 7, 8]
    # the question that elicited the order id, the lookup whose result the writes used (the later of
    # two identical lookups: the tracker keeps the latest result's sources), the refund-method
    # question, the user lookup listing the gift card, and the two writes; not the greeting, the
    # failed guess or the closing


def test_results_without_call_ids_are_matched_in_call_order():
    """verl's agent loop writes neither call ids nor ``tool_call_id``: the results answer the calls
    of the message before them in order, and the causal set is the same."""
    stripped = []
    for message in _model_transcript():
        message = {key: value for key, value in message.items() if key != "tool_call_id"}
        if message.get("tool_calls"):
            message["tool_calls"] = [{k: v for k, v in call.items() if k != "id"} for call in message["tool_calls"]]
        stripped.append(message)
    assert causal_actions(stripped, reward=1.0) == causal_actions(_model_transcript(), reward=1.0)
    assert any(causal_actions(stripped, reward=1.0))


def test_a_failed_episode_has_no_causal_action_and_junk_is_tolerated():
    assert not any(causal_actions(_model_transcript(), reward=0.0))
    messages = _model_transcript()
    messages[9] = {"role": "tool", "tool_call_id": "c3", "content": "{not json"}  # unreadable, unmatched results
    messages.insert(3, {"role": "tool", "tool_call_id": "nope", "content": "{}"})
    assert len(causal_actions(messages, reward=1.0)) == 10
