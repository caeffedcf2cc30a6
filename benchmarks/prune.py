"""How fast retention deletes idle sessions, and the longest lock it holds.

Run from the repo root::

    .venv/bin/python benchmarks/prune.py                          # 100,000 sessions, SQLite
    .venv/bin/python benchmarks/prune.py --stores sqlite postgres --sessions 20000

Each run fills a fresh store with ``--sessions`` finished sessions, written with SQL
in bulk (a completed turn, two messages, two memoized steps and two events each,
bodies of a few hundred bytes, as a one-tool turn leaves them) and ``--archived``
of them also with one archived generation, then runs ``turnkit.Retention``'s
``prune`` at a time when all of it has aged out. It reports the sessions and rows
deleted per second, the whole prune's time, and the longest one session's writer
lock was held (each session is its own commit, so no lock spans two sessions).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _floor import drop_schema

import turnkit
from turnkit import Retention
from turnkit.stores import SqliteStore, Store
from turnkit.testing import ScriptedModel

BODY = '{"role": "assistant", "text": "' + "x" * 240 + '"}'
#: Rows a session holds besides its own: a turn, two messages, two steps, two events.
ROWS_PER_SESSION = 7
ARCHIVED_ROWS = 4  # an archived message, step, event and turn
#: The statements that fill one session: the session id, then (where a row has a
#: body) the body, both bound parameters.
FILL = (
    "INSERT INTO turnkit_sessions (session_id, agent, status, created_at, updated_at) "
    "VALUES (?, 'a', 'idle', 1.0, 1.0)",
    "INSERT INTO turnkit_turns (session_id, turn_id, agent, status, opening, created_at, "
    "finished_at) VALUES (?, 't1', 'a', 'completed', ?, 1.0, 1.0)",
    "INSERT INTO turnkit_messages (session_id, idx, turn_id, body) VALUES (?, 0, 't1', ?)",
    "INSERT INTO turnkit_messages (session_id, idx, turn_id, body) VALUES (?, 1, 't1', ?)",
    "INSERT INTO turnkit_steps (session_id, turn_id, step_id, result) VALUES (?, 't1', 'm1', ?)",
    "INSERT INTO turnkit_steps (session_id, turn_id, step_id, result) VALUES (?, 't1', 'm2', ?)",
    "INSERT INTO turnkit_events (session_id, seq, turn_id, body) VALUES (?, 1, 't1', ?)",
    "INSERT INTO turnkit_events (session_id, seq, turn_id, body) VALUES (?, 2, 't1', ?)",
)
ARCHIVE = (
    "INSERT INTO turnkit_generations (session_id, generation, archived_at) VALUES (?, 0, 1.0)",
    "INSERT INTO turnkit_archived_messages (session_id, generation, idx, turn_id, body) "
    "VALUES (?, 0, 0, 't0', ?)",
    "INSERT INTO turnkit_archived_steps (session_id, generation, turn_id, step_id, result) "
    "VALUES (?, 0, 't0', 'm1', ?)",
    "INSERT INTO turnkit_archived_events (session_id, generation, seq, turn_id, body) "
    "VALUES (?, 0, 0, 't0', ?)",
    "INSERT INTO turnkit_archived_turns (session_id, generation, turn_id, agent, status, "
    "opening, created_at) VALUES (?, 0, 't0', 'a', 'completed', ?, 1.0)",
)


def _params(statement: str, session_id: str) -> tuple[str, ...]:
    return (session_id, BODY) if statement.count("?") == 2 else (session_id,)


def fill_sqlite(path: Path, sessions: int, archived: int) -> None:
    with sqlite3.connect(path) as conn:
        for statements, count in ((FILL, sessions), (ARCHIVE, archived)):
            for statement in statements:
                conn.executemany(statement, (_params(statement, f"s{i}") for i in range(count)))


def fill_postgres(dsn: str, schema: str, sessions: int, archived: int) -> None:
    import psycopg

    from turnkit.stores.postgres import qmark_to_pyformat

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        for statements, count in ((FILL, sessions), (ARCHIVE, archived)):
            for statement in statements:
                # The session ids come from generate_series, the body stays a parameter.
                select = qmark_to_pyformat(statement).replace("VALUES (%s,", "SELECT 's' || i,")
                select = select.rstrip(")") + " FROM generate_series(0, %s) AS i"
                body = (BODY,) if statement.count("?") == 2 else ()
                conn.execute(select, (*body, count - 1))
        conn.execute("ANALYZE")


async def run_one(kind: str, store: Store, sessions: int, archived: int) -> None:
    keep = Retention(archives_for=1.0, sessions_idle_for=1.0, batch=500)
    agent = turnkit.Agent(name="a", model=ScriptedModel(respond=lambda _: "x"))
    async with turnkit.Runtime(agent, store=store, retention=keep) as runtime:
        started = time.perf_counter()
        report = await runtime.prune(now=time.time())
        elapsed = time.perf_counter() - started
    rows = sessions * (ROWS_PER_SESSION + 1) + archived * (ARCHIVED_ROWS + 1)
    print(
        f"{kind:9} sessions {report.sessions:>7,} generations {report.generations:>7,} "
        f"in {elapsed:6.1f} s: {report.sessions / elapsed:8,.0f} sessions/s, "
        f"{rows / elapsed:9,.0f} rows/s; longest lock {report.longest_hold * 1000:.2f} ms"
    )
    assert report.sessions == sessions and report.generations == archived, report


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--archived", type=int, default=None, help="default: a tenth")
    parser.add_argument("--stores", nargs="+", default=["sqlite"], choices=["sqlite", "postgres"])
    parser.add_argument(
        "--dsn",
        default=os.environ.get("TURNKIT_BENCH_POSTGRES_DSN", "postgresql://127.0.0.1:5432/test"),
    )
    args = parser.parse_args(argv)
    archived = args.sessions // 10 if args.archived is None else args.archived
    for kind in args.stores:
        if kind == "sqlite":
            with tempfile.TemporaryDirectory() as folder:
                path = Path(folder) / "prune.db"
                asyncio.run(_create(SqliteStore(path)))
                fill_sqlite(path, args.sessions, archived)
                asyncio.run(run_one(kind, SqliteStore(path), args.sessions, archived))
        else:
            from turnkit.stores import PostgresStore

            schema = f"turnkit_prune_{uuid.uuid4().hex[:8]}"
            try:
                asyncio.run(_create(PostgresStore(args.dsn, schema=schema)))
                fill_postgres(args.dsn, schema, args.sessions, archived)
                store = PostgresStore(args.dsn, schema=schema)
                asyncio.run(run_one(kind, store, args.sessions, archived))
            finally:
                drop_schema(args.dsn, schema)


async def _create(store: Any) -> None:
    await store.open()
    await store.close()


if __name__ == "__main__":
    main()
