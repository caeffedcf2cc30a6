"""Memory and speed as one process touches more and more sessions.

Run from the repo root::

    .venv/bin/python benchmarks/many_sessions.py                     # 100,000 sessions
    .venv/bin/python benchmarks/many_sessions.py --sessions 20000 --stores sqlite

One ``Runtime`` (default ``session_cache``) runs waves of ``--wave`` turns, each turn
on a session it has never touched (so the process touches ``--sessions`` in all),
``--concurrency`` at a time. Each turn is one model+tool pair and an answer from a
zero-latency scripted model. After each wave the benchmark reports the process's
resident memory (``VmRSS``, after a ``gc.collect()``), the runtime's cached session
objects, and the wave's turns per second.

A turn that fails is counted (by its error) and the wave carries on: the bar is
0 failed turns, also with ``--concurrency 1000`` (every session of a wave at once).

The bars: resident memory levels off (the last wave's is within a few MB of the
wave at which the cache filled up), and the last wave's turns per second are at
least 90% of the first's. A store keeps growing on disk, which is the point: memory
is a cache, the store holds everything.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import re
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import turnkit
from turnkit import ModelDone, ModelReply, ToolCall, ToolContext, UserMessage, tool
from turnkit.stores import SqliteStore, Store

#: How long the ``--records`` tool blocks after its write (``--hold``), in seconds.
HOLD = 0.0
#: The table ``--records`` writes to.
_LOOKUPS = "CREATE TABLE lookups (turn_id TEXT, key TEXT)"


@tool
def lookup(key: str) -> str:
    """A no-op lookup."""
    return key


@tool(name="lookup")
def lookup_and_record(key: str, ctx: ToolContext) -> str:
    """A lookup that also writes a row in the step's transaction (exactly once)."""
    ctx.store.execute("INSERT INTO lookups (turn_id, key) VALUES (?, ?)", (ctx.turn_id, key))
    if HOLD:
        time.sleep(HOLD)  # e.g. an API call made after the write, inside the step
    return key


class PairModel:
    """One lookup, then an answer. Unlike ``ScriptedModel`` it keeps no record of
    its calls, so the process's memory is the runtime's and the store's alone."""

    async def stream(self, messages: Any, tools: Any, *, system: str | None) -> Any:
        if isinstance(messages[-1], UserMessage):
            call = ToolCall(id="c1", name="lookup", input={"key": "k"})
            yield ModelDone(reply=ModelReply(text="", tool_calls=(call,)))
        else:
            yield ModelDone(reply=ModelReply(text="done"))


def rss_mb() -> float:
    """This process's resident memory, in MB (Linux ``/proc``)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


async def one_wave(
    rt: turnkit.Runtime, prefix: str, turns: int, concurrency: int, failures: Counter[str]
) -> float:
    """Run ``turns`` turns, each on a fresh session, and return turns per second.
    A turn that fails is counted in ``failures`` (by its error) and the wave goes on."""
    names = iter(range(turns))

    async def worker() -> None:
        for i in names:
            session = rt.session("a", f"{prefix}-{i}")
            try:
                answer = await session.turn("hi")
            except Exception as exc:  # counted, not fatal: the point is how many
                what = re.sub(r"session \S+", "session …", str(exc))[:120]
                failures[f"{type(exc).__name__}: {what}"] += 1
            else:
                if answer != "done":
                    failures[f"wrong answer {answer!r}"] += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return turns / (time.perf_counter() - start)


async def run(
    store: Store, sessions: int, wave: int, concurrency: int, records: bool
) -> list[dict[str, Any]]:
    agent = turnkit.Agent(
        name="a", model=PairModel(), tools=[lookup_and_record if records else lookup]
    )
    rows: list[dict[str, Any]] = []
    async with turnkit.Runtime(agent, store=store) as rt:
        for n in range(sessions // wave):
            failures: Counter[str] = Counter()
            rate = await one_wave(rt, f"w{n}", wave, concurrency, failures)
            gc.collect()
            rows.append(
                {
                    "wave": n + 1,
                    "touched": (n + 1) * wave,
                    "rss_mb": round(rss_mb(), 1),
                    "cached": rt.cached_sessions,
                    "turns_per_s": round(rate, 1),
                    "failed": sum(failures.values()),
                }
            )
            print(
                f"  wave {n + 1:4d}  touched {(n + 1) * wave:7d}  rss {rows[-1]['rss_mb']:7.1f} MB"
                f"  cached {rt.cached_sessions:5d}  {rate:8.1f} turns/s"
                f"  failed {rows[-1]['failed']}",
                flush=True,
            )
            for error, count in failures.most_common(3):
                print(f"      {count} x {error}", flush=True)
    return rows


def verdict(rows: list[dict[str, Any]]) -> str:
    first = statistics.median(r["turns_per_s"] for r in rows[:3])
    last = statistics.median(r["turns_per_s"] for r in rows[-3:])
    plateau = rows[min(2, len(rows) - 1)]["rss_mb"]
    growth = rows[-1]["rss_mb"] - plateau
    failed = sum(r["failed"] for r in rows)
    return (
        f"failed turns {failed} of {sum(1 for _ in rows) and rows[-1]['touched']}; "
        f"turns/s last 3 waves vs first 3 (medians): {last:.1f} / {first:.1f} = "
        f"{last / first:.0%} (bar 90%); rss after wave 3 {plateau:.1f} MB, at the end "
        f"{rows[-1]['rss_mb']:.1f} MB ({growth:+.1f} MB)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--wave", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--stores", nargs="+", default=["sqlite", "postgres"])
    parser.add_argument(
        "--records",
        action="store_true",
        help="the tool also writes a row through ctx.store (in the step's transaction)",
    )
    parser.add_argument(
        "--hold",
        type=float,
        default=0.0,
        help="with --records: seconds the tool blocks after its write, holding its step open",
    )
    parser.add_argument("--dsn", default=os.environ.get("TURNKIT_TEST_POSTGRES_DSN", ""))
    args = parser.parse_args()
    global HOLD
    HOLD = args.hold
    for kind in args.stores:
        print(f"{kind}: {args.sessions} sessions in waves of {args.wave}", flush=True)
        if kind == "sqlite":
            with tempfile.TemporaryDirectory() as tmp:
                with sqlite3.connect(Path(tmp) / "many.db") as conn:
                    conn.execute(_LOOKUPS)
                store: Store = SqliteStore(Path(tmp) / "many.db")
                rows = asyncio.run(
                    run(store, args.sessions, args.wave, args.concurrency, args.records)
                )
        else:
            if not args.dsn:
                sys.exit("postgres: pass --dsn or set TURNKIT_TEST_POSTGRES_DSN")
            import psycopg

            from turnkit.stores import PostgresStore

            schema = f"bench_many_{uuid.uuid4().hex[:8]}"
            try:
                with psycopg.connect(args.dsn, autocommit=True) as conn:
                    conn.execute(f'CREATE SCHEMA "{schema}"')
                    conn.execute(f'SET search_path = "{schema}"')
                    conn.execute(_LOOKUPS)
                store = PostgresStore(args.dsn, schema=schema, max_size=20)
                rows = asyncio.run(
                    run(store, args.sessions, args.wave, args.concurrency, args.records)
                )
            finally:
                with psycopg.connect(args.dsn, autocommit=True) as conn:
                    conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        print(f"{kind}: {verdict(rows)}", flush=True)


if __name__ == "__main__":
    main()
