"""Erasing a session (``session.erase()``, ``DELETE …/sessions/{id}``): nothing of it is
left in any table of the store but its tombstone, a running turn is cancelled first,
and only its owner (or whoever ``authorize`` lets) may ask."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from erasure_support import MARK, leave_marks, marked_agent, pg_rows_with, sqlite_rows_with
from eventually import eventually

import turnkit
from turnkit import ToolContext, ToolMessage, tool
from turnkit.server import Principal, create_app
from turnkit.stores import SqliteStore
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call


async def test_erasure_leaves_no_trace_in_any_sqlite_table(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    async with turnkit.Runtime(marked_agent(), store=SqliteStore(db)) as rt:
        session = rt.session("a", "s1")
        await leave_marks(session)
        await leave_marks(rt.session("a", "kept"))
        assert {t for t, _ in sqlite_rows_with(db, MARK)} >= {
            "turnkit_messages",
            "turnkit_steps",
            "turnkit_events",
            "turnkit_turns",
            "turnkit_archived_messages",
            "turnkit_archived_steps",
            "turnkit_archived_events",
            "turnkit_archived_turns",
        }
        await session.erase(by="alice")
        left = [row for row in sqlite_rows_with(db, MARK) if "'s1'" in row[1]]
        assert left == []
        assert sqlite_rows_with(db, MARK)  # the other session keeps its history
        assert await session.pending() is None and await session.generations() == []


async def test_erasure_leaves_no_trace_in_any_postgres_table(pg_dsn: str, pg_schema: str) -> None:
    from turnkit.stores import PostgresStore

    store = PostgresStore(pg_dsn, schema=pg_schema)
    async with turnkit.Runtime(marked_agent(), store=store) as rt:
        session = rt.session("a", "s1")
        await leave_marks(session)
        await leave_marks(rt.session("a", "kept"))
        assert len({t for t, _ in pg_rows_with(pg_dsn, pg_schema, MARK)}) >= 8
        await session.erase(by="alice")
        left = [row for row in pg_rows_with(pg_dsn, pg_schema, MARK) if "(s1," in row[1]]
        assert left == []
        assert pg_rows_with(pg_dsn, pg_schema, MARK)  # the other session keeps its history
        erased = (await store.session("s1").load()).erased
        assert erased is not None and erased.by == "alice"


async def test_a_running_turn_is_cancelled_before_the_erasure(
    open_runtime: Any,
) -> None:
    started, release = asyncio.Event(), asyncio.Event()

    @tool
    async def slow(ctx: ToolContext) -> str:
        """Wait until the test lets go."""
        started.set()
        await asyncio.wait_for(release.wait(), timeout=30)
        return "slow result"

    model = ScriptedModel(
        respond=lambda m: (
            "after"
            if isinstance(m[-1], ToolMessage)
            else ScriptedReply(tool_calls=[tool_call("slow")])
        )
    )
    rt = await open_runtime(turnkit.Agent(name="a", model=model, tools=[slow]))
    session = rt.session("a", "s1")
    turn = session.start("go")
    await asyncio.wait_for(started.wait(), timeout=30)
    erasing = asyncio.create_task(session.erase())
    store = rt.store.session("s1")

    async def cancelled() -> bool:
        record = await store.turn(turn)
        return record is not None and record.cancel_reason is not None

    await eventually(cancelled, what="the erasure cancelling the running turn")
    assert not erasing.done()  # it waits for the turn to stop at its boundary
    release.set()
    await asyncio.wait_for(erasing, timeout=30)
    result = await session.result(turn)
    assert result.status == "cancelled"
    snap = await store.load(turn)
    assert (snap.messages, snap.turn, snap.erased is not None) == ([], None, True)
    after = await session.result(session.start("go"))  # the session takes turns again
    assert after.status == "completed"


async def test_erase_refuses_a_bad_by(open_runtime: Any) -> None:
    rt = await open_runtime(marked_agent())
    for bad in ("", 3, "nul\x00"):
        with pytest.raises(turnkit.ConfigurationError, match="erase"):
            await rt.session("a", "s1").erase(by=bad)  # type: ignore[arg-type]


def by_header(request: Any) -> Principal | None:
    user = request.headers.get("x-user")
    return Principal(id=user) if user else None


async def test_delete_over_http_is_the_owners_alone(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "t.db")
    async with turnkit.Runtime(marked_agent(), store=store) as rt:
        app = create_app(rt, authenticate=by_header)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            session = rt.session("a", "s1")
            alice = {"x-user": "alice"}
            sent = await client.post(
                "/agents/a/sessions/s1/turns", json={"text": f"o {MARK}"}, headers=alice
            )
            assert sent.status_code in (200, 202), sent.text
            await eventually(session.pending, what="the turn parked")

            url = "/agents/a/sessions/s1"
            assert (await client.delete(url, headers={"x-user": "bob"})).status_code == 404
            assert (
                await client.delete("/agents/a/sessions/nope", headers=alice)
            ).status_code == 404
            assert (await client.delete(url)).status_code == 401
            assert len(await turnkit.stores.transcript(store.session("s1"))) > 0  # untouched

            gone = await client.delete(url, headers=alice)
            assert gone.status_code == 204, gone.text
            assert await turnkit.stores.transcript(store.session("s1")) == []
            erased = (await store.session("s1").load()).erased
            assert erased is not None and erased.by == "alice"
            read = await client.get(f"{url}/transcript", headers=alice)
            assert read.status_code == 200 and MARK not in read.text
            # The owner stays: the id does not pass to someone else.
            taken = await client.post(
                f"{url}/turns", json={"text": "mine"}, headers={"x-user": "bob"}
            )
            assert taken.status_code == 404
