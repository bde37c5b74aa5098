"""Vocabulary of the token-level service-world policy: what it reads and what it writes.

The policy of ``bench/token_policy.py`` reads the rendered dialogue as one token stream and writes
every action as a sequence of tokens ended by ``<eos>``:

* a reply is a short string of word tokens, e.g. ``hello ! which order is this about , ...``;
* a tool call is ``<call> tool_name key <ENTITY> key <ENTITY> <eos>``, where an entity token
  (``<ORDER>``, ``<PM_GIFT>``, ...) is a pointer that :func:`resolve_entity` fills from what the
  dialogue revealed (a copy mechanism: the policy picks *which* value, not its digits; a pointer
  to something not yet known renders as ``"unknown"``, which the world rejects).

Observations are tokenized from the messages (customer text word by word with order ids as
``<order_ref>``; tool results as a short summary: name, ok/error and the counts the agent needs).
The vocabulary is built in code from the scripted agent's and the scripted customer's templates,
so every word they use has a token; anything else becomes ``<unk>``.

:func:`macro_tokens` writes the scripted agent's macro (``envs.service.agent``) in this token form;
it is the behaviour-cloning target, and rendering it reproduces the scripted agent's message.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from verl_credit.envs.service.agent import DialogueState, Known, RenderedAction
from verl_credit.envs.service.world import TOOL_FUNCTIONS

__all__ = [
    "ACT",
    "BOS",
    "CALL",
    "ENTITIES",
    "EOS",
    "PAD",
    "STRUCTURAL",
    "VOCAB",
    "Vocabulary",
    "detokenize_text",
    "macro_tokens",
    "observation_tokens",
    "render_action",
    "resolve_entity",
    "tokenize_text",
]

PAD, BOS, ACT, USER, TOOL, EOS, CALL, UNK = "<pad>", "<bos>", "<act>", "<user>", "<tool>", "<eos>", "<call>", "<unk>"
ORDER_REF = "<order_ref>"  # an order id inside an observation (the policy never writes one)
# Pointer tokens the policy writes; values come from the tracked dialogue state.
ENTITIES: tuple[str, ...] = (
    "<ORDER>",  # the order id the customer gave last
    "<USER>",  # owner of the fetched order
    "<PRODUCT>",  # product of the fetched order's first item
    "<ITEM_NEXT>",  # next item of the fetched order not yet returned
    "<ITEM_FIRST>",  # first item of the fetched order
    "<PM_ORDER>",  # the fetched order's payment method
    "<PM_GIFT>",  # the gift card id from the user details
    "<VARIANT>",  # item id of the requested variant
)
ARGUMENT_KEYS: tuple[str, ...] = (
    "order_id",
    "user_id",
    "product",
    "item_id",
    "payment_method_id",
    "new_item_id",
    "topic",
)
# Tokens that only ever appear as inputs: masked out of the policy's output distribution.
STRUCTURAL: tuple[str, ...] = (PAD, BOS, ACT, USER, TOOL, ORDER_REF)

_ENTITY = re.compile(r"(<[A-Z_]+>)")
_WORD = re.compile(r"<[a-z_]+>|#w\d+|[a-z]+(?:['-][a-z]+)*|\d+|[^\sa-z\d]")

# Every sentence the scripted agent (agent.render_macro) and customer (user.py) can say; entity
# slots written as tokens. The vocabulary is the set of their words.
_CORPUS: tuple[str, ...] = (
    "hello! which order is this about, and what would you like to do with it?",
    "could you remind me which order this is about and what you would like to do?",
    "i couldn't find order <ORDER>. could you double-check the order number?",
    "would you like the refund to go to the original payment method or to your gift card?",
    "just to confirm, you would like me to take care of your order. shall i proceed?",
    "to confirm: i will return the items of order <ORDER> and refund them to your payment method. shall i proceed?",
    "to confirm: i will exchange the item in order <ORDER> for the another option version. shall i proceed?",
    "thanks for your patience, i'm looking into this for you.",
    "your request is complete. is there anything else i can help you with?",
    "hi, i need some help with one of my orders.",
    "no, that's all. thank you!",
    "yes, please go ahead.",
    "please refund it to the original payment method.",
    "please refund it to my gift card.",
    "actually, i've changed my mind: please refund it to my gift card instead.",
    "sorry, i'm not sure what you mean. i just need help with my order.",
    "okay, thanks.",
    "sorry about that, the right order number is <order_ref>.",
    "i'd like to return the item from order <order_ref> and get a refund.",
    "i'd like to return all 2 3 4 items from order <order_ref> and get a refund.",
    "i'd like to exchange the from order for the version.",
    "0 1 2 3 4 5 ok error items pending refunded returns exchanges refunds",
)


def tokenize_text(text: str) -> list[str]:
    """Lower-cased word tokens of ``text``; order ids become ``<order_ref>``."""
    words: list[str] = []
    for part in _ENTITY.split(text):  # entity pointers keep their case
        if part in ENTITIES:
            words.append(part)
        else:
            words += [ORDER_REF if word.startswith("#w") else word for word in _WORD.findall(part.lower())]
    return words


def detokenize_text(words: Sequence[str]) -> str:
    """Words back to a sentence (no space before punctuation)."""
    return re.sub(r" ([?.!,:])", r"\1", " ".join(words))


class Vocabulary:
    """Token strings <-> ids; ``ids[PAD] == 0``."""

    def __init__(self, tokens: Sequence[str]):
        self.tokens: tuple[str, ...] = tuple(dict.fromkeys(tokens))
        self.ids: dict[str, int] = {token: index for index, token in enumerate(self.tokens)}

    def __len__(self) -> int:
        return len(self.tokens)

    def encode(self, tokens: Sequence[str]) -> list[int]:
        return [self.ids.get(token, self.ids[UNK]) for token in tokens]

    def decode(self, ids: Sequence[int]) -> list[str]:
        return [self.tokens[int(i)] for i in ids]


def _build_vocabulary() -> Vocabulary:
    words: list[str] = [PAD, BOS, ACT, USER, TOOL, ORDER_REF, EOS, CALL, UNK, *ENTITIES]
    words += [*TOOL_FUNCTIONS, *ARGUMENT_KEYS]
    for sentence in _CORPUS:
        words += tokenize_text(sentence)
    return Vocabulary(words)


VOCAB = _build_vocabulary()


# ----------------------------------------------------------------------------------------------
# Observations
# ----------------------------------------------------------------------------------------------


def _tool_summary(name: str, content: str) -> list[str]:
    """What a tool result tells the policy: name, ok/error, and the item counts it must track."""
    if content.startswith("Error"):
        return [name, "error"]
    payload = json.loads(content)
    if name == "get_order_details":
        pending = sum(not item["returned"] for item in payload["items"])
        return [name, "ok", "items", str(len(payload["items"])), "pending", str(pending)]
    if name == "return_item":
        return [name, "ok", "pending", str(len(payload["items_pending"]))]
    if name == "refund_order":
        return [name, "ok", "refunded"]
    return [name, "ok"]


def observation_tokens(message: dict[str, Any]) -> list[str]:
    """Tokens of one non-assistant message (customer text or tool result)."""
    if message["role"] == "tool":
        return [TOOL, *_tool_summary(message.get("name", ""), message["content"])]
    return [USER, *tokenize_text(message["content"])]


# ----------------------------------------------------------------------------------------------
# Actions: entity pointers, rendering, the scripted agent's macros as tokens
# ----------------------------------------------------------------------------------------------


def _method_sources(state: DialogueState) -> frozenset[int]:
    return state.method.sources if state.method is not None else frozenset()


def resolve_entity(token: str, state: DialogueState) -> tuple[str, frozenset[int]]:
    """``(value, actions it came from)`` of a pointer token in ``state`` (``"unknown"`` when the
    dialogue has not revealed it). Sources follow ``agent.render_macro`` (a payment method also
    depends on the customer's answer about the method, when there was one)."""
    order = state.order
    if token == "<ORDER>":
        known: Known | None = state.order_id
        return (known.value, known.sources) if known is not None else ("unknown", frozenset())
    if token == "<VARIANT>":
        known = state.variant_id
        return (known.value, known.sources) if known is not None else ("unknown", frozenset())
    if token == "<PM_GIFT>":
        if state.gift_id is None:
            return "unknown", frozenset()
        return state.gift_id.value, state.gift_id.sources | _method_sources(state)
    if order is None:
        return "unknown", frozenset()
    if token == "<USER>":
        return order["user_id"], state.order_sources
    if token == "<PRODUCT>":
        return order["items"][0]["product"], state.order_sources
    if token == "<ITEM_FIRST>":
        return order["items"][0]["item_id"], state.order_sources
    if token == "<ITEM_NEXT>":
        pending = state.pending_items()
        return (pending[0], state.order_sources) if pending else ("unknown", frozenset())
    if token == "<PM_ORDER>":
        return order["payment_method_id"], state.order_sources | _method_sources(state)
    raise ValueError(f"unknown entity token {token!r}; entities: {ENTITIES}")


def render_action(tokens: Sequence[str], state: DialogueState, action: int) -> RenderedAction:
    """The assistant message the policy's action ``tokens`` (without ``<eos>``) mean in ``state``.

    ``<call>`` first: a tool call; the next token names the tool and the rest are ``key value``
    pairs (a value is an entity pointer or a literal word; a dangling key is dropped). Anything
    else: a reply, entity pointers replaced by their values. Malformed calls are still sent (the
    world answers with an error), as a language model's malformed call would be.
    """
    if tokens and tokens[0] == CALL:
        name = tokens[1] if len(tokens) > 1 else ""
        arguments: dict[str, Any] = {}
        sources: frozenset[int] = frozenset()
        rest = list(tokens[2:])
        for key, value in zip(rest[0::2], rest[1::2], strict=False):
            if value in ENTITIES:
                value, found = resolve_entity(value, state)
                sources = sources | found
            arguments[key] = value
        call = {
            "id": f"call_{action}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)},
        }
        return RenderedAction({"role": "assistant", "content": "", "tool_calls": [call]}, name, arguments, sources)
    words = [resolve_entity(t, state)[0] if t in ENTITIES else t for t in tokens]
    text = detokenize_text(words)
    return RenderedAction({"role": "assistant", "content": text}, asks="?" in text)


def _refund_target(state: DialogueState) -> str:
    """The pointer the scripted agent's refund uses (``agent._refund_method_id``)."""
    if state.method is not None and state.method.value == "gift_card" and state.gift_id is not None:
        return "<PM_GIFT>"
    return "<PM_ORDER>"


def macro_tokens(macro: str, state: DialogueState) -> list[str]:
    """The scripted agent's ``macro`` in ``state`` as policy tokens (ending with ``<eos>``);
    :func:`render_action` of them gives ``agent.render_macro``'s message (lower-cased)."""
    if macro == "ask_request":
        if state.id_invalid:
            text = "i couldn't find order <ORDER>. could you double-check the order number?"
        elif state.goal is None:
            text = _CORPUS[0]
        else:
            text = _CORPUS[1]
        return [*tokenize_text(text), EOS]
    if macro == "ask_method":
        return [*tokenize_text(_CORPUS[3]), EOS]
    if macro == "confirm":
        if state.goal is None or state.order_id is None:
            return [*tokenize_text(_CORPUS[4]), EOS]
        if state.goal.value == "exchange":
            option = state.option.value if state.option is not None else "another option"
            text = f"to confirm: i will exchange the item in order <ORDER> for the {option} version. shall i proceed?"
            return [*tokenize_text(text), EOS]
        target = _refund_target(state)
        if target == "<PM_ORDER>" and state.order is None:
            target = "your payment method"
        text = f"to confirm: i will return the items of order <ORDER> and refund them to {target}. shall i proceed?"
        return [*tokenize_text(text), EOS]
    if macro == "small_talk":
        return [*tokenize_text(_CORPUS[7]), EOS]
    if macro == "finish":
        return [*tokenize_text(_CORPUS[8]), EOS]
    calls: dict[str, list[str]] = {
        "lookup_order": ["get_order_details", "order_id", "<ORDER>"],
        "lookup_user": ["get_user_details", "user_id", "<USER>"],
        "lookup_variants": ["get_product_variants", "product", "<PRODUCT>"],
        "return_item": ["return_item", "order_id", "<ORDER>", "item_id", "<ITEM_NEXT>"],
        "refund": ["refund_order", "order_id", "<ORDER>", "payment_method_id", _refund_target(state)],
        "exchange": ["exchange_item", "order_id", "<ORDER>", "item_id", "<ITEM_FIRST>", "new_item_id", "<VARIANT>"],
    }
    if macro == "search_help":
        topic = "exchanges" if state.goal is not None and state.goal.value == "exchange" else "returns"
        return [CALL, "search_help", "topic", topic, EOS]
    if macro not in calls:
        raise ValueError(f"unknown macro {macro!r}")
    return [CALL, *calls[macro], EOS]
