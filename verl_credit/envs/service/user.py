"""The scripted customer: reveals the hidden goal only when asked, answers clarifying questions.

It reads the agent's last text with keyword rules (so it works for the scripted agent and for a
language-model policy alike) and answers in the order a person would: closing question, request
for confirmation, refund-method question, question about the order/request, any other question,
or a plain statement (acknowledged without new information).

What it says, and when:

* the opening turn is vague ("I need some help with one of my orders");
* asked which order / what they want -> the goal and the order id (``error_repair``: a mistyped
  id the first time; the right one once asked to double-check);
* asked how to be refunded -> "original payment method" or "gift card";
* asked to confirm -> "yes", except in ``revision`` tasks, where the first request for
  confirmation gets the revised refund method instead (a goal revision);
* asked whether there is anything else -> ends the conversation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from verl_credit.envs.service.tasks import ServiceTask

__all__ = ["OPENING_MESSAGE", "ScriptedUser", "UserReply"]

OPENING_MESSAGE = "Hi, I need some help with one of my orders."

_CLOSING = re.compile(r"anything else|is there something else|all set\?", re.IGNORECASE)
_CONFIRM = re.compile(
    r"shall i proceed|should i proceed|do you confirm|can you confirm|please confirm|"
    r"go ahead\?|is that correct\?|do you want me to proceed",
    re.IGNORECASE,
)
_METHOD = re.compile(
    r"original payment|gift card|refund (it )?to|payment method|how would you like .*refund", re.IGNORECASE
)
_REQUEST = re.compile(
    r"which order|order (number|id)|what would you like|how can i help|what can i do|"
    r"double-check|couldn't find|could not find|what do you need|help you with",
    re.IGNORECASE,
)

_METHOD_TEXT = {"original": "the original payment method", "gift_card": "my gift card"}


@dataclass(frozen=True)
class UserReply:
    content: str
    done: bool = False


class ScriptedUser:
    """One customer for one episode (stateful: remembers what it already said)."""

    def __init__(self, task: ServiceTask):
        self.task = task
        self.gave_typo = False
        self.revised = False

    def reply(self, assistant_text: str) -> UserReply:
        """The customer's answer to the agent's last message."""
        text = assistant_text or ""
        if _CLOSING.search(text):
            return UserReply("No, that's all. Thank you!", done=True)
        if _CONFIRM.search(text):
            return UserReply(self._confirmation())
        if _METHOD.search(text) and self.task.kind == "refund":
            return UserReply(f"Please refund it to {_METHOD_TEXT[self._current_method()]}.")
        if _REQUEST.search(text):
            return UserReply(self._request())
        if "?" in text:
            return UserReply("Sorry, I'm not sure what you mean. I just need help with my order.")
        return UserReply("Okay, thanks.")

    def _current_method(self) -> str:
        if self.revised and self.task.revised_method:
            return self.task.revised_method
        return self.task.refund_method or "original"

    def _confirmation(self) -> str:
        if self.task.revised_method and not self.revised:
            self.revised = True
            return (
                f"Actually, I've changed my mind: please refund it to {_METHOD_TEXT[self.task.revised_method]} instead."
            )
        return "Yes, please go ahead."

    def _request(self) -> str:
        task = self.task
        order_id = task.order_id
        if task.typo_order_id and not self.gave_typo:
            self.gave_typo = True
            order_id = task.typo_order_id
        elif task.typo_order_id:
            return f"Sorry about that, the right order number is {order_id}."
        if task.kind == "exchange":
            order = task.database.orders[task.order_id]
            item = next(i for i in order.items if i.item_id == task.exchange_item_id)
            return (
                f"I'd like to exchange the {item.product} ({item.option}) from order {order_id} "
                f"for the {task.exchange_option} version."
            )
        items = len(task.database.orders[task.order_id].items)
        what = "the item" if items == 1 else f"all {items} items"
        return f"I'd like to return {what} from order {order_id} and get a refund."
