"""tau2 termination, parallel tool calls and first-use loading, checked against tau2 and verl themselves.

* Termination: the same scripted agent and user play one episode in tau2's own ``Orchestrator`` (the
  reference) and through our eval runner + ``Tau2Environment``; termination reason, step count and
  error count must agree -- agent tool errors, user tool errors (telecom), the limit hit inside a run
  of agent tool calls, several failing calls in one message, ``max_steps`` (not checked while a tool
  call is pending) and a user stop at the last step (tau2 overrides it with ``max_steps``).
* Training path (no runner): each ``call_tool`` is its own message; once the limit is hit the episode
  is over at once, later calls are not run and the user is not asked again.
* Parallel calls: the runner keeps and runs the first ``max_parallel_calls`` calls, as verl's
  ``ToolAgentLoop._build_assistant_message`` does, and counts the rest.
* First use: the tau2 import and the task loading run off the event loop (a ticker keeps ticking
  while a blocking loader, patched in, waits for it: events, no timing).
"""

from __future__ import annotations

import asyncio
import collections
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import tau2  # noqa: F401  (a required test dependency: a broken install fails, never skips)

from verl_credit.envs.tau2 import Tau2Environment
from verl_credit.envs.tau2 import domains as domains_module
from verl_credit.envs.tau2 import env as env_module
from verl_credit.envs.tau2.domains import get_task, load_split, new_environment
from verl_credit.envs.tau2.evaluate import build_parser, episode_summary, main
from verl_credit.envs.tau2.runner import _assistant_message, run_episode
from verl_credit.envs.tau2.termination import StepLimits, episode_over, tool_step

#: slow: tau2's own orchestrator and verl's tool agent loop
pytestmark = pytest.mark.slow

USER_URL = "http://user.test/v1"


# -- scripts shared by tau2's orchestrator and our runner --------------------------------------------


@dataclass(frozen=True)
class Turn:
    """One scripted message: text, or tool calls ``[(name, arguments), ...]``."""

    text: str | None = None
    calls: tuple[tuple[str, dict[str, Any]], ...] = ()


def say(text: str) -> Turn:
    return Turn(text=text)


def call(*calls: tuple[str, dict[str, Any]]) -> Turn:
    return Turn(calls=tuple(calls))


