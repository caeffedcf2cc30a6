"""Cost of one turn as a session's history grows, on each store.

Run from the repo root::

    .venv/bin/python benchmarks/history_growth.py               # 1500 turns per store
    .venv/bin/python benchmarks/history_growth.py --turns 3000 --stores sqlite

One session takes ``--turns`` one-step turns (a zero-latency scripted model that
answers at once). The time of single turns is reported at growing transcript
lengths, as the median of the ``--window`` turns around each mark. A session keeps
its transcript between deliveries and reads only what was committed since, so a
turn's cost should not grow with the history; the ``growth`` column is the cost at
the last mark over the cost at the first one after warm-up.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import turnkit
from turnkit.stores import MemoryStore, SqliteStore, Store
from turnkit.testing import ScriptedModel


def make_store(kind: str, tmp: Path) -> Store:
    if kind == "memory":
        return MemoryStore()
    if kind == "sqlite":
        return SqliteStore(tmp / "history.db")
    raise SystemExit(f"unknown store {kind!r}")


async def measure(kind: str, turns: int, window: int, tmp: Path) -> list[tuple[int, float]]:
    agent = turnkit.Agent(
        name="bench", model=ScriptedModel(respond=lambda m: "ok", record_calls=False)
    )
    marks = sorted({min(turns, m) for m in (window * 2, turns // 10, turns // 2, turns)})
    times: list[float] = []
    async with turnkit.Runtime(agent, store=make_store(kind, tmp)) as runtime:
        session = runtime.session("bench", "s1")
        for _ in range(turns):
            t0 = time.perf_counter()
            await session.turn("hi")
            times.append(time.perf_counter() - t0)
    out = []
    for mark in marks:
        around = times[max(0, mark - window) : mark]
        out.append((2 * mark, statistics.median(around) * 1e6))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--turns", type=int, default=1500)
    p.add_argument("--window", type=int, default=50, help="turns per median")
    p.add_argument("--stores", nargs="+", default=["memory", "sqlite"])
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.stores:
            rows = asyncio.run(measure(kind, args.turns, args.window, Path(tmp)))
            cells = "  ".join(f"{n} msgs: {us:.0f} µs" for n, us in rows)
            growth = rows[-1][1] / rows[0][1]
            print(f"{kind:<7} {cells}  growth {growth:.2f}x")


if __name__ == "__main__":
    main()
