"""Child process for the deadline-across-a-SIGKILL test (not collected by pytest).

Usage::

    python deadline_child.py SCHEMA DSN SECONDS

Opens a runtime on PostgreSQL schema ``SCHEMA`` (its timer loop wins the store's
election, nobody else standing yet), parks turn ``t-1`` of session ``s1`` on a
question whose deadline is ``SECONDS`` away with a default answer, prints
``parked <deadline>`` and then waits to be killed.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))  # for eventually
from eventually import eventually

from turnkit import Agent, Runtime, ToolContext, ToolMessage, UserMessage, tool
from turnkit.stores import PostgresStore
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call


def deadline_agent(seconds: float, ran: list[Any] | None = None) -> Agent:
    @tool
    async def ship(order_id: str, ctx: ToolContext) -> str:
        """Ship an order unless a person stops it in time."""
        answer = await ctx.request_input(
            "hold", f"Hold {order_id}?", expires_in=seconds, on_expiry="ship it"
        )
        if ran is not None:
            ran.append(answer)
        return str(answer)

    def respond(messages: Any) -> Any:
        last = messages[-1]
        if isinstance(last, UserMessage):
            return ScriptedReply(tool_calls=[tool_call("ship", {"order_id": "o-1"})])
        if isinstance(last, ToolMessage):
            return f"done: {last.result}"
        return "?"

    return Agent(name="a", model=ScriptedModel(respond=respond), tools=[ship])


async def main(schema: str, dsn: str, seconds: float) -> None:
    store = PostgresStore(dsn, schema=schema)
    async with Runtime(deadline_agent(seconds), store=store) as runtime:
        # Lead the timers first, so the deadline is this process's to fire.
        await eventually(lambda: runtime.timers.leading, what="leading the timer election")
        session = runtime.session("a", "s1")
        result = await session.result(session.start("ship o-1", turn_id="t-1"))
        assert result.request is not None
        print("parked", result.request.expires_at, flush=True)
        await asyncio.Event().wait()  # until SIGKILL


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