def _openai_calls(turn: Turn, prefix: str) -> list[dict[str, Any]]:
    return [
        {"id": f"{prefix}{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
        for i, (name, args) in enumerate(turn.calls)
    ]


def _openai_message(turn: Turn, prefix: str) -> dict[str, Any]:
    if turn.calls:
        return {"role": "assistant", "content": None, "tool_calls": _openai_calls(turn, prefix)}
    return {"role": "assistant", "content": turn.text}


def _tau2_message(turn: Turn, role: str, number: int) -> Any:
    from tau2.data_model.message import AssistantMessage, ToolCall, UserMessage

    cls = AssistantMessage if role == "assistant" else UserMessage
    if turn.calls:
        calls = [
            ToolCall(id=f"{role}{number}_{i}", name=name, arguments=args, requestor=role)
            for i, (name, args) in enumerate(turn.calls)
        ]
        return cls(role=role, tool_calls=calls)
    return cls(role=role, content=turn.text)


@dataclass
class Outcome:
    termination: str
    steps: int
    errors: int
    agent_turns: int  # agent messages asked for
    user_turns: int  # simulated-user messages asked for
    tool_results: int  # tool messages in tau2's trajectory


def run_tau2_orchestrator(
    domain: str, task_id: str, agent: Sequence[Turn], user: Sequence[Turn], **limits: int
) -> Outcome:
    """The reference: tau2's own Orchestrator with a scripted agent and user (no LLM)."""
    from tau2.agent.base import BaseAgent
    from tau2.orchestrator.orchestrator import Orchestrator
    from tau2.user.base import BaseUser
    from tau2.user.user_simulator import UserSimulator

    agent_script, user_script = collections.deque(agent), collections.deque(user)
    asked = {"agent": 0, "user": 0}

    class ScriptedAgent(BaseAgent):
        def generate_next_message(self, message: Any, state: Any) -> tuple[Any, Any]:
            asked["agent"] += 1
            return _tau2_message(agent_script.popleft(), "assistant", asked["agent"]), state

        def get_init_state(self, message_history: Any = None) -> Any:
            return None

        def stop(self, message: Any = None, state: Any = None) -> None:
            pass

    class ScriptedUser(BaseUser):
        def get_init_state(self, message_history: Any = None) -> Any:
            return None

        def generate_next_message(self, message: Any, state: Any) -> tuple[Any, Any]:
            asked["user"] += 1
            return _tau2_message(user_script.popleft(), "user", asked["user"]), state

        @classmethod
        def is_stop(cls, message: Any) -> bool:
            return UserSimulator.is_stop(message)

    orchestrator = Orchestrator(
        domain=domain,
        agent=ScriptedAgent(),
        user=ScriptedUser(),
        environment=new_environment(domain),
        task=get_task(domain, task_id),
        **limits,
    )
    simulation = orchestrator.run()
    return Outcome(
        termination=simulation.termination_reason.value
        if hasattr(simulation.termination_reason, "value")
        else str(simulation.termination_reason),
        steps=orchestrator.step_count,
        errors=orchestrator.num_errors,
        agent_turns=asked["agent"],
        user_turns=asked["user"],
        tool_results=sum(1 for m in orchestrator.trajectory if m.role == "tool"),
    )


class ScriptedUserEndpoint:
    """The simulated user's OpenAI-compatible endpoint, in-process: the next scripted turn per request."""

    def __init__(self, script: Sequence[Turn]) -> None:
        self.script = collections.deque(script)
        self.requests = 0

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        if not self.script:
            return httpx.Response(400, json={"error": {"message": "user script exhausted"}})
        message = _openai_message(self.script.popleft(), f"u{self.requests}_")
        return httpx.Response(200, json={"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]})


class ScriptedPolicy:
    """Stands in for ``PolicyClient``: the next scripted assistant message per request."""

    def __init__(self, script: Sequence[Turn | dict[str, Any]]) -> None:
        self.script = collections.deque(script)
        self.requests = 0

    async def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], seed: Any = None) -> Any:
        self.requests += 1
        turn = self.script.popleft()
        return turn if isinstance(turn, dict) else _openai_message(turn, f"p{self.requests}_")


def make_env(user: ScriptedUserEndpoint, **options: Any) -> Tau2Environment:
    config = {"base_urls": [USER_URL], "model": "user-model", "max_retries": 0}
    return Tau2Environment(user=config, transport=httpx.MockTransport(user.handler), **options)


def run_ours(
    domain: str, task_id: str, agent: Sequence[Turn], user: Sequence[Turn], **limits: int
) -> tuple[Outcome, Any, Tau2Environment]:
    """The same script through our eval runner and Tau2Environment."""
    endpoint, policy = ScriptedUserEndpoint(user), ScriptedPolicy(agent)
    env = make_env(endpoint, **limits)

    async def play() -> Any:
        try:
            return await run_episode(env, {"domain": domain, "task_id": task_id}, policy, max_turns=100)
        finally:
            await env.close()

    result = asyncio.run(play())
    outcome = Outcome(
        termination=str(env.termination),
        steps=env.limits.step_count,
        errors=env.num_errors,
        agent_turns=policy.requests,
        user_turns=endpoint.requests,
        tool_results=sum(1 for m in env.tau2_messages if m.role == "tool"),
    )
    return outcome, result, env


RETAIL = ("retail", "0")
TELECOM_TASK = load_split("telecom", "train")[0].id
BAD_ORDER = "get_order_details"  # with an unknown order id the retail tool raises: a failed call


def _bad_order(i: int) -> tuple[str, dict[str, Any]]:
    return (BAD_ORDER, {"order_id": f"#W{i}"})


SCENARIOS: dict[str, tuple[tuple[str, str], list[Turn], list[Turn], dict[str, int], Outcome]] = {
    # the limit is hit in the middle of a run of agent tool calls: over right after the 3rd result
    "agent_errors_across_messages": (
        RETAIL,
        [call(_bad_order(0)), call(_bad_order(1)), call(_bad_order(2)), say("never asked")],
        [say("Hi, I need help with an order.")],
        {"max_errors": 3},
        Outcome("too_many_errors", steps=7, errors=3, agent_turns=3, user_turns=1, tool_results=3),
    ),
    # one message's calls are one step: all four run, then the check
    "failing_calls_in_one_message": (
        RETAIL,
        [call(*(_bad_order(i) for i in range(4))), say("never asked")],
        [say("Hi.")],
        {"max_errors": 2},
        Outcome("too_many_errors", steps=3, errors=4, agent_turns=1, user_turns=1, tool_results=4),
    ),
    # telecom's user has tools: their failures count too, alone or with the agent's
    "user_tool_errors": (
        ("telecom", TELECOM_TASK),
        [say("never asked")],
        [call(("toggle_airplane_mode", {"bogus": 1})), call(("no_such_tool", {})), say("never sent")],
        {"max_errors": 2},
        Outcome("too_many_errors", steps=4, errors=2, agent_turns=0, user_turns=2, tool_results=2),
    ),
    "agent_and_user_errors_add_up": (
        ("telecom", TELECOM_TASK),
        [call(("get_customer_by_phone", {"bogus": "x"})), say("Please toggle airplane mode."), say("never asked")],
        [say("My mobile data does not work."), call(("toggle_airplane_mode", {"bogus": 1})), say("never sent")],
        {"max_errors": 2},
        Outcome("too_many_errors", steps=6, errors=2, agent_turns=2, user_turns=2, tool_results=2),
    ),
    # max_steps is not checked while a tool call waits for the environment: 4 is passed, 5 ends it
    "max_steps_waits_for_tool_results": (
        RETAIL,
        [say("How can I help?"), call(("get_user_details", {"user_id": "nobody"})), say("never asked")],
        [say("Hi."), say("Look me up.")],
        {"max_steps": 4},
        Outcome("max_steps", steps=5, errors=1, agent_turns=2, user_turns=2, tool_results=1),
    ),
    # a user stop on the last step: tau2's check after the step replaces USER_STOP with MAX_STEPS
    "user_stop_on_the_last_step_is_max_steps": (
        RETAIL,
        [say("How can I help?")],
        [say("Hi."), say("Never mind. ###STOP###")],
        {"max_steps": 3},
        Outcome("max_steps", steps=3, errors=0, agent_turns=1, user_turns=2, tool_results=0),
    ),
    "user_stop": (
        RETAIL,
        [call(_bad_order(0)), say("Sorry, I cannot find it.")],
        [say("Hi."), say("OK, bye. ###STOP###")],
        {},
        Outcome("user_stop", steps=5, errors=1, agent_turns=2, user_turns=2, tool_results=1),
    ),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_termination_matches_tau2s_orchestrator(name: str) -> None:
    (domain, task_id), agent, user, limits, expected = SCENARIOS[name]
    reference = run_tau2_orchestrator(domain, task_id, agent, user, **limits)
    ours, result, env = run_ours(domain, task_id, agent, user, **limits)
    assert reference == expected, "the scenario's expectation is tau2's own behaviour"
    assert ours == reference
    assert result.termination == reference.termination
    if reference.termination != "user_stop":
        assert result.reward == 0.0 and env.reward_info.info["note"].startswith("Simulation terminated prematurely")


def tau2_agent_histories(domain: str, task_id: str, agent: Sequence[Turn], user: Sequence[Turn]) -> list[list[Any]]:
    """What tau2's own Orchestrator gives its agent: the history of every ``generate_next_message``
    (the ``message_history`` of ``get_init_state`` plus each incoming message, as ``LLMAgent`` keeps
    them), as ``(role, text)`` pairs."""
    from tau2.agent.base import BaseAgent
    from tau2.data_model.message import MultiToolMessage
    from tau2.orchestrator.orchestrator import Orchestrator
    from tau2.user.base import BaseUser
    from tau2.user.user_simulator import UserSimulator

    agent_script, user_script = collections.deque(agent), collections.deque(user)
    history: list[Any] = []
    seen: list[list[Any]] = []

    def pair(message: Any) -> Any:
        return (message.role, message.content)

    class RecordingAgent(BaseAgent):
        def get_init_state(self, message_history: Any = None) -> Any:
            history.extend(pair(m) for m in message_history or [])
            return None

        def generate_next_message(self, message: Any, state: Any) -> tuple[Any, Any]:
            incoming = message.tool_messages if isinstance(message, MultiToolMessage) else [message]
            history.extend(pair(m) for m in incoming)
            seen.append(list(history))
            reply = _tau2_message(agent_script.popleft(), "assistant", len(seen))
            history.append(pair(reply))
            return reply, state

        def stop(self, message: Any = None, state: Any = None) -> None:
            pass

    class ScriptedUser(BaseUser):
        def get_init_state(self, message_history: Any = None) -> Any:
            return None

        def generate_next_message(self, message: Any, state: Any) -> tuple[Any, Any]:
            return _tau2_message(user_script.popleft(), "user", len(user) - len(user_script)), state

        @classmethod
        def is_stop(cls, message: Any) -> bool:
            return UserSimulator.is_stop(message)

    Orchestrator(
        domain=domain,
        agent=RecordingAgent(),
        user=ScriptedUser(),
        environment=new_environment(domain),
        task=get_task(domain, task_id),
    ).run()
    return seen


class RecordingPolicy(ScriptedPolicy):
    """:class:`ScriptedPolicy` that keeps the messages of every request."""

    def __init__(self, script: Sequence[Turn]) -> None:
        super().__init__(script)
        self.histories: list[list[dict[str, Any]]] = []

    async def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], seed: Any = None) -> Any:
        self.histories.append([dict(m) for m in messages])
        return await super().complete(messages, tools, seed)


