"""One service-world episode driven token by token (``agent.run_episode`` for a token policy).

:class:`TokenEpisodeRunner` takes each action as policy tokens, renders it
(``token_vocab.render_action``), runs the tool or asks the scripted customer, tracks the dialogue
state with the scripted agent's own :class:`~verl_credit.envs.service.agent.DialogueState`, and
returns the observation tokens the policy reads next. At the end, :meth:`finish` gives a
:class:`TokenEpisode` with the transcript, the reward, and the ground truth (causal actions and
mistakes) computed by ``agent._ground_truth`` exactly as for the scripted agent.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from verl_credit.bench.token_vocab import ACT, BOS, EOS, VOCAB, observation_tokens, render_action
from verl_credit.envs.service.agent import MACROS, DialogueState, _ground_truth
from verl_credit.envs.service.env import ServiceEpisode
from verl_credit.envs.service.tools import SYSTEM_PROMPT
from verl_credit.envs.service.user import OPENING_MESSAGE

__all__ = ["TokenEpisode", "TokenEpisodeRunner", "redundant_calls", "run_token_episode"]

WRITE_TOOLS = ("return_item", "refund_order", "exchange_item")


@dataclass
class TokenEpisode:
    """A finished episode of the token policy.

    ``tokens``: ``(N,)`` token ids of the whole stream (observations and actions, in order);
    ``action_of``: ``(N,)`` the action each token was *written* in (-1: an observation token);
    ``causal``/``mistakes``: ``(T,)`` ground-truth flags per action (``agent.Episode``'s).
    ``macros`` is ``range(T)`` (only its length is read by ``learning.oracle_weights``).
    """

    task_id: str
    messages: list[dict[str, Any]]
    reward: float
    tokens: list[int]
    action_of: list[int]
    causal: list[bool]
    mistakes: list[bool]
    action_texts: list[tuple[str, ...]]
    tool_calls: list[str]  # canonical "name(arguments)" of every call, in order
    expert_actions: tuple[int, ...] = ()
    """Actions the scripted expert wrote in a mixed (DAgger) rollout; empty in RL."""
    refund_wanted: str | None = None
    """Where the customer wants the refund ("original" | "gift_card"; None: an exchange task)."""
    refund_to_wanted: bool | None = None
    """Whether the episode's last successful refund went there (None: no refund was made): the
    decisive pointer token of a refund, written many turns after the customer's answer."""

    @property
    def num_actions(self) -> int:
        return len(self.causal)

    @property
    def macros(self) -> list[int]:
        return list(range(self.num_actions))

    @property
    def key(self) -> tuple[str, tuple[tuple[str, ...], ...]]:
        """The transcript is a deterministic function of (task, action tokens)."""
        return self.task_id, tuple(self.action_texts)

    @property
    def action_lengths(self) -> list[int]:
        """Tokens written per action (``(T,)``, ``<eos>`` included)."""
        counts = np.bincount(
            np.asarray([a for a in self.action_of if a >= 0], dtype=np.int64), minlength=self.num_actions
        )
        return counts.tolist()


def redundant_calls(calls: Sequence[str]) -> int:
    """Tool calls that repeat an earlier identical call (same name and arguments) of the episode."""
    return len(calls) - len(set(calls))


class TokenEpisodeRunner:
    """Step one episode with token actions; see the module doc."""

    def __init__(self, spec: Mapping[str, Any], max_action_tokens: int = 32):
        self.world = ServiceEpisode(spec)
        self.limit = self.world.task.max_turns
        self.max_action_tokens = max_action_tokens
        self.state = DialogueState()
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": OPENING_MESSAGE},
        ]
        self.tokens: list[int] = []
        self.action_of: list[int] = []
        self.writes: list[tuple[int, str, dict[str, Any], frozenset[int]]] = []
        self.mistakes: list[bool] = []
        self.action_texts: list[tuple[str, ...]] = []
        self.tool_calls: list[str] = []
        self.expert_actions: list[int] = []
        self.turn = 0
        self.written = 0  # tokens of the current action so far
        self.done = False
        self._observe([BOS, *observation_tokens(self.messages[1]), ACT])

    def _observe(self, words: Sequence[str]) -> None:
        self.tokens += VOCAB.encode(words)
        self.action_of += [-1] * len(words)

    def write_expert(self, words: Sequence[str]) -> None:
        """Write a whole action chosen by the scripted expert (ending with ``<eos>``) and step."""
        self.expert_actions.append(self.turn)
        for word in words:
            if self.write(VOCAB.ids[word]):
                break
        self.step()

    def write(self, token: int) -> bool:
        """Append one written token of the current action; True when the action is complete
        (``<eos>`` or ``max_action_tokens``), after which :meth:`step` must be called."""
        self.tokens.append(int(token))
        self.action_of.append(self.turn)
        self.written += 1
        return int(token) == VOCAB.ids[EOS] or self.written >= self.max_action_tokens

    def step(self) -> None:
        """Execute the action written since the last step; append what the policy observes next."""
        turn = self.turn
        ids = self.tokens[len(self.tokens) - self.written :]
        self.written = 0
        words = [w for w in VOCAB.decode(ids) if w != EOS]
        self.action_texts.append(tuple(words))
        rendered = render_action(words, self.state, turn)
        self.messages.append(rendered.message)
        self.turn += 1
        if rendered.tool is not None:
            content, is_error = self.world.call_tool(rendered.tool, rendered.arguments)
            call_id = rendered.message["tool_calls"][0]["id"]
            tool_message = {"role": "tool", "tool_call_id": call_id, "name": rendered.tool, "content": content}
            self.messages.append(tool_message)
            self.tool_calls.append(f"{rendered.tool}({json.dumps(rendered.arguments, sort_keys=True)})")
            self.state.observe_tool(
                rendered.tool, rendered.arguments, content, is_error, turn, rendered.argument_sources
            )
            if not is_error and rendered.tool in WRITE_TOOLS:
                self.writes.append((turn, rendered.tool, rendered.arguments, rendered.argument_sources))
            self.mistakes.append(is_error)
            self._continue(observation_tokens(tool_message))
            return
        reply = self.world.user_reply(rendered.message["content"])
        user_message = {"role": "user", "content": reply.content}
        self.messages.append(user_message)
        self.state.observe_user(reply.content, turn if rendered.asks else None)
        self.state.last_error = False
        if reply.done:
            self.mistakes.append(not self.state.goal_written)  # closing before the goal was done
            self.done = True
            return
        self.mistakes.append(False)
        self._continue(observation_tokens(user_message))

    def _continue(self, words: Sequence[str]) -> None:
        if self.turn >= self.limit:
            self.done = True
            return
        self._observe([*words, ACT])

    def finish(self) -> TokenEpisode:
        reward = self.world.reward()
        causal, wrong = _ground_truth(self.world, self.writes, self.turn, reward)
        mistakes = list(self.mistakes)
        for action in wrong:
            mistakes[action] = True
        task = self.world.task
        refunds = [arguments for _, tool, arguments, _ in self.writes if tool == "refund_order"]
        wanted_id = task.payment_method_id(task.final_method) if task.final_method is not None else None
        return TokenEpisode(
            task_id=task.task_id,
            messages=self.messages,
            reward=reward,
            tokens=self.tokens,
            action_of=self.action_of,
            causal=causal,
            mistakes=mistakes,
            action_texts=self.action_texts,
            tool_calls=self.tool_calls,
            expert_actions=tuple(self.expert_actions),
            refund_wanted=task.final_method,
            refund_to_wanted=refunds[-1].get("payment_method_id") == wanted_id if refunds else None,
        )


def run_token_episode(spec: Mapping[str, Any], choose: Callable[[TokenEpisodeRunner], Sequence[str]]) -> TokenEpisode:
    """Play one episode where ``choose(runner)`` returns each whole action as token strings
    (ending with ``<eos>``); used for the scripted agent's behaviour-cloning episodes."""
    runner = TokenEpisodeRunner(spec)
    while not runner.done:
        runner.write_expert(choose(runner))
    return runner.finish()


def scripted_chooser(policy: Any, rng: np.random.Generator) -> Callable[[TokenEpisodeRunner], list[str]]:
    """The scripted agent (``agent.LinearSoftmaxPolicy``) as a token chooser (one ``rng`` draw per action,
    as in ``agent.run_episode``)."""
    from verl_credit.bench.token_vocab import macro_tokens

    def choose(runner: TokenEpisodeRunner) -> list[str]:
        phi = runner.state.features(runner.turn, runner.limit)
        return macro_tokens(MACROS[policy.sample(phi, rng)], runner.state)

    return choose
