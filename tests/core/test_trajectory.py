"""Trajectory model: actions, observations, provenance, token lengths, record errors."""

from __future__ import annotations

import json

import pytest

from verl_credit.trajectory import Trajectory, TrajectoryError, asks_user, whitespace_token_count


def call(call_id: str, name: str, args: dict) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


DESIGN_EXAMPLE = {
    "id": "t17",
    "uid": "task-3",
    "reward": 1.0,
    "messages": [
        {"role": "system", "content": "..."},
        {"role": "user", "content": "refund order #W12 please"},
        {"role": "assistant", "content": "To card or store credit?"},
        {"role": "user", "content": "card"},
        {"role": "assistant", "content": "", "tool_calls": [call("c1", "get_order", {"order_id": "#W12"})]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"order_id": "#W12", "status": "delivered"}'},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [call("c2", "refund", {"order_id": "#W12", "method": "card"})],
        },
    ],
    "action_token_lengths": [7, 21, 25],
    "graph": None,
}


def test_design_example_actions_and_provenance() -> None:
    trajectory = Trajectory.from_record(DESIGN_EXAMPLE)
    assert trajectory.num_actions == 3
    assert trajectory.action_lengths == [7, 21, 25]
    assert [a.message_index for a in trajectory.actions] == [2, 4, 6]
    assert trajectory.actions[2].tool_calls[0].arguments == {"order_id": "#W12", "method": "card"}
    by_index = {o.message_index: o for o in trajectory.observations}
    assert by_index[0].source_action is None  # system prompt
    assert by_index[1].source_action is None  # opening request: unelicited
    assert by_index[3].source_action == 0  # "card" answers the question of action 0
    assert by_index[5].source_action == 1  # tool result of get_order (matched by tool_call_id)
    assert by_index[5].after_action == 2
    assert [o.message_index for o in trajectory.observations_after(0)] == [3]


def test_tool_result_without_id_goes_to_latest_tool_action_and_ids_win() -> None:
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [call("a", "f", {}), call("b", "g", {})]},
        {"role": "assistant", "content": "", "tool_calls": [call("c", "h", {})]},
        {"role": "tool", "tool_call_id": "a", "content": "from f"},
        {"role": "tool", "content": "no id"},
    ]
    trajectory = Trajectory.from_messages(messages)
    sources = [o.source_action for o in trajectory.observations if o.role == "tool"]
    assert sources == [0, 1]


def test_user_reply_after_statement_is_unelicited() -> None:
    messages = [
        {"role": "user", "content": "refund #W1"},
        {"role": "assistant", "content": "Your refund is complete."},
        {"role": "user", "content": "Also exchange #W2"},
        {"role": "assistant", "content": "Which size would you like?"},
        {"role": "user", "content": "M"},
        {"role": "user", "content": "and blue"},
    ]
    trajectory = Trajectory.from_messages(messages)
    users = [o.source_action for o in trajectory.observations if o.role == "user"]
    # a statement elicits nothing; a question elicits only the next user message
    assert users == [None, None, 1, None]


def test_asks_user() -> None:
    assert asks_user("To card or store credit?")
    assert asks_user("Please confirm the new address.")
    assert not asks_user("Your refund is complete.")
    assert not asks_user("")
    # generic offers ask nothing specific; "provide"/"confirm" only count in a request form
    assert not asks_user("Hello! How can I help you today?")
    assert not asks_user("Is there anything else I can help you with?")
    assert not asks_user("I can provide a refund to your card.")
    assert asks_user("Could you confirm the order id?")
    assert asks_user("Done. Anything else? Also, which option do you prefer: A or B?")


def test_whitespace_fallback_lengths() -> None:
    record = dict(DESIGN_EXAMPLE)
    del record["action_token_lengths"]
    trajectory = Trajectory.from_record(record)
    # "To card or store credit?" -> 5 words; get_order({"order_id": "#W12"}) -> 2 words
    assert trajectory.action_lengths[0] == 5
    assert trajectory.action_lengths[1] == whitespace_token_count('get_order({"order_id": "#W12"})')


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda r: r.pop("messages"), "messages"),
        (lambda r: r.pop("reward"), "reward"),
        (lambda r: r.update(reward="high"), "reward"),
        (lambda r: r.update(action_token_lengths=[1, 2]), "action_token_lengths"),
        (lambda r: r.update(action_token_lengths=[1, -2, 3]), "action_token_lengths[1]"),
        (lambda r: r.update(action_token_lengths=[1, 2.5, 3]), "action_token_lengths[1]"),
        (lambda r: r["messages"].append({"role": "robot", "content": "x"}), "messages[7].role"),
        (lambda r: r["messages"][2].update(tool_calls="nope"), "messages[2].tool_calls"),
    ],
)
def test_malformed_records_name_the_field(mutate, field: str) -> None:
    record = json.loads(json.dumps(DESIGN_EXAMPLE))
    mutate(record)
    with pytest.raises(TrajectoryError) as info:
        Trajectory.from_record(record)
    assert info.value.field == field


def test_unparseable_tool_arguments_are_kept_and_flagged() -> None:
    messages = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "x", "type": "function", "function": {"name": "f", "arguments": "{not json"}}],
        }
    ]
    trajectory = Trajectory.from_messages(messages)
    tool_call = trajectory.actions[0].tool_calls[0]
    assert not tool_call.arguments_valid
    assert tool_call.arguments == {}
    assert tool_call.raw_arguments == "{not json"


def test_record_round_trip() -> None:
    trajectory = Trajectory.from_record(json.loads(json.dumps(DESIGN_EXAMPLE)))
    again = Trajectory.from_record(trajectory.to_record())
    assert again.action_lengths == trajectory.action_lengths
    assert again.messages == trajectory.messages


def _tool_record(**tool: object) -> dict:
    return {
        "id": "t",
        "reward": 1.0,
        "messages": [
            {"role": "assistant", "content": "", "tool_calls": [call("c1", "f", {})]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok", **tool},
        ],
    }


@pytest.mark.parametrize(("key", "value"), [("tool_call_id", ["c1"]), ("tool_call_id", {"a": 1}), ("name", ["f"])])
def test_non_string_tool_ids_and_names_name_the_field(key: str, value: object) -> None:
    with pytest.raises(TrajectoryError, match=rf"messages\[1\]\.{key}"):
        Trajectory.from_record(_tool_record(**{key: value}))


@pytest.mark.parametrize("reward", [10**400, float("nan"), float("inf")])
def test_rewards_that_are_no_finite_float_are_rejected(reward: object) -> None:
    with pytest.raises(TrajectoryError, match="field 'reward'"):
        Trajectory.from_record({**_tool_record(), "reward": reward})


def test_absurd_token_lengths_are_rejected() -> None:
    with pytest.raises(TrajectoryError, match=r"action_token_lengths\[0\]"):
        Trajectory.from_record({**_tool_record(), "action_token_lengths": [10**300]})


def test_deeply_nested_tool_arguments_are_flagged_not_raised() -> None:
    messages = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "x", "function": {"name": "f", "arguments": '{"a":' + "[" * 5000 + "]" * 5000 + "}"}}
            ],
        }
    ]
    tool_call = Trajectory.from_messages(messages).actions[0].tool_calls[0]
    assert not tool_call.arguments_valid and tool_call.arguments == {}
