"""Child process for the durable-cancellation test (not collected by pytest).

Usage::

    python cancel_child.py STORE LOG

``STORE`` is a SQLite path or ``postgres:SCHEMA:DSN``. Starts turn ``t-1`` whose
remote tool logs one line to ``LOG``, cancels the session (which records the
cancellation in the store) and then SIGKILLs this process before the turn can
reach its next checkpoint boundary.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from turnkit import Agent, Runtime, ToolContext, UserMessage, tool
from turnkit.stores import SqliteStore, Store
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call


def open_store(spec: str) -> Store:
    if spec.startswith("postgres:"):
        from turnkit.stores import PostgresStore

        _, schema, dsn = spec.split(":", 2)
        return PostgresStore(dsn, schema=schema)
    return SqliteStore(spec)


async def main(spec: str, log: str) -> None:
    running: list[Runtime] = []

    @tool
    async def work(ctx: ToolContext) -> str:
        """Logs that it ran, asks for the turn to be cancelled, then dies."""
        with open(log, "a") as f:
            f.write("ran\n")
        await running[0].session("a", "s1").cancel()
        os.kill(os.getpid(), signal.SIGKILL)
        return "unreachable"

    def respond(messages: object) -> object:
        last = messages[-1]  # type: ignore[index]
        if isinstance(last, UserMessage):
            return ScriptedReply(tool_calls=[tool_call("work")])
        return "unexpected second model call"

    agent = Agent(name="a", model=ScriptedModel(respond=respond), tools=[work])
    async with Runtime(agent, store=open_store(spec)) as runtime:
        running.append(runtime)
        session = runtime.session("a", "s1")
        await session.result(session.start("go", turn_id="t-1"))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    asyncio.run(main(sys.argv[1], sys.argv[2]))