def test_the_agent_sees_tau2s_greeting_in_its_history_as_tau2s_orchestrator_gives_it() -> None:
    """tau2's orchestrator starts the agent's history with its greeting (``get_init_state(message_history=
    [DEFAULT_FIRST_AGENT_MESSAGE])``), then the user's answer to it; the agent's requests here (the eval
    runner, and the credit_agent loop through the same ``EpisodeStart.info["greeting"]``) hold the same
    messages after the system prompt, at every turn."""
    agent = [say("Which order?"), say("Done.")]
    user = [say("I want to return an item."), say("Order #W1. ###STOP###")]
    reference = tau2_agent_histories("retail", "0", agent, user)
    endpoint, policy = ScriptedUserEndpoint(user), RecordingPolicy(agent)
    env = make_env(endpoint)

    async def play() -> Any:
        try:
            return await run_episode(env, {"domain": "retail", "task_id": "0"}, policy, max_turns=10)
        finally:
            await env.close()

    asyncio.run(play())
    ours = [[(m["role"], m["content"]) for m in history[1:]] for history in policy.histories]
    assert policy.histories[0][0]["role"] == "system"
    assert reference[0][0] == ("assistant", "Hi! How can I help you today?")
    assert ours == reference
    # tau2's own trajectory, which its evaluator reads, holds the greeting once
    texts = [m.content for m in env.tau2_messages if m.role == "assistant"]
    assert texts.count("Hi! How can I help you today?") == 1


