"""Three slow remote calls of one model step: together (the default) versus one after another.

Run from the repo root::

    .venv/bin/python benchmarks/parallel_tools.py              # SQLite and memory, 9 runs
    .venv/bin/python benchmarks/parallel_tools.py --runs 21 --delay 0.3

Each run is one turn on a fresh session: a zero-latency model asks for ``--calls``
remote calls in one step, each sleeping ``--delay`` seconds, then answers. The turn
is timed from ``start`` to its result, with ``Agent(max_parallel_tools=…)`` at its
default and at 1. The floor of the parallel case is one delay (the calls overlap
completely); the floor of the sequential case is ``calls`` delays. The figures are
the median and the fastest of ``--runs`` runs; ``overhead`` is median minus floor.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import tempfile
import time
from pathlib import Path

import turnkit
from turnkit.stores import MemoryStore, SqliteStore, Store
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call


def build_agent(calls: int, delay: float, parallel: int) -> turnkit.Agent:
    @turnkit.tool
    async def lookup(key: str) -> str:
        """Looks a key up in a slow remote service."""
        await asyncio.sleep(delay)
        return key

    def respond(messages: object) -> object:
        last = messages[-1]  # type: ignore[index]
        if last.role == "user":
            return ScriptedReply(
                tool_calls=[tool_call("lookup", {"key": f"k{i}"}) for i in range(calls)]
            )
        return "done"

    model = ScriptedModel(respond=respond, record_calls=False)
    return turnkit.Agent(name="b", model=model, tools=[lookup], max_parallel_tools=parallel)


async def one_turn(store: Store, agent: turnkit.Agent, session_id: str) -> float:
    async with turnkit.Runtime([agent], store=store) as runtime:
        session = runtime.session("b", session_id)
        started = time.perf_counter()
        await session.result(session.start("go"))
        return time.perf_counter() - started


async def measure(kind: str, calls: int, delay: float, parallel: int, runs: int) -> list[float]:
    times: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(runs):
            store: Store = MemoryStore() if kind == "memory" else SqliteStore(Path(tmp) / "b.db")
            agent = build_agent(calls, delay, parallel)
            times.append(await one_turn(store, agent, f"s{run}"))
    return times


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--delay", type=float, default=0.3)
    parser.add_argument("--stores", nargs="+", default=["sqlite", "memory"])
    args = parser.parse_args()
    default = turnkit.Agent(name="x", model=ScriptedModel(["x"])).max_parallel_tools
    print(f"{args.calls} calls of {args.delay:g} s each, {args.runs} runs per case")
    print(
        f"{'store':8} {'max_parallel_tools':>18} {'median s':>9} {'fastest s':>9} "
        f"{'floor s':>8} {'overhead ms':>11}"
    )
    for kind in args.stores:
        for parallel in (default, 1):
            times = await measure(kind, args.calls, args.delay, parallel, args.runs)
            floor = args.delay * math.ceil(args.calls / parallel)
            median = statistics.median(times)
            print(
                f"{kind:8} {parallel:>18} {median:9.3f} {min(times):9.3f} "
                f"{floor:8.3f} {(median - floor) * 1000:11.1f}"
            )


if __name__ == "__main__":
    asyncio.run(main())
