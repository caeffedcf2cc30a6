"""What one claim costs on PostgreSQL with a deep queue: the claim statement alone.

Run from the repo root::

    .venv/bin/python benchmarks/claim_cost.py
    PYTHONPATH=/path/to/older/src .venv/bin/python benchmarks/claim_cost.py   # compare

On a fresh schema, tenant A queues ``--big`` turns and ``--tenants`` other tenants
``--small`` each (each turn on a session of its own; a turnkit before tenants stores
them all under one). Then ``--held`` sessions are claimed and kept, as running
workers would hold them, and a second store claims ``--limit`` sessions and gives
them back, ``--repeat`` times: the median and p99 of one claim's round trip are
reported, with no worker running (nothing else competes for the database but what
else runs on the machine). The tables are analyzed first, as autovacuum keeps them
(``--no-analyze``: as right after the burst, before it has).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import os
import statistics
import time
from collections.abc import Sequence

import _floor

import turnkit
from turnkit.stores import PostgresStore
from turnkit.testing import ScriptedModel

AGENT = "bench"


async def _fill(store: PostgresStore, args: argparse.Namespace) -> None:
    agent = turnkit.Agent(name=AGENT, model=ScriptedModel([]))
    tenanted = "tenant" in inspect.signature(turnkit.AgentSession.submit).parameters
    plan = [("A", f"A{i:05d}") for i in range(args.big)]
    plan += [(f"T{t}", f"T{t}-{i:03d}") for t in range(args.tenants) for i in range(args.small)]
    async with turnkit.RuntimeClient(agent, store=store) as rt:
        queue = list(reversed(plan))

        async def one() -> None:
            while queue:
                tenant, session = queue.pop()
                extra = {"tenant": tenant} if tenanted else {}
                await rt.session(AGENT, session).submit("x", **extra)

        await asyncio.gather(*(one() for _ in range(16)))


def _analyze(dsn: str, schema: str) -> None:
    """Table statistics as autovacuum keeps them in a steady state (a fresh table
    has none, and the planner then misjudges the claim's lookups)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'ANALYZE "{schema}".turnkit_turns')
        conn.execute(f'ANALYZE "{schema}".turnkit_sessions')


async def run(args: argparse.Namespace) -> list[float]:
    schema = _floor.fresh_schema("claim")
    filler = PostgresStore(args.dsn, schema=schema, max_size=16)
    holder = PostgresStore(args.dsn, schema=schema)
    claimer = PostgresStore(args.dsn, schema=schema)
    try:
        await filler.open()
        await _fill(filler, args)
        if args.analyze:
            _analyze(args.dsn, schema)
        await holder.open()
        held = await holder.claim([AGENT], limit=args.held)
        await claimer.open()
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            taken = await claimer.claim([AGENT], limit=args.limit)
            times.append((time.perf_counter() - start) * 1000)
            for record in taken:
                claimer.unclaim(record.session_id)
        print(f"held {len(held)} sessions; each claim took {len(taken)}")
        return times
    finally:
        for store in (claimer, holder, filler):
            await store.close()
        _floor.drop_schema(args.dsn, schema)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--dsn", default=os.environ.get("TURNKIT_BENCH_POSTGRES_DSN", _floor.DEFAULT_DSN)
    )
    p.add_argument("--big", type=int, default=5000, help="tenant A's queued turns")
    p.add_argument("--tenants", type=int, default=4, help="other tenants")
    p.add_argument("--small", type=int, default=50, help="each other tenant's queued turns")
    p.add_argument("--held", type=int, default=96, help="sessions held as if running")
    p.add_argument("--limit", type=int, default=32, help="sessions one claim takes")
    p.add_argument("--repeat", type=int, default=200)
    p.add_argument(
        "--no-analyze",
        dest="analyze",
        action="store_false",
        help="claim on a table with no statistics (as right after a burst of inserts)",
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    print(_floor.describe(_floor.server_info(args.dsn)))
    print(f"turnkit from {os.path.dirname(turnkit.__file__)}")
    times = sorted(asyncio.run(run(args)))
    p99 = times[min(len(times) - 1, int(0.99 * len(times)))]
    print(
        f"claim of {args.limit} with {args.big} + {args.tenants}x{args.small} queued: "
        f"median {statistics.median(times):.2f} ms, p99 {p99:.2f} ms"
    )


if __name__ == "__main__":
    main()
