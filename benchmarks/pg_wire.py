"""PostgresStore's raw pipeline path beside psycopg's own ``AsyncConnection.pipeline()``.

Run from the repo root::

    .venv/bin/python benchmarks/pg_wire.py                       # 2,000 commits, 5 runs
    .venv/bin/python benchmarks/pg_wire.py --commits 5000 --dsn postgresql://...

One commit is what a step sends: three rows (the step, its message, its event, the
engine's exact JSON bodies) in one transaction. Three ways to send it, each on one
connection of its own, in a fresh schema with turnkit's tables:

- ``raw``: what ``PostgresStore`` does (``_pg_wire``): the statements prepared once,
  then each commit is their three executions and one Sync, in libpq's pipeline mode
  through ``psycopg.pq``, results read without psycopg's cursors;
- ``pipeline``: psycopg's documented API, ``async with conn.pipeline()`` around a
  ``conn.transaction()`` whose three ``execute(..., prepare=True)`` calls use
  server-side prepared statements;
- ``pipeline1``: ``conn.pipeline()`` with BEGIN and COMMIT sent as statements in it,
  so the block's one Sync ends the transaction (psycopg's closest to ``raw``);
- ``plain``: the same without a pipeline (a round trip per statement), for scale.

It also counts round trips, in a separate short run through a counting TCP proxy
(``RoundTrips``): a round trip is each time the client speaks again after the
server has answered. Figures are µs per commit, medians of ``--runs`` (timed on a
direct connection); the rule: the raw path stays only if it is more than 10%
faster than psycopg's own.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import os
import statistics
import time
from collections.abc import Sequence
from typing import Any

import psycopg
from _floor import DEFAULT_DSN, bare_commits, drop_schema, fresh_schema, pyformat

from turnkit.stores.postgres import _wire as wire
from turnkit.stores.postgres._schema import migrate

_SESSION = "bench"
_runs = itertools.count()
_TURN = "0" * 32


def _commits(n: int) -> list[list[tuple[str, tuple[Any, ...]]]]:
    return [pyformat(rows) for rows in bare_commits(n, _TURN, _SESSION)]


async def _reset(conn: psycopg.AsyncConnection[Any]) -> None:
    await conn.execute("TRUNCATE turnkit_steps, turnkit_messages, turnkit_events")


class RoundTrips:
    """A TCP proxy to PostgreSQL that counts round trips: client bursts that follow
    a server reply (the client's first burst counts too)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.count = 0
        self._server_spoke = True
        self._server: asyncio.base_events.Server | None = None
        self._serving: set[asyncio.Task[Any]] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        """Stop listening, once the proxied connections (closed by now) are done."""
        if self._serving:
            await asyncio.wait(self._serving, timeout=10)
        if self._server is not None:
            self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._serving.add(task)
        task.add_done_callback(self._serving.discard)
        up_reader, up_writer = await asyncio.open_connection(*self.target)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, client: bool) -> None:
            while chunk := await src.read(65536):
                if client and self._server_spoke:
                    self.count += 1
                self._server_spoke = not client
                dst.write(chunk)
                await dst.drain()
            dst.close()

        await asyncio.gather(
            pipe(reader, up_writer, True), pipe(up_reader, writer, False), return_exceptions=True
        )


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
    gc.collect()
    start = time.perf_counter()
    for rows in commits:
        async with conn.pipeline():
            await conn.execute("BEGIN")
            for sql, params in rows:
                await conn.execute(sql, params, prepare=True)
            await conn.execute("COMMIT")
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
