"""SqliteStore specifics: schema versioning, indexes, pragmas and clear failures."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import turnkit
from turnkit.stores import SqliteStore
from turnkit.stores._sqlite_schema import MIGRATIONS, SCHEMA_VERSION, migrate
from turnkit.testing import ScriptedModel


async def test_open_creates_the_schema_at_the_current_version(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    store = SqliteStore(db)
    await store.open()
    await store.close()
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT version FROM turnkit_schema").fetchone() == (SCHEMA_VERSION,)
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_migrations_run_forward_from_any_version_and_only_once(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "m.db", isolation_level=None)
    extra = [*MIGRATIONS, ("ALTER TABLE turnkit_sessions ADD COLUMN note TEXT",)]
    assert migrate(conn) == SCHEMA_VERSION
    conn.execute(
        "INSERT INTO turnkit_sessions VALUES ('s', 'a', 'idle', 0, 0)"
    )  # data written at the old version survives the upgrade
    assert migrate(conn, extra) == SCHEMA_VERSION + 1
    assert migrate(conn, extra) == SCHEMA_VERSION + 1  # idempotent
    assert conn.execute("SELECT session_id, note FROM turnkit_sessions").fetchall() == [("s", None)]


def test_a_newer_schema_is_refused_not_misread(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "n.db", isolation_level=None)
    migrate(conn)
    conn.execute("UPDATE turnkit_schema SET version = 99")
    with pytest.raises(turnkit.StoreError, match="version 99, newer than this turnkit"):
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
    ],
)
def test_every_session_query_uses_an_index(tmp_path: Path, query: str) -> None:
    conn = sqlite3.connect(tmp_path / "q.db", isolation_level=None)
    migrate(conn)
    params = (1, 2, 3)[: query.count("?")]
    plan = [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {query}", params)]
    # Every step of the plan goes through an index (a partial index scan included).
    assert plan and all("USING" in step for step in plan), plan


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
    await session.commit(lambda tx: tx.append_message(0, first))

    def clash(tx: turnkit.stores.Transaction) -> None:
        tx.put_step("model:1", "t1", {"text": "x"})
        tx.append_message(0, turnkit.UserMessage(text="two", turn_id="t2"))

    with pytest.raises(turnkit.StoreError, match="session s1: commit failed: UNIQUE constraint"):
        await session.commit(clash)
    assert await session.messages() == [first]
    assert (await session.load("t1")).steps == {}
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
