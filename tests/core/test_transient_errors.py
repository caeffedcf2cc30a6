"""A local tool whose database work fails for a passing reason (a lock held too long
by someone else) is not answered with that error: the step fails unrecorded and a
redelivery runs the tool again. Only the tool's own exceptions become results.

Real databases throughout: a PostgreSQL row lock held by a second connection, and
a SQLite file whose write lock another connection holds.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

import turnkit
from turnkit import ToolContext, UserMessage, tool
from turnkit.stores import SqliteStore
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call


def one_tool_agent(fn: Any) -> turnkit.Agent:
    t = tool(fn)

    def respond(messages: Any) -> Any:
        if isinstance(messages[-1], UserMessage):
            return ScriptedReply(tool_calls=[tool_call(t.name)])
        return f"done: {messages[-1].result}"

    return turnkit.Agent(name="a", model=ScriptedModel(respond=respond), tools=[t])


async def deliver_twice(
    agent: turnkit.Agent, store: Any, release: Any, *, failure: str
) -> turnkit.AgentSession:
    """Deliver a turn whose tool meets the lock: the delivery fails with a store error
    naming ``failure`` and records nothing of the tool step; once ``release()`` ran,
    a redelivery completes with the tool's real answer."""
    async with turnkit.Runtime(agent, store=store) as rt:
        session = rt.session("a", "s1")
        tid = session.start("go")
        with pytest.raises(turnkit.StoreError, match=failure):
            await session.result(tid)
        assert [m.role for m in await session.messages()] == ["user", "assistant"]
        assert [e.type for e in await session.events()].count("action.completed") == 0
        assert (await session.turn_record(tid)).status == "running"  # type: ignore[union-attr]
        release()
        session.start("go", turn_id=tid)
        assert (await session.result(tid)).text == "done: updated"
        assert [m.role for m in await session.messages()] == [
            "user",
            "assistant",
            "tool",
            "assistant",
        ]
        return session


async def test_a_postgres_lock_timeout_fails_the_step_and_a_redelivery_runs_it(
    pg_dsn: str, pg_schema: str
) -> None:
    psycopg = pytest.importorskip("psycopg")
    from turnkit.stores import PostgresStore

    runs: list[str] = []

    def update(ctx: ToolContext) -> str:
        """Updates a row that another connection may hold locked."""
        runs.append("run")
        ctx.store.execute("SET LOCAL lock_timeout = '50ms'")
        ctx.store.execute("UPDATE accounts SET balance = balance + 1 WHERE id = ?", (1,))
        return "updated"

    holder = psycopg.connect(pg_dsn, autocommit=True)
    try:
        holder.execute(f'CREATE SCHEMA "{pg_schema}"')
        holder.execute(f'CREATE TABLE "{pg_schema}".accounts (id int PRIMARY KEY, balance int)')
        holder.execute(f'INSERT INTO "{pg_schema}".accounts VALUES (1, 0)')
        holder.execute("BEGIN")
        holder.execute(f'SELECT * FROM "{pg_schema}".accounts WHERE id = 1 FOR UPDATE')
        store = PostgresStore(pg_dsn, schema=pg_schema)
        await deliver_twice(
            one_tool_agent(update), store, lambda: holder.execute("COMMIT"), failure="lock"
        )
        row = holder.execute(f'SELECT balance FROM "{pg_schema}".accounts').fetchone()
        assert row == (1,) and runs == ["run", "run"]  # the failed run's update undone
    finally:
        holder.close()


async def test_a_locked_sqlite_database_fails_the_step_and_a_redelivery_runs_it(
    tmp_path: Path,
) -> None:
    """The tool writes a second database file through a connection of its own;
    another connection holds that file's write lock the first time."""
    ledger = tmp_path / "ledger.db"
    with sqlite3.connect(ledger) as setup:
        setup.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER)")
        setup.execute("INSERT INTO accounts VALUES (1, 0)")
    holder = sqlite3.connect(ledger, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")

    def update(ctx: ToolContext) -> str:
        """Updates the ledger, whose file another connection may hold locked."""
        with sqlite3.connect(ledger, timeout=0.05) as conn:
            conn.execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
        return "updated"

    store = SqliteStore(tmp_path / "turns.db")
    try:
        await deliver_twice(
            one_tool_agent(update), store, lambda: holder.execute("COMMIT"), failure="locked"
        )
    finally:
        holder.close()
    with sqlite3.connect(ledger) as check:
        assert check.execute("SELECT balance FROM accounts").fetchone() == (1,)


async def test_a_tool_that_wraps_the_lock_error_is_still_not_answered_with_it(
    tmp_path: Path,
) -> None:
    ledger = tmp_path / "ledger.db"
    sqlite3.connect(ledger).close()
    holder = sqlite3.connect(ledger, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")

    class LedgerError(Exception):
        pass

    def update() -> str:
        """Wraps whatever the ledger raises in an error of its own (and takes no
        context: the failure is told apart all the same)."""
        try:
            with sqlite3.connect(ledger, timeout=0.05) as conn:
                conn.execute("CREATE TABLE IF NOT EXISTS t (x)")
        except sqlite3.Error as exc:
            raise LedgerError("the ledger failed") from exc
        return "updated"

    try:
        await deliver_twice(
            one_tool_agent(update),
            SqliteStore(tmp_path / "turns.db"),
            lambda: holder.execute("COMMIT"),
            failure="LedgerError: the ledger failed",
        )
    finally:
        holder.close()


async def test_the_tools_own_exceptions_are_still_its_results(make_store: Any) -> None:
    """Database errors that are not passing ones (a constraint, bad SQL) and plain
    exceptions stay the tool's answer, on every store."""

    def broken(ctx: ToolContext) -> str:
        """Fails with a database error of its own making, or a plain one."""
        if ctx.store.unwrap() is not None:
            ctx.store.execute("SELECT no_such_column FROM no_such_table")
        raise ValueError("not a number")

    async with turnkit.Runtime(one_tool_agent(broken), store=make_store()) as rt:
        result = await rt.session("a", "s1").turn("go")
    assert result.startswith("done: {'error':"), result
