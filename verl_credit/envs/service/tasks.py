"""Tasks of the demo service world: a database, a hidden goal, and the expected final state.

A task is built deterministically from a small spec ``{"variant": ..., "seed": ...}`` (what a
dataset row's ``extra_info`` carries), so every rollout of a group sees the same world.

Variants (the goal is hidden: the customer opens with "I need help with an order" and reveals
what they want only when asked):

* ``refund`` -- return the single item of an order and refund it, to the original payment
  method or to the account's gift card (the customer says which only when asked);
* ``exchange`` -- exchange an item for another size/color (needs the product's variants);
* ``revision`` -- a refund where the customer revises the refund method when asked to confirm
  (a goal revision: an agent that writes without confirming refunds to the wrong place);
* ``error_repair`` -- the customer first gives a mistyped order id (the lookup fails: a tool
  error) and gives the right one when asked to double-check;
* ``delayed`` -- a refund of a four-item order: the payment method and item ids fetched early
  are used many turns later, after every item has been returned;
* ``mixed`` -- one of the above, drawn from the seed.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from verl_credit.envs.service.world import Database, Item, Order, PaymentMethod, User, Variant, execute_tool

__all__ = ["VARIANTS", "ServiceTask", "build_task", "expected_database"]

VARIANTS: tuple[str, ...] = ("refund", "exchange", "revision", "error_repair", "delayed", "mixed")
_CONCRETE = ("refund", "exchange", "revision", "error_repair", "delayed")
MAX_TURNS: dict[str, int] = {"refund": 12, "exchange": 12, "revision": 14, "error_repair": 14, "delayed": 16}

_NAMES = ("mia", "noah", "ava", "liam", "zoe", "omar", "ines", "yuki", "lena", "ravi", "sara", "theo")
_SURNAMES = ("garcia", "kim", "novak", "silva", "okafor", "tanaka", "berg", "rossi", "haddad", "moreau")
# product -> (options, price)
_PRODUCTS: dict[str, tuple[tuple[str, ...], float]] = {
    "T-Shirt": (("size S", "size M", "size L", "size XL"), 19.99),
    "Running Shoes": (("size 8", "size 9", "size 10", "size 11"), 89.5),
    "Water Bottle": (("color blue", "color green", "color black"), 14.25),
    "Desk Lamp": (("color white", "color black", "color brass"), 42.0),
    "Backpack": (("color grey", "color navy", "color olive"), 64.75),
    "Headphones": (("color black", "color silver", "color red"), 119.0),
}


@dataclass(frozen=True)
class ServiceTask:
    """One task: the initial database plus what the customer wants (hidden from the agent)."""

    task_id: str
    variant: str  # the concrete variant (never "mixed")
    kind: str  # "refund" | "exchange"
    database: Database
    user_id: str
    order_id: str
    refund_method: str | None = None  # "original" | "gift_card": the customer's first answer
    revised_method: str | None = None  # set for ``revision``: the answer once asked to confirm
    typo_order_id: str | None = None  # set for ``error_repair``: the id the customer gives first
    exchange_item_id: str | None = None
    exchange_new_item_id: str | None = None
    exchange_option: str | None = None
    max_turns: int = 12

    @property
    def final_method(self) -> str | None:
        return self.revised_method or self.refund_method

    def payment_method_id(self, method: str) -> str:
        """The payment-method id meaning ``method`` ("original" or "gift_card") for this task."""
        if method == "original":
            return self.database.orders[self.order_id].payment_method_id
        user = self.database.users[self.user_id]
        return next(m.id for m in user.payment_methods if m.kind == "gift_card")

    def spec(self) -> dict[str, Any]:
        variant, _, seed = self.task_id.partition("-")
        return {"variant": variant, "seed": int(seed), "max_turns": self.max_turns}


def build_task(spec: Mapping[str, Any]) -> ServiceTask:
    """Build the task of ``{"variant": str, "seed": int[, "max_turns": int]}``; bad specs raise ValueError."""
    variant = spec.get("variant", "mixed")
    if variant not in VARIANTS:
        raise ValueError(f"task variant must be one of {VARIANTS}, got {variant!r}")
    seed = spec.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"task seed must be an integer, got {seed!r}")
    rng = random.Random(f"service:{variant}:{seed}")
    concrete = rng.choice(_CONCRETE) if variant == "mixed" else variant
    max_turns = spec.get("max_turns", MAX_TURNS[concrete])
    if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
        raise ValueError(f"task max_turns must be a positive integer, got {max_turns!r}")
    database, user_id, target = _build_database(rng, items_in_target=4 if concrete == "delayed" else 1)
    common: dict[str, Any] = {
        "task_id": f"{variant}-{seed}",
        "variant": concrete,
        "database": database,
        "user_id": user_id,
        "order_id": target,
        "max_turns": max_turns,
    }
    if concrete == "exchange":
        item = database.orders[target].items[0]
        choices = [v for v in database.variants[item.product] if v.available and v.option != item.option]
        new = rng.choice(choices)
        return ServiceTask(
            kind="exchange",
            exchange_item_id=item.item_id,
            exchange_new_item_id=new.item_id,
            exchange_option=new.option,
            **common,
        )
    method = rng.choice(("original", "gift_card"))
    revised = None
    if concrete == "revision":
        method, revised = rng.choice((("original", "gift_card"), ("gift_card", "original")))
    typo = _typo(rng, target, database) if concrete == "error_repair" else None
    return ServiceTask(kind="refund", refund_method=method, revised_method=revised, typo_order_id=typo, **common)


def expected_database(task: ServiceTask) -> Database:
    """The database after the correct writes (what the reward compares the final state with)."""
    db = task.database.copy()
    order = db.orders[task.order_id]
    if task.kind == "exchange":
        _, failed = execute_tool(
            db,
            "exchange_item",
            {"order_id": task.order_id, "item_id": task.exchange_item_id, "new_item_id": task.exchange_new_item_id},
        )
    else:
        for item in list(order.items):
            execute_tool(db, "return_item", {"order_id": task.order_id, "item_id": item.item_id})
        method_id = task.payment_method_id(task.final_method or "original")
        _, failed = execute_tool(db, "refund_order", {"order_id": task.order_id, "payment_method_id": method_id})
    if failed:  # a generator bug, never a user error
        raise RuntimeError(f"task {task.task_id}: the expected writes fail")
    return db


def _digits(rng: random.Random, count: int) -> str:
    return "".join(rng.choice("0123456789") for _ in range(count))


def _build_database(rng: random.Random, items_in_target: int) -> tuple[Database, str, str]:
    """A user with a card and a gift card, three delivered orders (one is the target), variants."""
    db = Database()
    for product, (options, price) in _PRODUCTS.items():
        db.variants[product] = [
            Variant(item_id=_digits(rng, 10), option=option, price=price, available=rng.random() > 0.15)
            for option in options
        ]
        db.variants[product][0].available = True  # every product has at least two available options
        db.variants[product][1].available = True
    first, last = rng.choice(_NAMES), rng.choice(_SURNAMES)
    user_id = f"user_{first}_{_digits(rng, 4)}"
    card = PaymentMethod(f"credit_card_{_digits(rng, 4)}", "credit_card", "Visa card")
    gift = PaymentMethod(f"gift_card_{_digits(rng, 4)}", "gift_card", "gift card")
    paypal = PaymentMethod(f"paypal_{_digits(rng, 4)}", "paypal", "PayPal")
    methods = [card, gift] + ([paypal] if rng.random() < 0.5 else [])
    db.users[user_id] = User(user_id, f"{first.title()} {last.title()}", f"{first}.{last}@example.com", methods)
    order_ids: list[str] = []
    while len(order_ids) < 3:
        candidate = f"#W{_digits(rng, 7)}"
        if candidate not in order_ids:
            order_ids.append(candidate)
    for position, order_id in enumerate(order_ids):
        count = items_in_target if position == 0 else rng.randint(1, 2)
        products = rng.sample(sorted(_PRODUCTS), count)
        items = []
        for product in products:
            variant = rng.choice([v for v in db.variants[product] if v.available])
            items.append(Item(item_id=variant.item_id, product=product, option=variant.option, price=variant.price))
        payer = card if position != 1 else (paypal if len(methods) == 3 else card)
        db.orders[order_id] = Order(order_id, user_id, "delivered", items, payer.id)
    return db, user_id, order_ids[0]


def _typo(rng: random.Random, order_id: str, db: Database) -> str:
    """The order id with two adjacent digits swapped (or one changed) that names no order."""
    digits = list(order_id[2:])
    for _ in range(20):
        position = rng.randrange(len(digits) - 1)
        swapped = digits.copy()
        swapped[position], swapped[position + 1] = swapped[position + 1], swapped[position]
        if swapped == digits:
            swapped[position] = str((int(swapped[position]) + 1) % 10)
        candidate = "#W" + "".join(swapped)
        if candidate not in db.orders:
            return candidate
    raise RuntimeError(f"cannot make a typo of {order_id}")
