"""Turns per second one process completes over N concurrent sessions, on SQLite and PostgreSQL.

Run from the repo root::

    .venv/bin/python benchmarks/throughput.py               # full run, a few minutes
    .venv/bin/python benchmarks/throughput.py --sessions 1 10 --stores postgres
    .venv/bin/python benchmarks/throughput.py --pairs 4 --max-size 40 --json out.json

One ``Runtime`` drives N sessions at once, each a loop of ``await session.turn(...)``.
A turn is ``--pairs`` model+tool step pairs and a final answer from a zero-latency
model, with a no-op tool (plain ``def``, which runs inside the step's transaction, and
``async def``, which runs on the event loop), so it commits its opening, two steps per
pair and the final step. Every session runs the same ``--turns`` turns: a turn's
``load`` reads the whole transcript, so equal histories keep the work per turn the same
at every N. Rounds of N fresh sessions repeat until ``--min-seconds`` have been timed;
turns/s = turns / timed seconds, commits/s = turns/s * commits per turn (counted once
on a ``MemoryStore``). Each run gets a fresh store (one SQLite file; PostgreSQL: a
fresh schema, dropped afterwards, ``PostgresStore(max_size=--max-size)`` with the pool
filled up front) and an untimed one-turn round first. Figures are medians of ``--runs``.

The bar (PostgreSQL): the largest N completes at least 5x the turns per second of
the smallest (1 vs 100 by default), because commits of different sessions overlap and
no session waits behind another's I/O. SqliteStore commits on the event-loop thread,
so there is nothing to overlap; its ratio is shown for reference only.

The PostgreSQL floor: the same bare commit as ``step_overhead.py`` (one step, one
message and one event row in one pipeline with ``BEGIN`` and ``COMMIT``), psycopg alone,
over a pool of the same size, measured before the engine runs: one commit's latency,
and the commits per second that min(N, max-size) threads reach, shown as turns/s at
this turn's commits per turn. Its own N-vs-1 ratio, printed beside the verdict, is
what this machine's CPUs, disk and driver allow before any turnkit code runs.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import _floor
from _floor import Row

import turnkit
from turnkit import (
    AssistantMessage,
    Message,
    ModelDelta,
    ModelDone,
    ModelReply,
    StopReason,
    TextDelta,
    ToolCall,
    ToolMessage,
    ToolSpec,
)
from turnkit.stores import MemoryStore, SqliteStore, Store
from turnkit.testing import CrashingStore

StoreKind = Literal["sqlite", "postgres"]
ToolKind = Literal["def", "async"]

RATIO_BAR = 5.0  # PostgreSQL: turns/s at the largest N / turns/s at the smallest
_ALL_STORES: list[StoreKind] = ["sqlite", "postgres"]
_TOOL_NAME = {"def": "noop", "async": "noop_async"}
_AGENT = "bench"


# -- the zero-latency model and the no-op tools ----------------------------------


class PairsModel:
    """Calls ``tool`` until this turn has ``pairs`` tool results, then answers.

    The count comes from the transcript's tail (the messages after the turn's
    opening), so one model serves every session and every turn without state.
    """

    def __init__(self, pairs: int, tool: str) -> None:
        self.pairs = pairs
        self.tool = tool
        self._tool_stop = StopReason(kind="tool_use")
        self._end_stop = StopReason(kind="end_turn")

    async def stream(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        *,
        system: str | None,
    ) -> AsyncIterator[ModelDelta]:
        done = 0
        for m in reversed(messages):
            if isinstance(m, ToolMessage):
                done += 1
            elif not isinstance(m, AssistantMessage):
                break  # the opening
        if done < self.pairs:
            n = len(messages)
            call = ToolCall(id=f"c{n}", name=self.tool, input={"k": n})
            yield TextDelta(text="ok")
            yield ModelDone(reply=ModelReply(text="ok", tool_calls=(call,), stop=self._tool_stop))
        else:
            yield TextDelta(text="done")
            yield ModelDone(reply=ModelReply(text="done", stop=self._end_stop))


@turnkit.tool
def noop(k: int = 0) -> dict[str, Any]:
    """Do nothing and say so."""
    return {"ok": True, "k": k}


@turnkit.tool
async def noop_async(k: int = 0) -> dict[str, Any]:
    """Do nothing, asynchronously, and say so."""
    return {"ok": True, "k": k}


def _agent(tool: ToolKind, pairs: int) -> turnkit.Agent:
    fn = noop if tool == "def" else noop_async
    return turnkit.Agent(name=_AGENT, model=PairsModel(pairs, _TOOL_NAME[tool]), tools=[fn])


# -- one measured run ------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """What every run shares: the turn's shape, how long to time, where stores live."""

    pairs: int
    turns: int  # per session per round
    min_seconds: float
    max_size: int
    tmp: Path
    dsn: str


