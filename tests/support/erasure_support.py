"""Marked history and the search for the mark in every table of a store: what the
tests of erasure, of blobs and of encryption at rest share to show that a session's
text is gone from (or never stored plainly in) the database."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

import turnkit
from turnkit import ToolContext, ToolMessage, UserMessage, tool
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call

MARK = "zq-erase-marker-41"


def marked_agent() -> turnkit.Agent:
    """An agent that leaves ``MARK`` everywhere a session keeps text: the user's
    message, the tool's arguments and result, the question a person answers, the
    answer, the model's reply and the events."""

    @tool
    async def refund(order: str, ctx: ToolContext) -> dict[str, Any]:
        """Refund an order once a person approves it."""
        answer = await ctx.request_input("ok", f"Refund {order}?", schema={"type": "string"})
        return {"order": order, "note": answer}

    def respond(messages: Any) -> Any:
        last = messages[-1]
        if isinstance(last, UserMessage):
            return ScriptedReply(tool_calls=[tool_call("refund", {"order": last.text})])
        if isinstance(last, ToolMessage):
            return f"refunded {last.result}"
        return "?"

    return turnkit.Agent(name="a", model=ScriptedModel(respond=respond), tools=[refund])


async def leave_marks(session: turnkit.AgentSession) -> None:
    """Two generations of marked history: one archived by a reset, one live."""
    for _ in range(2):
        parked = await session.result(session.start(f"order {MARK}"))
        assert parked.status == "suspended"
        done = await session.result(await session.resume(parked.turn_id, "ok", f"yes {MARK}"))
        assert done.status == "completed" and MARK in (done.text or "")
        if not await session.generations():
            await session.reset()
    await session.result(session.start(f"again {MARK}"))  # parked at the end


def sqlite_rows_with(db: Path, marker: str) -> list[tuple[str, str]]:
    """Every row of every table of the SQLite file whose text holds ``marker``."""
    found: list[tuple[str, str]] = []
    with sqlite3.connect(db) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            for row in conn.execute(f'SELECT * FROM "{table}"'):
                if marker in repr(row):
                    found.append((table, repr(row)))
    return found


def pg_rows_with(dsn: str, schema: str, marker: str) -> list[tuple[str, str]]:
    """Every row of every table of the PostgreSQL schema whose text holds ``marker``."""
    psycopg = pytest.importorskip("psycopg")
    from psycopg import sql

    found: list[tuple[str, str]] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
                (schema,),
            )
        ]
        assert "turnkit_turns" in tables
        for table in tables:
            query = sql.SQL("SELECT t::text FROM {}.{} t").format(
                sql.Identifier(schema), sql.Identifier(table)
            )
            for (text,) in conn.execute(query):
                if marker in text:
                    found.append((table, text))
    return found
