"""Fair claims across tenants on one PostgreSQL: one tenant's burst against four small ones.

Run from the repo root::

    .venv/bin/python benchmarks/fairness.py                     # ~4 minutes
    .venv/bin/python benchmarks/fairness.py --runs 1 --big 2000
    .venv/bin/python benchmarks/fairness.py --unfair-src /path/to/older/turnkit/src

Three ``turnkit worker`` processes (``benchmarks/scale_out_agent``: a scripted model
step calling a local tool that writes a row, the tool step, a final model step; five
commits a turn) run the turns this process submits the way an HTTP node does
(``RuntimeClient``, ``session.submit(..., tenant=...)``), each turn on a
session of its own.

To start every tenant "at the same moment" whatever the submission takes, the
workers are started and then paused (SIGSTOP); the turns are submitted, A's and
B-E's interleaved; then the workers are resumed (SIGCONT) at ``t0``. A turn's time
to completion is its ``finished_at - t0``, both on this machine's clock.

* **idle**: only B, C, D and E, ``--small`` turns each: their times on a deployment
  with nothing else to do.
* **fair**: A submits ``--big`` turns and B-E ``--small`` each; this turnkit's claim.
* **fair, capped** (with ``--per-tenant N``): the same, each worker run with
  ``--per-tenant N``, so A holds at most N slots and B-E's turns share the CPU
  with fewer of A's.
* **unfair** (with ``--unfair-src``): the same, the workers importing an older
  turnkit whose claim takes the oldest runnable turn first, whatever its tenant.

Reported per case: each tenant's p50/p99 time to completion, and A's throughput
(its turns / the time its last one finished after ``t0``). The bars: B-E's p99 in
the fair run within 2x of idle, and A's throughput in the fair run at least 90% of
the unfair run's. Figures are medians of ``--runs`` runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import signal
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import _floor
from scale_out import AGENT, cluster, percentile, submitting_agent

import turnkit
from turnkit.stores import PostgresStore

SMALL = ("B", "C", "D", "E")


@dataclass
class Case:
    """One run: each tenant's (p50, p99) seconds to completion and A's turns/s."""

    times: dict[str, tuple[float, float]]
    a_per_second: float


async def _submit(dsn: str, schema: str, plan: list[tuple[str, str]], parallel: int) -> None:
    """Submit ``plan`` (tenant, session) in order, ``parallel`` at a time."""
    store = PostgresStore(dsn, schema=schema, max_size=parallel)
    async with turnkit.RuntimeClient(submitting_agent(), store=store) as rt:
        queue = list(reversed(plan))

        async def one() -> None:
            while queue:
                tenant, session = queue.pop()
                await rt.session(AGENT, session).submit(f"turn {session}", tenant=tenant)

        await asyncio.gather(*(one() for _ in range(parallel)))


def run_case(
    args: argparse.Namespace, big: int, source: str | None, extra: Sequence[str] = ()
) -> Case:
    with cluster(args.dsn, args.concurrency, args.poll, args.pool_size) as made:
        made.source = source
        made.worker_args = list(extra)
        for _ in range(args.workers):
            made.start_worker()
        for proc in made.workers:
            proc.send_signal(signal.SIGSTOP)
        a = [("A", f"A{i:05d}") for i in range(big)]
        small = [(t, f"{t}{i:05d}") for i in range(args.small) for t in SMALL]
        # Interleaved: the small tenants' turns land among A's, not after them.
        step = max(1, len(a) // max(1, len(small)))
        plan: list[tuple[str, str]] = []
        for n, item in enumerate(small):
            plan.extend(a[n * step : (n + 1) * step])
            plan.append(item)
        plan.extend(a[len(small) * step :])
        asyncio.run(_submit(args.dsn, made.schema, plan, args.submitters))
        t0 = time.time()
        for proc in made.workers:
            proc.send_signal(signal.SIGCONT)
        total = len(plan)
        deadline = time.monotonic() + args.timeout
        while True:
            done = made.sql("SELECT count(*) FROM turnkit_turns WHERE status = 'completed'")
            if int(done[0][0]) >= total:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"only {done[0][0]} of {total} turns completed in time")
            time.sleep(0.2)
        rows = made.sql("SELECT tenant, finished_at FROM turnkit_turns")
    by: dict[str, list[float]] = {}
    for tenant, finished in rows:
        by.setdefault(str(tenant), []).append(float(finished) - t0)
    times = {}
    for tenant, values in sorted(by.items()):
        values.sort()
        times[tenant] = (percentile(values, 0.5), percentile(values, 0.99))
    a_last = max(by.get("A", [0.0]))
    return Case(times, big / a_last if big and a_last > 0 else float("nan"))


def median_case(cases: Sequence[Case]) -> Case:
    tenants = cases[0].times
    times = {
        t: (
            statistics.median(c.times[t][0] for c in cases),
            statistics.median(c.times[t][1] for c in cases),
        )
        for t in tenants
    }
    return Case(times, statistics.median(c.a_per_second for c in cases))


def show(name: str, case: Case, runs: Sequence[Case]) -> None:
    print(f"\n{name}:")
    for tenant, (p50, p99) in case.times.items():
        print(f"  {tenant}: p50 {p50 * 1000:8.0f} ms   p99 {p99 * 1000:8.0f} ms")
    if case.a_per_second == case.a_per_second:  # not NaN
        each = ", ".join(f"{r.a_per_second:.1f}" for r in runs)
        print(f"  A: {case.a_per_second:.1f} turns/s (runs: {each})")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--dsn", default=os.environ.get("TURNKIT_BENCH_POSTGRES_DSN", _floor.DEFAULT_DSN)
    )
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--big", type=int, default=5000, help="tenant A's turns")
    p.add_argument("--small", type=int, default=50, help="each of B-E's turns")
    p.add_argument("--runs", type=int, default=3, help="runs per case; figures are medians")
    p.add_argument("--concurrency", type=int, default=32, help="each worker's --concurrency")
    p.add_argument("--poll", type=float, default=0.5)
    p.add_argument("--pool-size", type=int, default=4)
    p.add_argument("--submitters", type=int, default=16, help="submissions in flight")
    p.add_argument("--timeout", type=float, default=600.0, help="most seconds a run may take")
    p.add_argument(
        "--per-tenant",
        type=int,
        help="also run the fair case with workers capping each tenant at this many sessions",
    )
    p.add_argument(
        "--unfair-src",
        help="the src directory of a turnkit before fair claims, for the unfair run",
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    print(_floor.describe(_floor.server_info(args.dsn)))
    print(f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(
        f"{args.workers} workers x {args.concurrency}; A: {args.big} turns, "
        f"B-E: {args.small} each; {args.runs} run(s) per case"
    )
    results: dict[str, Any] = {}
    capped = ["--per-tenant", str(args.per_tenant)] if args.per_tenant else []
    cases: list[tuple[str, int, str | None, list[str]]] = [
        ("idle", 0, None, []),
        ("fair", args.big, None, []),
    ]
    if capped:
        cases.append((f"fair, --per-tenant {args.per_tenant}", args.big, None, capped))
    if args.unfair_src:
        cases.append(("unfair", args.big, args.unfair_src, []))
    for name, big, source, extra in cases:
        runs = [run_case(args, big, source, extra) for _ in range(args.runs)]
        results[name] = median_case(runs)
        show(name, results[name], runs)
    idle = results["idle"]
    for name in [n for n in results if n.startswith("fair")]:
        fair = results[name]
        print(f"\n{name}:")
        for tenant in SMALL:
            ratio = fair.times[tenant][1] / idle.times[tenant][1]
            print(f"  {tenant}: p99 / idle p99 = {ratio:.2f} (bar: <= 2)")
        if "unfair" in results:
            share = fair.a_per_second / results["unfair"].a_per_second
            print(f"  A: throughput / unfair = {share:.2f} (bar: >= 0.90)")


if __name__ == "__main__":
    main()
