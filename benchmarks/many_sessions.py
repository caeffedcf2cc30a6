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
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import turnkit
from turnkit import ModelDone, ModelReply, ToolCall, UserMessage, tool
from turnkit.stores import SqliteStore, Store


@tool
def lookup(key: str) -> str:
    """A no-op lookup."""
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


async def one_wave(rt: turnkit.Runtime, prefix: str, turns: int, concurrency: int) -> float:
    """Run ``turns`` turns, each on a fresh session, and return turns per second."""
    names = iter(range(turns))

    async def worker() -> None:
        for i in names:
            session = rt.session("a", f"{prefix}-{i}")
            await session.turn("hi")

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return turns / (time.perf_counter() - start)


async def run(store: Store, sessions: int, wave: int, concurrency: int) -> list[dict[str, Any]]:
    agent = turnkit.Agent(name="a", model=PairModel(), tools=[lookup])
    rows: list[dict[str, Any]] = []
    async with turnkit.Runtime(agent, store=store) as rt:
        for n in range(sessions // wave):
            rate = await one_wave(rt, f"w{n}", wave, concurrency)
            gc.collect()
            rows.append(
                {
                    "wave": n + 1,
                    "touched": (n + 1) * wave,
                    "rss_mb": round(rss_mb(), 1),
                    "cached": rt.cached_sessions,
                    "turns_per_s": round(rate, 1),
                }
            )
            print(
                f"  wave {n + 1:4d}  touched {(n + 1) * wave:7d}  rss {rows[-1]['rss_mb']:7.1f} MB"
                f"  cached {rt.cached_sessions:5d}  {rate:8.1f} turns/s",
                flush=True,
            )
    return rows


def verdict(rows: list[dict[str, Any]]) -> str:
    first = statistics.median(r["turns_per_s"] for r in rows[:3])
    last = statistics.median(r["turns_per_s"] for r in rows[-3:])
    plateau = rows[min(2, len(rows) - 1)]["rss_mb"]
    growth = rows[-1]["rss_mb"] - plateau
    return (
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
    parser.add_argument("--dsn", default=os.environ.get("TURNKIT_TEST_POSTGRES_DSN", ""))
    args = parser.parse_args()
    for kind in args.stores:
        print(f"{kind}: {args.sessions} sessions in waves of {args.wave}", flush=True)
        if kind == "sqlite":
            with tempfile.TemporaryDirectory() as tmp:
                store: Store = SqliteStore(Path(tmp) / "many.db")
                rows = asyncio.run(run(store, args.sessions, args.wave, args.concurrency))
        else:
            if not args.dsn:
                sys.exit("postgres: pass --dsn or set TURNKIT_TEST_POSTGRES_DSN")
            import psycopg

            from turnkit.stores import PostgresStore

            schema = f"bench_many_{uuid.uuid4().hex[:8]}"
            try:
                store = PostgresStore(args.dsn, schema=schema, max_size=20)
                rows = asyncio.run(run(store, args.sessions, args.wave, args.concurrency))
            finally:
                with psycopg.connect(args.dsn, autocommit=True) as conn:
                    conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        print(f"{kind}: {verdict(rows)}", flush=True)


if __name__ == "__main__":
    main()
