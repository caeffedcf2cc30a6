"""Workers and HTTP nodes on the test PostgreSQL server, each in a runtime of its own
over a store (and connections) of its own, as separate processes would have: what the
tests of claims, tenant caps, deployed versions, rate limits and cells share."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import turnkit
from turnkit.stores import PostgresStore

Agents = turnkit.Agent | Sequence[turnkit.Agent]


@asynccontextmanager
async def running(worker: turnkit.Worker) -> AsyncIterator[turnkit.Worker]:
    """``worker`` claiming turns until the block ends; then stopped, and its
    deliveries finished, within 30 s."""
    task = asyncio.ensure_future(worker.run())
    try:
        yield worker
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)


@asynccontextmanager
async def pg_worker(
    dsn: str,
    schema: str,
    agents: Agents,
    *,
    caps: turnkit.Concurrency | None = None,
    rate_limits: Sequence[turnkit.RateLimit] = (),
    slots: int = 8,
    serve_versions: Sequence[str] | None = None,
) -> AsyncIterator[turnkit.Worker]:
    """A ``Worker`` with ``slots`` deliveries at once, polling every 0.2 s, in a
    runtime of its own (with ``caps`` and ``rate_limits``) on a store of its own."""
    store = PostgresStore(dsn, schema=schema, busy_timeout=30.0)
    async with turnkit.Runtime(
        agents, store=store, concurrency=caps, rate_limits=rate_limits
    ) as rt:
        worker = turnkit.Worker(rt, poll=0.2, concurrency=slots, serve_versions=serve_versions)
        async with running(worker):
            yield worker


@asynccontextmanager
async def pg_node(dsn: str, schema: str, agents: Agents) -> AsyncIterator[turnkit.RuntimeClient]:
    """An HTTP node's runtime: it stores turns, workers run them."""
    store = PostgresStore(dsn, schema=schema, busy_timeout=30.0)
    async with turnkit.RuntimeClient(agents, store=store) as rt:
        yield rt
