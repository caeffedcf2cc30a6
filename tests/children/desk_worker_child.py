"""The worker process of the ``RuntimeClient`` tests (not collected by pytest).

Usage::

    python desk_worker_child.py STORE

``STORE`` is a SQLite file or ``postgresql://…#schema``. It runs the ``desk``
agent's turns that another process (a ``RuntimeClient``) stores there. On
PostgreSQL it is a ``Worker``, claiming each turn as it is stored; SQLite has no
claim queue, so there it delivers what the store holds for a worker (queued and
left-running turns, answered ones, parked ones whose cancellation is recorded)
each time a line ``sweep`` reaches its stdin, then answers ``swept``. Each turn
that ends here, or parks, is printed as ``ran TURN_ID EVENT``. It prints
``ready`` once open and stops at the end of its input.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from shared_session_child import open_store

from turnkit import (
    Agent,
    Runtime,
    ToolContext,
    ToolMessage,
    TurnEvent,
    UserMessage,
    Worker,
    tool,
)
from turnkit.stores import InboxStore, TurnQueue
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call

ENDINGS = ("turn.completed", "turn.cancelled", "turn.failed", "input.requested")


@tool
async def ask(ctx: ToolContext) -> str:
    """Asks the desk's person to confirm."""
    return str(await ctx.request_input("ok", "Confirm?"))


def respond(messages: Any) -> Any:
    last = messages[-1]
    if isinstance(last, UserMessage) and last.text.startswith("ask"):
        return ScriptedReply(tool_calls=[tool_call("ask")])
    if isinstance(last, ToolMessage):
        return f"answered: {last.result}"
    return f"echo: {last.text}"


def desk_agent() -> Agent:
    """The agent both processes hold: the client stores its turns, this one runs them."""
    return Agent(name="desk", model=ScriptedModel(respond=respond), tools=[ask])


def report(event: TurnEvent) -> None:
    if event.type in ENDINGS:
        print("ran", event.turn_id, event.type, flush=True)


async def sweep(runtime: Runtime) -> None:
    """Deliver here what a worker would claim from a store without a claim queue."""
    store = runtime.store
    records = list(await store.unfinished_turns())
    if isinstance(store, InboxStore):
        parked = await store.parked_turns(limit=1000)
        records += [r for r in parked if r.cancel_reason is not None]
    waits = []
    for record in records:
        session = runtime.session(record.agent, record.session_id)
        waits.append(session.result(session.run_stored(record)))
    await asyncio.gather(*waits)


async def main(spec: str) -> None:
    async with Runtime(desk_agent(), store=open_store(spec)) as runtime:
        runtime.sink.subscribe(report)
        print("ready", flush=True)
        if isinstance(runtime.store, TurnQueue):
            worker = Worker(runtime, poll=0.2)
            working = asyncio.create_task(worker.run())
            await asyncio.to_thread(sys.stdin.read)  # until the test closes our input
            worker.stop()
            await working
            return
        while line := await asyncio.to_thread(sys.stdin.readline):
            if line.strip() == "sweep":
                await sweep(runtime)
                print("swept", flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    asyncio.run(main(sys.argv[1]))
