"""Chat transcript -> actions, observations, provenance and token spans (docs/design.md section 2).

A trajectory is one rollout of one task. Its *actions* are the assistant messages (the only
trainable unit); every other message is an *observation*. Provenance links each observation to
the action it came from:

* a tool result belongs to the action whose tool call produced it: the nearest preceding call
  with its ``tool_call_id`` that no earlier result answered (some providers reuse ids within one
  conversation, e.g. ``call_0`` in every turn); when every such call is answered, the nearest
  preceding call with that id; without an id (or an id no call has), the next unanswered call of
  the closest preceding action that made a tool call. ``Observation.call_position`` says which
  of that action's calls it answers;
* a user reply belongs to the closest preceding assistant action that *asked* (text that
  addresses the user with a question or a request, see :func:`asks_user`), provided no
  other user message came in between; otherwise it is an unelicited (direct) user input.

Token lengths: ``action_token_lengths`` when given (trainable tokens per action, from the
tokenizer that produced the rollout); otherwise a whitespace count of the action's rendered
text (content, tool-call names and arguments) -- the documented fallback used by the CLI.
An action may have length 0 (an empty generation, or an action cut off by a length limit):
it stays in the graph, so its edges still count for other actions, but it carries no tokens
and therefore no advantage mass.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from verl_credit.credit_math.grpo import REWARD_LIMIT

__all__ = [
    "Action",
    "Observation",
    "ToolCall",
    "Trajectory",
    "TrajectoryError",
    "asks_user",
    "render_action_text",
    "whitespace_token_count",
]

VALID_ROLES = ("system", "user", "assistant", "tool")
#: largest accepted entry of ``action_token_lengths`` (a generation of more tokens is not a rollout)
MAX_TOKEN_LENGTH = 2**31 - 1
#: tool-call arguments (a JSON string) nested deeper than this count as invalid arguments
MAX_ARGUMENT_DEPTH = 64

# A user turn is "elicited" only by assistant text that asks for something specific: a question
# or a request ("please provide ...", "could you confirm ..."). Generic help offers in greetings
# and closings ("How can I help you today?", "Anything else?") ask for nothing in particular.
_ASK_PATTERN = re.compile(
    r"\?|\b(please (provide|confirm|share|tell|choose|select|specify|send|let me know)|"
    r"could you|can you|would you|do you|shall i|should i|which (one|option))\b",
    re.IGNORECASE,
)
_GENERIC_OFFER_PATTERN = re.compile(
    r"(how (can|may) i (help|assist)|anything else|let me know if you need|is there something else|"
    r"what can i do for you)",
    re.IGNORECASE,
)


class TrajectoryError(ValueError):
    """A rollout record that cannot be turned into a trajectory; ``field`` names what was wrong."""

    def __init__(self, field_name: str, message: str):
        super().__init__(f"field '{field_name}': {message}")
        self.field = field_name


@dataclass(frozen=True)
class ToolCall:
    """One function call inside an assistant message."""

    id: str | None
    name: str
    arguments: dict[str, Any]
    raw_arguments: str
    arguments_valid: bool  # False when the arguments string was not a JSON object


@dataclass(frozen=True)
class Action:
    """One assistant message: the trainable unit. ``index`` is its 0-based position among actions."""

    index: int
    message_index: int
    content: str
    tool_calls: tuple[ToolCall, ...]
    length: int  # trainable tokens L_i

    @property
    def is_tool_action(self) -> bool:
        return bool(self.tool_calls)


@dataclass(frozen=True)
class Observation:
    """A non-trainable message with its provenance.

    ``source_action`` is the action that produced (tool result) or elicited (user reply) it, or
    ``None`` for the system prompt, the opening user request and unelicited user turns.
    ``after_action`` is the number of actions that precede it (its position in the action order).
    """

    message_index: int
    role: str
    content: str
    source_action: int | None
    after_action: int
    tool_call_id: str | None = None
    tool_name: str | None = None
    call_position: int | None = None  # tool results: which of the source action's tool calls it answers


@dataclass
class Trajectory:
    """One rollout: messages split into actions and observations, plus reward and group id."""

    id: str
    uid: str
    reward: float
    messages: list[dict[str, Any]]
    actions: list[Action]
    observations: list[Observation]
    graph: Any = None  # the raw serialized graph carried by the record, if any (validated later)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def num_actions(self) -> int:
        return len(self.actions)

    @property
    def action_lengths(self) -> list[int]:
        return [a.length for a in self.actions]

    def observations_after(self, action_index: int) -> list[Observation]:
        """Observations that directly follow action ``action_index`` (before the next action)."""
        return [o for o in self.observations if o.after_action == action_index + 1]

    @classmethod
    def from_messages(
        cls,
        messages: list[dict[str, Any]],
        *,
        id: str = "",
        uid: str = "",
        reward: float = 0.0,
        action_token_lengths: list[int] | None = None,
        graph: Any = None,
    ) -> Trajectory:
        """Build a trajectory from OpenAI chat messages; raises :class:`TrajectoryError`."""
        if not isinstance(messages, list):
            raise TrajectoryError("messages", f"expected a list of messages, got {type(messages).__name__}")
        actions: list[Action] = []
        observations: list[Observation] = []
        pairing = _ToolResultPairing()
        last_tool_action: int | None = None
        last_asking_action: int | None = None  # cleared once a user message consumed it
        assistant_positions = [
            i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "assistant"
        ]
        if action_token_lengths is not None:
            _check_lengths(action_token_lengths, len(assistant_positions))

        for message_index, message in enumerate(messages):
            where = f"messages[{message_index}]"
            if not isinstance(message, dict):
                raise TrajectoryError(where, f"expected an object, got {type(message).__name__}")
            role = message.get("role")
            if role not in VALID_ROLES:
                raise TrajectoryError(f"{where}.role", f"expected one of {VALID_ROLES}, got {role!r}")
            content = _content_text(message.get("content"), f"{where}.content")
            if role == "assistant":
                index = len(actions)
                tool_calls = _parse_tool_calls(message.get("tool_calls"), f"{where}.tool_calls")
                pairing.add_action(index, tool_calls)
                draft = Action(index, message_index, content, tool_calls, 0)
                length = (
                    int(action_token_lengths[index])
                    if action_token_lengths is not None
                    else whitespace_token_count(render_action_text(draft))
                )
                actions.append(Action(index, message_index, content, tool_calls, length))
                if tool_calls:
                    last_tool_action = index
                last_asking_action = index if asks_user(content) else None
            elif role == "tool":
                call_id = message.get("tool_call_id")
                if call_id is not None and not isinstance(call_id, str):
                    raise TrajectoryError(f"{where}.tool_call_id", f"expected a string, got {type(call_id).__name__}")
                tool_name = message.get("name")
                if tool_name is not None and not isinstance(tool_name, str):
                    raise TrajectoryError(f"{where}.name", f"expected a string, got {type(tool_name).__name__}")
                source, position = pairing.answer(call_id, last_tool_action)
                observations.append(
                    Observation(message_index, role, content, source, len(actions), call_id, tool_name, position)
                )
            elif role == "user":
                observations.append(Observation(message_index, role, content, last_asking_action, len(actions)))
                last_asking_action = None
            else:  # system
                observations.append(Observation(message_index, role, content, None, len(actions)))
        return cls(
            id=str(id),
            uid=str(uid),
            reward=float(reward),
            messages=messages,
            actions=actions,
            observations=observations,
            graph=graph,
        )

    @classmethod
    def from_record(cls, record: Any) -> Trajectory:
        """Build a trajectory from one rollouts-JSONL object (docs/design.md section 8)."""
        if not isinstance(record, dict):
            raise TrajectoryError("<record>", f"expected a JSON object, got {type(record).__name__}")
        for required in ("id", "messages"):
            if required not in record:
                raise TrajectoryError(required, "missing")
        reward = record.get("reward")
        if reward is None:
            raise TrajectoryError("reward", "missing")
        if isinstance(reward, bool) or not isinstance(reward, int | float):
            raise TrajectoryError("reward", f"expected a number, got {_brief(reward)}")
        try:
            reward = float(reward)
        except OverflowError:
            raise TrajectoryError("reward", "number too large for a float") from None
        if not math.isfinite(reward):
            raise TrajectoryError("reward", f"expected a finite number, got {reward!r}")
        if abs(reward) > REWARD_LIMIT:
            raise TrajectoryError(
                "reward", f"{reward:g} lies beyond +-{REWARD_LIMIT:g} (a larger reward overflows the credit)"
            )
        lengths = record.get("action_token_lengths")
        trajectory = cls.from_messages(
            record["messages"],
            id=record["id"],
            uid=record.get("uid", record["id"]),
            reward=reward,
            action_token_lengths=lengths,
            graph=record.get("graph"),
        )
        trajectory.extra = {k: v for k, v in record.items() if k not in _RECORD_KEYS}
        return trajectory

    def to_record(self) -> dict[str, Any]:
        """The rollouts-JSONL object for this trajectory (inverse of :meth:`from_record`)."""
        record: dict[str, Any] = {
            "id": self.id,
            "uid": self.uid,
            "reward": self.reward,
            "messages": self.messages,
            "action_token_lengths": self.action_lengths,
            "graph": self.graph,
        }
        record.update(self.extra)
        return record


_RECORD_KEYS = ("id", "uid", "reward", "messages", "action_token_lengths", "graph")


class _ToolResultPairing:
    """Which tool call each tool result answers, in one pass over the messages (module docstring).

    Linear: each call is queued once under its id and once under its action; each result removes
    at most one queue entry (answered entries are dropped lazily from the queue heads).
    """

    def __init__(self) -> None:
        self.open_by_id: dict[str, list[tuple[int, int]]] = {}  # id -> unanswered (action, position), in order
        self.latest_by_id: dict[str, tuple[int, int]] = {}
        self.open_by_action: dict[int, list[int]] = {}  # action -> unanswered positions, in order
        self.answered: set[tuple[int, int]] = set()

    def add_action(self, action: int, calls: tuple[ToolCall, ...]) -> None:
        if not calls:
            return
        self.open_by_action[action] = list(range(len(calls)))
        for position, call in enumerate(calls):
            if call.id:
                self.open_by_id.setdefault(call.id, []).append((action, position))
                self.latest_by_id[call.id] = (action, position)

    def _take(self, key: tuple[int, int]) -> tuple[int, int]:
        self.answered.add(key)
        return key

    def answer(self, call_id: str | None, last_tool_action: int | None) -> tuple[int | None, int | None]:
        """``(action, call position)`` of the call a result with ``call_id`` answers."""
        if call_id:
            queue = self.open_by_id.get(call_id)
            while queue and queue[-1] in self.answered:
                queue.pop()
            if queue:
                # the nearest preceding action with an unanswered call of this id; its first such call
                latest_action = queue[-1][0]
                k = len(queue) - 1
                chosen = k
                while k >= 0 and queue[k][0] == latest_action:
                    if queue[k] not in self.answered:
                        chosen = k
                    k -= 1
                return self._take(queue.pop(chosen))
            if call_id in self.latest_by_id:
                return self.latest_by_id[call_id]  # every call of this id was answered: a repeated result
        if last_tool_action is None:
            return None, None
        free = self.open_by_action.get(last_tool_action, [])
        while free and (last_tool_action, free[0]) in self.answered:
            free.pop(0)
        if free:
            return self._take((last_tool_action, free.pop(0)))
        return last_tool_action, 0


def asks_user(text: str) -> bool:
    """True when assistant text asks the user something specific (a question or a request).

    A generic help offer ("How can I help you today?", "Anything else I can do?") does not count:
    the user's next turn is then an unelicited (direct) input.
    """
    sentences = re.split(r"(?<=[.!?])\s+", text.strip()) if text else []
    return any(_ASK_PATTERN.search(s) and not _GENERIC_OFFER_PATTERN.search(s) for s in sentences)


def render_action_text(action: Action) -> str:
    """The text an action contributes: its content plus each tool call as ``name(arguments)``."""
    parts = [action.content] if action.content else []
    parts.extend(f"{call.name}({call.raw_arguments})" for call in action.tool_calls)
    return "\n".join(parts)


#: texts longer than this are counted in slices of this many characters (bounded memory)
_COUNT_CHUNK = 1 << 16


def whitespace_token_count(text: str) -> int:
    """The CLI's documented fallback tokenizer: number of whitespace-separated words (>= 1 for
    non-empty text, 0 for empty text).

    Same count as ``len(text.split())``, but a long text is counted slice by slice, so the memory
    it needs is that of one slice's words, not a list of every word of a huge message.
    """
    if len(text) <= _COUNT_CHUNK:
        return len(text.split())
    count = 0
    previous_in_word = False  # the last character of the previous slice was not whitespace
    for start in range(0, len(text), _COUNT_CHUNK):
        chunk = text[start : start + _COUNT_CHUNK]
        count += len(chunk.split())
        if previous_in_word and not chunk[0].isspace():
            count -= 1  # a word cut by the slice boundary was counted twice
        previous_in_word = not chunk[-1].isspace()
    return count


def _check_lengths(lengths: Any, num_assistant: int) -> None:
    if not isinstance(lengths, list):
        raise TrajectoryError("action_token_lengths", f"expected a list of integers, got {type(lengths).__name__}")
    if len(lengths) != num_assistant:
        raise TrajectoryError(
            "action_token_lengths",
            f"has {len(lengths)} entries but the transcript has {num_assistant} assistant messages",
        )
    for position, value in enumerate(lengths):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TrajectoryError(f"action_token_lengths[{position}]", f"expected an integer, got {_brief(value)}")
        if value < 0:
            raise TrajectoryError(f"action_token_lengths[{position}]", f"negative token length {_brief(value)}")
        if value > MAX_TOKEN_LENGTH:
            raise TrajectoryError(
                f"action_token_lengths[{position}]", f"token length {_brief(value)} exceeds {MAX_TOKEN_LENGTH}"
            )


def _brief(value: Any, limit: int = 60) -> str:
    """``repr`` of a bad value, shortened for a one-line message (never a huge number's digits)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**limit:
        return f"an integer of {len(str(abs(value))) if abs(value) < 10**4000 else 'over 4000'} digits"
    if isinstance(value, dict | list):
        return f"a {'JSON object' if isinstance(value, dict) else 'list'}"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _depth_exceeds(value: Any, limit: int) -> bool:
    """True when ``value`` nests lists/objects deeper than ``limit`` (iterative, no recursion)."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth >= limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return False


def _content_text(content: Any, where: str) -> str:
    """Chat content as plain text (strings, or lists of ``{"type": "text", "text": ...}`` parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif isinstance(part, str):
                texts.append(part)
        return "\n".join(texts)
    raise TrajectoryError(where, f"expected a string or a list of parts, got {type(content).__name__}")


def _parse_tool_calls(raw: Any, where: str) -> tuple[ToolCall, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise TrajectoryError(where, f"expected a list, got {type(raw).__name__}")
    calls = []
    for position, call in enumerate(raw):
        call_where = f"{where}[{position}]"
        if not isinstance(call, dict):
            raise TrajectoryError(call_where, "expected an object")
        function = call.get("function", call)
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise TrajectoryError(f"{call_where}.function.name", "missing")
        raw_arguments = function.get("arguments", "{}")
        arguments: dict[str, Any] = {}
        valid = True
        if isinstance(raw_arguments, dict):
            arguments = raw_arguments
            raw_arguments = json.dumps(raw_arguments, sort_keys=True)
        elif isinstance(raw_arguments, str):
            try:
                parsed = json.loads(raw_arguments) if raw_arguments.strip() else {}
            except (json.JSONDecodeError, RecursionError):
                parsed, valid = {}, False
            except ValueError:  # e.g. an integer over Python's int-string conversion limit
                parsed, valid = {}, False
            if isinstance(parsed, dict) and _depth_exceeds(parsed, MAX_ARGUMENT_DEPTH):
                parsed, valid = {}, False
            if isinstance(parsed, dict):
                arguments = parsed
            else:
                valid = False
        else:
            raise TrajectoryError(f"{call_where}.function.arguments", "expected a JSON string or an object")
        call_id = call.get("id")
        calls.append(
            ToolCall(str(call_id) if call_id is not None else None, function["name"], arguments, raw_arguments, valid)
        )
    return tuple(calls)
