"""OpenAI function-tool schemas of the demo service world (one per tool in ``world.TOOL_FUNCTIONS``)."""

from __future__ import annotations

from typing import Any

__all__ = ["SYSTEM_PROMPT", "TOOL_SCHEMAS"]

SYSTEM_PROMPT = (
    "You are a customer-service agent for an online store. Find out what the customer wants before acting: "
    "ask which order and what they would like to do, and how they want to be refunded. Look orders up with the "
    "tools, return every item of an order before refunding it, and confirm with the customer before any change. "
    "Use only ids that a tool or the customer gave you."
)


def _function(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": list(properties),
                "additionalProperties": False,
            },
        },
    }


_ORDER_ID = {"type": "string", "description": "Order id such as '#W1234567'."}

TOOL_SCHEMAS: list[dict[str, Any]] = [
    _function("get_order_details", "Status, items, owner and payment method of an order.", {"order_id": _ORDER_ID}),
    _function(
        "get_user_details",
        "Name, email, payment methods and orders of a user.",
        {"user_id": {"type": "string", "description": "User id such as 'user_mia_4412'."}},
    ),
    _function(
        "get_product_variants",
        "Variants (item ids, options, availability) of a product.",
        {"product": {"type": "string", "description": "Product name as shown in the order."}},
    ),
    _function(
        "search_help", "Search the help center.", {"topic": {"type": "string", "description": "e.g. 'returns'."}}
    ),
    _function(
        "return_item",
        "Mark one delivered item of an order as returned.",
        {"order_id": _ORDER_ID, "item_id": {"type": "string", "description": "Item id from the order details."}},
    ),
    _function(
        "refund_order",
        "Refund an order whose items are all returned to one of the owner's payment methods.",
        {"order_id": _ORDER_ID, "payment_method_id": {"type": "string", "description": "e.g. 'credit_card_4421'."}},
    ),
    _function(
        "exchange_item",
        "Exchange a delivered item for another available variant of the same product.",
        {
            "order_id": _ORDER_ID,
            "item_id": {"type": "string", "description": "Item id from the order details."},
            "new_item_id": {"type": "string", "description": "Item id of the variant from get_product_variants."},
        },
    ),
]
