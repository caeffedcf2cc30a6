"""``lookup`` reads an order's state and notes the lookup, in the step's transaction
(so a worker that dies mid-turn and the one that takes over never note it twice)."""

from __future__ import annotations

import os

from turnkit import ToolContext, tool


@tool
def lookup(ctx: ToolContext, order: str) -> dict[str, object]:
    """Look an order up."""
    ctx.store.execute(
        "INSERT INTO order_lookups (session_id, turn_id, order_id, pid) VALUES (?, ?, ?, ?)",
        (ctx.session_id, ctx.turn_id, order, os.getpid()),
    )
    state = ("packed", "shipped", "delivered")[sum(map(ord, order)) % 3]
    return {"order": order, "state": state, "pid": os.getpid()}
