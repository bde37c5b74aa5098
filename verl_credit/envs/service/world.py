"""The demo service world's database and its tools (pure, synchronous, deterministic).

An evolving-state retail back office: users with payment methods, orders with items, product
variants. Read tools return JSON; write tools change the database and return a JSON receipt;
any misuse (unknown id, wrong status, a payment method of another user, an unavailable variant)
returns an ``Error: ...`` text with ``is_error = True`` and leaves the database untouched.

The outcome reward compares :meth:`Database.snapshot` of the final state with the snapshot of
the task's expected final state (``tasks.expected_database``), so *what* the agent wrote is
checked, not what it said.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "READ_TOOLS",
    "WRITE_TOOLS",
    "Database",
    "Item",
    "Order",
    "PaymentMethod",
    "User",
    "Variant",
    "execute_tool",
]

READ_TOOLS: tuple[str, ...] = ("get_order_details", "get_user_details", "get_product_variants", "search_help")
WRITE_TOOLS: tuple[str, ...] = ("return_item", "refund_order", "exchange_item")

HELP_ARTICLES: dict[str, str] = {
    "returns": "Delivered orders can be returned item by item; refund the order once every item is returned.",
    "refunds": "Refunds go to the original payment method or to a gift card of the same account.",
    "exchanges": "A delivered item can be exchanged for an available variant of the same product.",
}


@dataclass
class PaymentMethod:
    id: str
    kind: str  # "credit_card" | "paypal" | "gift_card"
    label: str


@dataclass
class User:
    user_id: str
    name: str
    email: str
    payment_methods: list[PaymentMethod]


@dataclass
class Item:
    item_id: str
    product: str
    option: str
    price: float
    returned: bool = False
    exchanged_to: str | None = None


@dataclass
class Order:
    order_id: str
    user_id: str
    status: str  # "delivered" | "return_in_progress" | "refunded" | "exchange_requested"
    items: list[Item]
    payment_method_id: str
    refund_to: str | None = None
    refund_amount: float | None = None


@dataclass
class Variant:
    item_id: str
    option: str
    price: float
    available: bool = True


@dataclass
class Database:
    users: dict[str, User] = field(default_factory=dict)
    orders: dict[str, Order] = field(default_factory=dict)
    variants: dict[str, list[Variant]] = field(default_factory=dict)  # product -> variants

    def copy(self) -> Database:
        return copy.deepcopy(self)

    def snapshot(self) -> dict[str, Any]:
        """The mutable state the reward compares: per order its status, refund and item states."""
        return {
            order_id: {
                "status": order.status,
                "refund_to": order.refund_to,
                "refund_amount": order.refund_amount,
                "items": [(item.item_id, item.returned, item.exchanged_to) for item in order.items],
            }
            for order_id, order in sorted(self.orders.items())
        }


ToolOutcome = tuple[str, bool]  # (content, is_error)


def _error(message: str) -> ToolOutcome:
    return f"Error: {message}", True


def _ok(payload: Mapping[str, Any]) -> ToolOutcome:
    return json.dumps(payload, sort_keys=False), False


def _order_payload(order: Order) -> dict[str, Any]:
    return {
        "order_id": order.order_id,
        "user_id": order.user_id,
        "status": order.status,
        "payment_method_id": order.payment_method_id,
        "items": [
            {"item_id": i.item_id, "product": i.product, "option": i.option, "price": i.price, "returned": i.returned}
            for i in order.items
        ],
    }


def _get_order(db: Database, args: Mapping[str, Any]) -> ToolOutcome:
    order = db.orders.get(str(args.get("order_id", "")))
    if order is None:
        return _error(f"order {args.get('order_id')!s} not found")
    return _ok(_order_payload(order))


def _get_user(db: Database, args: Mapping[str, Any]) -> ToolOutcome:
    user = db.users.get(str(args.get("user_id", "")))
    if user is None:
        return _error(f"user {args.get('user_id')!s} not found")
    orders = sorted(o.order_id for o in db.orders.values() if o.user_id == user.user_id)
    methods = [{"id": m.id, "kind": m.kind, "label": m.label} for m in user.payment_methods]
    return _ok(
        {"user_id": user.user_id, "name": user.name, "email": user.email, "payment_methods": methods, "orders": orders}
    )


def _get_variants(db: Database, args: Mapping[str, Any]) -> ToolOutcome:
    product = str(args.get("product", ""))
    variants = db.variants.get(product)
    if variants is None:
        return _error(f"product {product!r} not found")
    return _ok(
        {
            "product": product,
            "variants": [
                {"item_id": v.item_id, "option": v.option, "price": v.price, "available": v.available} for v in variants
            ],
        }
    )


def _search_help(db: Database, args: Mapping[str, Any]) -> ToolOutcome:
    topic = str(args.get("topic", "")).strip().lower()
    for key, text in HELP_ARTICLES.items():
        if key in topic or (topic and topic in key):
            return _ok({"topic": key, "article": text})
    return _ok({"topic": topic, "article": "No article found. Topics: " + ", ".join(HELP_ARTICLES)})


def _find_item(order: Order, item_id: str) -> Item | None:
    return next((item for item in order.items if item.item_id == item_id), None)


def _return_item(db: Database, args: Mapping[str, Any]) -> ToolOutcome:
    order = db.orders.get(str(args.get("order_id", "")))
    if order is None:
        return _error(f"order {args.get('order_id')!s} not found")
    if order.status not in ("delivered", "return_in_progress"):
        return _error(f"order {order.order_id} has status {order.status!r}; only delivered orders can be returned")
    item = _find_item(order, str(args.get("item_id", "")))
    if item is None:
        return _error(f"item {args.get('item_id')!s} is not part of order {order.order_id}")
    if item.returned:
        return _error(f"item {item.item_id} of order {order.order_id} was already returned")
    if item.exchanged_to is not None:
        return _error(f"item {item.item_id} of order {order.order_id} is being exchanged")
    item.returned = True
    order.status = "return_in_progress"
    pending = [i.item_id for i in order.items if not i.returned]
    return _ok({"order_id": order.order_id, "item_id": item.item_id, "returned": True, "items_pending": pending})


def _refund_order(db: Database, args: Mapping[str, Any]) -> ToolOutcome:
    order = db.orders.get(str(args.get("order_id", "")))
    if order is None:
        return _error(f"order {args.get('order_id')!s} not found")
    if order.status != "return_in_progress":
        return _error(f"order {order.order_id} has status {order.status!r}; return its items before refunding")
    pending = [i.item_id for i in order.items if not i.returned]
    if pending:
        return _error(f"items not yet returned for order {order.order_id}: {', '.join(pending)}")
    method_id = str(args.get("payment_method_id", ""))
    user = db.users[order.user_id]
    if method_id not in {m.id for m in user.payment_methods}:
        return _error(f"payment method {method_id} not found for user {user.user_id}")
    order.status = "refunded"
    order.refund_to = method_id
    order.refund_amount = round(sum(i.price for i in order.items), 2)
    return _ok(
        {"order_id": order.order_id, "status": "refunded", "refund_to": method_id, "amount": order.refund_amount}
    )


def _exchange_item(db: Database, args: Mapping[str, Any]) -> ToolOutcome:
    order = db.orders.get(str(args.get("order_id", "")))
    if order is None:
        return _error(f"order {args.get('order_id')!s} not found")
    if order.status != "delivered":
        return _error(f"order {order.order_id} has status {order.status!r}; only delivered orders can be exchanged")
    item = _find_item(order, str(args.get("item_id", "")))
    if item is None:
        return _error(f"item {args.get('item_id')!s} is not part of order {order.order_id}")
    new_id = str(args.get("new_item_id", ""))
    variant = next((v for v in db.variants.get(item.product, []) if v.item_id == new_id), None)
    if variant is None:
        return _error(f"item {new_id} is not a variant of {item.product}")
    if not variant.available:
        return _error(f"variant {new_id} ({variant.option}) is out of stock")
    if variant.item_id == item.item_id:
        return _error(f"item {new_id} is the item already ordered")
    item.exchanged_to = new_id
    order.status = "exchange_requested"
    return _ok(
        {"order_id": order.order_id, "item_id": item.item_id, "new_item_id": new_id, "status": "exchange_requested"}
    )


TOOL_FUNCTIONS: dict[str, Callable[[Database, Mapping[str, Any]], ToolOutcome]] = {
    "get_order_details": _get_order,
    "get_user_details": _get_user,
    "get_product_variants": _get_variants,
    "search_help": _search_help,
    "return_item": _return_item,
    "refund_order": _refund_order,
    "exchange_item": _exchange_item,
}


def execute_tool(db: Database, name: str, arguments: Mapping[str, Any]) -> ToolOutcome:
    """Run tool ``name`` on ``db`` (mutating it for write tools); unknown tools are errors."""
    function = TOOL_FUNCTIONS.get(name)
    if function is None:
        return _error(f"unknown tool {name!r}; available: {', '.join(TOOL_FUNCTIONS)}")
    if not isinstance(arguments, Mapping):
        return _error(f"arguments of {name} must be a JSON object")
    return function(db, arguments)
