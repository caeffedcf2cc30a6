"""Child process for the subagent crash test (not collected by pytest).

Usage::

    python subagent_child.py STORE run CRASH_AT    # SIGKILL before commit CRASH_AT
    python subagent_child.py STORE recover         # recover, print a JSON summary

``STORE`` is a SQLite path or ``postgres:SCHEMA:DSN``. The parent agent ``boss``
hands a task to the ``researcher`` subagent, whose local tool writes one app row
through the step transaction; commits are counted across both sessions, so the
kill lands anywhere in the parent's or the child's turn.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from turnkit import (
    Agent,
    Runtime,
    ToolContext,
    ToolMessage,
    TriggerMessage,
    UserMessage,
    subagent,
    tool,
)
from turnkit.stores import SqliteStore, Store
from turnkit.testing import CrashingStore, ScriptedModel, ScriptedReply, tool_call


@tool
def note(text: str, ctx: ToolContext) -> dict[str, Any]:
    """Write a note (an app row committed with the step)."""
    ctx.store.execute("CREATE TABLE IF NOT EXISTS notes (turn_id TEXT, body TEXT)")
    ctx.store.execute("INSERT INTO notes (turn_id, body) VALUES (?, ?)", (ctx.turn_id, text))
    return {"noted": text}


def researcher_reply(messages: Any) -> Any:
    last = messages[-1]
    if isinstance(last, TriggerMessage):
        return ScriptedReply(text="Noting.", tool_calls=[tool_call("note", {"text": last.text})])
    if isinstance(last, ToolMessage):
        return f"researched: {last.result['noted']}"
    return "?"


def boss_reply(messages: Any) -> Any:
    last = messages[-1]
    if isinstance(last, UserMessage):
        return ScriptedReply(tool_calls=[tool_call("researcher", {"task": "prices of widgets"})])
    if isinstance(last, ToolMessage):
        return f"boss says: {last.result.get('text', last.result)}"
    return "?"


def agents() -> list[Agent]:
    return [
        Agent(
            name="boss",
            model=ScriptedModel(respond=boss_reply),
            tools=[subagent("researcher", description="Researches a question.")],
        ),
        Agent(name="researcher", model=ScriptedModel(respond=researcher_reply), tools=[note]),
    ]


def open_store(spec: str) -> Store:
    if spec.startswith("postgres:"):
        from turnkit.stores import PostgresStore

        _, schema, dsn = spec.split(":", 2)
        return PostgresStore(dsn, schema=schema)
    return SqliteStore(spec)


async def main(spec: str, mode: str, crash_at: int | None) -> None:
    store = open_store(spec)
    if mode == "run":
        store = CrashingStore(store, crash_at=crash_at, when="before")
    async with Runtime(agents(), store=store) as runtime:
        if mode == "run":
            session = runtime.session("boss", "s1")
            result = await session.result(
                await session.submit("research widgets", turn_id="parent-1")
            )
            print(json.dumps({"crashed": False, "status": result.status}))
            return
        await runtime.recover()
        parent = runtime.session("boss", "s1")
        started = parent.start("research widgets", turn_id="parent-1")  # a redelivery
        result = await parent.result(started)
        children = [s for s in await runtime.sessions() if s.agent == "researcher"]
        child_turns: set[str] = set()
        for info in children:
            for event in await runtime.session("researcher", info.session_id).events():
                child_turns.add(event.turn_id)
        print(
            json.dumps(
                {
                    "status": result.status,
                    "text": result.text,
                    "child_sessions": len(children),
                    "child_turns": sorted(child_turns),
                }
            )
        )


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[2] not in ("run", "recover"):
        raise SystemExit(__doc__)
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else None))
