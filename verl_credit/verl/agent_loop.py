"""``credit_agent``: verl's tool agent loop plus what dependency-aware credit needs.

One episode, driven by a :class:`verl_credit.envs.base.Environment` chosen by name
(``extra_info.env`` of the row, else ``credit.env.name``)::

    start = env.start(task)                 system prompt, tools, first user message (and the
                                            agent's greeting the user answered, if any)
    loop:  generate (verl's _handle_generating_state, unchanged)
           tool calls  -> env.call_tool      (verl's _handle_processing_tools_state, unchanged)
           no tool call -> simulated user   (credit.user: env | llm | scripted | none)
    reward = env.reward()
    annotate the finished trajectory (async, here in the rollout worker)  -> extra_fields

Without an environment (``credit.env.name=null``) the loop uses verl's own tools and the
dataset's ``raw_prompt``, exactly like ``tool_agent``.

Recorded in ``extra_fields["credit"]`` of every output row (``CREDIT_KEY``):

* ``spans``: ``[[action, start, end], ...]`` half-open token offsets into *that row's* response;
  ``action`` indexes the transcript's assistant messages. Exact: every span is all ones in
  ``response_mask`` and the spans cover every 1 of it.
* on the session's final row also ``messages`` (the transcript, including the assistant message
  verl drops when a turn limit or the length limit stops the loop), ``num_actions``,
  ``action_lengths``, ``stop_reason``, ``truncated_action`` and the annotation payload
  (``graph`` / ``call_graph`` / ``annotation``, see :mod:`verl_credit.verl.annotation`).

The episode (everything but the annotation) runs within ``credit.session.deadline``; a training
episode whose environment start, user reply or rollout-server call fails, or that passes the
deadline, returns one placeholder row instead (nothing trainable, ``session_failed`` in its
payload): the trainer drops its group, counted (:mod:`verl_credit.verl.session_failures`).

An environment whose ``EpisodeStart.info`` has a ``greeting`` (tau2: the agent's opening line,
which the simulated user's first message answers) gets it as the agent's first assistant message,
before that user message, as tau2's orchestrator builds the agent's history; it is context (part
of the prompt), not a trained action.

Layouts (``credit.layout``): ``merged`` returns one output holding all turns (verl's layout);
``per_request`` returns one output per model request (prompt = the exact context the model saw,
response = the tokens it generated), which verl stores as ``{uid}_{session}_{index}`` rows.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
from collections.abc import Awaitable
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput, register
from verl.experimental.agent_loop.tool_agent_loop import AgentData, AgentState, ToolAgentLoop
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from verl_credit.envs.base import (
    Environment,
    build_environment,
    episode_over,
    episode_task,
    take_turn_reward,
    tool_step,
)
from verl_credit.estimators.needs import TURN_REWARDS_KEY
from verl_credit.openai_chat import strip_thinking
from verl_credit.trajectory import Trajectory
from verl_credit.verl.annotation import annotate_finished_trajectory
from verl_credit.verl.batch import VALIDATE_KEY
from verl_credit.verl.session_failures import SessionFailure, failed_session_output, run_within_deadline
from verl_credit.verl.settings import CreditSettings, load_settings
from verl_credit.verl.tool_call_errors import count_malformed_tool_calls
from verl_credit.verl.users import SimulatedUser, build_user

__all__ = ["AGENT_NAME", "CREDIT_KEY", "CreditAgentLoop", "EnvironmentTool", "RecordedAction"]

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "WARN"))

T = TypeVar("T")

AGENT_NAME = "credit_agent"
CREDIT_KEY = "credit"
#: ``EpisodeStart.info`` key of the agent's opening line the environment already sent to the user
GREETING_KEY = "greeting"


class Phase(Enum):
    PENDING = "pending"
    GENERATING = "generating"
    TOOLS = "tools"
    USER = "user"
    DONE = "done"


@dataclass
class RecordedAction:
    """One model request of the episode.

    ``start``/``end``: offsets of its tokens in the merged response (before the final clip to
    ``response_length``); ``prompt_ids``: the exact context the model was given;
    ``message_index``: its assistant message in the transcript (``None`` while verl has not
    appended it: a turn-limit or length cut).
    """

    index: int
    start: int
    end: int
    prompt_ids: list[int]
    token_ids: list[int]
    log_probs: list[float] | None
    routed_experts: Any
    message_index: int | None
    cut: str | None = None


class EnvironmentTool(BaseTool):
    """A tool of the episode's environment, in verl's ``BaseTool`` shape so that verl's
    ``_call_tool`` (name/JSON validation, error text, truncation) runs unchanged.

    ``schema`` is kept as given: it is what the chat template renders and what the annotator
    checks calls against. verl's ``OpenAIFunctionToolSchema`` (``tool_schema``, read by the tool
    parser) keeps only ``type``/``description``/``enum`` of each property, so dumping it would
    drop ``items``, ``$defs``, ``anyOf`` and nested objects from the policy's prompt.
    """

    def __init__(self, schema: dict[str, Any]):
        # BaseTool.__init__ prints the schema; set its attributes directly instead.
        self.config: dict[str, Any] = {}
        self.schema: dict[str, Any] = copy.deepcopy(dict(schema))
        self.tool_schema = OpenAIFunctionToolSchema.model_validate(parser_schema(self.schema))
        self.name = self.tool_schema.function.name

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict]:
        agent_data = kwargs["agent_data"]
        env: Environment = agent_data.credit_env
        result = await env.call_tool(self.name, parameters)
        return ToolResponse(text=result.content), 0.0, {"is_error": bool(result.is_error)}


@register(AGENT_NAME)
class CreditAgentLoop(ToolAgentLoop):
    """verl's ToolAgentLoop + environment + simulated user + exact spans + async annotation."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.settings: CreditSettings = load_settings(self.config)

    async def run(self, sampling_params: dict[str, Any], priority: int = 0, **kwargs: Any) -> Any:
        """One episode -> one output (merged) or one output per model request (per_request); a
        training episode that fails outside the policy -> one placeholder output (module docstring)."""
        extra_info = dict(kwargs.get("extra_info") or {})
        env = self._build_env(extra_info)
        users: list[SimulatedUser] = []
        try:
            played = await run_within_deadline(
                self._play(env, extra_info, kwargs, priority, sampling_params, users), self.settings.session.deadline
            )
        except SessionFailure as failure:
            if _is_validation(kwargs):  # verl's validation skips failed sessions itself
                raise
            return self._failed_session(failure, kwargs)
        finally:
            for user in users:
                await user.aclose()
            close_failed = env is not None and not await _close_environment(env)
        agent_data, actions, stop_reason, reward = played
        agent_data.credit_reward_failures += close_failed
        return await self._finish(agent_data, actions, stop_reason, reward, env, kwargs)

    async def _play(
        self,
        env: Environment | None,
        extra_info: dict[str, Any],
        kwargs: dict[str, Any],
        priority: int,
        sampling_params: dict[str, Any],
        users: list[SimulatedUser],
    ) -> tuple[AgentData, list[RecordedAction], str, float | None]:
        """The episode up to its reward (``users`` collects the user, for the caller to close)."""
        agent_data, episode_info = await self._open_episode(env, extra_info, kwargs, priority)
        user = build_user(self.settings.user, env, extra_info, episode_info)
        if user is not None:
            users.append(user)
        with count_malformed_tool_calls() as malformed:
            actions, stop_reason = await self._run_episode(agent_data, sampling_params, user)
        agent_data.credit_malformed_calls = malformed.count
        reward: float | None = None
        if env is not None:
            reward = await _scored_reward(env, agent_data)
        return agent_data, actions, stop_reason, reward

    def _failed_session(self, failure: SessionFailure, kwargs: dict[str, Any]) -> AgentLoopOutput:
        """The placeholder row of a training session that failed outside the policy."""
        logger.warning(
            "credit_agent: session %s_%s failed (%s); its group is dropped from the step (credit/failed_sessions)",
            kwargs.get("uid", ""),
            kwargs.get("session_id", 0),
            failure,
        )
        token = self.tokenizer.eos_token_id if self.tokenizer.eos_token_id is not None else 0
        fields = failed_session_output(
            failure,
            token,
            global_steps=int(kwargs.get("global_steps", 0) or 0),
            with_log_probs=bool(self.rollout_config.calculate_log_probs),
        )
        return AgentLoopOutput(metrics=AgentLoopMetrics(), **fields)

    # ------------------------------------------------------------------ episode

    def _build_env(self, extra_info: dict[str, Any]) -> Environment | None:
        name = extra_info.get("env") or self.settings.env.name
        if not name:
            return None
        options = {**dict(self.settings.env.options), **dict(extra_info.get("env_options") or {})}
        return build_environment(str(name), **options)

    async def _open_episode(
        self, env: Environment | None, extra_info: dict[str, Any], kwargs: dict[str, Any], priority: int
    ) -> tuple[AgentData, dict[str, Any]]:
        episode_info: dict[str, Any] = {}
        if env is not None:
            start = await _outside_policy(
                "environment", "starting the environment", env.start(episode_task(extra_info))
            )
            messages: list[dict[str, Any]] = []
            if start.system_prompt:
                messages.append({"role": "system", "content": start.system_prompt})
            if start.info.get(GREETING_KEY):  # the line the first user message answers (tau2's orchestrator)
                messages.append({"role": "assistant", "content": str(start.info[GREETING_KEY])})
            messages.append({"role": "user", "content": start.first_user_message})
            tools: dict[str, BaseTool] = {}
            for schema in start.tools:
                tool = EnvironmentTool(schema)
                tools[tool.name] = tool
            episode_info = dict(start.info)
        else:
            messages = [dict(m) for m in kwargs["raw_prompt"]]
            tools = dict(self.tools)
            selection = extra_info.get("tool_selection")
            if selection:
                tools = {name: self.tools[name] for name in selection if name in self.tools}
        agent_data = AgentData(
            messages=messages,
            image_data=None,
            video_data=None,
            audio_data=None,
            mm_processor_kwargs=None,
            metrics={},
            request_id=self._make_request_id(priority, self.rollout_config.full_determinism),
            tools_kwargs=kwargs.get("tools_kwargs", {}) or {},
        )
        agent_data._active_tools = tools
        agent_data._active_tool_schemas = [prompt_tool_schema(tool) for tool in tools.values()]
        agent_data.credit_env = env
        agent_data.credit_action_offset = sum(1 for m in messages if m.get("role") == "assistant")
        agent_data.credit_user_replies = 0
        agent_data.credit_dropped_calls = 0
        agent_data.credit_malformed_calls = 0
        agent_data.credit_reward_failures = 0
        agent_data.credit_turn_rewards = []
        return agent_data, episode_info

    async def _run_episode(
        self, agent_data: AgentData, sampling_params: dict[str, Any], user: SimulatedUser | None
    ) -> tuple[list[RecordedAction], str]:
        actions: list[RecordedAction] = []
        phase, stop_reason = Phase.PENDING, ""
        while phase is not Phase.DONE:
            if phase is Phase.PENDING:
                await self._handle_pending_state(agent_data, sampling_params)
                phase = Phase.GENERATING
            elif phase is Phase.GENERATING:
                phase, stop_reason = await self._generate_action(agent_data, sampling_params, actions)
                if phase is not Phase.TOOLS:  # an action without tool calls is finished here
                    self._record_turn_reward(agent_data)
            elif phase is Phase.TOOLS:
                # the turn's executed calls are one environment step (tau2 counts steps and errors so)
                executed = min(len(agent_data.tool_calls), self.max_parallel_calls)
                with tool_step(agent_data.credit_env, executed):
                    state = await self._handle_processing_tools_state(agent_data)
                self._record_turn_reward(agent_data)
                if state != AgentState.GENERATING:
                    phase, stop_reason = Phase.DONE, "length"
                elif episode_over(agent_data.credit_env):  # e.g. tau2's max_errors / max_steps
                    phase, stop_reason = Phase.DONE, "env_done"
                else:
                    phase, stop_reason = Phase.GENERATING, ""
            else:
                phase, stop_reason = await self._user_turn(agent_data, user)
        return actions, stop_reason

    async def _generate_action(
        self, agent_data: AgentData, sampling_params: dict[str, Any], actions: list[RecordedAction]
    ) -> tuple[Phase, str]:
        """verl's generating step, recording the request's context, tokens and span."""
        prompt_before = list(agent_data.prompt_ids)
        messages_before = len(agent_data.messages)
        state = await _outside_policy(
            "policy", "the rollout server's generate", self._handle_generating_state(agent_data, sampling_params)
        )
        generated = list(agent_data.response_ids)
        end = len(agent_data.response_mask)
        start = end - len(generated)
        log_probs = list(agent_data.response_logprobs[start:end]) if agent_data.response_logprobs else None
        appended = len(agent_data.messages) > messages_before
        action = RecordedAction(
            index=agent_data.credit_action_offset + len(actions),
            start=start,
            end=end,
            prompt_ids=prompt_before,
            token_ids=generated,
            log_probs=log_probs,
            routed_experts=agent_data.routed_experts,
            message_index=len(agent_data.messages) - 1 if appended else None,
        )
        actions.append(action)
        if state == AgentState.PROCESSING_TOOLS:
            # verl executes (and keeps in the message) only the first max_parallel_calls calls;
            # the others' tokens stay in the trained span: count them.
            agent_data.credit_dropped_calls += max(0, len(agent_data.tool_calls) - self.max_parallel_calls)
            return Phase.TOOLS, ""
        if not appended:  # verl stopped on a limit before appending the message
            action.cut = self._cut_reason(agent_data)
            return Phase.DONE, action.cut
        return Phase.USER, ""

    @staticmethod
    def _record_turn_reward(agent_data: AgentData) -> None:
        """The environment's reward for the action just finished (environments with a
        ``turn_reward`` hook only): ``turn_rewards`` of the session payload."""
        reward = take_turn_reward(agent_data.credit_env) if agent_data.credit_env is not None else None
        if reward is not None:
            agent_data.credit_turn_rewards.append(reward)

    def _cut_reason(self, agent_data: AgentData) -> str:
        """Which of verl's limits stopped the loop (same order as verl checks them)."""
        if len(agent_data.response_mask) >= self.response_length:
            return "length"
        if self.max_assistant_turns and agent_data.assistant_turns >= self.max_assistant_turns:
            return "max_assistant_turns"
        return "max_user_turns"

    async def _user_turn(self, agent_data: AgentData, user: SimulatedUser | None) -> tuple[Phase, str]:
        """The simulated user answers an assistant turn without tool calls."""
        if user is None:
            return Phase.DONE, "no_tool_call"
        if agent_data.credit_user_replies >= self.settings.user.max_turns:
            return Phase.DONE, "user_max_turns"
        turn = await _outside_policy(
            "user", "the simulated user's reply", user.reply(user_view(agent_data.messages, self.tokenizer.eos_token))
        )
        if turn.content:
            agent_data.messages.append({"role": "user", "content": turn.content})
        if turn.done or not turn.content:
            return Phase.DONE, "user_done"
        merge_result, response_mask, response_logprobs = await self.ct_merge_context_msg(
            agent_data.messages[:-1],
            agent_data.messages,
            agent_data.prompt_ids,
            agent_data.response_mask,
            agent_data.response_logprobs if agent_data.response_logprobs else None,
            tools=agent_data._active_tool_schemas,
        )
        if len(response_mask) >= self.response_length:
            return Phase.DONE, "length"
        agent_data.prompt_ids = merge_result.token_ids
        agent_data.response_mask = response_mask
        if agent_data.response_logprobs:
            agent_data.response_logprobs = response_logprobs or []
        agent_data.credit_user_replies += 1
        return Phase.GENERATING, ""

    # ------------------------------------------------------------------ outputs

    async def _finish(
        self,
        agent_data: AgentData,
        actions: list[RecordedAction],
        stop_reason: str,
        reward: float | None,
        env: Environment | None,
        kwargs: dict[str, Any],
    ) -> AgentLoopOutput | list[AgentLoopOutput]:
        num_response = len(agent_data.response_mask)
        prompt_ids = agent_data.prompt_ids[: len(agent_data.prompt_ids) - num_response]
        response_ids = agent_data.prompt_ids[len(prompt_ids) :][: self.response_length]
        response_mask = agent_data.response_mask[: self.response_length]
        spans = exact_spans(actions, response_mask)
        truncated_action = await self._append_cut_message(agent_data, actions, spans, response_ids)

        lengths = [0] * agent_data.credit_action_offset + [end - start for start, end in spans]
        num_actions = sum(1 for m in agent_data.messages if m.get("role") == "assistant")
        if num_actions != len(lengths):
            raise RuntimeError(
                f"credit_agent: transcript has {num_actions} assistant messages but {len(lengths)} recorded actions"
            )
        uid = str(kwargs.get("uid", ""))
        transcript = clean_transcript(agent_data.messages, self.tokenizer.eos_token)
        trajectory = Trajectory.from_messages(
            transcript,
            id=f"{uid}_{kwargs.get('session_id', 0)}",
            uid=uid,
            reward=reward if reward is not None else 0.0,
            action_token_lengths=lengths,
        )
        tools = list(agent_data._active_tool_schemas)
        trajectory.extra["tools"] = tools  # the rule annotator checks calls against the schemas
        session_payload: dict[str, Any] = {
            "messages": transcript,
            "tools": tools,
            "num_actions": num_actions,
            "action_lengths": lengths,
            "stop_reason": stop_reason,
            "truncated_action": truncated_action,
            "env": getattr(env, "name", None) if env is not None else None,
            "layout": self.settings.layout,
            "dropped_tool_calls": int(agent_data.credit_dropped_calls),
            "malformed_tool_calls": int(agent_data.credit_malformed_calls),
            "reward_failures": int(agent_data.credit_reward_failures),
        }
        if agent_data.credit_turn_rewards:  # actions of the prompt earned nothing
            offset = agent_data.credit_action_offset
            session_payload[TURN_REWARDS_KEY] = [0.0] * offset + list(agent_data.credit_turn_rewards)
        if _is_validation(kwargs) and not self.settings.annotator.in_validation:
            session_payload["validation"] = True  # validation episodes are scored, never trained on
        else:
            session_payload.update(await self._annotate(trajectory))

        base_extra = dict(agent_data.extra_fields)
        base_extra.update({"turn_scores": agent_data.turn_scores, "tool_rewards": agent_data.tool_rewards})
        if reward is not None:
            base_extra["reward_extra_info"] = {"env_reward": reward}
        num_turns = agent_data.user_turns + agent_data.assistant_turns + agent_data.credit_user_replies + 1
        if self.settings.layout == "per_request" and any(end > start for start, end in spans):
            return self._per_request_outputs(
                actions, spans, response_ids, base_extra, session_payload, reward, num_turns, agent_data
            )
        extra = dict(base_extra)
        extra[CREDIT_KEY] = {
            "spans": [[a.index, start, end] for a, (start, end) in zip(actions, spans, strict=True) if end > start],
            "row": 0,
            "rows": 1,
            "final": True,
            **session_payload,
        }
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response_ids,
            response_mask=response_mask,
            response_logprobs=agent_data.response_logprobs[: self.response_length]
            if agent_data.response_logprobs
            else None,
            routed_experts=(
                agent_data.routed_experts[: len(prompt_ids) + self.response_length]
                if agent_data.routed_experts is not None
                else None
            ),
            multi_modal_data={},
            reward_score=reward,
            num_turns=num_turns,
            metrics=agent_data.metrics,
            extra_fields=extra,
        )

    def _per_request_outputs(
        self,
        actions: list[RecordedAction],
        spans: list[tuple[int, int]],
        response_ids: list[int],
        base_extra: dict[str, Any],
        session_payload: dict[str, Any],
        reward: float | None,
        num_turns: int,
        agent_data: AgentData,
    ) -> list[AgentLoopOutput]:
        """One output per model request with tokens; the final one carries the session payload."""
        kept = [(a, s, e) for a, (s, e) in zip(actions, spans, strict=True) if e > s]
        outputs = []
        for row, (action, start, end) in enumerate(kept):
            final = row == len(kept) - 1
            tokens = response_ids[start:end]
            extra = copy.deepcopy(base_extra) if not final else dict(base_extra)
            extra[CREDIT_KEY] = {
                "spans": [[action.index, 0, end - start]],
                "row": row,
                "rows": len(kept),
                "final": final,
            }
            if final:
                extra[CREDIT_KEY].update(session_payload)
            routed = action.routed_experts
            outputs.append(
                AgentLoopOutput(
                    prompt_ids=action.prompt_ids,
                    response_ids=tokens,
                    response_mask=[1] * len(tokens),
                    response_logprobs=action.log_probs[: len(tokens)] if action.log_probs is not None else None,
                    routed_experts=routed[: len(action.prompt_ids) + len(tokens)] if routed is not None else None,
                    multi_modal_data={},
                    reward_score=reward if final else None,
                    num_turns=num_turns,
                    metrics=agent_data.metrics if final else AgentLoopMetrics(),
                    extra_fields=extra,
                )
            )
        return outputs

    async def _append_cut_message(
        self,
        agent_data: AgentData,
        actions: list[RecordedAction],
        spans: list[tuple[int, int]],
        response_ids: list[int],
    ) -> int | None:
        """verl does not append the assistant message of a generation stopped by a limit; build it
        from the tokens that remain in the response, so transcript and spans agree."""
        if not actions or actions[-1].message_index is not None:
            return None
        action = actions[-1]
        start, end = spans[-1]
        tools = [tool.tool_schema for tool in agent_data._active_tools.values()]
        content, agent_data.tool_calls = await self.tool_parser.extract_tool_calls(response_ids[start:end], tools)
        agent_data.messages.append(self._build_assistant_message(content, agent_data))
        agent_data.tool_calls = []
        action.message_index = len(agent_data.messages) - 1
        return action.index

    async def _annotate(self, trajectory: Trajectory) -> dict[str, Any]:
        """The annotation payload, computed now (async, its CPU work in threads) unless disabled.

        A failure leaves the session without a graph so the trainer annotates it (counted)
        instead of losing the group. ``credit.annotator.deadline`` bounds one session's
        annotation: past it the session is marked ``annotation_timeout`` and the trainer gives it
        the configured fallback (counted), so one slow annotation cannot stall the step.
        """
        estimator = self.settings.estimator
        annotator = self.settings.annotator
        if not annotator.in_rollout:
            return {}
        try:
            return await asyncio.wait_for(
                annotate_finished_trajectory(trajectory, estimator, annotator), timeout=annotator.deadline
            )
        except TimeoutError:
            logger.warning(
                "credit_agent: annotation of %s passed credit.annotator.deadline=%ss; the trainer uses the fallback",
                trajectory.id,
                annotator.deadline,
            )
            return {"annotation_timeout": True, "annotation_error": f"deadline of {annotator.deadline}s passed"}
        except Exception as exc:  # the trainer re-annotates sessions without a graph
            logger.warning(
                "credit_agent: annotation of %s failed (%r); the trainer will annotate it", trajectory.id, exc
            )
            return {"annotation_error": repr(exc)}


