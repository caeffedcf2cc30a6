"""SqliteStore specifics: schema versioning, indexes, pragmas and clear failures."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from eventually import eventually

import turnkit
from turnkit.stores import AppendMessage, PutStep, SqliteStore, all_sessions, transcript
from turnkit.stores import _sql as sql_text
from turnkit.stores._sqlite_schema import MIGRATIONS, SCHEMA_VERSION, migrate
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call


async def test_open_creates_the_schema_at_the_current_version(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    store = SqliteStore(db)
    await store.open()
    await store.close()
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT version FROM turnkit_schema").fetchone() == (SCHEMA_VERSION,)
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)


async def test_each_file_gets_its_own_identity_and_keeps_it(tmp_path: Path) -> None:
    ids = []
    for name in ("a.db", "b.db", "a.db"):
        store = SqliteStore(tmp_path / name)
        await store.open()
        ids.append(store.store_id)
        await store.close()
    assert ids[0] == ids[2] != ids[1]
    assert len(ids[0]) == 32
    with pytest.raises(turnkit.StoreError, match="not open"):
        _ = SqliteStore(tmp_path / "a.db").store_id


def test_migrations_run_forward_from_any_version_and_only_once(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "m.db", isolation_level=None)
    extra = [*MIGRATIONS, ("ALTER TABLE turnkit_sessions ADD COLUMN note TEXT",)]
    assert migrate(conn) == SCHEMA_VERSION
    conn.execute(
        "INSERT INTO turnkit_sessions (session_id, agent, status, created_at, updated_at) "
        "VALUES ('s', 'a', 'idle', 0, 0)"
    )  # data written at the old version survives the upgrade
    assert migrate(conn, extra) == SCHEMA_VERSION + 1
    assert migrate(conn, extra) == SCHEMA_VERSION + 1  # idempotent
    assert conn.execute("SELECT session_id, note FROM turnkit_sessions").fetchall() == [("s", None)]


async def test_sessions_from_before_owners_have_none_and_stay_usable(tmp_path: Path) -> None:
    db = tmp_path / "v5.db"
    conn = sqlite3.connect(db, isolation_level=None)
    assert migrate(conn, MIGRATIONS[:5]) == 5  # a database written before owners were kept
    conn.execute(
        "INSERT INTO turnkit_sessions (session_id, agent, status, created_at, updated_at) "
        "VALUES ('old', 'a', 'idle', 0, 0)"
    )
    conn.close()
    store = SqliteStore(db)
    await store.open()
    try:
        assert [(i.session_id, i.owner) for i in await all_sessions(store)] == [("old", None)]
        assert (await store.session("old").load()).owner is None
        assert await store.session_page(limit=5, owner="alice") == []
    finally:
        await store.close()


def test_a_newer_schema_is_used_only_if_it_says_this_turnkit_may(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "n.db", isolation_level=None)
    migrate(conn)
    # A newer turnkit's additive migrations: it records that this one may go on.
    conn.execute("UPDATE turnkit_schema SET version = 99")
    assert migrate(conn) == 99
    # One this turnkit cannot live with: refused, not misread.
    conn.execute("UPDATE turnkit_schema SET readable_from = 98")
    with pytest.raises(turnkit.StoreError, match="version 99, newer than this turnkit"):
        migrate(conn)
    conn.execute("UPDATE turnkit_schema SET readable_from = NULL")  # a release before floors
    with pytest.raises(turnkit.StoreError, match="not readable by it"):
        migrate(conn)


def test_a_failed_migration_leaves_the_previous_version(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "f.db", isolation_level=None)
    migrate(conn)
    broken = [*MIGRATIONS, ("CREATE TABLE fine (x INTEGER)", "THIS IS NOT SQL")]
    with pytest.raises(sqlite3.OperationalError):
        migrate(conn, broken)
    assert conn.execute("SELECT version FROM turnkit_schema").fetchone() == (SCHEMA_VERSION,)
    assert conn.execute("SELECT name FROM sqlite_master WHERE name = 'fine'").fetchall() == []


@pytest.mark.parametrize(
    "query",
    [
        "SELECT body FROM turnkit_messages WHERE session_id = ? ORDER BY idx",
        "SELECT step_id, result FROM turnkit_steps WHERE session_id = ? AND turn_id = ?",
        "SELECT max(seq) FROM turnkit_events WHERE session_id = ?",
        "SELECT body FROM turnkit_events WHERE session_id = ? AND turn_id = ? AND seq > ? "
        "ORDER BY seq",
        "SELECT status FROM turnkit_turns WHERE session_id = ? AND turn_id = ?",
        "SELECT turn_id FROM turnkit_turns WHERE status = 'running' ORDER BY created_at",
        "SELECT seq FROM turnkit_archived_events WHERE session_id = ? "
        "ORDER BY generation DESC, seq DESC LIMIT 1",
        "SELECT session_id FROM turnkit_sessions WHERE agent = ? AND (updated_at < ? "
        "OR (updated_at = ? AND session_id > 'x')) ORDER BY updated_at DESC, session_id LIMIT 3",
    ],
)
def test_every_session_query_uses_an_index(tmp_path: Path, query: str) -> None:
    conn = sqlite3.connect(tmp_path / "q.db", isolation_level=None)
    migrate(conn)
    params = (1, 2, 3)[: query.count("?")]
    plan = [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {query}", params)]
    # Every step of the plan goes through an index (a partial index scan included).
    assert plan and all("USING" in step for step in plan), plan


@pytest.mark.parametrize(
    ("query", "index"),
    [
        (f"SELECT {sql_text.SQLITE_ORDER}", "turnkit_turns_by_session"),
        (sql_text.UNFINISHED, "turnkit_turns_unfinished"),
    ],
)
def test_what_a_submission_reads_goes_by_the_sessions_turns_in_order(
    tmp_path: Path, query: str, index: str
) -> None:
    """A submission reads its session's latest turn (the new one goes after it) and
    its unfinished turns: through an index of the session's turns by time, a few
    entries, not the primary key's range of every turn the session ever had."""
    conn = sqlite3.connect(tmp_path / "q.db", isolation_level=None)
    migrate(conn)
    params = ("t", "s", "s")[-query.count("?") :]
    plan = [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {query}", params)]
    assert any(index in step for step in plan), plan


async def test_clear_errors_for_unusable_files(tmp_path: Path) -> None:
    with pytest.raises(turnkit.StoreError, match="does not exist"):
        await SqliteStore(tmp_path / "missing" / "x.db").open()
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a database" * 100)
    with pytest.raises(turnkit.StoreError, match="cannot open"):
        await SqliteStore(junk).open()
    with pytest.raises(turnkit.StoreError, match="not open"):
        SqliteStore(tmp_path / "closed.db").connection  # noqa: B018


async def test_sessions_share_one_file_but_never_each_others_rows(tmp_path: Path) -> None:
    db = tmp_path / "shared.db"
    agent = turnkit.Agent(name="a", model=ScriptedModel(respond=lambda m: m[-1].text.upper()))
    async with turnkit.Runtime(agent, store=SqliteStore(db)) as rt:
        await rt.session("a", "s1").turn("one")
        await rt.session("a", "s2").turn("two")
        s1 = [getattr(m, "text", "") for m in await rt.session("a", "s1").messages()]
        s2 = [getattr(m, "text", "") for m in await rt.session("a", "s2").messages()]
    assert s1 == ["one", "ONE"] and s2 == ["two", "TWO"]


async def test_a_taken_transcript_position_is_a_store_error_and_changes_nothing(
    tmp_path: Path,
) -> None:
    store = SqliteStore(tmp_path / "dup.db")
    await store.open()
    session = store.session("s1")
    first = turnkit.UserMessage(text="one", turn_id="t1")
    await session.commit([AppendMessage(0, first)])

    clash = [
        PutStep("model:1", "t1", {"text": "x"}),
        AppendMessage(0, turnkit.UserMessage(text="two", turn_id="t2")),
    ]
    with pytest.raises(turnkit.StoreError, match="session s1: commit failed: UNIQUE constraint"):
        await session.commit(clash)
    assert await transcript(session) == [first]
    assert len((await session.load("t1")).steps) == 0
    await store.close()


async def test_wal_checkpoints_run_in_the_background(tmp_path: Path) -> None:
    from turnkit.stores.sqlite import CHECKPOINT_EVERY

    db = tmp_path / "wal.db"
    agent = turnkit.Agent(name="a", model=ScriptedModel(respond=lambda m: "ok"))
    store = SqliteStore(db)
    async with turnkit.Runtime(agent, store=store) as rt:
        session = rt.session("a", "s1")
        for i in range(CHECKPOINT_EVERY):  # two commits per turn
            await session.turn(f"m{i}")
    assert store.checkpoints >= 1
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM turnkit_turns").fetchone() == (CHECKPOINT_EVERY,)


async def test_a_background_checkpoint_rewinds_a_long_wal(tmp_path: Path) -> None:
    from turnkit.stores.sqlite import CHECKPOINT_BACKSTOP_PAGES, CHECKPOINT_EVERY, RESTART_FRAMES

    db = tmp_path / "wal.db"
    agent = turnkit.Agent(name="a", model=ScriptedModel(respond=lambda m: "ok"))
    store = SqliteStore(db)
    # Three commits a turn (its opening, its reply, its end): the first background
    # checkpoint starts during the last of these turns.
    turns = -(-CHECKPOINT_EVERY // 3)
    # Each opening's text is written eight times (the message, turn.started, and the
    # turn row's opening and inbound event at its insert and at each of its two moves:
    # a row is written whole), so the first background checkpoint finds more than
    # RESTART_FRAMES pages: about midway to SQLite's own backstop, which would copy
    # them first.
    pages = (RESTART_FRAMES + CHECKPOINT_BACKSTOP_PAGES) // 2
    assert pages > RESTART_FRAMES
    text = "x" * (4096 * pages // (8 * turns))
    async with turnkit.Runtime(agent, store=store) as rt:
        session = rt.session("a", "s1")
        for i in range(turns):
            await session.turn(f"{i} {text}")
        # Wait for it here: if commits went on meanwhile on a loaded machine, SQLite's
        # own backstop could copy the WAL first, and there would be nothing to rewind.
        await eventually(lambda: store.checkpoints >= 1, what="a background checkpoint")
    assert store.restarts >= 1
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM turnkit_turns").fetchone() == (turns,)


def _one_tool_agent(fn: Any) -> turnkit.Agent:
    t = turnkit.tool(fn)
    model = ScriptedModel([ScriptedReply(tool_calls=[tool_call(t.name)]), "unreachable"])
    return turnkit.Agent(name="a", model=model, tools=[t])


async def _run_one(db: Path, agent: turnkit.Agent) -> turnkit.TurnResult:
    async with turnkit.Runtime(agent, store=SqliteStore(db)) as rt:
        session = rt.session("a", "s1")
        return await session.result(session.start("go"))


async def test_a_tool_that_commits_the_step_transaction_fails_the_turn(tmp_path: Path) -> None:
    def sneaky_commit(ctx: turnkit.ToolContext) -> str:
        """Commits on the raw handle."""
        ctx.store.execute("CREATE TABLE IF NOT EXISTS app (x INTEGER)")
        ctx.store.unwrap().commit()
        return "done"

    result = await _run_one(tmp_path / "c.db", _one_tool_agent(sneaky_commit))
    assert result.status == "failed"
    assert "ended the step's transaction" in (result.error or "")


async def test_transaction_control_through_execute_is_refused(tmp_path: Path) -> None:
    def control(ctx: turnkit.ToolContext) -> str:
        """Tries to commit through execute."""
        ctx.store.execute("CREATE TABLE app (x INTEGER)")
        ctx.store.execute("commit")
        return "done"

    db = tmp_path / "r.db"
    result = await _run_one(db, _one_tool_agent(control))
    assert result.status == "failed" and "refused COMMIT" in (result.error or "")
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT name FROM sqlite_master WHERE name = 'app'").fetchall() == []


async def test_a_statement_that_aborts_the_transaction_fails_the_turn_cleanly(
    tmp_path: Path,
) -> None:
    def aborting(ctx: turnkit.ToolContext) -> str:
        """Swallows an error that rolled the whole transaction back."""
        conn = ctx.store.unwrap()
        conn.execute("CREATE TABLE IF NOT EXISTS u (x INTEGER UNIQUE ON CONFLICT ROLLBACK)")
        conn.execute("INSERT INTO u VALUES (1)")
        with contextlib.suppress(sqlite3.IntegrityError):
            conn.execute("INSERT INTO u VALUES (1)")
        return "pretending all is well"

    db = tmp_path / "a.db"
    result = await _run_one(db, _one_tool_agent(aborting))
    assert result.status == "failed" and "ended the step's transaction" in (result.error or "")
    async with turnkit.Runtime(_one_tool_agent(aborting), store=SqliteStore(db)) as rt:
        assert await rt.session("a", "s1").status() == "idle"  # not stuck running


async def test_a_locked_database_is_waited_for_without_blocking_the_loop(tmp_path: Path) -> None:
    db = tmp_path / "lock.db"
    agent = turnkit.Agent(name="a", model=ScriptedModel(respond=lambda m: "ok"))
    async with turnkit.Runtime(agent, store=SqliteStore(db)) as rt:
        other = sqlite3.connect(db, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:  # not a wait: a ticker, counting the turns of a loop that must turn
                ticks += 1
                await asyncio.sleep(0.01)  # not a wait: one tick

        ticking = asyncio.create_task(ticker())
        asyncio.get_running_loop().call_later(0.3, other.execute, "COMMIT")
        assert await rt.session("a", "s1").turn("hi") == "ok"
        ticking.cancel()
        other.close()
    assert ticks > 5  # the loop kept running while the turn waited for the lock


async def test_a_lock_held_too_long_is_a_store_error_and_the_turn_stays_open(
    tmp_path: Path,
) -> None:
    db = tmp_path / "held.db"
    agent = turnkit.Agent(name="a", model=ScriptedModel(respond=lambda m: "ok"))
    async with turnkit.Runtime(agent, store=SqliteStore(db, busy_timeout=0.2)) as rt:
        session = rt.session("a", "s1")
        await session.turn("first")  # the schema exists; the next turn's opening will wait
        other = sqlite3.connect(db, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        tid = session.start("second")
        with pytest.raises(turnkit.StoreError, match="stayed locked by another connection"):
            await session.result(tid)
        other.execute("COMMIT")
        other.close()
        # Nothing of the second turn committed (its opening could not), so start it again.
        assert [m.role for m in await session.messages()] == ["user", "assistant"]
        assert await session.turn("second") == "ok"


async def test_a_tool_step_that_cannot_begin_fails_the_delivery_even_if_the_tool_catches_it(
    tmp_path: Path,
) -> None:
    db = tmp_path / "tool-lock.db"
    runs: list[str] = []

    def stubborn(ctx: turnkit.ToolContext) -> str:
        """Writes through ctx.store and swallows the failure the first time."""
        if not runs:
            other = sqlite3.connect(db, isolation_level=None)
            other.execute("BEGIN IMMEDIATE")  # someone else holds the write lock
            try:
                ctx.store.execute("CREATE TABLE app (x INTEGER)")
            except turnkit.StoreError:
                runs.append("swallowed")
                return "pretending all is well"
            finally:
                other.execute("ROLLBACK")
                other.close()
        ctx.store.execute("CREATE TABLE app (x INTEGER)")
        runs.append("wrote")
        return "written"

    t = turnkit.tool(stubborn)
    model = ScriptedModel([ScriptedReply(tool_calls=[tool_call(t.name)]), "done"])
    agent = turnkit.Agent(name="a", model=model, tools=[t])
    async with turnkit.Runtime(agent, store=SqliteStore(db, busy_timeout=0.2)) as rt:
        session = rt.session("a", "s1")
        with pytest.raises(turnkit.StoreError, match="cannot begin the tool's step"):
            await session.result(session.start("go"))
        # The step did not land as if the tool had succeeded: the turn stays open.
        assert not [m for m in await session.messages() if m.role == "tool"]
        [result] = await rt.recover()
        assert result.status == "completed" and runs == ["swallowed", "wrote"]
        tools = [m for m in await session.messages() if isinstance(m, turnkit.ToolMessage)]
        assert [m.result for m in tools] == ["written"]


def test_tool_threads_must_be_a_positive_count(tmp_path: Path) -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(turnkit.ConfigurationError, match="tool_threads >= 1"):
            SqliteStore(tmp_path / "x.db", tool_threads=bad)  # type: ignore[arg-type]


async def test_unreadable_rows_are_reported_as_store_errors(tmp_path: Path) -> None:
    db = tmp_path / "bad.db"
    agent = turnkit.Agent(name="a", model=ScriptedModel(respond=lambda m: "ok"))
    async with turnkit.Runtime(agent, store=SqliteStore(db)) as rt:
        await rt.session("a", "s1").turn("hi")
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE turnkit_messages SET body = '{not json' WHERE idx = 1")
    async with turnkit.Runtime(agent, store=SqliteStore(db)) as rt:
        with pytest.raises(
            turnkit.StoreError, match="session s1 holds data that is not valid JSON"
        ):
            await rt.session("a", "s1").messages()


def test_the_lock_files_mark_shows_a_change_another_process_wrote(tmp_path: Path) -> None:
    """The change mark a delivery reads at every step boundary (through a mapping of
    the lock file) shows what another process wrote with its own descriptor, and a
    new file reads as no change until a signal."""
    from turnkit.stores._host_locks import HostSessionLocks

    path = str(tmp_path / "x.db-locks")
    locks = HostSessionLocks(path, timeout=1.0)
    locks.open()
    try:
        before = locks.mark()
        assert before == bytes(8)
        other = os.open(path, os.O_RDWR)  # as another process writes it
        try:
            os.pwrite(other, b"12345678", 0)
        finally:
            os.close(other)
        assert locks.mark() == b"12345678"
        locks.signal()
        assert locks.mark() not in (b"12345678", before)
    finally:
        locks.close()