# -- the training path: call_tool without the runner's tool_step ------------------------------------


def _started_env(endpoint: ScriptedUserEndpoint, **options: Any) -> Tau2Environment:
    env = make_env(endpoint, **options)
    asyncio.run(env.start({"domain": "retail", "task_id": "0"}))
    return env


def test_limit_hit_by_a_lone_call_ends_the_episode_at_once() -> None:
    endpoint = ScriptedUserEndpoint([say("Hi."), say("never sent")])
    env = _started_env(endpoint, max_errors=2)
    first = asyncio.run(env.call_tool(BAD_ORDER, {"order_id": "#W0"}))
    assert first.is_error and not env.episode_over
    second = asyncio.run(env.call_tool(BAD_ORDER, {"order_id": "#W1"}))
    assert second.is_error and env.episode_over and env.termination == "too_many_errors"
    assert episode_over(env)
    # a later call (the policy's next message, if the driver keeps going) is not run
    recorded = len(env.tau2_messages)
    late = asyncio.run(env.call_tool("get_order_details", {"order_id": "#W2378156"}))
    assert late.is_error and "episode has ended (too_many_errors)" in late.content
    assert len(env.tau2_messages) == recorded and env.num_errors == 2
    turn = asyncio.run(env.user_turn([{"role": "assistant", "content": "Sorry."}]))
    assert turn.done and endpoint.requests == 1  # the user was not asked again
    assert asyncio.run(env.reward()) == 0.0


