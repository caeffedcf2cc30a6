"""Deadlines at scale on PostgreSQL: many parked turns whose deadlines fall within the
same second, fired by a deployment of worker processes.

Run from the repo root::

    .venv/bin/python benchmarks/deadlines.py                   # 1,000 turns, 3 workers
    .venv/bin/python benchmarks/deadlines.py --turns 200 --workers 2 --runs 3

This process parks ``--turns`` turns (one per session) through a runtime that runs
no turn itself (a ``RuntimeClient``, as an HTTP node's); ``--workers`` worker processes
(``Runtime`` + ``Worker`` on the same schema, ``concurrency`` 64) run them. Each
turn's tool asks a question whose deadline is the same instant for every turn
(``--lead`` seconds after the run starts), with a default answer; after the
answer the tool inserts one row in ``deadline_effects`` (one psycopg connection
per process, outside turnkit), so a tool that ran past the question twice would
leave two rows.

Reported, per run: how many deadlines fired (``input.expired`` events logged: one
per turn is exactly once), effect rows per turn (1 each), and, from the logged
events, the time from a turn's deadline to its firing (``late_by``) and to the
resumed turn's completion (its ``finished_at`` minus its deadline), p50 and p99.
The clocks are all this machine's. The timers are fired by the one worker leading
the election ``turnkit:timers``; the resumed turns are claimed by all of them.

``--firing-only`` measures the firing's own pace, the floor of the figures above:
this process parks the turns, then settles every deadline itself with no worker
running the woken turns (``Runtime.claims_turns``), and reports turns fired a second.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

import turnkit
from turnkit import ToolContext, ToolMessage, UserMessage, tool
from turnkit.stores import PostgresStore
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call

DSN = os.environ.get("TURNKIT_BENCH_POSTGRES_DSN", "postgresql://127.0.0.1:5432/test")


#: One connection per process for the effect rows (a new connection per row would
#: make PostgreSQL start a backend per turn and time that instead).
_EFFECTS: list[psycopg.AsyncConnection[Any]] = []
_EFFECTS_LOCK = asyncio.Lock()


async def _effect(dsn: str, statement: str, ctx: ToolContext) -> None:
    async with _EFFECTS_LOCK:
        if not _EFFECTS:
            _EFFECTS.append(await psycopg.AsyncConnection.connect(dsn, autocommit=True))
        await _EFFECTS[0].execute(statement, (ctx.turn_id,))


def deadline_agent(dsn: str, schema: str, at: float) -> turnkit.Agent:
    """Each turn asks once, with a deadline at the instant ``at``, then records one
    effect row for the answer."""

    @tool
    async def ship(order_id: str, ctx: ToolContext) -> str:
        """Ship an order unless a person holds it in time."""
        answer = await ctx.request_input(
            "hold", f"Hold {order_id}?", expires_in=max(at - time.time(), 0.001), on_expiry="ship"
        )
        await _effect(dsn, f'INSERT INTO "{schema}".deadline_effects (turn_id) VALUES (%s)', ctx)
        return str(answer)

    def respond(messages: Any) -> Any:
        last = messages[-1]
        if isinstance(last, UserMessage):
            return ScriptedReply(tool_calls=[tool_call("ship", {"order_id": last.text})])
        if isinstance(last, ToolMessage):
            return f"done: {last.result}"
        return "?"

    return turnkit.Agent(name="a", model=ScriptedModel(respond=respond), tools=[ship])


async def run_worker(dsn: str, schema: str, at: float) -> None:
    """One worker process: runs turns until SIGTERM (warnings on stderr)."""
    logging.basicConfig(level=logging.WARNING, format=f"worker {os.getpid()} %(name)s: %(message)s")
    store = PostgresStore(dsn, schema=schema)
    async with turnkit.Runtime(deadline_agent(dsn, schema, at), store=store) as runtime:
        worker = turnkit.Worker(runtime, concurrency=64)
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, worker.stop)
        print("ready", flush=True)
        await worker.run()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def one_run(turns: int, workers: int, lead: float) -> dict[str, Any]:
    schema = f"bench_deadlines_{uuid.uuid4().hex[:8]}"
    at = time.time() + lead
    store = PostgresStore(DSN, schema=schema)
    procs: list[subprocess.Popen[str]] = []
    try:
        async with turnkit.RuntimeClient(deadline_agent(DSN, schema, at), store=store) as node:
            async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
                await conn.execute(f'CREATE TABLE "{schema}".deadline_effects (turn_id text)')
            for _ in range(workers):
                proc = subprocess.Popen(
                    [sys.executable, __file__, "--worker", schema, repr(at)],
                    stdout=subprocess.PIPE,
                    text=True,
                )
                procs.append(proc)
                assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
            ids = [
                await node.session("a", f"s{n}").submit(f"o-{n}", turn_id=f"t{n}")
                for n in range(turns)
            ]
            parked_by = time.time()
            # Wait for every turn to end (each deadline fires at ``at``).
            limit = at + 300
            while time.time() < limit:
                counts = await store.turn_counts()
                if not any(counts.values()):
                    break
                await asyncio.sleep(0.2)
            late: list[float] = []
            to_end: list[float] = []
            fired = completed = 0
            for n, tid in enumerate(ids):
                session = store.session(f"s{n}")
                events = await session.events(turn_id=tid)
                expired = [e for e in events if e.type == "input.expired"]
                fired += len(expired)
                record = await session.turn(tid)
                completed += record is not None and record.status == "completed"
                if expired and record is not None and record.finished_at is not None:
                    late.append(expired[0].late_by)  # type: ignore[union-attr]
                    to_end.append(record.finished_at - expired[0].expires_at)  # type: ignore[union-attr]
            async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
                cur = await conn.execute(
                    f'SELECT count(*), count(DISTINCT turn_id) FROM "{schema}".deadline_effects'
                )
                effects, distinct = await cur.fetchone()  # type: ignore[misc]
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=60)
        async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    return {
        "turns": turns,
        "workers": workers,
        "parked_before_deadline_s": round(at - parked_by, 2),
        "fired": fired,
        "completed": completed,
        "effect_rows": effects,
        "turns_with_effects": distinct,
        "late_p50_ms": round(1000 * pct(late, 0.5), 1) if late else None,
        "late_p99_ms": round(1000 * pct(late, 0.99), 1) if late else None,
        "resumed_end_p50_ms": round(1000 * pct(to_end, 0.5), 1) if to_end else None,
        "resumed_end_p99_ms": round(1000 * pct(to_end, 0.99), 1) if to_end else None,
    }


async def firing_only(turns: int) -> dict[str, Any]:
    """Park ``turns`` turns, then fire every deadline here, running none of them."""
    schema = f"bench_firing_{uuid.uuid4().hex[:8]}"
    at = time.time() + 3600
    store = PostgresStore(DSN, schema=schema)
    try:
        async with turnkit.Runtime(deadline_agent(DSN, schema, at), store=store) as runtime:
            for n in range(turns):
                session = runtime.session("a", f"s{n}")
                await session.result(session.start(f"o-{n}", turn_id=f"t{n}"))
            runtime.claims_turns = True  # the woken turns are left queued
            t0, c0 = time.perf_counter(), time.process_time()
            fired = 0
            while batch := await runtime.timers.fire_due(store, now=at + 1):
                fired += batch
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    return {
        "fired": fired,
        "seconds": round(wall, 3),
        "cpu_seconds": round(cpu, 3),
        "turns_per_second": round(fired / wall),
    }


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        asyncio.run(run_worker(DSN, sys.argv[2], float(sys.argv[3])))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--lead", type=float, default=40.0, help="seconds to the deadline")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--firing-only", action="store_true", help="the firing's own pace")
    args = parser.parse_args()
    if args.firing_only:
        for _ in range(args.runs):
            print(json.dumps(asyncio.run(firing_only(args.turns))))
        return
    results = [asyncio.run(one_run(args.turns, args.workers, args.lead)) for _ in range(args.runs)]
    for r in results:
        print(json.dumps(r))
    if len(results) > 1:
        for key in ("late_p50_ms", "late_p99_ms", "resumed_end_p50_ms", "resumed_end_p99_ms"):
            values = [r[key] for r in results if r[key] is not None]
            if values:
                print(f"median {key}: {statistics.median(values)}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
