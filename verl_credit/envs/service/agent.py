"""The scripted agent of the demo service world: discrete macro actions over a tracked dialogue state.

An agent step has three parts:

1. :class:`DialogueState` -- what the agent knows, tracked from the transcript it sees (ids the
   customer typed, JSON the tools returned, errors) -- and :meth:`DialogueState.features`, the
   featurized state ``phi(s)`` of shape ``(F,)``;
2. a policy picks one of the :data:`MACROS` (a softmax over ``W phi(s)``, :class:`LinearSoftmaxPolicy`);
3. :func:`render_macro` writes the assistant message: text for the customer, or one OpenAI tool
   call whose arguments are filled from the tracked state (a guess such as ``"unknown"`` when the
   agent does not know the id, which the world rejects with a tool error).

The stochastic scripted agent of ``verl-credit demo`` is this policy with the hand-written prior
weights :data:`PRIOR_WEIGHTS` (a sloppy agent: skips questions, retries failing calls, chats);
the learning benchmark trains the same parametric policy from that prior.

Ground truth for evaluation (never shown to annotators): every value the tracker learns carries
the set of actions it came from, so an episode knows which actions its correct writes really
depended on (``causal``) and which actions were mistakes (``mistakes``: tool errors, writes the
task did not ask for, closing the conversation before the goal was done).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from verl_credit.envs.service.env import ServiceEpisode
from verl_credit.envs.service.tools import SYSTEM_PROMPT
from verl_credit.envs.service.user import OPENING_MESSAGE

__all__ = [
    "FEATURES",
    "MACROS",
    "PRIOR_WEIGHTS",
    "DialogueState",
    "Episode",
    "LinearSoftmaxPolicy",
    "prior_weight_matrix",
    "render_macro",
    "run_episode",
]

MACROS: tuple[str, ...] = (
    "ask_request",  # ask which order and what the customer wants (or to double-check a failing id)
    "ask_method",  # ask where the refund should go
    "confirm",  # restate the plan and ask for confirmation
    "lookup_order",  # get_order_details
    "lookup_user",  # get_user_details
    "lookup_variants",  # get_product_variants
    "return_item",  # return_item (the next item not yet returned)
    "refund",  # refund_order
    "exchange",  # exchange_item
    "search_help",  # search_help (never needed)
    "small_talk",  # a reassuring line without a question
    "finish",  # "anything else?" (the customer ends the chat)
)
MACRO_INDEX = {name: index for index, name in enumerate(MACROS)}

FEATURES: tuple[str, ...] = (
    "bias",
    "goal_known",  # the customer said what they want and which order
    "order_fetched",  # valid details of that order are known
    "method_known",  # the customer said where the refund goes
    "method_gift",  # ... and it is the gift card
    "gift_id_known",  # the gift card's payment-method id is known
    "confirmed",  # the customer confirmed the current plan
    "items_pending",  # refund: items of the fetched order still to return
    "all_returned",  # refund: every item of the fetched order is returned
    "goal_written",  # the final write (refund / exchange) succeeded
    "last_error",  # the last tool result was an error
    "id_invalid",  # the current order id failed a lookup and was not corrected yet
    "goal_exchange",  # the customer wants an exchange
    "variant_known",  # the item id of the requested variant is known
    "progress",  # turn / max_turns
)
FEATURE_INDEX = {name: index for index, name in enumerate(FEATURES)}

# The demo agent and the benchmark's starting policy: logit(a) = sum_f W[a, f] phi_f. Written by
# hand as a plausible but sloppy support agent (never fitted to any credit method).
PRIOR_WEIGHTS: dict[str, dict[str, float]] = {
    "ask_request": {"bias": 2.0, "goal_known": -3.5, "id_invalid": 2.0},
    "ask_method": {"bias": -1.0, "goal_known": 0.8, "method_known": -3.0, "goal_exchange": -2.0},
    "confirm": {"bias": -1.5, "goal_known": 0.8, "order_fetched": 0.5, "confirmed": -2.5, "goal_written": -2.0},
    "lookup_order": {"bias": -0.5, "goal_known": 2.0, "order_fetched": -3.0, "last_error": 0.5},
    "lookup_user": {"bias": -1.5, "order_fetched": 0.5, "method_gift": 1.0, "gift_id_known": -3.0},
    "lookup_variants": {"bias": -2.0, "goal_exchange": 2.5, "variant_known": -3.0, "order_fetched": 0.5},
    "return_item": {"bias": -2.0, "items_pending": 3.0},
    "refund": {"bias": -2.5, "all_returned": 3.0, "goal_written": -3.0},
    "exchange": {"bias": -3.0, "goal_exchange": 1.0, "variant_known": 2.5, "goal_written": -3.0},
    "search_help": {"bias": -0.5},
    "small_talk": {"bias": -0.5},
    "finish": {"bias": -2.5, "goal_written": 3.5, "progress": 1.0},
}

_ORDER_ID = re.compile(r"#W\d{7}")
_OPTION = re.compile(r"for the (.+?) version", re.IGNORECASE)


def prior_weight_matrix() -> np.ndarray:
    """:data:`PRIOR_WEIGHTS` as a ``(len(MACROS), len(FEATURES))`` matrix."""
    weights = np.zeros((len(MACROS), len(FEATURES)))
    for macro, row in PRIOR_WEIGHTS.items():
        for feature, value in row.items():
            weights[MACRO_INDEX[macro], FEATURE_INDEX[feature]] = value
    return weights


@dataclass(frozen=True)
class Known:
    """A value the agent learned and the actions it came from (the action and its own sources)."""

    value: Any
    sources: frozenset[int]


def _learn(known: Known | None, value: Any, sources: frozenset[int]) -> Known:
    """A value heard again keeps its first source (the earliest source of the same unit)."""
    if known is not None and known.value == value:
        return known
    return Known(value, sources)


@dataclass
class DialogueState:
    """What the agent knows after the messages so far (updated observation by observation)."""

    goal: Known | None = None  # "refund" | "exchange"
    order_id: Known | None = None
    id_invalid: bool = False
    option: Known | None = None  # requested exchange option, e.g. "size L"
    method: Known | None = None  # "original" | "gift_card"
    order: dict[str, Any] | None = None  # last valid details of the current order
    order_sources: frozenset[int] = frozenset()
    gift_id: Known | None = None
    variant_id: Known | None = None
    returned: set[str] = field(default_factory=set)
    goal_written: bool = False
    confirmed: bool = False
    last_error: bool = False

    # -- features ---------------------------------------------------------------------------
    def features(self, turn: int, max_turns: int) -> np.ndarray:
        """``phi(s)``: shape ``(len(FEATURES),)``, values in [0, 1]."""
        pending = self.pending_items()
        is_refund = self.goal is not None and self.goal.value == "refund"
        values = (
            1.0,
            float(self.goal is not None and self.order_id is not None and not self.id_invalid),
            float(self.order is not None),
            float(self.method is not None),
            float(self.method is not None and self.method.value == "gift_card"),
            float(self.gift_id is not None),
            float(self.confirmed),
            float(is_refund and self.order is not None and bool(pending)),
            float(is_refund and self.order is not None and not pending),
            float(self.goal_written),
            float(self.last_error),
            float(self.id_invalid),
            float(self.goal is not None and self.goal.value == "exchange"),
            float(self.variant_id is not None),
            turn / max_turns,
        )
        return np.asarray(values)

    def pending_items(self) -> list[str]:
        if self.order is None:
            return []
        return [item["item_id"] for item in self.order["items"] if item["item_id"] not in self.returned]

    # -- observations -------------------------------------------------------------------------
    def observe_user(self, text: str, elicited_by: int | None) -> None:
        """A customer message; ``elicited_by`` is the action it answers (None: unprompted)."""
        sources = frozenset() if elicited_by is None else frozenset({elicited_by})
        lowered = text.lower()
        order_ids = _ORDER_ID.findall(text)
        if order_ids:
            if self.order_id is None or order_ids[-1] != self.order_id.value:
                self.order, self.order_sources = None, frozenset()
            self.order_id, self.id_invalid = _learn(self.order_id, order_ids[-1], sources), False
            self.goal = _learn(self.goal, "exchange" if "exchange" in lowered else "refund", sources)
            option = _OPTION.search(text)
            if option:
                self.option = _learn(self.option, option.group(1), sources)
        if "changed my mind" in lowered:
            self.confirmed = False
        if "gift card" in lowered:
            self.method = _learn(self.method, "gift_card", sources)
        elif "original payment method" in lowered:
            self.method = _learn(self.method, "original", sources)
        if lowered.startswith("yes"):
            self.confirmed = True

    def observe_tool(
        self,
        name: str,
        arguments: dict[str, Any],
        content: str,
        is_error: bool,
        action: int,
        argument_sources: frozenset[int],
    ) -> None:
        """A tool result of ``action``, whose arguments came from ``argument_sources``."""
        self.last_error = is_error
        sources = argument_sources | {action}
        if is_error:
            if (
                name == "get_order_details"
                and self.order_id is not None
                and arguments.get("order_id") == (self.order_id.value)
            ):
                self.id_invalid = True
            return
        payload = json.loads(content)
        if name == "get_order_details" and self.order_id is not None and payload["order_id"] == self.order_id.value:
            self.order, self.order_sources = payload, sources
            self.returned = {item["item_id"] for item in payload["items"] if item["returned"]} | self.returned
        elif name == "get_user_details":
            gift = next((m["id"] for m in payload["payment_methods"] if m["kind"] == "gift_card"), None)
            if gift is not None:
                self.gift_id = Known(gift, sources)
        elif name == "get_product_variants" and self.option is not None:
            match = next((v for v in payload["variants"] if v["option"] == self.option.value and v["available"]), None)
            if match is not None:
                self.variant_id = Known(match["item_id"], sources | self.option.sources)
        elif name == "return_item":
            self.returned.add(payload["item_id"])
        elif name in ("refund_order", "exchange_item"):
            self.goal_written = True


@dataclass
class RenderedAction:
    """One assistant message plus what the ground truth needs to know about it."""

    message: dict[str, Any]
    tool: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    argument_sources: frozenset[int] = frozenset()
    asks: bool = False


def _sources(*known: Known | None) -> frozenset[int]:
    out: frozenset[int] = frozenset()
    for value in known:
        if value is not None:
            out = out | value.sources
    return out


def _refund_method_id(state: DialogueState) -> tuple[str, frozenset[int]]:
    """The payment method the agent would refund to: the gift card if asked for and known,
    otherwise the order's original payment method (a sloppy agent's default)."""
    if state.method is not None and state.method.value == "gift_card" and state.gift_id is not None:
        return state.gift_id.value, state.gift_id.sources | state.method.sources
    method_sources = state.method.sources if state.method is not None else frozenset()
    if state.order is not None:
        return state.order["payment_method_id"], state.order_sources | method_sources
    return "unknown", frozenset()


def render_macro(macro: str, state: DialogueState, action: int) -> RenderedAction:
    """The assistant message of ``macro`` in ``state``; ``action`` is its 0-based action index."""
    order_id = state.order_id.value if state.order_id is not None else "unknown"
    order_sources = _sources(state.order_id)
    if macro == "ask_request":
        if state.id_invalid:
            text = f"I couldn't find order {order_id}. Could you double-check the order number?"
        elif state.goal is None:
            text = "Hello! Which order is this about, and what would you like to do with it?"
        else:
            text = "Could you remind me which order this is about and what you would like to do?"
        return _text(text, asks=True)
    if macro == "ask_method":
        return _text("Would you like the refund to go to the original payment method or to your gift card?", True)
    if macro == "confirm":
        return _text(_confirmation_text(state), asks=True)
    if macro == "small_talk":
        return _text("Thanks for your patience, I'm looking into this for you.")
    if macro == "finish":
        return _text("Your request is complete. Is there anything else I can help you with?", asks=True)
    if macro == "lookup_order":
        return _call(action, "get_order_details", {"order_id": order_id}, order_sources)
    if macro == "lookup_user":
        user_id = state.order["user_id"] if state.order is not None else "unknown"
        return _call(action, "get_user_details", {"user_id": user_id}, state.order_sources)
    if macro == "lookup_variants":
        product, sources = "unknown", frozenset()
        if state.order is not None:
            product, sources = state.order["items"][0]["product"], state.order_sources
        return _call(action, "get_product_variants", {"product": product}, sources)
    if macro == "return_item":
        pending = state.pending_items()
        item_id = pending[0] if pending else "unknown"
        return _call(
            action,
            "return_item",
            {"order_id": order_id, "item_id": item_id},
            order_sources | (state.order_sources if pending else frozenset()),
        )
    if macro == "refund":
        method_id, sources = _refund_method_id(state)
        return _call(
            action, "refund_order", {"order_id": order_id, "payment_method_id": method_id}, order_sources | sources
        )
    if macro == "exchange":
        item_id, sources = "unknown", frozenset()
        if state.order is not None:
            item_id, sources = state.order["items"][0]["item_id"], state.order_sources
        new_id = state.variant_id.value if state.variant_id is not None else "unknown"
        return _call(
            action,
            "exchange_item",
            {"order_id": order_id, "item_id": item_id, "new_item_id": new_id},
            order_sources | sources | _sources(state.variant_id),
        )
    if macro == "search_help":
        topic = "exchanges" if state.goal is not None and state.goal.value == "exchange" else "returns"
        return _call(action, "search_help", {"topic": topic}, frozenset())
    raise ValueError(f"unknown macro {macro!r}; known: {MACROS}")


def _confirmation_text(state: DialogueState) -> str:
    if state.goal is None or state.order_id is None:
        return "Just to confirm, you would like me to take care of your order. Shall I proceed?"
    order_id = state.order_id.value
    if state.goal.value == "exchange":
        option = state.option.value if state.option is not None else "another option"
        return f"To confirm: I will exchange the item in order {order_id} for the {option} version. Shall I proceed?"
    method_id, _ = _refund_method_id(state)
    target = method_id if method_id != "unknown" else "your payment method"
    return f"To confirm: I will return the items of order {order_id} and refund them to {target}. Shall I proceed?"


def _text(text: str, asks: bool = False) -> RenderedAction:
    return RenderedAction({"role": "assistant", "content": text}, asks=asks)


def _call(action: int, name: str, arguments: dict[str, Any], sources: frozenset[int]) -> RenderedAction:
    call = {"id": f"call_{action}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
    return RenderedAction({"role": "assistant", "content": "", "tool_calls": [call]}, name, arguments, sources)


class LinearSoftmaxPolicy:
    """``pi(a | s) = softmax(W phi(s))`` over :data:`MACROS`; ``W``: ``(len(MACROS), len(FEATURES))``."""

    def __init__(self, weights: np.ndarray | None = None, temperature: float = 1.0):
        self.weights = prior_weight_matrix() if weights is None else np.asarray(weights, dtype=np.float64)
        if self.weights.shape != (len(MACROS), len(FEATURES)):
            raise ValueError(f"policy weights must have shape {(len(MACROS), len(FEATURES))}, got {self.weights.shape}")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.temperature = temperature

    def probabilities(self, phi: np.ndarray) -> np.ndarray:
        """``(len(MACROS),)`` action probabilities for one state ``phi`` of shape ``(F,)``."""
        logits = self.weights @ phi / self.temperature
        logits = logits - logits.max()
        exp = np.exp(logits)
        return exp / exp.sum()

    def sample(self, phi: np.ndarray, rng: np.random.Generator) -> int:
        probabilities = self.probabilities(phi)
        return int(min(np.searchsorted(np.cumsum(probabilities), rng.random()), len(MACROS) - 1))


@dataclass
class Episode:
    """A finished episode: the transcript, the reward, and the agent's own record of it.

    ``macros``: ``(T,)`` action indices into :data:`MACROS`; ``features``: ``(T, F)`` the states
    they were taken in; ``causal``/``mistakes``: ``(T,)`` ground-truth flags (see module doc).
    """

    task_id: str
    messages: list[dict[str, Any]]
    reward: float
    macros: list[int]
    features: np.ndarray
    causal: list[bool]
    mistakes: list[bool]

    @property
    def key(self) -> tuple[str, tuple[int, ...]]:
        """The transcript is a deterministic function of (task, macro sequence)."""
        return self.task_id, tuple(self.macros)


def run_episode(
    episode: ServiceEpisode,
    choose: Callable[[np.ndarray, int], int],
    max_turns: int | None = None,
) -> Episode:
    """Play one episode: ``choose(phi, turn) -> macro index`` picks every action.

    The episode ends when the customer ends the chat or after ``max_turns`` actions (default:
    the task's own limit).
    """
    task = episode.task
    limit = task.max_turns if max_turns is None else max_turns
    state = DialogueState()
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": OPENING_MESSAGE},
    ]
    macros: list[int] = []
    features: list[np.ndarray] = []
    writes: list[tuple[int, str, dict[str, Any], frozenset[int]]] = []  # successful writes
    mistakes: list[bool] = []
    for turn in range(limit):
        phi = state.features(turn, limit)
        macro = int(choose(phi, turn))
        rendered = render_macro(MACROS[macro], state, turn)
        macros.append(macro)
        features.append(phi)
        messages.append(rendered.message)
        mistake = False
        if rendered.tool is not None:
            content, is_error = episode.call_tool(rendered.tool, rendered.arguments)
            call_id = rendered.message["tool_calls"][0]["id"]
            messages.append({"role": "tool", "tool_call_id": call_id, "name": rendered.tool, "content": content})
            state.observe_tool(rendered.tool, rendered.arguments, content, is_error, turn, rendered.argument_sources)
            mistake = is_error
            if not is_error and rendered.tool in ("return_item", "refund_order", "exchange_item"):
                writes.append((turn, rendered.tool, rendered.arguments, rendered.argument_sources))
            mistakes.append(mistake)
            continue
        reply = episode.user_reply(rendered.message["content"])
        messages.append({"role": "user", "content": reply.content})
        state.observe_user(reply.content, turn if rendered.asks else None)
        state.last_error = False
        if reply.done:
            mistakes.append(not state.goal_written)  # closing before the goal was done
            break
        mistakes.append(False)
    reward = episode.reward()
    causal, wrong = _ground_truth(episode, writes, len(macros), reward)
    for action in wrong:
        mistakes[action] = True
    return Episode(task.task_id, messages, reward, macros, np.asarray(features), causal, mistakes)


def _ground_truth(
    episode: ServiceEpisode,
    writes: Sequence[tuple[int, str, dict[str, Any], frozenset[int]]],
    count: int,
    reward: float,
) -> tuple[list[bool], list[int]]:
    """(causal flags, actions that wrote what the task did not ask for)."""
    task = episode.task
    target_method = task.payment_method_id(task.final_method) if task.kind == "refund" else None
    causal = [False] * count
    wrong: list[int] = []
    for action, tool, arguments, sources in writes:
        wanted = arguments.get("order_id") == task.order_id and (
            (task.kind == "refund" and tool == "return_item")
            or (tool == "refund_order" and arguments.get("payment_method_id") == target_method)
            or (tool == "exchange_item" and arguments.get("new_item_id") == task.exchange_new_item_id)
        )
        if not wanted:
            wrong.append(action)
        elif reward > 0:
            for source in (*sources, action):
                causal[source] = True
    return causal, wrong
