"""PostgresStore's raw pipeline path beside psycopg's own ``AsyncConnection.pipeline()``.

Run from the repo root::

    .venv/bin/python benchmarks/pg_wire.py                       # 2,000 commits, 5 runs
    .venv/bin/python benchmarks/pg_wire.py --commits 5000 --dsn postgresql://...

One commit is what a step sends: three rows (the step, its message, its event, the
engine's exact JSON bodies) in one transaction. Four ways to send it, each on one
connection of its own, in a fresh schema with turnkit's tables:

- ``raw``: what ``PostgresStore`` does (its module ``_wire``): the statements
  prepared once, then each commit is their three executions and one Sync, in
  libpq's pipeline mode through ``psycopg.pq``, results read without psycopg's
  cursors;
- ``pipeline``: psycopg's documented API, ``async with conn.pipeline()`` around a
  ``conn.transaction()`` whose three ``execute(..., prepare=True)`` calls use
  server-side prepared statements;
- ``pipeline1``: ``conn.pipeline()`` with BEGIN and COMMIT sent as statements in it,
  so the block's one Sync ends the transaction, on one cursor reused for every
  commit (psycopg's closest to ``raw``);
- ``plain``: the same without a pipeline (a round trip per statement), for scale.

It also counts round trips, in a separate short run through a counting TCP proxy
(``tests/support/round_trips.py``): a round trip is each time the client speaks again
after the server has answered. Figures are µs per commit, medians of ``--runs``
(timed on a direct connection); the rule: the raw path stays only if it is more
than 10% faster than psycopg's own.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
from _floor import DEFAULT_DSN, bare_commits, drop_schema, fresh_schema, pyformat

from turnkit.stores.postgres import _wire as wire
from turnkit.stores.postgres._schema import migrate

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
from round_trips import RoundTrips  # the tests' counting proxy

_SESSION = "bench"
_runs = itertools.count()
_TURN = "0" * 32


def _commits(n: int) -> list[list[tuple[str, tuple[Any, ...]]]]:
    return [pyformat(rows) for rows in bare_commits(n, _TURN, _SESSION)]


async def _reset(conn: psycopg.AsyncConnection[Any]) -> None:
    await conn.execute("TRUNCATE turnkit_steps, turnkit_messages, turnkit_events")


async def time_raw(conn: psycopg.AsyncConnection[Any], commits: Sequence[Any]) -> float:
    """µs per commit over the store's own path; the socket waits per commit."""
    await _reset(conn)
    names: dict[str, bytes] = {}
    prepare: list[wire.Statement] = []
    run = next(_runs)  # statement names are the connection's for as long as it lives
    for sql, _ in commits[0]:
        names[sql] = f"bench_{run}_{len(names)}".encode()
        prepare.append(wire.Prepare(names[sql], wire.numbered(sql)))
    await wire.exchange(conn, prepare)
    requests = [[wire.execute(names[sql], params) for sql, params in rows] for rows in commits]
    gc.collect()
    start = time.perf_counter()
    for statements in requests:
        await wire.exchange(conn, statements)
    elapsed = time.perf_counter() - start
    return elapsed / len(commits) * 1e6


async def time_pipeline(conn: psycopg.AsyncConnection[Any], commits: Sequence[Any]) -> float:
    """µs per commit with ``conn.pipeline()`` and prepared statements."""
    await _reset(conn)
    gc.collect()
    start = time.perf_counter()
    for rows in commits:
        async with conn.pipeline(), conn.transaction():
            for sql, params in rows:
                await conn.execute(sql, params, prepare=True)
    elapsed = time.perf_counter() - start
    return elapsed / len(commits) * 1e6


async def time_pipeline_one_sync(
    conn: psycopg.AsyncConnection[Any], commits: Sequence[Any]
) -> float:
    """µs per commit with ``conn.pipeline()``, the transaction as BEGIN and COMMIT
    statements in it, so the block's one Sync ends it: psycopg's closest to ``raw``."""
    await _reset(conn)
    cur = conn.cursor()  # one for every commit: psycopg's cheapest way to send
    gc.collect()
    start = time.perf_counter()
    for rows in commits:
        async with conn.pipeline():
            await cur.execute("BEGIN")
            for sql, params in rows:
                await cur.execute(sql, params, prepare=True)
            await cur.execute("COMMIT")
    elapsed = time.perf_counter() - start
    return elapsed / len(commits) * 1e6


async def time_plain(conn: psycopg.AsyncConnection[Any], commits: Sequence[Any]) -> float:
    """µs per commit with one round trip per statement (no pipeline)."""
    await _reset(conn)
    gc.collect()
    start = time.perf_counter()
    for rows in commits:
        async with conn.transaction():
            for sql, params in rows:
                await conn.execute(sql, params, prepare=True)
    elapsed = time.perf_counter() - start
    return elapsed / len(commits) * 1e6


async def main_async(dsn: str, n: int, runs: int) -> None:
    schema = fresh_schema("bench_wire")
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn, schema)
    target = f"{dsn}{'&' if '?' in dsn else '?'}options=-csearch_path%3D{schema}"
    commits = _commits(n)
    ways = {
        "raw": time_raw,
        "pipeline": time_pipeline,
        "pipeline1": time_pipeline_one_sync,
        "plain": time_plain,
    }
    results: dict[str, list[float]] = {name: [] for name in ways}
    trips: dict[str, float] = {}
    try:
        async with await psycopg.AsyncConnection.connect(target, autocommit=True) as conn:
            server = (conn.info.host, conn.info.port)
            for _ in range(runs):
                for name, way in ways.items():
                    results[name].append(await way(conn, commits))
        proxy = RoundTrips(*server)
        port = await proxy.start()
        few = commits[:200]
        try:
            for name, way in ways.items():
                proxied = psycopg.conninfo.make_conninfo(target, host="127.0.0.1", port=port)
                async with await psycopg.AsyncConnection.connect(proxied, autocommit=True) as c:
                    await way(c, few[:1])  # the truncate and the statements' preparation
                    before = proxy.count
                    await way(c, few)
                    trips[name] = (proxy.count - before - 1) / len(few)  # less the truncate
        finally:
            await proxy.close()
    finally:
        drop_schema(dsn, schema)
    raw = statistics.median(results["raw"])
    print(f"{n} commits of 3 rows, median of {runs} runs, µs per commit:")
    for name, samples in results.items():
        med = statistics.median(samples)
        print(
            f"  {name:9s} {med:8.1f}   ({med / raw:.2f}x raw; round trips per commit: "
            f"{trips[name]:.2f})"
        )
    pipeline = min(statistics.median(results[n]) for n in ("pipeline", "pipeline1"))
    verdict = "within" if pipeline <= raw * 1.10 else "more than"
    print(f"psycopg's pipeline() is {verdict} 10% of the raw path ({pipeline / raw - 1:+.0%}).")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--commits", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--dsn", default=os.environ.get("TURNKIT_TEST_POSTGRES_DSN", DEFAULT_DSN))
    args = parser.parse_args(argv)
    asyncio.run(main_async(args.dsn, args.commits, args.runs))


if __name__ == "__main__":
    main()