async def _scored_reward(env: Environment, agent_data: AgentData) -> float:
    """The environment's reward of the finished episode. A reward that raises -- an environment
    the policy broke (a coding sandbox whose grader a hostile tree crashed) or that broke on its
    own -- scores 0 and is counted in the payload's ``reward_failures`` (the trainer's
    ``credit/reward_failures``), never a crashed rollout worker or a dropped group: a policy must
    not escape its reward by breaking the grader."""
    try:
        return float(await env.reward())
    except Exception:
        logger.warning("credit_agent: the environment's reward failed; scored 0 (credit/reward_failures)", exc_info=1)
        agent_data.credit_reward_failures += 1
        return 0.0


async def _close_environment(env: Environment) -> bool:
    """``env.close()``; False (logged, counted in ``reward_failures`` by the caller) when it raised."""
    try:
        await env.close()
        return True
    except Exception:
        logger.warning("credit_agent: closing the environment failed (credit/reward_failures)", exc_info=True)
        return False


async def _outside_policy(kind: str, what: str, step: Awaitable[T]) -> T:
    """``await step``; an exception there (a dead or failing server, an environment that cannot
    start) is a :class:`SessionFailure` of ``kind``, not a crash of the rollout worker."""
    try:
        return await step
    except SessionFailure:
        raise
    except Exception as exc:
        raise SessionFailure(kind, f"{what} failed: {exc!r}") from exc


