"""A remote tool: it awaits a (here simulated) shipping service, outside the transaction.

Remote tools are at-least-once, so the call carries `ctx.idempotency_key`, which a
real service would use to deduplicate a replayed request.
"""

from __future__ import annotations

import asyncio

from turnkit import ToolContext, tool

_STATUSES = ("received", "packed", "shipped")


@tool
async def lookup_order(order_id: int, ctx: ToolContext) -> dict[str, object]:
    """Look up an order's shipping status by its id."""
    await asyncio.sleep(0)  # stands in for the HTTP request to the shipping service
    return {
        "order_id": order_id,
        "status": _STATUSES[order_id % len(_STATUSES)],
        "request_key": ctx.idempotency_key,
    }
