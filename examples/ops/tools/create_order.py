"""A local tool: its row commits in the same transaction as the step, exactly once."""

from __future__ import annotations

from turnkit import ToolContext, tool

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS orders ("
    "id INTEGER PRIMARY KEY, item TEXT NOT NULL, quantity INTEGER NOT NULL, "
    "session_id TEXT NOT NULL)"
)


@tool
def create_order(item: str, quantity: int, ctx: ToolContext) -> dict[str, object]:
    """Place an order for `quantity` units of `item`; returns the new order id."""
    if quantity < 1:
        raise ValueError("quantity must be at least 1")
    ctx.store.execute(_SCHEMA)
    rows = ctx.store.execute(
        "INSERT INTO orders (item, quantity, session_id) VALUES (?, ?, ?) RETURNING id",
        (item, quantity, ctx.session_id),
    )
    return {"order_id": rows[0][0], "item": item, "quantity": quantity}
