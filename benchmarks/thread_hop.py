"""The floor under a ``def`` tool's extra cost: one hop to a thread and back.

Run from the repo root::

    .venv/bin/python benchmarks/thread_hop.py            # 20,000 hops, 5 runs

A plain ``def`` tool may block, so it runs off the event loop: at least one
hand-off to a worker thread and one wake-up of the loop when it returns. This
times exactly that, with nothing else: ``await loop.run_in_executor(pool, f)`` for
a function that returns at once, on a one-thread pool (as a store's tool thread)
and on the loop's default executor, and the same call made directly, so a ``def``
tool's cost over an ``async`` one in ``step_overhead.py`` can be read against it.
``on_thread`` is the hop turnkit's stores make (``stores/_off_loop.py``): the
caller's context carried, the call handed to the ``ToolThreads`` thread idle last,
and the outcome handed straight back to the loop instead of through
``run_in_executor``'s chain of futures; ``on_thread, pool`` is the same over a
``ThreadPoolExecutor`` (as the stores hopped before).
``hop_floor`` gives that hop's wall and CPU time for ``step_overhead.py`` to print
beside a ``def`` tool's cost over an ``async`` one, measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import functools
import gc
import statistics
import time
from collections.abc import Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass

from turnkit.stores._off_loop import on_thread
from turnkit.stores._tool_threads import ToolThreads


def _noop() -> int:
    return 1


async def _hops(executor: Executor | None, n: int, with_context: bool) -> float:
    loop = asyncio.get_running_loop()
    call = _noop
    for _ in range(100):  # warm the pool's thread
        await loop.run_in_executor(executor, call)
    gc.collect()
    start = time.perf_counter()
    for _ in range(n):
        if with_context:  # as turnkit's on_thread does: the caller's context vars go along
            call = functools.partial(contextvars.copy_context().run, _noop)
        await loop.run_in_executor(executor, call)
    return (time.perf_counter() - start) / n * 1e6


async def _on_thread(threads: ToolThreads, n: int) -> float:
    for _ in range(100):
        await on_thread(threads, _noop)
    gc.collect()
    start = time.perf_counter()
    for _ in range(n):
        await on_thread(threads, _noop)
    return (time.perf_counter() - start) / n * 1e6


async def _executor_hop(pool: Executor) -> int:
    """The hop the stores made before ``ToolThreads``: ``on_thread``'s hand-back,
    the call sent through ``ThreadPoolExecutor.submit``."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[int] = loop.create_future()
    context = contextvars.copy_context()

    def run() -> None:
        value = context.run(_noop)
        loop.call_soon_threadsafe(done.set_result, value)

    pool.submit(run)
    return await done


async def _executor_hops(pool: Executor, n: int) -> float:
    for _ in range(100):
        await _executor_hop(pool)
    gc.collect()
    start = time.perf_counter()
    for _ in range(n):
        await _executor_hop(pool)
    return (time.perf_counter() - start) / n * 1e6


@dataclass(frozen=True)
class HopFloor:
    """One hop as the stores make it, µs: wall and the process's CPU time (every
    thread's), medians of the runs. ``busy_*``: what a hop adds to a call that does
    ``BUSY_ITEMS`` dict inserts of Python work (~25 µs here, the order of a ``def``
    tool step's share on its thread), over the same call made on the loop: the
    thread then wakes into work, and the loop wakes from a real sleep."""

    wall_us: float
    cpu_us: float
    busy_wall_us: float = float("nan")
    busy_cpu_us: float = float("nan")
    busy_work_us: float = float("nan")


#: Dict inserts a busy hop's call makes (see ``HopFloor``).
BUSY_ITEMS = 300


def _busy() -> int:
    made: dict[int, str] = {}
    for i in range(BUSY_ITEMS):
        made[i] = str(i)
    return len(made)


async def _timed_busy(threads: ToolThreads, n: int) -> tuple[float, float, float]:
    """A busy call hopped minus the same call inline, wall and CPU µs, and the call's
    own CPU µs (inline), each over ``n`` calls."""
    for _ in range(100):
        await on_thread(threads, _busy)
    gc.collect()
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(n):
        _busy()
    inline_wall, inline_cpu = time.perf_counter() - t0, time.process_time() - c0
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(n):
        await on_thread(threads, _busy)
    hop_wall, hop_cpu = time.perf_counter() - t0, time.process_time() - c0
    return (
        (hop_wall - inline_wall) / n * 1e6,
        (hop_cpu - inline_cpu) / n * 1e6,
        inline_cpu / n * 1e6,
    )


async def _timed_hops(threads: ToolThreads, n: int) -> tuple[float, float]:
    for _ in range(100):
        await on_thread(threads, _noop)
    gc.collect()
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(n):
        await on_thread(threads, _noop)
    return (time.perf_counter() - t0) / n * 1e6, (time.process_time() - c0) / n * 1e6


def hop_floor(n: int = 5_000, runs: int = 5) -> HopFloor:
    """What one loop -> thread -> loop hop of ``on_thread`` costs on this machine now."""

    async def measured() -> tuple[list[tuple[float, float]], list[tuple[float, float, float]]]:
        threads = ToolThreads(4, "hop-floor")
        try:
            plain = [await _timed_hops(threads, n) for _ in range(runs)]
            busy = [await _timed_busy(threads, max(1, n // 5)) for _ in range(runs)]
            return plain, busy
        finally:
            threads.shutdown()

    samples, busy = asyncio.run(measured())
    return HopFloor(
        wall_us=statistics.median(w for w, _ in samples),
        cpu_us=statistics.median(c for _, c in samples),
        busy_wall_us=statistics.median(w for w, _, _ in busy),
        busy_cpu_us=statistics.median(c for _, c, _ in busy),
        busy_work_us=statistics.median(k for _, _, k in busy),
    )


async def _direct(n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        _noop()
    return (time.perf_counter() - start) / n * 1e6


async def measure(n: int, runs: int) -> dict[str, float]:
    samples: dict[str, list[float]] = {"direct": [], "own pool": [], "own pool + ctx": []}
    samples["default executor"] = []
    samples["on_thread, pool"] = []
    samples["on_thread"] = []
    threads = ToolThreads(4, "hop")
    with ThreadPoolExecutor(4) as pool:
        for _ in range(runs):
            samples["direct"].append(await _direct(n))
            samples["own pool"].append(await _hops(pool, n, False))
            samples["own pool + ctx"].append(await _hops(pool, n, True))
            samples["default executor"].append(await _hops(None, n, False))
            samples["on_thread, pool"].append(await _executor_hops(pool, n))
            samples["on_thread"].append(await _on_thread(threads, n))
    threads.shutdown()
    return {name: statistics.median(values) for name, values in samples.items()}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hops", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    result = asyncio.run(measure(args.hops, args.runs))
    print(f"µs per call, median of {args.runs} runs of {args.hops}:")
    for name, us in result.items():
        print(f"  {name:18s} {us:8.2f}")
    floor = hop_floor(args.hops, args.runs)
    print(f"on_thread: wall {floor.wall_us:.2f} µs, CPU {floor.cpu_us:.2f} µs (every thread's)")
    print(
        f"on_thread carrying {floor.busy_work_us:.1f} µs of Python work, over the same work "
        f"on the loop: wall {floor.busy_wall_us:.2f} µs, CPU {floor.busy_cpu_us:.2f} µs"
    )


if __name__ == "__main__":
    main()