@dataclass
class CaseResult:
    store: StoreKind
    tool: ToolKind
    sessions: int
    commits_per_turn: float
    turns_per_s: float
    commits_per_s: float
    turn_ms_p50: float  # one turn's latency as its session sees it
    turn_ms_p90: float
    runs: list[dict[str, Any]] = field(default_factory=list)


@asynccontextmanager
async def _fresh_store(kind: StoreKind, cfg: Config) -> AsyncIterator[Store]:
    if kind == "sqlite":
        yield SqliteStore(cfg.tmp / f"throughput-{uuid.uuid4().hex[:8]}.db")
        return
    from turnkit.stores import PostgresStore

    schema = _floor.fresh_schema("tput")
    try:
        yield PostgresStore(cfg.dsn, schema=schema, min_size=cfg.max_size, max_size=cfg.max_size)
    finally:
        await asyncio.to_thread(_floor.drop_schema, cfg.dsn, schema)


async def _round(
    runtime: turnkit.Runtime, tag: str, n: int, turns: int, latencies: list[float]
) -> float:
    """N fresh sessions run ``turns`` turns each, all at once; return the wall time."""
    clock = time.perf_counter

    async def drive(session: turnkit.AgentSession) -> None:
        for _ in range(turns):
            t0 = clock()
            await session.turn("go")
            latencies.append(clock() - t0)

    sessions = [runtime.session(_AGENT, f"{tag}-{i}") for i in range(n)]
    t0 = clock()
    await asyncio.gather(*(drive(s) for s in sessions))
    return clock() - t0


