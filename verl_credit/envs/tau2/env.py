"""tau2-bench as a :class:`verl_credit.envs.base.Environment`: real policy, database, tools and evaluator.

One instance plays one episode of one task, following tau2's orchestrator:

- ``start``: a fresh domain environment (databases from the tau2 package), the task's initial state
  (``initialization_data`` / ``initialization_actions``: telecom puts the user's phone into its broken
  state this way), tau2's opening agent line ``"Hi! How can I help you today?"`` and the simulated
  user's first reply. The agent sees tau2's LLM-agent system prompt (instruction + domain policy) and
  the domain's tools as OpenAI schemas; the opening line comes back as ``EpisodeStart.info["greeting"]``
  and the drivers (the ``credit_agent`` loop, the eval runner) put it into the agent's history before
  the user's reply, as tau2's orchestrator does (``agent.get_init_state(message_history=[greeting])``).
- ``call_tool``: the agent's call runs against the domain environment (``Environment.get_response``,
  which also syncs the user's device state in telecom); tool errors are returned as text. The calls
  of one assistant message form one tau2 step when the driver brackets them with
  :func:`~verl_credit.envs.tau2.termination.tool_step` (the eval runner does); otherwise each call is
  a message of its own.
- ``user_turn``: the agent's text goes to tau2's user simulator (LLM endpoint). In telecom the user
  has tools of their own (dual control: toggle airplane mode, reseat the SIM, run a speed test, ...);
  their calls run against the user side of the same environment and the simulator is asked again
  until it says something to the agent. The agent never sees the user's tool calls, as in tau2.
- termination: tau2's orchestrator rule (:class:`~verl_credit.envs.tau2.termination.StepLimits`):
  after every step, ``max_steps`` steps or ``max_errors`` failed tool calls (the agent's and the
  user's) end the episode at once (``MAX_STEPS`` / ``TOO_MANY_ERRORS``); :attr:`episode_over` tells
  the driver, later tool calls are not run and the next ``user_turn`` says done.
- ``reward``: ``tau2.evaluator.evaluate_simulation(..., EvaluationType.ALL)`` on the episode's tau2
  message list: the product over the task's ``reward_basis`` of DB-hash match against the gold
  actions replayed on a fresh environment, environment assertions, gold-action presence, and
  communicated info. An episode that did not end with a user stop token (ran out of turns, too many
  tool errors, an empty agent message) gets 0, as tau2 gives prematurely terminated simulations.

The first episode of a process imports tau2 (~7 s) and loads the domain's tasks (telecom ~2 s): that
and building the episode's environment run in a worker thread, so the rollout worker's event loop
keeps serving its other sessions meanwhile.

The episode's full tau2 trajectory (``tau2_messages``) and tau2's ``RewardInfo`` (``reward_info``)
stay on the instance for logging and tests.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from verl_credit.envs.base import Environment, EpisodeStart, ToolResult, UserTurn, register_environment
from verl_credit.envs.tau2._deps import check_tau2_installed, require_tau2
from verl_credit.envs.tau2.domains import agent_system_prompt, agent_tool_schemas, evaluation_domain, get_task
from verl_credit.envs.tau2.domains import new_environment as new_tau2_environment
from verl_credit.envs.tau2.termination import (
    AGENT_ERROR,
    DEFAULT_MAX_ERRORS,
    DEFAULT_MAX_STEPS,
    MAX_STEPS,
    USER_ERROR,
    USER_STOP,
    StepLimits,
)
from verl_credit.envs.tau2.user_sim import OpenAIUserSimulator, UserSimConfig
from verl_credit.openai_chat import make_async_client

__all__ = ["Tau2Environment"]

_GREETING = "Hi! How can I help you today?"  # tau2.orchestrator.orchestrator.DEFAULT_FIRST_AGENT_MESSAGE


@dataclass
class _Prepared:
    """What a new episode needs from tau2, built in a worker thread (:func:`_prepare_episode`)."""

    task: Any
    env: Any
    system_prompt: str
    tools: list[dict[str, Any]]
    user: OpenAIUserSimulator


@dataclass
class _ToolStep:
    """One assistant message's tool calls, executed as one tau2 environment step."""

    message: Any = None  # the tau2 AssistantMessage holding the step's calls (made at the first call)
    calls: int = 0  # calls that reached the domain environment