def test_calls_the_driver_answered_count_as_failed_calls() -> None:
    """verl answers bad-JSON / unknown-tool calls itself; tau2's environment would fail them."""
    env = _started_env(ScriptedUserEndpoint([say("Hi.")]), max_errors=3)
    with tool_step(env, num_calls=3):
        ok = asyncio.run(env.call_tool("get_order_details", {"order_id": "#W2378156"}))
        assert not ok.is_error and not env.episode_over  # checked only when the message's step ends
    assert env.num_errors == 2 and not env.episode_over
    assert env.limits.step_count == 3  # user's first message, the agent's calls, their results
    (message,) = [m for m in env.tau2_messages if m.role == "assistant" and m.tool_calls]
    assert [c.name for c in message.tool_calls] == ["get_order_details"]


def test_step_limits_validate_and_follow_the_orchestrator_order() -> None:
    limits = StepLimits(max_steps=2, max_errors=1)
    assert limits.after_step(to_env=True) is None  # pending tool call: no check
    limits.count_errors(1)
    assert limits.after_step(to_env=False, stop="user_stop") == "too_many_errors"  # errors checked last
    with pytest.raises(ValueError, match=r"credit\.env\.max_steps"):
        StepLimits(max_steps=0)
    with pytest.raises(ValueError, match=r"credit\.env\.max_steps"):
        Tau2Environment(max_steps=0)


# -- parallel tool calls: verl's cut, in the runner ----------------------------------------------------


def test_runner_keeps_and_runs_the_first_max_parallel_calls_like_verl() -> None:
    calls = call(*(("get_user_details", {"user_id": f"u{i}"}) for i in range(5)))
    endpoint = ScriptedUserEndpoint([say("Hi."), say("Thanks. ###STOP###")])
    policy = ScriptedPolicy([calls, say("Done.")])
    env = make_env(endpoint)

    async def play() -> Any:
        try:
            return await run_episode(env, {"domain": "retail", "task_id": "0"}, policy, max_parallel_calls=2)
        finally:
            await env.close()

    result = asyncio.run(play())
    assistant = result.messages[3]  # after the system prompt, tau2's greeting and the user's reply
    assert [c["function"]["arguments"] for c in assistant["tool_calls"]] == ['{"user_id": "u0"}', '{"user_id": "u1"}']
    assert [m["role"] for m in result.messages[4:6]] == ["tool", "tool"] and result.messages[6]["role"] == "assistant"
    assert sum(1 for m in env.tau2_messages if m.role == "tool") == 2  # the other 3 never ran
    assert result.dropped_tool_calls == 3 and result.to_record()["dropped_tool_calls"] == 3
    summary = episode_summary([result.to_record(), {**result.to_record(), "dropped_tool_calls": 0}])
    assert summary["dropped_tool_calls"] == 3 and summary["episodes_with_dropped_tool_calls"] == 1
    assert summary["terminations"] == {"user_stop": 2}