def parser_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` in the shape verl's ``OpenAIFunctionToolSchema`` accepts (it is what verl's tool
    parsers are given): every property needs a ``type``, which a JSON schema property written as
    ``anyOf``/``oneOf``/``$ref`` lacks; it gets its branches' types (``object`` when none say)."""
    fixed = copy.deepcopy(schema)
    properties = (fixed.get("function") or {}).get("parameters", {}).get("properties") or {}
    for name, prop in list(properties.items()):
        if isinstance(prop, dict) and "type" not in prop:
            branches = [b for key in ("anyOf", "oneOf") for b in prop.get(key) or [] if isinstance(b, dict)]
            types = sorted({str(b["type"]) for b in branches if isinstance(b.get("type"), str)})
            properties[name] = {**prop, "type": types if len(types) > 1 else (types or ["object"])[0]}
    return fixed


def prompt_tool_schema(tool: BaseTool) -> dict[str, Any]:
    """The schema the chat template renders for ``tool``: an environment tool's own schema, in
    full; for verl's configured tools the dump of verl's schema (what ``tool_agent`` renders)."""
    if isinstance(tool, EnvironmentTool):
        return copy.deepcopy(tool.schema)
    return tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True)


def _is_validation(kwargs: dict[str, Any]) -> bool:
    """Whether verl runs this episode for validation (the credit trainer tags those rows with
    ``VALIDATE_KEY``; verl's own trainers do not, so their rows count as training)."""
    value = kwargs.get(VALIDATE_KEY, False)
    return bool(value.item() if hasattr(value, "item") else value)


def exact_spans(actions: list[RecordedAction], response_mask: list[int]) -> list[tuple[int, int]]:
    """Each action's ``[start, end)`` in the final (clipped) response.

    The recorded offsets are clipped to the response, and each end is shortened to the run of
    ones that starts at its start (a builder may trim boundary tokens of a previous turn, and the
    final clip may cut the last turn). Raises when the spans do not cover exactly the ones of
    ``response_mask`` (a bug, not bad data: training on misattributed tokens is never silent).
    """
    size = len(response_mask)
    spans = []
    for action in actions:
        start, end = min(action.start, size), min(action.end, size)
        cursor = start
        while cursor < end and response_mask[cursor] == 1:
            cursor += 1
        spans.append((start, cursor))
    covered = sum(end - start for start, end in spans)
    if covered != sum(response_mask):
        raise RuntimeError(
            f"credit_agent: action spans cover {covered} tokens but response_mask has {sum(response_mask)}"
        )
    return spans


def clean_transcript(messages: list[dict[str, Any]], eos_token: str | None) -> list[dict[str, Any]]:
    """A deep copy of the transcript for annotation and storage.

    verl's hermes parser decodes generated tokens without skipping special tokens, so an
    assistant message's content ends with the EOS text (``<|im_end|>``) when the server returns
    the EOS token. That is chat markup, not content: it is removed here (the token itself stays in
    the trained span).
    """
    cleaned = copy.deepcopy(messages)
    if not eos_token:
        return cleaned
    for message in cleaned:
        content = message.get("content")
        if message.get("role") == "assistant" and isinstance(content, str):
            while content.endswith(eos_token):
                content = content[: -len(eos_token)]
            message["content"] = content
    return cleaned


def user_view(messages: list[dict[str, Any]], eos_token: str | None) -> list[dict[str, Any]]:
    """The transcript the simulated user (and through it the environment) is shown:
    :func:`clean_transcript` without the assistant's reasoning.

    verl's hermes parser leaves a thinking model's ``<think>...</think>`` block in the assistant
    content; a served Qwen3 returns it apart (``reasoning_content``), so a chat partner never sees
    it. It is cut as the simulated users' own replies are (:func:`verl_credit.openai_chat.strip_thinking`:
    everything up to the last ``</think>``, as Qwen3's chat template cuts history). The stored
    transcript and the trained tokens keep it.
    """
    view = clean_transcript(messages, eos_token)
    for message in view:
        content = message.get("content")
        if message.get("role") == "assistant" and isinstance(content, str) and "think>" in content:
            message["content"] = strip_thinking(content)
    return view