@register_environment("tau2")
class Tau2Environment(Environment):
    """tau2-bench episode (airline, retail, telecom) with an LLM-simulated user.

    Args:
        user: settings of the simulated user (``credit.env.options.user``), a mapping or a
            :class:`UserSimConfig`.
        max_errors: tau2's ``max_errors``: once this many tool calls failed (agent's and user's together)
            the episode ends with reward 0 (``TOO_MANY_ERRORS``).
        max_steps: tau2's ``max_steps`` (messages delivered, a tool-call batch's execution counting as
            one): reaching it ends the episode with reward 0 (``MAX_STEPS``). Default 200, ``tau2 run``'s.
        transport: optional ``httpx`` transport for the user-simulator client (tests).
    """

    def __init__(
        self,
        user: UserSimConfig | Mapping[str, Any] | None = None,
        max_errors: int = DEFAULT_MAX_ERRORS,
        max_steps: int = DEFAULT_MAX_STEPS,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        # only a cheap check here: the environment is built on the rollout worker's event loop, and the
        # tau2 import itself (~7 s) waits for start(), which runs it in a thread
        check_tau2_installed()
        self.user_config = user if isinstance(user, UserSimConfig) else UserSimConfig.from_mapping(user)
        StepLimits(max_steps=max_steps, max_errors=max_errors)  # validates both, naming the key
        self.max_errors = int(max_errors)
        self.max_steps = int(max_steps)
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._reset_episode()

    def _reset_episode(self) -> None:
        self.domain: str | None = None
        self.task: Any = None
        self.tau2_messages: list[Any] = []
        self.termination: str | None = None
        self.limits = StepLimits(max_steps=self.max_steps, max_errors=self.max_errors)
        self.reward_info: Any = None
        self._env: Any = None
        self._user: OpenAIUserSimulator | None = None
        self._step: _ToolStep | None = None
        self._assistant_seen = 0
        self._calls = 0
        self._start_time = ""
        self._t0 = 0.0

    @property
    def num_errors(self) -> int:
        """Failed tool calls so far (agent's and user's), tau2's ``num_errors``."""
        return self.limits.num_errors

    @property
    def episode_over(self) -> bool:
        """The episode has ended (user stop, a limit, an error): the driver should stop generating."""
        return self.termination is not None

    @property
    def user_reasoning_fallbacks(self) -> int:
        """Simulated-user replies taken from the reasoning field because ``content`` was empty."""
        return self._user.reasoning_fallbacks if self._user is not None else 0

    # -- Environment interface -------------------------------------------------------------------

    async def start(self, task: Mapping[str, Any]) -> EpisodeStart:
        """Reset to ``task`` (``{"domain": ..., "task_id": ...}``, a row's ``extra_info``)."""
        for key in ("domain", "task_id"):
            if key not in task or task[key] is None:
                raise ValueError(f"tau2 task spec is missing {key!r}; got keys {sorted(task)}")
        self._reset_episode()
        self.domain = str(task["domain"])
        if self._client is None:
            self._client = make_async_client(
                transport=self._transport, timeout=self.user_config.timeout_s, trust_env=self.user_config.trust_env
            )
        # the tau2 import, task loading, the domain's database and tau2's user prompt are blocking CPU
        # work (seconds the first time): a worker thread, so the loop's other episodes keep going
        prepared = await asyncio.to_thread(
            _prepare_episode, self.domain, str(task["task_id"]), self.user_config, self._client
        )
        from tau2.data_model.message import AssistantMessage
        from tau2.utils.utils import get_now

        self.task, self._env, self._user = prepared.task, prepared.env, prepared.user
        self._start_time = get_now()
        self._t0 = time.perf_counter()

        greeting = AssistantMessage(role="assistant", content=_GREETING)  # not a step (tau2's initialize)
        self.tau2_messages.append(greeting)
        first = await self._user_reply(greeting)
        info = {
            "domain": self.domain,
            "task_id": self.task.id,
            "greeting": _GREETING,
            "reward_basis": [basis.value for basis in self.task.evaluation_criteria.reward_basis]
            if self.task.evaluation_criteria is not None
            else [],
            "user_done": first.done,
        }
        return EpisodeStart(
            system_prompt=prepared.system_prompt,
            tools=prepared.tools,
            first_user_message=first.content or "",
            info=info,
        )

    async def call_tool(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        """Run one agent tool call against the domain environment (errors come back as ``Error: ...``).

        Outside :meth:`begin_tool_step` / :meth:`end_tool_step` the call is a tool-call message of its
        own (tau2 checks the limits right after it). Once the episode is over, calls are not run.
        """
        self._require_started()
        if not isinstance(arguments, Mapping):
            raise TypeError(f"tool arguments must be a mapping, got {type(arguments).__name__}")
        if self.termination is not None:
            return ToolResult(content=f"Error: the episode has ended ({self.termination}); not run", is_error=True)
        if self._step is not None:
            return self._run_agent_call(self._step, str(name), dict(arguments))
        self.begin_tool_step()
        try:
            return self._run_agent_call(self._step, str(name), dict(arguments))
        finally:
            self.end_tool_step(1)

    def begin_tool_step(self) -> None:
        """The following ``call_tool`` calls are one assistant message's (one tau2 environment step)."""
        self._require_started()
        if self._step is not None:
            raise RuntimeError("Tau2Environment: a tool step is already open (end_tool_step was not called)")
        self._step = _ToolStep()

    def end_tool_step(self, num_calls: int | None = None) -> None:
        """Close the tool step: tau2's agent-message step and environment step, then its limit check.

        ``num_calls``: the calls the assistant message had; those that never reached ``call_tool`` (the
        driver answered them: bad JSON arguments, unknown tool) count as failed calls, as they do in
        tau2, whose environment raises on them.
        """
        step, self._step = self._step, None
        if step is None:
            raise RuntimeError("Tau2Environment: end_tool_step without begin_tool_step")
        if self.termination is not None:
            return  # ended before this message: its calls were not run
        self.limits.count_errors(max(0, int(num_calls or 0) - step.calls))
        self._after_step(to_env=True)  # the agent's tool-call message, to the environment: no check
        self._after_step(to_env=False)  # the environment's results, back to the agent: checked

    async def user_turn(self, messages: list[dict[str, Any]]) -> UserTurn:
        """The simulated user's answer to the agent's last text message (``messages``: the transcript)."""
        from tau2.data_model.message import AssistantMessage

        self._require_started()
        if self.termination is not None:
            return UserTurn(content=None, done=True)
        last_text = self._record_assistant_texts(messages)
        if last_text is None:  # the agent's last message has no text: tau2's AGENT_ERROR (empty message)
            return self._end(AGENT_ERROR)
        if self._after_step(to_env=False):  # the agent's text message, to the user: checked
            return UserTurn(content=None, done=True)
        return await self._user_reply(AssistantMessage(role="assistant", content=last_text))

    async def reward(self) -> float:
        """tau2's evaluation of the episode (``EvaluationType.ALL``); 0 unless the user ended it."""
        self._require_started()
        if self.reward_info is None:
            self.reward_info = await asyncio.to_thread(self.evaluate)
        return float(self.reward_info.reward)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # -- evaluation --------------------------------------------------------------------------------

    def evaluate(self) -> Any:
        """tau2's ``RewardInfo`` for the episode so far (termination ``max_steps`` if it has not ended)."""
        from tau2.data_model.simulation import SimulationRun, TerminationReason
        from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
        from tau2.utils.utils import get_now

        simulation = SimulationRun(
            id=str(uuid.uuid4()),
            task_id=self.task.id,
            start_time=self._start_time,
            end_time=get_now(),
            duration=time.perf_counter() - self._t0,
            termination_reason=TerminationReason(self.termination or MAX_STEPS),
            messages=list(self.tau2_messages),
        )
        return evaluate_simulation(
            simulation=simulation,
            task=self.task,
            evaluation_type=EvaluationType.ALL,
            solo_mode=False,
            domain=evaluation_domain(self.domain),
        )

    # -- helpers -----------------------------------------------------------------------------------

    def _require_started(self) -> None:
        if self._env is None:
            raise RuntimeError("Tau2Environment.start(task) must be called first")

    def _end(self, reason: str, content: str | None = None) -> UserTurn:
        self.termination = reason
        return UserTurn(content=content, done=True)

    def _after_step(self, *, to_env: bool, stop: str | None = None) -> bool:
        """A tau2 step happened: sync the tools (as tau2 does after every step), apply the limits;
        ``True`` if the episode ended."""
        self._env.sync_tools()
        reason = self.limits.after_step(to_env=to_env, stop=stop)
        if reason is not None:
            self.termination = reason
        return reason is not None

    def _run_agent_call(self, step: _ToolStep, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Execute one agent call inside ``step`` (tau2: the calls of one AssistantMessage, then their results)."""
        from tau2.data_model.message import AssistantMessage, ToolCall

        self._calls += 1
        call = ToolCall(id=f"call_{self._calls}", name=name, arguments=arguments, requestor="assistant")
        if step.message is None:
            step.message = AssistantMessage(role="assistant", tool_calls=[])
            self.tau2_messages.append(step.message)
        step.message.tool_calls.append(call)
        step.calls += 1
        result = self._env.get_response(call)
        self.tau2_messages.append(result)
        self.limits.count_errors(int(result.error))
        return ToolResult(content=result.content or "", is_error=bool(result.error))

    def _record_assistant_texts(self, messages: list[dict[str, Any]]) -> str | None:
        """Append the agent's new text messages to the tau2 trajectory; return the last one's text.

        Tool calls were recorded by ``call_tool`` already; the text (what tau2's communicate check
        reads) is taken from the transcript. Returns ``None`` if the transcript's last assistant message
        has no text.
        """
        from tau2.data_model.message import AssistantMessage

        assistants = [m for m in messages if m.get("role") == "assistant"]
        seen = self._assistant_seen
        if seen == 0 and _opens_with_greeting(messages):
            seen = 1  # the greeting in the agent's history: start() recorded it already
        last_text: str | None = None
        for message in assistants[seen:]:
            text = _text_of(message.get("content"))
            if text.strip():
                self.tau2_messages.append(AssistantMessage(role="assistant", content=text))
        self._assistant_seen = len(assistants)
        if assistants:
            text = _text_of(assistants[-1].get("content"))
            last_text = text if text.strip() else None
        return last_text

    async def _user_reply(self, incoming: Any) -> UserTurn:
        """Ask the simulated user, running its own tool calls (dual control) until it speaks or stops.

        Each user message is a tau2 step (checked unless it is a tool call), and so is the execution of
        its tool calls (checked): a user's failing tool calls count towards ``max_errors`` too.
        """
        from tau2.data_model.message import MultiToolMessage

        assert self._user is not None
        tool_messages = 0
        while True:
            message = await self._user.respond(incoming)
            self.tau2_messages.append(message)
            if not message.is_tool_call():
                return self._user_text_step(message)
            if self.user_config.max_tool_steps is not None and tool_messages >= self.user_config.max_tool_steps:
                return self._end(MAX_STEPS)
            tool_messages += 1
            self._after_step(to_env=True)  # the user's tool-call message, to the environment: no check
            results = [self._env.get_response(call) for call in message.tool_calls]
            self.tau2_messages.extend(results)
            self.limits.count_errors(sum(int(result.error) for result in results))
            if self._after_step(to_env=False):  # the results, back to the user: checked
                return UserTurn(content=None, done=True)
            incoming = results[0] if len(results) == 1 else MultiToolMessage(role="tool", tool_messages=results)

    def _user_text_step(self, message: Any) -> UserTurn:
        """The user's text message to the agent: a step, checked; a stop token ends the episode."""
        assert self._user is not None
        if not message.has_text_content():  # tau2's UserMessage.validate() rejects an empty message
            return self._end(USER_ERROR)
        stop = USER_STOP if self._user.is_stop(message) else None
        if self._after_step(to_env=False, stop=stop):
            return UserTurn(content=message.content, done=True)
        return UserTurn(content=message.content, done=False)


def _prepare_episode(domain: str, task_id: str, config: UserSimConfig, client: httpx.AsyncClient) -> _Prepared:
    """Everything blocking a new episode needs (run in a worker thread by :meth:`Tau2Environment.start`)."""
    require_tau2()
    task = get_task(domain, task_id)
    initial = task.initial_state
    if initial is not None and initial.message_history:
        raise ValueError(f"tau2 task {task.id!r} has a message_history; replaying one is not supported")
    env = _initial_environment(domain, initial)
    evaluation_domain(domain)  # registers the cached constructor now rather than at the first reward
    user_tools = env.get_user_tools() if env.user_tools is not None else None
    user = OpenAIUserSimulator(str(task.user_scenario), user_tools, config, client)
    return _Prepared(
        task=task,
        env=env,
        system_prompt=agent_system_prompt(domain),
        tools=agent_tool_schemas(domain),
        user=user,
    )


def _initial_environment(domain: str, initial: Any) -> Any:
    """A fresh tau2 environment of ``domain`` in the task's initial state (tau2's orchestrator does the same)."""
    env = new_tau2_environment(domain)
    env.set_state(
        initialization_data=initial.initialization_data if initial is not None else None,
        initialization_actions=initial.initialization_actions if initial is not None else None,
        message_history=[],
    )
    env.sync_tools()  # as Orchestrator.initialize ends
    return env


def _opens_with_greeting(messages: list[dict[str, Any]]) -> bool:
    """Whether the transcript's first assistant message is tau2's greeting, before any user message."""
    for message in messages:
        if message.get("role") == "user":
            return False
        if message.get("role") == "assistant":
            return _text_of(message.get("content")) == _GREETING
    return False


_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)
_CHAT_SPECIAL = re.compile(r"<\|(?:im_end|im_start|endoftext|eot_id|end)\|>")


def _text_of(content: Any) -> str:
    """The agent's text as a person would read it, from an OpenAI message content (a string or a list
    of ``{"type": "text", "text": ...}`` parts).

    verl's hermes tool parser decodes the generated ids without skipping special tokens, so a
    training transcript's assistant content ends with ``<|im_end|>``; chat special tokens and
    ``<think>`` blocks are removed before the text reaches the simulated user or tau2's evaluator.
    """
    if content is None:
        return ""
    if isinstance(content, list):
        content = "".join(part.get("text", "") for part in content if isinstance(part, Mapping))
    return _CHAT_SPECIAL.sub("", _THINK_BLOCK.sub("", str(content))).strip()