def test_runner_cut_equals_verls_build_assistant_message() -> None:
    from types import SimpleNamespace

    from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop
    from verl.experimental.agent_loop.tool_parser import FunctionCall

    reply = _openai_message(call(*(("get_user_details", {"user_id": f"u{i}"}) for i in range(20))), "c")
    parsed = [
        FunctionCall(name=c["function"]["name"], arguments=c["function"]["arguments"], tool_call_id=c["id"])
        for c in reply["tool_calls"]
    ]
    for limit in (1, 3, 16):
        ours, dropped = _assistant_message(reply, limit)
        verl = ToolAgentLoop._build_assistant_message(
            SimpleNamespace(max_parallel_calls=limit), "", SimpleNamespace(tool_calls=parsed)
        )
        assert [c["id"] for c in ours["tool_calls"]] == [c["id"] for c in verl["tool_calls"]]
        assert [json.loads(c["function"]["arguments"]) for c in ours["tool_calls"]] == [
            c["function"]["arguments"] for c in verl["tool_calls"]
        ]
        assert dropped == 20 - limit


def test_cli_max_parallel_calls_defaults_to_16_and_reaches_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["run", "--policy-base-url", "http://p/v1", "--policy-model", "p"]
    base += ["--user-base-url", "http://u/v1", "--user-model", "u", "--out", "/nonexistent/r.jsonl"]
    args = build_parser().parse_args(base)
    assert (args.max_parallel_calls, args.max_steps, args.max_errors, args.trust_env) == (16, 200, 10, False)
    assert main([*base, "--domains", "airline", "--dry-run", "--max-parallel-calls", "4"]) == 0
    plan = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (plan["max_parallel_calls"], plan["max_steps"], plan["max_errors"]) == (4, 200, 10)
    assert main([*base, "--max-parallel-calls", "0"]) == 2


# -- first use off the event loop ----------------------------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("loader", ["require_tau2", "get_task"])
def test_first_use_loading_runs_off_the_event_loop(loader: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The patched loader blocks until a ticker coroutine on the loop has ticked; on the loop it could
    never see a tick (the wait would time out and the test fail)."""
    real = getattr(env_module, loader)
    ticked = threading.Event()
    saw_ticks: list[bool] = []

    def blocking_loader(*args: Any) -> Any:
        saw_ticks.append(ticked.wait(timeout=30))
        return real(*args)

    monkeypatch.setattr(env_module, loader, blocking_loader)

    async def ticker() -> int:
        ticks = 0
        while not ticked.is_set():
            await asyncio.sleep(0)
            ticks += 1
            if ticks >= 3:
                ticked.set()
        return ticks

    async def scenario() -> None:
        env = make_env(ScriptedUserEndpoint([say("Hi.")]))
        try:
            ticking = asyncio.create_task(ticker())
            start = await env.start({"domain": "telecom", "task_id": TELECOM_TASK})
            assert start.first_user_message == "Hi." and await ticking >= 3
        finally:
            await env.close()

    asyncio.run(scenario())
    assert saw_ticks == [True]


def test_domain_caches_compute_once_under_concurrent_threads() -> None:
    calls: list[str] = []
    release = threading.Event()

    @domains_module._cached_once
    def slow(key: str) -> object:
        calls.append(key)
        release.wait(timeout=30)
        return object()

    results: list[object] = []
    threads = [threading.Thread(target=lambda: results.append(slow("telecom"))) for _ in range(8)]
    for thread in threads:
        thread.start()
    release.set()
    for thread in threads:
        thread.join(timeout=30)
    assert calls == ["telecom"] and len(results) == 8 and len({id(r) for r in results}) == 1


def test_constructing_the_env_does_not_import_tau2(monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent loop builds the env on the event loop: only start() (in a thread) may import tau2."""
    imported: list[bool] = []
    monkeypatch.setattr(env_module, "require_tau2", lambda: imported.append(True))
    Tau2Environment(user={"base_urls": [USER_URL], "model": "m"})
    assert imported == []
