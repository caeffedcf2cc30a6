"""Child process for the park-then-resume-elsewhere test (not collected by pytest).

Usage::

    python park_child.py STORE park|resume

``STORE`` is a SQLite path or ``postgres:SCHEMA:DSN``. ``park`` starts a refund turn
that parks on an approval and exits; ``resume`` (a new process, nothing in memory)
answers it and prints how the turn ended.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from turnkit import Agent, Runtime, ToolContext, ToolMessage, UserMessage, tool
from turnkit.stores import SqliteStore, Store
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call


@tool
async def refund(order_id: str, ctx: ToolContext) -> dict[str, Any]:
    """Refund an order once a person approves it."""
    answer = await ctx.request_input("approve", f"Refund {order_id}?")
    return {"refunded": bool(answer["approved"])}


def respond(messages: Any) -> Any:
    last = messages[-1]
    if isinstance(last, UserMessage):
        return ScriptedReply(tool_calls=[tool_call("refund", {"order_id": "o-1"})])
    if isinstance(last, ToolMessage):
        return f"done: {last.result}"
    return "?"


def open_store(spec: str) -> Store:
    if spec.startswith("postgres:"):
        from turnkit.stores import PostgresStore

        _, schema, dsn = spec.split(":", 2)
        return PostgresStore(dsn, schema=schema)
    return SqliteStore(spec)


async def main(spec: str, mode: str) -> None:
    agent = Agent(name="a", model=ScriptedModel(respond=respond), tools=[refund])
    async with Runtime(agent, store=open_store(spec)) as runtime:
        session = runtime.session("a", "s1")
        if mode == "park":
            result = await session.result(session.start("refund o-1", turn_id="t-1"))
            print(result.status, result.request.id if result.request else None)
        else:
            request = await session.pending()
            assert request is not None, "nothing is parked"
            tid = await session.resume(request.turn_id, request.id, {"approved": True})
            result = await session.result(tid)
            print(result.status, result.text)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[2] not in ("park", "resume"):
        raise SystemExit(__doc__)
    asyncio.run(main(sys.argv[1], sys.argv[2]))
