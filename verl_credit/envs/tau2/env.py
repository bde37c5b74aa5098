"""tau2-bench as a :class:`verl_credit.envs.base.Environment`: real policy, database, tools and evaluator.

One instance plays one episode of one task, following tau2's orchestrator:

- ``start``: a fresh domain environment (databases from the tau2 package), the task's initial state
  (``initialization_data`` / ``initialization_actions``: telecom puts the user's phone into its broken
  state this way), tau2's opening agent line ``"Hi! How can I help you today?"`` and the simulated
  user's first reply. The agent sees tau2's LLM-agent system prompt (instruction + domain policy) and
  the domain's tools as OpenAI schemas.
- ``call_tool``: the agent's call runs against the domain environment (``Environment.get_response``,
  which also syncs the user's device state in telecom); tool errors are returned as text.
- ``user_turn``: the agent's text goes to tau2's user simulator (LLM endpoint). In telecom the user
  has tools of their own (dual control: toggle airplane mode, reseat the SIM, run a speed test, ...);
  their calls run against the user side of the same environment and the simulator is asked again
  until it says something to the agent. The agent never sees the user's tool calls, as in tau2.
- ``reward``: ``tau2.evaluator.evaluate_simulation(..., EvaluationType.ALL)`` on the episode's tau2
  message list: the product over the task's ``reward_basis`` of DB-hash match against the gold
  actions replayed on a fresh environment, environment assertions, gold-action presence, and
  communicated info. An episode that did not end with a user stop token (ran out of turns, too many
  tool errors, an empty agent message) gets 0, as tau2 gives prematurely terminated simulations.

The episode's full tau2 trajectory (``tau2_messages``) and tau2's ``RewardInfo`` (``reward_info``)
stay on the instance for logging and tests.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Mapping
from typing import Any

import httpx

from verl_credit.envs.base import Environment, EpisodeStart, ToolResult, UserTurn, register_environment
from verl_credit.envs.tau2._deps import require_tau2
from verl_credit.envs.tau2.domains import agent_system_prompt, agent_tool_schemas, evaluation_domain, get_task
from verl_credit.envs.tau2.domains import new_environment as new_tau2_environment
from verl_credit.envs.tau2.user_sim import OpenAIUserSimulator, UserSimConfig

__all__ = ["Tau2Environment"]

_GREETING = "Hi! How can I help you today?"  # tau2.orchestrator.orchestrator.DEFAULT_FIRST_AGENT_MESSAGE


@register_environment("tau2")
class Tau2Environment(Environment):
    """tau2-bench episode (airline, retail, telecom) with an LLM-simulated user.

    Args:
        user: settings of the simulated user (``credit.env.options.user``), a mapping or a
            :class:`UserSimConfig`.
        max_errors: tau2's ``max_errors``: after this many failed tool calls (agent's and user's together)
            the episode ends with reward 0 (``TOO_MANY_ERRORS``).
        transport: optional ``httpx`` transport for the user-simulator client (tests).
    """

    def __init__(
        self,
        user: UserSimConfig | Mapping[str, Any] | None = None,
        max_errors: int = 10,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        require_tau2()
        self.user_config = user if isinstance(user, UserSimConfig) else UserSimConfig.from_mapping(user)
        if max_errors <= 0:
            raise ValueError(f"credit.env.max_errors must be > 0, got {max_errors}")
        self.max_errors = int(max_errors)
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._reset_episode()

    def _reset_episode(self) -> None:
        self.domain: str | None = None
        self.task: Any = None
        self.tau2_messages: list[Any] = []
        self.termination: str | None = None
        self.num_errors = 0
        self.reward_info: Any = None
        self._env: Any = None
        self._user: OpenAIUserSimulator | None = None
        self._assistant_seen = 0
        self._calls = 0
        self._start_time = ""
        self._t0 = 0.0

    # -- Environment interface -------------------------------------------------------------------

    async def start(self, task: Mapping[str, Any]) -> EpisodeStart:
        """Reset to ``task`` (``{"domain": ..., "task_id": ...}``, a row's ``extra_info``)."""
        from tau2.data_model.message import AssistantMessage
        from tau2.utils.utils import get_now

        for key in ("domain", "task_id"):
            if key not in task or task[key] is None:
                raise ValueError(f"tau2 task spec is missing {key!r}; got keys {sorted(task)}")
        self._reset_episode()
        self.domain = str(task["domain"])
        self.task = get_task(self.domain, str(task["task_id"]))
        initial = self.task.initial_state
        if initial is not None and initial.message_history:
            raise ValueError(f"tau2 task {self.task.id!r} has a message_history; replaying one is not supported")
        # building the domain (unpickling its database) and tau2's evaluation are CPU work of 0.05-0.5 s:
        # they run in a worker thread so the agent loop's other episodes keep generating meanwhile
        self._env = await asyncio.to_thread(_initial_environment, self.domain, initial)
        user_tools = self._env.get_user_tools() if self._env.user_tools is not None else None
        if self._client is None:
            self._client = httpx.AsyncClient(transport=self._transport, timeout=self.user_config.timeout_s)
        self._user = OpenAIUserSimulator(str(self.task.user_scenario), user_tools, self.user_config, self._client)
        self._start_time = get_now()
        self._t0 = time.perf_counter()

        greeting = AssistantMessage(role="assistant", content=_GREETING)
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
            system_prompt=agent_system_prompt(self.domain),
            tools=agent_tool_schemas(self.domain),
            first_user_message=first.content or "",
            info=info,
        )

    async def call_tool(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        """Run one agent tool call against the domain environment (errors come back as ``Error: ...``)."""
        from tau2.data_model.message import AssistantMessage, ToolCall

        self._require_started()
        if not isinstance(arguments, Mapping):
            raise TypeError(f"tool arguments must be a mapping, got {type(arguments).__name__}")
        self._calls += 1
        call = ToolCall(id=f"call_{self._calls}", name=str(name), arguments=dict(arguments), requestor="assistant")
        self.tau2_messages.append(AssistantMessage(role="assistant", tool_calls=[call]))
        result = self._env.get_response(call)
        self.tau2_messages.append(result)
        self.num_errors += int(result.error)
        return ToolResult(content=result.content or "", is_error=bool(result.error))

    async def user_turn(self, messages: list[dict[str, Any]]) -> UserTurn:
        """The simulated user's answer to the agent's last text message (``messages``: the transcript)."""
        from tau2.data_model.message import AssistantMessage

        self._require_started()
        if self.termination is not None:
            return UserTurn(content=None, done=True)
        last_text = self._record_assistant_texts(messages)
        if self.num_errors >= self.max_errors:
            return self._end("too_many_errors")
        if last_text is None:  # the agent's last message has no text: tau2's AGENT_ERROR (empty message)
            return self._end("agent_error")
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
            termination_reason=TerminationReason(self.termination or "max_steps"),
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

    def _record_assistant_texts(self, messages: list[dict[str, Any]]) -> str | None:
        """Append the agent's new text messages to the tau2 trajectory; return the last one's text.

        Tool calls were recorded by ``call_tool`` already; the text (what tau2's communicate check
        reads) is taken from the transcript. Returns ``None`` if the transcript's last assistant message
        has no text.
        """
        from tau2.data_model.message import AssistantMessage

        assistants = [m for m in messages if m.get("role") == "assistant"]
        last_text: str | None = None
        for message in assistants[self._assistant_seen :]:
            text = _text_of(message.get("content"))
            if text.strip():
                self.tau2_messages.append(AssistantMessage(role="assistant", content=text))
        self._assistant_seen = len(assistants)
        if assistants:
            text = _text_of(assistants[-1].get("content"))
            last_text = text if text.strip() else None
        return last_text

    async def _user_reply(self, incoming: Any) -> UserTurn:
        """Ask the simulated user, running its own tool calls (dual control) until it speaks or stops."""
        from tau2.data_model.message import MultiToolMessage

        assert self._user is not None
        for _ in range(self.user_config.max_tool_steps + 1):
            message = await self._user.respond(incoming)
            self.tau2_messages.append(message)
            if not message.is_tool_call():
                if not message.has_text_content():
                    return self._end("user_error")
                if self._user.is_stop(message):
                    return self._end("user_stop", message.content)
                return UserTurn(content=message.content, done=False)
            results = [self._env.get_response(call) for call in message.tool_calls]
            self.tau2_messages.extend(results)
            self.num_errors += sum(int(result.error) for result in results)
            self._env.sync_tools()
            if self.num_errors >= self.max_errors:
                return self._end("too_many_errors")
            incoming = results[0] if len(results) == 1 else MultiToolMessage(role="tool", tool_messages=results)
        return self._end("max_steps")


def _initial_environment(domain: str, initial: Any) -> Any:
    """A fresh tau2 environment of ``domain`` in the task's initial state (tau2's orchestrator does the same)."""
    env = new_tau2_environment(domain)
    env.set_state(
        initialization_data=initial.initialization_data if initial is not None else None,
        initialization_actions=initial.initialization_actions if initial is not None else None,
        message_history=[],
    )
    return env


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
