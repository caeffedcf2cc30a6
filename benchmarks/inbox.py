"""How fast the inbox pages: ``runtime.pending_inputs`` over many parked turns.

Run from the repo root::

    .venv/bin/python benchmarks/inbox.py                              # 20,000 parked, SQLite
    .venv/bin/python benchmarks/inbox.py --stores sqlite postgres --parked 50000

Each run fills a fresh store, with SQL in bulk, with ``--parked`` sessions parked
on one question each (every tenth for ``ana``, the rest for other people) and
four times as many finished turns beside them, then times ``ana``'s first page
(50 questions, the median of 20 reads) and a walk through all her pages. On
PostgreSQL it also prints the plan of one page's query, to show it walks the
partial index over parked turns (``turnkit_turns_inbox``) rather than the table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _floor import drop_schema

import turnkit
from turnkit import Answerers, InputRequest
from turnkit._values.checkpoints import SuspendCheckpoint
from turnkit.stores import SqliteStore, Store
from turnkit.testing import ScriptedModel

OPENING = json.dumps({"role": "user", "text": "please", "turn_id": "t1"})


def pending(user: str) -> str:
    request = InputRequest(
        id="approve",
        prompt=f"Approve this for {user}?",
        turn_id="t1",
        call_id="c1",
        tool="refund",
        schema={"type": "boolean"},
        answerers=(Answerers.user(user),),
        asked_at=time.time(),
    )
    checkpoint = SuspendCheckpoint(
        request=request, call_id="c1", opening_text="please", event=None, policy=None
    )
    return json.dumps(checkpoint.to_dict())


def rows(parked: int) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Sessions, and turns: one parked per session (ana's every tenth), four finished."""
    mine, theirs = pending("ana"), pending("bo")
    sessions, turns = [], []
    for i in range(parked):
        sid = f"s{i:07d}"
        sessions.append((sid,))
        at = 1000.0 + i
        turns.append((sid, "t1", "suspended", at, mine if i % 10 == 0 else theirs))
        for n in range(4):
            turns.append((sid, f"d{n}", "completed", at - 0.5 + n / 10, None))
    return sessions, turns


SESSION = (
    "INSERT INTO turnkit_sessions (session_id, agent, status, created_at, updated_at) "
    "VALUES (?, 'a', 'suspended', 1.0, 1.0)"
)
TURN = (
    "INSERT INTO turnkit_turns (session_id, turn_id, agent, status, opening, created_at, "
    "pending) VALUES (?, ?, 'a', ?, '" + OPENING + "', ?, ?)"
)


def fill_sqlite(path: Path, parked: int) -> None:
    sessions, turns = rows(parked)
    with sqlite3.connect(path) as conn:
        conn.executemany(SESSION, sessions)
        conn.executemany(TURN, turns)
        conn.execute("ANALYZE")


def fill_postgres(dsn: str, schema: str, parked: int) -> None:
    import psycopg

    from turnkit.stores.postgres import qmark_to_pyformat

    sessions, turns = rows(parked)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        with conn.cursor() as cur:
            cur.executemany(qmark_to_pyformat(SESSION), sessions)
            cur.executemany(qmark_to_pyformat(TURN), turns)
        conn.execute("ANALYZE")


def explain_postgres(dsn: str, schema: str) -> str:
    import psycopg

    from turnkit.stores._sql import PARKED_TURNS
    from turnkit.stores.postgres import qmark_to_pyformat

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        plan = conn.execute(
            "EXPLAIN " + qmark_to_pyformat(PARKED_TURNS), (5000.0, "s", "t1", 50)
        ).fetchall()
    return "\n".join("    " + line for (line,) in plan)


async def run_one(kind: str, store: Store, parked: int) -> None:
    agent = turnkit.Agent(name="a", model=ScriptedModel(respond=lambda _: "x"))
    async with turnkit.Runtime(agent, store=store) as runtime:
        first: list[float] = []
        for _ in range(20):
            started = time.perf_counter()
            page = await runtime.pending_inputs("ana", limit=50)
            first.append(time.perf_counter() - started)
        assert len(page.items) == 50, len(page.items)
        started = time.perf_counter()
        seen, after, pages = 0, None, 0
        while True:
            page = await runtime.pending_inputs("ana", limit=50, after=after)
            seen, pages = seen + len(page.items), pages + 1
            if page.next is None:
                break
            after = page.next
        walk = time.perf_counter() - started
    assert seen == (parked + 9) // 10, seen
    print(
        f"{kind:9} {parked:>7,} parked ({parked * 4:,} finished beside): first page of 50 "
        f"median {statistics.median(first) * 1000:.1f} ms (p90 "
        f"{statistics.quantiles(first, n=10)[-1] * 1000:.1f} ms); all {seen:,} of ana's in "
        f"{pages} pages, {walk:.2f} s ({walk / pages * 1000:.1f} ms a page)"
    )


async def _create(store: Store) -> None:
    await store.open()
    await store.close()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parked", type=int, default=20_000)
    parser.add_argument("--stores", nargs="+", default=["sqlite"], choices=["sqlite", "postgres"])
    parser.add_argument(
        "--dsn",
        default=os.environ.get("TURNKIT_BENCH_POSTGRES_DSN", "postgresql://127.0.0.1:5432/test"),
    )
    args = parser.parse_args(argv)
    for kind in args.stores:
        if kind == "sqlite":
            with tempfile.TemporaryDirectory() as folder:
                path = Path(folder) / "inbox.db"
                asyncio.run(_create(SqliteStore(path)))
                fill_sqlite(path, args.parked)
                asyncio.run(run_one(kind, SqliteStore(path), args.parked))
        else:
            from turnkit.stores import PostgresStore

            schema = f"turnkit_inbox_{uuid.uuid4().hex[:8]}"
            try:
                asyncio.run(_create(PostgresStore(args.dsn, schema=schema)))
                fill_postgres(args.dsn, schema, args.parked)
                print(explain_postgres(args.dsn, schema))
                asyncio.run(run_one(kind, PostgresStore(args.dsn, schema=schema), args.parked))
            finally:
                drop_schema(args.dsn, schema)


if __name__ == "__main__":
    main()