async def _run(kind: StoreKind, tool: ToolKind, n: int, cfg: Config) -> dict[str, Any]:
    async with (
        _fresh_store(kind, cfg) as store,
        turnkit.Runtime(_agent(tool, cfg.pairs), store=store) as runtime,
    ):
        await _round(runtime, "warm", n, 1, [])  # threads, prepared statements
        latencies: list[float] = []
        seconds, turns, rounds = 0.0, 0, 0
        gc.collect()
        while rounds == 0 or seconds < cfg.min_seconds:
            seconds += await _round(runtime, f"r{rounds}", n, cfg.turns, latencies)
            turns += n * cfg.turns
            rounds += 1
    latencies.sort()
    return {
        "rounds": rounds,
        "turns": turns,
        "seconds": seconds,
        "turns_per_s": turns / seconds,
        "turn_ms_p50": latencies[len(latencies) // 2] * 1e3,
        "turn_ms_p90": latencies[int(len(latencies) * 0.9)] * 1e3,
    }


async def commits_per_turn(tool: ToolKind, pairs: int) -> float:
    """How many commits one turn of this shape makes, counted at the store seam."""
    counting = CrashingStore(MemoryStore())
    async with turnkit.Runtime(_agent(tool, pairs), store=counting) as runtime:
        session = runtime.session(_AGENT, "count")
        await session.turn("go")  # a session's first turn has no previous one to read
        before = counting.commits
        for _ in range(3):
            await session.turn("go")
    return (counting.commits - before) / 3


async def measure_case(
    kind: StoreKind, tool: ToolKind, n: int, runs: int, cfg: Config, per_turn: float
) -> CaseResult:
    samples = [await _run(kind, tool, n, cfg) for _ in range(runs)]

    def med(key: str) -> float:
        return statistics.median(s[key] for s in samples)

    tps = med("turns_per_s")
    return CaseResult(
        store=kind,
        tool=tool,
        sessions=n,
        commits_per_turn=per_turn,
        turns_per_s=tps,
        commits_per_s=tps * per_turn,
        turn_ms_p50=med("turn_ms_p50"),
        turn_ms_p90=med("turn_ms_p90"),
        runs=samples,
    )


# -- the PostgreSQL floor ----------------------------------------------------------


@dataclass
class PgFloor:
    pool_size: int
    commit_us: float  # one bare commit, one thread, sequential
    commits_per_s: dict[int, float]  # by N: min(N, pool_size) threads committing at once
    threads: dict[int, int]


def _rows_for(template: list[list[Row]], session: str) -> list[list[Row]]:
    return [[(sql, (session, *params[1:])) for sql, params in rows] for rows in template]


def _concurrent_commits(pool: Any, threads: int, per_thread: int, tag: str) -> float:
    """Commits per second with ``threads`` threads each committing ``per_thread`` times."""
    template = [_floor.pyformat(r) for r in _floor.bare_commits(per_thread // 2, "0" * 32, "t")]
    work = [_rows_for(template, f"{tag}-{i}") for i in range(threads)]
    start = threading.Barrier(threads + 1)

    def commit_all(commits: list[list[Row]]) -> None:
        start.wait()
        for rows in commits:
            with pool.connection() as conn:
                _floor.commit_pipelined(conn, rows)

    workers = [threading.Thread(target=commit_all, args=(w,)) for w in work]
    for w in workers:
        w.start()
    start.wait()
    t0 = time.perf_counter()
    for w in workers:
        w.join()
    return threads * len(template) / (time.perf_counter() - t0)


def measure_pg_floor(dsn: str, sessions: Sequence[int], pool_size: int, runs: int) -> PgFloor:
    per_thread = 400
    with _floor.floor_pool(dsn, size=pool_size) as pool:
        _concurrent_commits(pool, pool_size, 20, "warm")  # every connection prepared
        latency = statistics.median(
            1e6 / _concurrent_commits(pool, 1, per_thread, f"lat{r}") for r in range(runs)
        )
        threads = {n: min(n, pool_size) for n in sessions}
        rates = {
            n: statistics.median(
                _concurrent_commits(pool, t, per_thread, f"n{n}r{r}") for r in range(runs)
            )
            for n, t in threads.items()
        }
    return PgFloor(pool_size=pool_size, commit_us=latency, commits_per_s=rates, threads=threads)


# -- report ----------------------------------------------------------------------


def print_table(cases: list[CaseResult]) -> None:
    header = (
        f"{'store':<8} {'tool':<6} {'sessions':>8} {'turns/s':>9} {'commits/s':>10} "
        f"{'vs N=' + str(min(c.sessions for c in cases)):>8} {'turn ms p50':>12} "
        f"{'p90':>8}"
    )
    print(header)
    print("-" * len(header))
    for c in cases:
        base = _base(cases, c)
        print(
            f"{c.store:<8} {c.tool:<6} {c.sessions:>8} {c.turns_per_s:>9.1f} "
            f"{c.commits_per_s:>10.1f} {c.turns_per_s / base.turns_per_s:>7.2f}x "
            f"{c.turn_ms_p50:>12.2f} {c.turn_ms_p90:>8.2f}"
        )


def _base(cases: list[CaseResult], c: CaseResult) -> CaseResult:
    mine = [x for x in cases if x.store == c.store and x.tool == c.tool]
    return min(mine, key=lambda x: x.sessions)


def print_pg_floor(floor: PgFloor, cases: list[CaseResult]) -> None:
    per_turn = {c.tool: c.commits_per_turn for c in cases if c.store == "postgres"}
    print(f"PostgreSQL floor (psycopg alone, pool of {floor.pool_size}, one pipeline per commit):")
    print(
        f"  one bare commit (BEGIN + step + message + event row + COMMIT): {floor.commit_us:.1f} µs"
    )
    for n, rate in floor.commits_per_s.items():
        turns = " / ".join(f"{rate / k:.1f} ({t})" for t, k in per_turn.items())
        engine = " / ".join(
            f"{100 * c.commits_per_s / rate:.0f}% ({c.tool})"
            for c in cases
            if c.store == "postgres" and c.sessions == n
        )
        print(
            f"  N={n:<4} {floor.threads[n]:>3} threads: {rate:8.1f} commits/s "
            f"= floor turns/s {turns or '-'}; engine reaches {engine or '-'}"
        )


def verdicts(cases: list[CaseResult], floor: PgFloor | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for store in _ALL_STORES:
        for tool in ("def", "async"):
            mine = [c for c in cases if c.store == store and c.tool == tool]
            if len(mine) < 2:
                continue
            low = min(mine, key=lambda c: c.sessions)
            high = max(mine, key=lambda c: c.sessions)
            ratio = high.turns_per_s / low.turns_per_s
            barred = store == "postgres"
            out.append(
                {
                    "store": store,
                    "tool": tool,
                    "low_sessions": low.sessions,
                    "high_sessions": high.sessions,
                    "low_turns_per_s": low.turns_per_s,
                    "high_turns_per_s": high.turns_per_s,
                    "ratio": ratio,
                    "bar": RATIO_BAR if barred else None,
                    "ok": ratio >= RATIO_BAR if barred else None,
                    "floor_ratio": (
                        floor.commits_per_s[high.sessions] / floor.commits_per_s[low.sessions]
                        if barred and floor is not None
                        else None
                    ),
                }
            )
    return out


def print_verdicts(rows: list[dict[str, Any]]) -> None:
    for v in rows:
        if v["ok"] is None:
            judged = "no bar (commits run on the event-loop thread): n/a"
        else:
            judged = f"≥ {v['bar']:g}x: {'PASS' if v['ok'] else 'FAIL'}"
        floor = ""
        if v.get("floor_ratio") is not None:
            floor = f" [psycopg-alone floor, same N: {v['floor_ratio']:.2f}x]"
        print(
            f"VERDICT {v['store']} ({v['tool']}): N={v['high_sessions']} vs "
            f"N={v['low_sessions']}: {v['high_turns_per_s']:.1f} / "
            f"{v['low_turns_per_s']:.1f} turns/s = {v['ratio']:.2f}x vs {judged}{floor}"
        )


# -- main ------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=(
            "Turns per second one process completes over N concurrent sessions "
            "(zero-latency model, no-op tool) on SqliteStore and PostgresStore."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--sessions", type=int, nargs="+", default=[1, 10, 100])
    p.add_argument("--stores", nargs="+", choices=_ALL_STORES, default=None)
    p.add_argument(
        "--tools",
        nargs="+",
        choices=["def", "async"],
        default=["def", "async"],
        help="no-op tool variants: plain def (local) and async def (remote)",
    )
    p.add_argument("--pairs", type=int, default=2, help="model+tool step pairs per turn")
    p.add_argument("--turns", type=int, default=20, help="turns per session per round")
    p.add_argument("--min-seconds", type=float, default=1.0, help="timed seconds per run, at least")
    p.add_argument("--runs", type=int, default=3, help="runs per case; figures are medians")
    p.add_argument("--max-size", type=int, default=20, help="PostgresStore pool size")
    p.add_argument(
        "--dsn",
        default=os.environ.get("TURNKIT_BENCH_POSTGRES_DSN", _floor.DEFAULT_DSN),
        help="PostgreSQL to use (env TURNKIT_BENCH_POSTGRES_DSN); each run gets a fresh schema",
    )
    p.add_argument("--no-floor", action="store_true", help="skip the PostgreSQL floor")
    p.add_argument("--json", type=Path, metavar="PATH", help="also write the results here")
    args = p.parse_args(argv)
    if min(args.sessions) < 1 or args.pairs < 0 or args.turns < 1 or args.runs < 1:
        p.error("--sessions, --turns and --runs must be positive, --pairs not negative")
    if args.max_size < 1:
        p.error("--max-size must be positive")
    args.sessions = sorted(set(args.sessions))
    return args


def _resolve_stores(args: argparse.Namespace) -> tuple[list[StoreKind], dict[str, Any] | None]:
    """The stores to run and, with postgres among them, the server's description."""
    explicit = args.stores is not None
    stores: list[StoreKind] = list(args.stores) if explicit else list(_ALL_STORES)
    if "postgres" not in stores:
        return stores, None
    try:
        info = _floor.server_info(args.dsn)
    except Exception as exc:
        if explicit:
            raise SystemExit(
                f"postgres: cannot connect to {_floor.redact(args.dsn)}: {exc}"
            ) from exc
        print(
            f"(postgres skipped: cannot connect to {_floor.redact(args.dsn)}: {exc})",
            file=sys.stderr,
        )
        return [s for s in stores if s != "postgres"], None
    free = int(info["settings"]["max_connections"]) - int(info["connections_in_use"] or 0) - 3
    if args.max_size + 2 > free:
        raise SystemExit(
            f"postgres: --max-size {args.max_size} needs {args.max_size + 2} connections "
            f"(pool, writer-lock connection, migration) but only about {free} are free "
            f"(max_connections={info['settings']['max_connections']})"
        )
    return stores, info


async def run_cases(
    args: argparse.Namespace, stores: Sequence[StoreKind], cfg: Config
) -> list[CaseResult]:
    per_turn = {t: await commits_per_turn(t, cfg.pairs) for t in args.tools}
    cases: list[CaseResult] = []
    for store in stores:
        for tool in args.tools:
            for n in args.sessions:
                cases.append(await measure_case(store, tool, n, args.runs, cfg, per_turn[tool]))
    return cases


def _config(args: argparse.Namespace) -> dict[str, Any]:
    out = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    out["dsn"] = _floor.redact(args.dsn)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    stores, pg_info = _resolve_stores(args)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="turnkit-tput-") as d:
        cfg = Config(
            pairs=args.pairs,
            turns=args.turns,
            min_seconds=args.min_seconds,
            max_size=args.max_size,
            tmp=Path(d),
            dsn=args.dsn,
        )
        # The floor first: right after thousands of engine commits the server is still
        # writing them back, which would make the bare commit look dearer than it is.
        floor = None
        if "postgres" in stores and not args.no_floor:
            floor = measure_pg_floor(args.dsn, args.sessions, args.max_size, args.runs)
        cases = asyncio.run(run_cases(args, stores, cfg))

    print(
        f"turnkit throughput: python {platform.python_version()}, sqlite "
        f"{sqlite3.sqlite_version}, {platform.machine()}, {os.cpu_count()} CPUs, "
        f"median of {args.runs} runs"
    )
    if pg_info is not None:
        print(_floor.describe(pg_info) + f"; PostgresStore pool {args.max_size}")
    counted = {c.tool: c.commits_per_turn for c in cases}
    per_turn = ", ".join(f"{k:g} ({tool})" for tool, k in counted.items())
    print(
        f"(turn = {args.pairs} model+tool pairs + final answer; commits per turn {per_turn}; "
        f"{args.turns} turns per session per round, ≥ {args.min_seconds:g} s timed per run)"
    )
    print()
    print_table(cases)
    if floor is not None:
        print()
        print_pg_floor(floor, cases)
    print()
    rows = verdicts(cases, floor)
    print_verdicts(rows)
    elapsed = time.perf_counter() - started
    print(f"\n(total {elapsed:.1f} s)")

    if args.json is not None:
        payload: dict[str, Any] = {
            "python": sys.version,
            "sqlite": sqlite3.sqlite_version,
            "postgres": pg_info,
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "config": _config(args),
            "stores": stores,
            "cases": [asdict(c) for c in cases],
            "pg_floor": asdict(floor) if floor is not None else None,
            "verdicts": rows,
            "bars": {"ratio_postgres": RATIO_BAR},
            "elapsed_s": elapsed,
        }
        args.json.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n")
        print(f"wrote {args.json}")
    return 0 if all(v["ok"] is not False for v in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
