"""An approval tool: the turn parks until a person says yes or no, then carries on.

Everything before ``request_input`` runs again when the turn resumes, so it is kept
to reads; the refund itself happens after the answer, once.
"""

from __future__ import annotations

from turnkit import ToolContext, tool


@tool
async def refund_order(order_id: int, ctx: ToolContext) -> dict[str, object]:
    """Refund an order, once a person approves it."""
    approved = await ctx.request_input(
        "approve",
        f"Refund order #{order_id} in full?",
        schema={"type": "boolean"},
    )
    if not approved:
        return {"order_id": order_id, "refunded": False}
    return {"order_id": order_id, "refunded": True}
