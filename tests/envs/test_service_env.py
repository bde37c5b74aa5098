"""The demo service world: tools, scripted customer, outcome reward, scripted agent, call graphs."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from verl_credit.envs.base import build_environment, take_turn_reward
from verl_credit.envs.service import ServiceEnvironment, ServiceEpisode, build_task, expected_database
from verl_credit.envs.service.agent import MACRO_INDEX, MACROS, LinearSoftmaxPolicy, run_episode
from verl_credit.envs.service.roles import build_service_call_graph
from verl_credit.envs.service.rollouts import sample_groups
from verl_credit.envs.service.tools import TOOL_SCHEMAS
from verl_credit.envs.service.world import TOOL_FUNCTIONS
from verl_credit.trajectory import Trajectory


def run(coroutine):
    return asyncio.run(coroutine)


def scripted(*names: str):
    """A `choose` function that plays the given macros in order."""
    plan = [MACRO_INDEX[name] for name in names]
    return lambda phi, turn: plan[turn]


async def _ask(env: ServiceEnvironment, text: str) -> str:
    turn = await env.user_turn([{"role": "assistant", "content": text}])
    return turn.content


def test_registered_as_service_and_schemas_cover_every_tool():
    env = build_environment("service")
    assert isinstance(env, ServiceEnvironment)
    names = [schema["function"]["name"] for schema in TOOL_SCHEMAS]
    assert sorted(names) == sorted(TOOL_FUNCTIONS)
    for schema in TOOL_SCHEMAS:
        parameters = schema["function"]["parameters"]
        assert schema["type"] == "function"
        assert parameters["required"] == list(parameters["properties"])


def test_goal_is_revealed_only_when_asked_and_correct_refund_gets_reward_1():
    async def episode() -> float:
        env = build_environment("service")
        start = await env.start({"variant": "refund", "seed": 3})
        task = env.episode.task
        assert task.order_id not in start.first_user_message  # the opening is vague
        assert "#W" not in await _ask(env, "Thanks for your patience.")  # no question, no information
        request = await _ask(env, "Which order is this about, and what would you like to do with it?")
        assert task.order_id in request and "refund" in request
        details = json.loads((await env.call_tool("get_order_details", {"order_id": task.order_id})).content)
        preference = await _ask(
            env, "Would you like the refund to go to the original payment method or to your gift card?"
        )
        if task.refund_method == "gift_card":
            assert "gift card" in preference
            user = json.loads((await env.call_tool("get_user_details", {"user_id": details["user_id"]})).content)
            method = next(m["id"] for m in user["payment_methods"] if m["kind"] == "gift_card")
        else:
            assert "original payment method" in preference
            method = details["payment_method_id"]
        for item in details["items"]:
            result = await env.call_tool("return_item", {"order_id": task.order_id, "item_id": item["item_id"]})
            assert not result.is_error
        result = await env.call_tool("refund_order", {"order_id": task.order_id, "payment_method_id": method})
        assert not result.is_error
        closing = await env.user_turn([{"role": "assistant", "content": "Done. Is there anything else?"}])
        assert closing.done
        return await env.reward()

    assert run(episode()) == 1.0


def test_refund_to_the_wrong_payment_method_gets_reward_0():
    task = build_task({"variant": "refund", "seed": 3})
    episode = ServiceEpisode(task)
    wanted = task.payment_method_id(task.final_method)
    other = task.payment_method_id("gift_card" if task.final_method == "original" else "original")
    assert other != wanted
    for item in task.database.orders[task.order_id].items:
        episode.call_tool("return_item", {"order_id": task.order_id, "item_id": item.item_id})
    content, is_error = episode.call_tool("refund_order", {"order_id": task.order_id, "payment_method_id": other})
    assert not is_error and json.loads(content)["refund_to"] == other
    assert episode.reward() == 0.0


def test_bad_ids_and_misuse_are_tool_errors_that_leave_the_database_untouched():
    task = build_task({"variant": "refund", "seed": 5})
    episode = ServiceEpisode(task)
    before = episode.database.snapshot()
    content, is_error = episode.call_tool("get_order_details", {"order_id": "#W0000000"})
    assert is_error and content == "Error: order #W0000000 not found"
    # refund before the items are returned
    method = task.payment_method_id("original")
    content, is_error = episode.call_tool("refund_order", {"order_id": task.order_id, "payment_method_id": method})
    assert is_error and "return its items" in content
    # payment method of nobody
    content, is_error = episode.call_tool("refund_order", {"order_id": task.order_id, "payment_method_id": "card_1"})
    assert is_error
    _, is_error = episode.call_tool("cancel_everything", {})
    assert is_error
    assert episode.database.snapshot() == before
    assert episode.reward() == 0.0  # nothing written: the goal is not done


def test_goal_revision_at_confirmation_changes_what_earns_the_reward():
    task = build_task({"variant": "revision", "seed": 2})
    assert task.revised_method is not None and task.revised_method != task.refund_method
    first = ServiceEpisode(task)
    assert (
        task.refund_method.replace("_", " ").split()[0]
        in first.user_reply(
            "Would you like the refund to go to the original payment method or to your gift card?"
        ).content
    )
    revision = first.user_reply("To confirm: I will refund it. Shall I proceed?").content
    assert "changed my mind" in revision
    assert first.user_reply("To confirm again. Shall I proceed?").content.startswith("Yes")

    def refund(method: str) -> float:
        episode = ServiceEpisode(task)
        for item in task.database.orders[task.order_id].items:
            episode.call_tool("return_item", {"order_id": task.order_id, "item_id": item.item_id})
        episode.call_tool(
            "refund_order", {"order_id": task.order_id, "payment_method_id": task.payment_method_id(method)}
        )
        return episode.reward()

    assert refund(task.revised_method) == 1.0
    assert refund(task.refund_method) == 0.0


def test_error_repair_customer_gives_a_typo_first_and_the_right_id_when_asked_again():
    task = build_task({"variant": "error_repair", "seed": 4})
    episode = ServiceEpisode(task)
    first = episode.user_reply("Which order is this about?").content
    assert task.typo_order_id in first and task.order_id not in first
    _, is_error = episode.call_tool("get_order_details", {"order_id": task.typo_order_id})
    assert is_error
    second = episode.user_reply(f"I couldn't find order {task.typo_order_id}. Could you double-check?").content
    assert task.order_id in second


def test_expected_database_differs_from_the_initial_one_for_every_variant():
    for variant in ("refund", "exchange", "revision", "error_repair", "delayed"):
        task = build_task({"variant": variant, "seed": 7})
        assert expected_database(task).snapshot() != task.database.snapshot()
    assert (
        len(
            build_task({"variant": "delayed", "seed": 7})
            .database.orders[build_task({"variant": "delayed", "seed": 7}).order_id]
            .items
        )
        == 4
    )


def test_bad_task_spec_names_the_key():
    with pytest.raises(ValueError, match="variant"):
        build_task({"variant": "teleport", "seed": 1})
    with pytest.raises(ValueError, match="seed"):
        build_task({"variant": "refund", "seed": "x"})
    with pytest.raises(ValueError, match="option"):
        build_environment("service", colour="red")


def test_scripted_agent_optimal_plan_succeeds_with_hand_computed_ground_truth():
    task = build_task({"variant": "refund", "seed": 11})
    plan = ["ask_request", "small_talk", "lookup_order", "ask_method"]
    plan += ["lookup_user"] if task.refund_method == "gift_card" else ["search_help"]
    plan += ["return_item", "refund", "finish"]
    episode = run_episode(ServiceEpisode(task), scripted(*plan))
    assert episode.reward == 1.0
    assert [MACROS[m] for m in episode.macros] == plan
    # Causal: 0 ask_request (order id), 2 lookup_order (item id, payment id or user id),
    # 3 ask_method (the answer chose the payment method), 5 return_item, 6 refund; and for a
    # gift-card refund 4 lookup_user (gift card id). Not: 1 small_talk, 4 search_help, 7 finish.
    expected = {0, 2, 3, 5, 6} | ({4} if task.refund_method == "gift_card" else set())
    assert {i for i, flag in enumerate(episode.causal) if flag} == expected
    assert not any(episode.mistakes)
    assert episode.features.shape == (8, 15)


def test_scripted_agent_failure_marks_its_mistakes():
    task = build_task({"variant": "refund", "seed": 11})
    # never asks: the order id is unknown -> lookup fails; then closes the chat
    episode = run_episode(ServiceEpisode(task), scripted("lookup_order", "finish"))
    assert episode.reward == 0.0
    assert episode.mistakes == [True, True]  # tool error; closing before the goal was done
    assert not any(episode.causal)


def test_transcript_is_a_deterministic_function_of_task_and_macros_and_parses():
    spec = {"variant": "delayed", "seed": 1}
    rng = np.random.default_rng(0)
    policy = LinearSoftmaxPolicy()
    first = run_episode(ServiceEpisode(spec), lambda phi, turn: policy.sample(phi, rng))
    replay = run_episode(ServiceEpisode(spec), lambda phi, turn: first.macros[turn])
    assert replay.messages == first.messages and replay.reward == first.reward
    trajectory = Trajectory.from_messages(first.messages, reward=first.reward)
    assert trajectory.num_actions == len(first.macros)


def test_service_call_graph_roles_and_edges():
    task = build_task({"variant": "refund", "seed": 11})
    plan = ["ask_request", "lookup_order", "return_item", "ask_method", "lookup_user", "refund", "lookup_order"]
    episode = run_episode(ServiceEpisode(task), scripted(*plan), max_turns=len(plan))
    graph = build_service_call_graph(Trajectory.from_messages(episode.messages))
    # ask_request inherits lookup_order's IG; ask_method inherits lookup_user's IG; the last
    # lookup reads the order after the refund wrote it: RV.
    assert graph.roles == ("IG", "IG", "AE", "IG", "IG", "AE", "RV")
    edges = {(e.src, e.dst, e.kind) for e in graph.edges}
    assert (1, 2, "IG->AE") in edges  # item id from the order details
    assert (1, 5, "IG->AE") in edges  # order id (and, for the original method, the payment id)
    assert (5, 6, "AE->RV") in edges
    if task.refund_method == "gift_card":
        assert (4, 5, "IG->AE") in edges  # gift card id from the user details


def test_sample_groups_is_deterministic_and_mixes_outcomes():
    first = sample_groups(3, 6, seed=2)
    second = sample_groups(3, 6, seed=2)
    assert [r.record for r in first] == [r.record for r in second]
    assert len({r.record["uid"] for r in first}) == 3
    rewards = {r.record["reward"] for r in first}
    assert rewards == {0.0, 1.0}
    with pytest.raises(ValueError, match="groups"):
        sample_groups(0, 4)


def test_turn_rewards_sum_to_the_share_of_required_changes_made() -> None:
    """``turn_rewards=true``: each finished action earns the share of the task's required database
    changes it made; the correct writes of a refund task sum to 1 (and the episode's reward is 1)."""

    async def episode() -> tuple[list[float], float]:
        env = ServiceEnvironment(turn_rewards=True)
        await env.start({"variant": "refund", "seed": 5})
        task = env.episode.task
        earned = [take_turn_reward(env)]  # an action that wrote nothing
        for item in list(task.database.orders[task.order_id].items):
            await env.call_tool("return_item", {"order_id": task.order_id, "item_id": item.item_id})
            earned.append(take_turn_reward(env))
        method_id = task.payment_method_id(task.final_method or "original")
        await env.call_tool("refund_order", {"order_id": task.order_id, "payment_method_id": method_id})
        earned.append(take_turn_reward(env))
        return earned, await env.reward()

    earned, reward = asyncio.run(episode())
    assert reward == 1.0 and earned[0] == 0.0 and all(value > 0 for value in earned[1:])
    assert sum(earned) == pytest.approx(1.0)
    assert take_turn_reward(ServiceEnvironment()) is None  # off by default: no turn rewards
    with pytest.raises(ValueError, match="turn_rewards must be true or false"):
        ServiceEnvironment(turn_rewards="yes")
