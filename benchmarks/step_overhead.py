"""Engine overhead per model+tool step pair, on each store, at growing transcript lengths.

Run from the repo root::

    .venv/bin/python benchmarks/step_overhead.py            # full run, about a minute
    .venv/bin/python benchmarks/step_overhead.py --runs 3 --steps 10 100
    .venv/bin/python benchmarks/step_overhead.py --stores postgres --dsn postgresql://…
    .venv/bin/python benchmarks/step_overhead.py --json results.json
    .venv/bin/python benchmarks/step_overhead.py --tracer sdk   # with OpenTelemetry spans
    .venv/bin/python benchmarks/step_overhead.py --history      # history policies' cost
    .venv/bin/python benchmarks/step_overhead.py --codec aes    # encryption's cost
    .venv/bin/python benchmarks/step_overhead.py --blobs        # blobs' cost, small payloads

Each case is ONE turn on a fresh session and store: a zero-latency model calls a
no-op tool once per model step for N steps and then answers with text, so the turn
commits N model steps, N tool steps and a final model step. Before it, untimed, the
same runtime runs a one-pair turn on another session, so that the timed turn finds
the store as a running service has it (PostgreSQL's pool connected, statements
prepared, the tool threads started, the caches a full collection before it emptied
filled again), as the floors find theirs; ``--cold`` leaves that out. The whole turn is timed
(``turn µs/pair`` = turn time / N, fixed per-turn costs included) and so are windows
inside it, from ``time.perf_counter()`` taken at each ``action.completed`` event: the
first pairs (from ``turn.started`` to the W-th ``action.completed``) and the last W
pairs. ``growth`` is last-window cost / first-window cost (median of the per-run
ratios); it shows whether a step costs more as the transcript grows. ``cpu µs/pair``
is the process's CPU time over the turn (every thread's) / N: other processes' load
inflates it far less than the wall figures, so compare changes by it on a shared
machine. ``typical`` is the median pair (of the intervals between consecutive
``action.completed`` events): a turn's mean counts the few pairs a loaded machine
stalls for milliseconds (a thread that slept waits for a core), its median does not.
Every figure is the median of ``--runs`` runs.

Before any run, the benchmark collects once and freezes what start-up left alive
(``gc.freeze()``, as ``turnkit worker`` does); before each run and each floor, it
collects the two younger generations, so every run starts from the same heap. Not
a full collection: one (even with nothing to walk) leaves the interpreter cold for
the next few milliseconds. Measured here, a 100-pair turn after one warm pair paid
133, 71, 63, 61 µs for its first pairs against 49 µs for its last, ~3 µs a pair
over the turn; ``sys._clear_type_cache()`` alone does much the same, so it is the
interpreter's warm state, not the heap, and a service pays it once per full
collection, not once per turn. ``--full-collect`` times the old way.

After the table come the ``def - async`` lines: what a ``def`` tool costs per pair
over an ``async`` one at each store and length, wall and CPU, beside one thread hop
(loop -> thread -> loop, ``thread_hop.hop_floor``) timed in the same run. A ``def``
tool must leave the event loop (it may block) and an ``async`` one need not, so the
bar a ``def`` tool is held to is one hop + 25 µs of CPU over the ``async`` one.

The verdicts: SQLite and PostgreSQL pairs (``def`` and ``async``, at 100 pairs and
more) at most 1.3x two bare commits of their floor in the same run, growth at most
1.1x; the memory store's ``async`` pair at most 60 µs of CPU (the engine's own cost).

``--codec aes`` times every case twice, run by run in turn: on the plain store and on
the same store sealing every payload with ``turnkit.crypto.EnvelopeCodec`` (AES-GCM
envelopes, a ``KeyRing`` holding one key), and reports encryption's cost per pair as
the median of the runs' differences. The bar: at most 30 µs a pair on SQLite.

``--blobs`` does the same with and without a blob store (``FileBlobStore`` on
SQLite, ``blobs=True`` on PostgreSQL, ``MemoryBlobStore`` on the memory store). The
payloads here are small, so nothing spills: it is what turning blobs on costs every
step that carries no large payload (``benchmarks/large_payloads.py`` times the ones
that do).

``--history`` times the history policy instead: sessions of ``--history-turns``
turns under each policy (see ``_history_bench.py``), per model step, first and last
``--history-window`` turns, the policy's cost over no policy, and the floor.

The SQLite floor is what SQLite alone charges on this machine for the rows the engine
writes: the same PRAGMAs and schema, ``BEGIN IMMEDIATE`` + one step, one message and
one event row + ``COMMIT``, with pre-encoded JSON bodies of the engine's own sizes, no
turnkit code.

PostgreSQL (``--dsn``, default ``$TURNKIT_BENCH_POSTGRES_DSN`` or the local server):
every run opens ``PostgresStore`` on a fresh schema and drops it afterwards. Its floor
commits the same rows with psycopg alone over a ``psycopg_pool.ConnectionPool`` of
autocommit connections on a fresh migrated schema, in the store's shape (one pipeline:
``BEGIN``, the rows, ``COMMIT``): "one bare commit" is one step, one message and one
event row; the engine's exact pair is its 4-row model commit plus 3-row tool commit.
For reference it also times the bare commit unpipelined (five round trips), with the
store's writer fence added, and one ``SELECT 1`` round trip. When PostgreSQL is not
reachable and ``--stores`` was not given, the postgres cases are skipped with a note.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import _floor
import _history_bench as hb
import thread_hop
from _floor import Row, pair_rows, pyformat

import turnkit
from turnkit import (
    Message,
    ModelDelta,
    ModelDone,
    ModelReply,
    StopReason,
    TextDelta,
    ToolCall,
    ToolSpec,
    TurnEvent,
)
from turnkit.stores import FileBlobStore, MemoryBlobStore, MemoryStore, SqliteStore, Store
from turnkit.stores._sqlite_schema import MIGRATIONS, migrate

StoreKind = Literal["memory", "sqlite", "postgres"]
ToolKind = Literal["def", "async"]

PAIR_FACTOR = 1.3  # SQLite and PostgreSQL: pair ≤ this times two bare commits
GROWTH_BAR = 1.1  # a pair's last-window cost / first-window cost, any store
HISTORY_GROWTH_BAR = 1.2  # --history: the policy's prepare, last turns / first turns
MEMORY_CPU_BAR_US = 60.0  # MemoryStore, async tool: the engine's CPU per pair
DEF_OVER_HOP_US = 25.0  # a def tool ≤ async + one thread hop + this, CPU per pair
CODEC_BAR_US = 30.0  # SQLite: what sealing every payload adds per model+tool pair

_TOOL_NAME = {"def": "noop", "async": "noop_async"}
_SESSION = "bench"
_WARM_SESSION = "bench-warm-up"
_TURN_ID = "0" * 32  # a uuid4().hex-sized id
_ALL_STORES: list[StoreKind] = ["memory", "sqlite", "postgres"]


# -- the zero-latency model and the no-op tools ----------------------------------


class ZeroModel:
    """Calls ``tool`` once per model step until ``steps`` tool results exist, then answers.

    The step number comes from the transcript (one opening, then assistant/tool pairs),
    so no state is kept and nothing is copied: it reads ``len(messages)`` only.
    """

    def __init__(self, steps: int, tool: str) -> None:
        self.steps = steps
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
        n = len(messages)
        if (n - 1) // 2 < self.steps:
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


# -- one measured turn -----------------------------------------------------------


@dataclass
class RunSample:
    turn_s: float  # whole turn: start() to its result
    stamps: list[float]  # perf_counter at turn.started, then at each action.completed
    cpu_s: float = 0.0  # the process's CPU time over the turn (every thread's)


@dataclass
class CaseResult:
    store: StoreKind
    tool: ToolKind
    steps: int
    window: int
    turn_ms: float
    turn_us_per_pair: float
    #: The process's CPU time over the turn / steps (every thread's): what other
    #: processes' load inflates least.
    cpu_us_per_pair: float
    #: The typical pair: the median of the turn's pair-to-pair intervals (from one
    #: ``action.completed`` to the next), which the rare pair a busy machine stalls
    #: for milliseconds leaves alone.
    typical_us_per_pair: float
    head_pairs: int
    head_us_per_pair: float
    tail_us_per_pair: float | None
    growth: float | None
    runs: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Where:
    """Where the stores live: SQLite files under ``tmp``, PostgreSQL schemas at ``dsn``."""

    tmp: Path
    dsn: str
    #: ``--tracer``: none (the default no-op), api (OtelTracer, no SDK) or sdk.
    tracer: str = "none"
    #: ``--codec``: none, or aes (an EnvelopeCodec over one key).
    codec: str = "none"
    #: ``--blobs``: whether the store keeps large payloads as blobs.
    blobs: bool = False
    #: Whether each timed turn follows a one-pair turn on another session of the same
    #: runtime (``--cold``: not), so that opening the store's connections and
    #: preparing its statements are not counted as the timed turn's pairs.
    warm: bool = True


def _codec(kind: str) -> turnkit.Codec | None:
    if kind == "none":
        return None
    from turnkit.crypto import EnvelopeCodec, KeyRing

    keys = KeyRing()
    keys.add("default", "bench-1", os.urandom(32))
    return EnvelopeCodec(keys)


_db_numbers = itertools.count()


@asynccontextmanager
async def _fresh_store(kind: StoreKind, where: Where) -> AsyncIterator[Store]:
    """A fresh, empty store for every run: one turn on one new session."""
    codec = _codec(where.codec)
    if kind == "memory":
        yield MemoryStore(codec=codec, blobs=MemoryBlobStore() if where.blobs else None)
    elif kind == "sqlite":
        n = next(_db_numbers)
        blobs = FileBlobStore(where.tmp / f"bench-{n}-blobs") if where.blobs else None
        yield SqliteStore(where.tmp / f"bench-{n}.db", codec=codec, blobs=blobs)
    else:
        from turnkit.stores import PostgresStore

        schema = _floor.fresh_schema()
        try:
            yield PostgresStore(where.dsn, schema=schema, codec=codec, blobs=where.blobs)
        finally:
            await asyncio.to_thread(_floor.drop_schema, where.dsn, schema)


def _tracer(kind: str) -> turnkit.Tracer | None:
    """The runtime's tracer for ``--tracer``: ``sdk`` records every span with the
    OpenTelemetry SDK (and exports none), ``api`` is OtelTracer with no SDK set up."""
    if kind == "none":
        return None
    from turnkit.otel import OtelTracer

    if kind == "api":
        return OtelTracer()
    from opentelemetry.sdk.trace import TracerProvider

    return OtelTracer(TracerProvider())


async def _run_turn(
    store_kind: StoreKind, tool_kind: ToolKind, steps: int, where: Where
) -> RunSample:
    tool = noop if tool_kind == "def" else noop_async
    model = ZeroModel(steps, _TOOL_NAME[tool_kind])
    agent = turnkit.Agent(name="bench", model=model, tools=[tool])
    stamps: list[float] = []
    append, clock = stamps.append, time.perf_counter

    def on_event(event: TurnEvent) -> None:
        # Same tiny cost for every event at every position in the turn.
        kind = event.type
        if kind == "action.completed" or kind == "turn.started":
            append(clock())

    async with (
        _fresh_store(store_kind, where) as store,
        turnkit.Runtime(agent, store=store, tracer=_tracer(where.tracer)) as runtime,
    ):
        settle_heap()  # (none while timing: every run starts with the same heap)
        if where.warm:
            # One pair on another session first: the store's connections open and its
            # statements are prepared, as in a service that is running (the floors
            # commit on open connections too), and caches the full collection just
            # emptied are filled again (a turn right after one costs ~0.4 ms more).
            model.steps = 1
            warm = runtime.session("bench", _WARM_SESSION)
            await warm.result(warm.start("warm up"))
            model.steps = steps
        session = runtime.session("bench", _SESSION)
        unsubscribe = session.subscribe(on_event)
        c0 = time.process_time()
        t0 = clock()
        tid = session.start("go")
        result = await session.result(tid)
        t1 = clock()
        c1 = time.process_time()
        unsubscribe()
    if result.status != "completed" or len(stamps) != steps + 1:
        raise RuntimeError(f"benchmark turn did not run as scripted: {result}, {len(stamps)}")
    return RunSample(turn_s=t1 - t0, stamps=stamps, cpu_s=c1 - c0)


#: Which generations ``settle_heap`` collects: 1 (the two younger ones), or 2 with
#: ``--full-collect`` (see the module's docstring).
_settle_generation = 1


def prepare_collector(full_collect: bool) -> None:
    """Collect once and freeze what start-up left alive; choose how each run settles."""
    global _settle_generation
    gc.collect()
    gc.freeze()
    _settle_generation = 2 if full_collect else 1


def settle_heap() -> None:
    """Before a timed run or floor: collect what earlier runs left (none while timing)."""
    gc.collect(_settle_generation)


def _median(values: Sequence[float]) -> float:
    return statistics.median(values)


async def _measure_case(
    store_kind: StoreKind, tool_kind: ToolKind, steps: int, runs: int, window: int, where: Where
) -> CaseResult:
    samples = [await _run_turn(store_kind, tool_kind, steps, where) for _ in range(runs)]
    return _summarize(store_kind, tool_kind, steps, window, samples)


def _summarize(
    store_kind: StoreKind, tool_kind: ToolKind, steps: int, window: int, samples: list[RunSample]
) -> CaseResult:
    head_n = min(window, steps)
    has_tail = steps >= 2 * window
    per_run: list[dict[str, Any]] = []
    for s in samples:
        st = s.stamps  # st[0] = turn.started, st[k] = k-th action.completed
        head = (st[head_n] - st[0]) / head_n * 1e6
        tail = (st[steps] - st[steps - window]) / window * 1e6 if has_tail else None
        per_run.append(
            {
                "turn_ms": s.turn_s * 1e3,
                "turn_us_per_pair": s.turn_s / steps * 1e6,
                "cpu_us_per_pair": s.cpu_s / steps * 1e6,
                "typical_us_per_pair": _median([b - a for a, b in itertools.pairwise(st)]) * 1e6,
                "head_us_per_pair": head,
                "tail_us_per_pair": tail,
                "growth": tail / head if tail is not None else None,
            }
        )

    def med(key: str) -> float:
        return _median([r[key] for r in per_run])

    return CaseResult(
        store=store_kind,
        tool=tool_kind,
        steps=steps,
        window=window,
        turn_ms=med("turn_ms"),
        turn_us_per_pair=med("turn_us_per_pair"),
        cpu_us_per_pair=med("cpu_us_per_pair"),
        typical_us_per_pair=med("typical_us_per_pair"),
        head_pairs=head_n,
        head_us_per_pair=med("head_us_per_pair"),
        tail_us_per_pair=med("tail_us_per_pair") if has_tail else None,
        growth=med("growth") if has_tail else None,
        runs=per_run,
    )


# -- encryption's cost (--codec aes) --------------------------------------------------


@dataclass
class CodecCase:
    store: StoreKind
    tool: ToolKind
    steps: int
    plain_us_per_pair: float
    sealed_us_per_pair: float
    #: Median of the runs' differences (each run times both, one after the other).
    cost_us_per_pair: float
    #: The same in the process's CPU time, which other processes' load does not inflate.
    plain_cpu_us_per_pair: float
    sealed_cpu_us_per_pair: float
    cpu_cost_us_per_pair: float


async def run_codec_cases(
    args: argparse.Namespace, stores: Sequence[StoreKind], where: Where
) -> list[CodecCase]:
    """Each case on the plain store and on the sealed one (or, with ``--blobs``, the
    one with blobs), run by run in turn."""
    sealed = replace(where, blobs=True) if args.blobs else replace(where, codec="aes")
    out: list[CodecCase] = []
    for store in stores:
        for tool in args.tools:
            for _ in range(args.warmup):
                await _run_turn(store, tool, min(100, max(args.steps)), where)
                await _run_turn(store, tool, min(100, max(args.steps)), sealed)
            for steps in args.steps:
                plain: list[RunSample] = []
                aes: list[RunSample] = []
                for _ in range(args.runs):
                    plain.append(await _run_turn(store, tool, steps, where))
                    aes.append(await _run_turn(store, tool, steps, sealed))
                out.append(_codec_case(store, tool, steps, plain, aes))
    return out


def _codec_case(
    store: StoreKind, tool: ToolKind, steps: int, plain: list[RunSample], aes: list[RunSample]
) -> CodecCase:
    def per_pair(samples: list[RunSample], cpu: bool) -> list[float]:
        return [(s.cpu_s if cpu else s.turn_s) / steps * 1e6 for s in samples]

    def cost(cpu: bool) -> float:
        pairs = zip(per_pair(aes, cpu), per_pair(plain, cpu), strict=True)
        return _median([a - p for a, p in pairs])

    return CodecCase(
        store=store,
        tool=tool,
        steps=steps,
        plain_us_per_pair=_median(per_pair(plain, False)),
        sealed_us_per_pair=_median(per_pair(aes, False)),
        cost_us_per_pair=cost(False),
        plain_cpu_us_per_pair=_median(per_pair(plain, True)),
        sealed_cpu_us_per_pair=_median(per_pair(aes, True)),
        cpu_cost_us_per_pair=cost(True),
    )


def print_codec_table(cases: list[CodecCase], blobs: bool = False) -> bool:
    """The table of encryption's (or blobs') cost, and whether SQLite's stays within
    the bar (encryption's; blobs have none)."""
    if blobs:
        print("blobs' cost on small payloads (nothing spills), µs per pair:")
        print("wall = turn time / steps; cpu = the process's CPU time / steps")
    else:
        print("encryption's cost (EnvelopeCodec: AES-GCM, a data key per session), µs per pair:")
        print("wall = turn time / steps; cpu = the process's CPU time / steps (the bar's figure)")
    other = "blobs" if blobs else "sealed"
    print(
        f"{'store':<9}{'tool':<7}{'steps':>6}{'wall plain':>12}{other:>9}{'cost':>8}"
        f"{'cpu plain':>11}{other:>9}{'cost':>8}"
    )
    for c in cases:
        print(
            f"{c.store:<9}{c.tool:<7}{c.steps:>6}{c.plain_us_per_pair:>12.1f}"
            f"{c.sealed_us_per_pair:>9.1f}{c.cost_us_per_pair:>8.1f}"
            f"{c.plain_cpu_us_per_pair:>11.1f}{c.sealed_cpu_us_per_pair:>9.1f}"
            f"{c.cpu_cost_us_per_pair:>8.1f}"
        )
    if blobs:
        return True
    sqlite = [c.cpu_cost_us_per_pair for c in cases if c.store == "sqlite"]
    ok = all(cost <= CODEC_BAR_US for cost in sqlite) if sqlite else None
    worst = f"{max(sqlite):.1f} µs" if sqlite else "-"
    print(
        f"\nVERDICT codec: SQLite CPU cost per pair at most {worst} "
        f"vs ≤ {CODEC_BAR_US:g} µs: {_word(ok)}"
    )
    return ok is not False


def codec_main(args: argparse.Namespace, stores: Sequence[StoreKind]) -> int:
    """``--codec aes``: every case plain and sealed, and the SQLite floor beside them."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="turnkit-bench-") as d:
        tmp = Path(d)
        where = Where(tmp=tmp, dsn=args.dsn, warm=not args.cold)
        cases = asyncio.run(run_codec_cases(args, stores, where))
        floor = None
        seal_floor = None
        if "sqlite" in stores and not args.no_floor:
            floor = measure_floor(
                "sqlite", max(args.steps), args.runs, args.window, _sqlite_timer(tmp)
            )
            if not args.blobs:
                seal_floor = measure_seal_floor(tmp, max(args.steps), max(args.runs, 5))
    print(
        f"turnkit {'blobs' if args.blobs else 'encryption'} cost: "
        f"python {platform.python_version()}, sqlite "
        f"{sqlite3.sqlite_version}, {platform.machine()}, {os.cpu_count()} CPUs, "
        f"median of {args.runs} runs"
    )
    print()
    ok = print_codec_table(cases, blobs=args.blobs)
    if floor is not None:
        print(
            f"SQLite floor (WAL, synchronous=NORMAL): one bare commit {floor.commit_3rows_us:.1f} "
            f"µs; a model+tool pair's exact rows {floor.pair_exact_us:.1f} µs"
        )
    if seal_floor is not None:
        print(
            f"encryption's floor (sqlite3 and cryptography alone: the pair's exact rows, each "
            f"body sealed as EnvelopeCodec seals it, {seal_floor.pairs} pairs): "
            f"+{seal_floor.cost_cpu_us:.1f} µs CPU a pair (+{seal_floor.cost_wall_us:.1f} wall) "
            f"over {seal_floor.plain_cpu_us:.1f} in the clear"
        )
    print(f"(total {time.perf_counter() - started:.1f} s)")
    if args.json is not None:
        payload = {
            "config": _config(args),
            "codec": [asdict(c) for c in cases],
            "floor": asdict(floor) if floor is not None else None,
            "seal_floor": asdict(seal_floor) if seal_floor is not None else None,
            "bar_us_sqlite": CODEC_BAR_US,
        }
        args.json.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n")
        print(f"wrote {args.json}")
    return 0 if ok else 1


# -- the SQLite floor --------------------------------------------------------------

Timer = Callable[[str, list[list[Row]]], list[float]]


def _open_floor_db(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    migrate(conn, MIGRATIONS)
    return conn


def _sqlite_timer(tmp: Path) -> Timer:
    def time_commits(tag: str, commits: list[list[Row]]) -> list[float]:
        """``perf_counter`` before the first commit and after each one, on a fresh database."""
        conn = _open_floor_db(tmp / f"floor-{tag}-{next(_db_numbers)}.db")
        try:
            execute = conn.execute
            clock = time.perf_counter
            stamps = [0.0] * (len(commits) + 1)
            settle_heap()
            stamps[0] = clock()
            for i, rows in enumerate(commits, start=1):
                execute("BEGIN IMMEDIATE")
                for sql, params in rows:
                    execute(sql, params)
                execute("COMMIT")
                stamps[i] = clock()
            return stamps
        finally:
            conn.close()

    return time_commits


@dataclass
class Floor:
    store: StoreKind
    pairs: int
    commit_3rows_us: float  # BEGIN + step + message + event + COMMIT
    pair_3rows_us: float  # two such commits
    pair_exact_us: float  # the engine's exact rows: model commit (4 rows) + tool commit (3)
    window: int
    head_pair_exact_us: float  # exact rows, first ``window`` pairs
    tail_pair_exact_us: float | None  # exact rows, last ``window`` pairs
    growth: float | None  # median of per-run tail/head
    body_bytes: dict[str, int]
    reference: dict[str, float] = field(default_factory=dict)  # PostgreSQL: other shapes


def measure_floor(store: StoreKind, pairs: int, runs: int, window: int, timer: Timer) -> Floor:
    model_commits: list[list[Row]] = []
    tool_commits: list[list[Row]] = []
    for k in range(1, pairs + 1):
        m, t = pair_rows(k, _TURN_ID, _SESSION)
        model_commits.append(m)
        tool_commits.append(t)
    # One step, one message, one event row per commit (the model commit minus its
    # action.requested row), alternating model and tool commits.
    three = _floor.bare_commits(pairs, _TURN_ID, _SESSION)
    exact: list[list[Row]] = []
    for m, t in zip(model_commits, tool_commits, strict=True):
        exact += [m, t]
    n3, nx = len(three), len(exact)
    c3 = _median([(s[-1] - s[0]) / n3 for s in (timer("3rows", three) for _ in range(runs))])
    head_n = min(window, pairs)
    has_tail = pairs >= 2 * window
    totals: list[float] = []
    heads: list[float] = []
    tails: list[float] = []
    for _ in range(runs):
        st = timer("exact", exact)  # st[2k] = after pair k
        totals.append((st[-1] - st[0]) / nx)
        heads.append((st[2 * head_n] - st[0]) / head_n)
        if has_tail:
            tails.append((st[2 * pairs] - st[2 * (pairs - window)]) / window)
    ce = _median(totals)
    m0, t0 = model_commits[0], tool_commits[0]
    names = ["model.step", "model.message", "model.event.completed", "model.event.requested"]
    sizes = {n: len(r[1][3]) for n, r in zip(names, m0, strict=True)}
    sizes |= {
        n: len(r[1][3])
        for n, r in zip(["tool.step", "tool.message", "tool.event"], t0, strict=True)
    }
    return Floor(
        store=store,
        pairs=pairs,
        commit_3rows_us=c3 * 1e6,
        pair_3rows_us=2 * c3 * 1e6,
        pair_exact_us=2 * ce * 1e6,
        window=head_n,
        head_pair_exact_us=_median(heads) * 1e6,
        tail_pair_exact_us=_median(tails) * 1e6 if has_tail else None,
        growth=_median([t / h for t, h in zip(tails, heads, strict=True)]) if has_tail else None,
        body_bytes=sizes,
    )


# -- what sealing costs with no turnkit code ---------------------------------------


@dataclass
class SealFloor:
    pairs: int
    #: CPU µs a pair: sqlite3 committing a pair's exact rows in the clear.
    plain_cpu_us: float
    #: The same rows, each body sealed first (median of the runs' paired differences).
    cost_cpu_us: float
    cost_wall_us: float


def _floor_sealer(session: str) -> Callable[[str, bytes], bytearray]:
    """Sealing as ``EnvelopeCodec`` does it, written out with ``cryptography`` alone:
    AES-GCM under one 256-bit key, a fresh random nonce from a pool (one system call
    per 512), the row's field and ``session`` as associated data, the envelope's
    header naming the key, and the store's NUL in front, joined as a ``bytearray``
    (which ``sqlite3`` binds without looking for an adapter, as the store does)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    encrypt = AESGCM(os.urandom(32)).encrypt
    head = bytes([0, 1, 7]) + b"bench-1"
    bound = {kind: f"{kind}\0{session}".encode() for kind in ("step", "message", "event")}
    nonces: list[bytes] = []
    join = bytearray().join

    def seal(kind: str, body: bytes) -> bytearray:
        if not nonces:
            batch = os.urandom(12 * 512)
            nonces.extend(batch[i : i + 12] for i in range(0, len(batch), 12))
        nonce = nonces.pop()
        return join((head, nonce, encrypt(nonce, body, bound[kind])))

    return seal


_KIND = {_floor.SQL_STEP: "step", _floor.SQL_MSG: "message", _floor.SQL_EVENT: "event"}


def measure_seal_floor(tmp: Path, pairs: int, runs: int) -> SealFloor:
    """sqlite3 alone committing ``pairs`` pairs' exact rows, in the clear and with
    every body sealed in the timed loop, run by run in turn: what encryption costs
    a pair before any of turnkit's code (the floor of the codec's cost)."""
    seal = _floor_sealer(_SESSION)
    commits: list[list[Row]] = []
    for k in range(1, pairs + 1):
        commits += list(pair_rows(k, _TURN_ID, _SESSION))
    encoded = [[(sql, (*p[:3], p[3].encode())) for sql, p in rows] for rows in commits]

    def timed(sealed: bool) -> tuple[float, float]:
        conn = _open_floor_db(tmp / f"seal-floor-{next(_db_numbers)}.db")
        try:
            execute = conn.execute
            settle_heap()
            c0, t0 = time.process_time(), time.perf_counter()
            for rows in encoded if sealed else commits:
                execute("BEGIN IMMEDIATE")
                for sql, params in rows:
                    if sealed:
                        body = seal(_KIND[sql], params[3])
                        params = (*params[:3], body)
                    execute(sql, params)
                execute("COMMIT")
            return time.process_time() - c0, time.perf_counter() - t0
        finally:
            conn.close()

    plain: list[tuple[float, float]] = []
    sealed: list[tuple[float, float]] = []
    for _ in range(runs):
        plain.append(timed(False))
        sealed.append(timed(True))
    per = 1e6 / pairs
    return SealFloor(
        pairs=pairs,
        plain_cpu_us=_median([c for c, _ in plain]) * per,
        cost_cpu_us=_median([(s[0] - p[0]) for s, p in zip(sealed, plain, strict=True)]) * per,
        cost_wall_us=_median([(s[1] - p[1]) for s, p in zip(sealed, plain, strict=True)]) * per,
    )


# -- the PostgreSQL floor ----------------------------------------------------------

_PG_REFERENCE_PAIRS = 250  # commits of each reference shape: twice this (or fewer)


def _pg_timer(pool: Any, commit: Callable[[Any, Sequence[Row]], None] | None = None) -> Timer:
    """Times commits over ``pool`` (one checkout per commit, as the store does), after
    emptying the tables, so each call starts from the same state as a fresh schema."""
    do_commit = commit or _floor.commit_pipelined

    def time_commits(tag: str, commits: list[list[Row]]) -> list[float]:
        converted = [pyformat(rows) for rows in commits]
        with pool.connection() as conn:
            conn.execute("TRUNCATE turnkit_steps, turnkit_messages, turnkit_events")
        connection = pool.connection
        clock = time.perf_counter
        stamps = [0.0] * (len(commits) + 1)
        settle_heap()
        stamps[0] = clock()
        for i, rows in enumerate(converted, start=1):
            with connection() as conn:
                do_commit(conn, rows)
            stamps[i] = clock()
        return stamps

    return time_commits


def _pg_round_trip_us(pool: Any, n: int = 500) -> float:
    with pool.connection() as conn:
        for _ in range(50):
            conn.execute("SELECT 1")
        t0 = time.perf_counter()
        for _ in range(n):
            conn.execute("SELECT 1")
        return (time.perf_counter() - t0) / n * 1e6


def measure_pg_floor(dsn: str, pairs: int, runs: int, window: int) -> Floor:
    with _floor.floor_pool(dsn) as pool:
        timer = _pg_timer(pool)
        warm = _floor.bare_commits(20, _TURN_ID, _SESSION)
        timer("warmup", warm)  # prepared statements, buffers
        floor = measure_floor("postgres", pairs, runs, window, timer)
        ref = _floor.bare_commits(min(pairs, _PG_REFERENCE_PAIRS), _TURN_ID, _SESSION)

        def per_commit(t: Timer) -> float:
            return _median(
                [(s[-1] - s[0]) / len(ref) * 1e6 for s in (t("ref", ref) for _ in range(runs))]
            )

        with pool.connection() as conn:
            token = _floor.take_writer(conn, _SESSION)

        def fenced(conn: Any, rows: Sequence[Row]) -> None:
            _floor.commit_fenced(conn, rows, _SESSION, token)

        floor.reference = {
            "round_trip_us": _pg_round_trip_us(pool),
            "commit_3rows_unpipelined_us": per_commit(_pg_timer(pool, _floor.commit_unpipelined)),
            "commit_3rows_fenced_us": per_commit(_pg_timer(pool, fenced)),
        }
    return floor


# -- report ----------------------------------------------------------------------


def _fmt(value: float | None, spec: str = ".1f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def print_table(cases: list[CaseResult], window: int) -> None:
    header = (
        f"{'store':<8} {'tool':<6} {'steps':>6} {'turn ms':>9} {'turn µs/pair':>13} "
        f"{'cpu µs/pair':>12} {'typical':>8} {'first ≤' + str(window) + ' µs/pair':>18} "
        f"{'last ' + str(window) + ' µs/pair':>17} {'growth':>7}"
    )
    print(header)
    print("-" * len(header))
    for c in cases:
        print(
            f"{c.store:<8} {c.tool:<6} {c.steps:>6} {c.turn_ms:>9.2f} {c.turn_us_per_pair:>13.1f} "
            f"{c.cpu_us_per_pair:>12.1f} {c.typical_us_per_pair:>8.1f} {c.head_us_per_pair:>18.1f} "
            f"{_fmt(c.tail_us_per_pair):>17} {_fmt(c.growth, '.2f', 'x'):>7}"
        )


def print_floor(floor: Floor, label: str) -> None:
    pg = floor.store == "postgres"
    begin = "BEGIN" if pg else "BEGIN IMMEDIATE"
    shape = ", one pipeline (one round trip) per commit" if pg else ""
    print(f"{label} floor ({floor.pairs} pairs{shape}):")
    print(
        f"  one bare commit ({begin} + step + message + event row + COMMIT): "
        f"{floor.commit_3rows_us:.1f} µs"
    )
    print(f"  pair floor (2 such commits): {floor.pair_3rows_us:.1f} µs")
    print(
        f"  pair floor, engine's exact rows (4-row model + 3-row tool commit): "
        f"{floor.pair_exact_us:.1f} µs"
    )
    if floor.tail_pair_exact_us is not None:
        print(
            f"  pair floor, exact rows, first {floor.window} pairs / last {floor.window} pairs: "
            f"{floor.head_pair_exact_us:.1f} / {floor.tail_pair_exact_us:.1f} µs "
            f"(growth {_fmt(floor.growth, '.2f', 'x')})"
        )
    ref = floor.reference
    if ref:
        print(
            f"  reference: bare commit unpipelined (5 round trips) "
            f"{ref['commit_3rows_unpipelined_us']:.1f} µs; pipelined + writer fence "
            f"{ref['commit_3rows_fenced_us']:.1f} µs; one round trip (SELECT 1) "
            f"{ref['round_trip_us']:.1f} µs"
        )
    sizes = ", ".join(f"{k} {v}" for k, v in floor.body_bytes.items())
    print(f"  JSON body bytes: {sizes}")


def _pair_bar(store: StoreKind, floors: dict[StoreKind, Floor]) -> tuple[float | None, str]:
    """The bar a store's pair cost is held to, and how to say it: the SQL stores
    against their floor's two bare commits (wall), the memory store's ``async`` pair
    in CPU time (``_pair_figures``)."""
    if store == "memory":
        return MEMORY_CPU_BAR_US, f"≤ {MEMORY_CPU_BAR_US:.0f} µs CPU (async)"
    floor = floors.get(store)
    if floor is None:
        return None, "no bar (no floor measured)"
    bar = PAIR_FACTOR * floor.pair_3rows_us
    return bar, f"≤ {PAIR_FACTOR} * 2 * {floor.commit_3rows_us:.0f} µs bare commit = {bar:.0f} µs"


def _pair_figures(store: StoreKind, cases: list[CaseResult]) -> dict[str, float]:
    """The figures a store's bar is checked on: every ``def`` and ``async`` case of
    100 pairs or more (wall per pair), or the memory store's ``async`` CPU per pair."""
    long = [c for c in cases if c.steps >= 100] or cases
    if store == "memory":
        return {f"async@{c.steps}": c.cpu_us_per_pair for c in long if c.tool == "async"}
    return {f"{c.tool}@{c.steps}": c.turn_us_per_pair for c in long}


def verdicts(
    cases: list[CaseResult], stores: Sequence[StoreKind], floors: dict[StoreKind, Floor]
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for store in stores:
        mine = [c for c in cases if c.store == store]
        if not mine:
            continue
        longest = max(c.steps for c in mine)
        top = [c for c in mine if c.steps == longest]
        pair = _pair_figures(store, mine)
        growth = {c.tool: c.growth for c in top if c.growth is not None}
        bar, bar_text = _pair_bar(store, floors)
        floor = floors.get(store)
        out.append(
            {
                "store": store,
                "steps": longest,
                "pair_us": pair,
                "pair_bar_us": bar,
                "pair_bar": bar_text,
                "pair_ok": all(v <= bar for v in pair.values()) if bar is not None else None,
                "growth": growth,
                "growth_bar": GROWTH_BAR,
                "growth_ok": all(v <= GROWTH_BAR for v in growth.values()) if growth else None,
                "pair_over_floor": (
                    {c.tool: c.turn_us_per_pair - floor.pair_exact_us for c in top}
                    if floor is not None
                    else None
                ),
            }
        )
    return out


# -- a def tool's cost over an async one -------------------------------------------


@dataclass
class DefOverAsync:
    """A ``def`` tool's cost over an ``async`` one at one store and length, µs per
    pair, beside the thread hop measured in the same run."""

    store: StoreKind
    steps: int
    wall_us: float
    cpu_us: float
    typical_us: float
    hop_wall_us: float
    hop_cpu_us: float

    @property
    def bar_cpu_us(self) -> float:
        """What a def tool may cost over an async one: one hop and ``DEF_OVER_HOP_US``."""
        return self.hop_cpu_us + DEF_OVER_HOP_US


def def_over_async(cases: list[CaseResult], hop: thread_hop.HopFloor) -> list[DefOverAsync]:
    """``def - async`` for every store and length timed with both tools."""
    out: list[DefOverAsync] = []
    by_key = {(c.store, c.tool, c.steps): c for c in cases}
    for (store, tool, steps), d in by_key.items():
        a = by_key.get((store, "async", steps))
        if tool != "def" or a is None:
            continue
        out.append(
            DefOverAsync(
                store=store,
                steps=steps,
                wall_us=d.turn_us_per_pair - a.turn_us_per_pair,
                cpu_us=d.cpu_us_per_pair - a.cpu_us_per_pair,
                typical_us=d.typical_us_per_pair - a.typical_us_per_pair,
                hop_wall_us=hop.wall_us,
                hop_cpu_us=hop.cpu_us,
            )
        )
    return out


def print_def_over_async(rows: list[DefOverAsync], hop: thread_hop.HopFloor) -> bool:
    """The ``def - async`` lines, and whether each stays within one hop + the margin."""
    print(
        f"one thread hop (loop -> thread -> loop, benchmarks/thread_hop.py, this run): "
        f"wall {hop.wall_us:.1f} µs, CPU {hop.cpu_us:.1f} µs; carrying "
        f"{hop.busy_work_us:.0f} µs of Python work, over that work on the loop: "
        f"wall {hop.busy_wall_us:.1f} µs, CPU {hop.busy_cpu_us:.1f} µs"
    )
    ok = True
    for r in rows:
        fits = r.cpu_us <= r.bar_cpu_us
        ok = ok and fits
        print(
            f"def - async  {_LABEL[r.store]:<10} @{r.steps:<5}: wall {r.wall_us:6.1f} µs "
            f"({r.wall_us / r.hop_wall_us:.1f} hops), CPU {r.cpu_us:6.1f} µs "
            f"({r.cpu_us / r.hop_cpu_us:.1f} hops), typical pair {r.typical_us:6.1f} µs "
            f"({r.typical_us / r.hop_wall_us:.1f} hops) vs ≤ one hop + {DEF_OVER_HOP_US:g} = "
            f"{r.bar_cpu_us:.1f} µs CPU: {_word(fits)}"
        )
    return ok


def _word(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "FAIL")


_LABEL = {"memory": "memory", "sqlite": "SQLite", "postgres": "PostgreSQL"}


def print_verdicts(rows: list[dict[str, Any]]) -> None:
    for v in rows:
        pair = " / ".join(f"{us:.1f} µs ({tool})" for tool, us in v["pair_us"].items())
        growth = " / ".join(f"{g:.2f}x ({tool})" for tool, g in v["growth"].items()) or "-"
        over = ""
        if v["pair_over_floor"]:
            over = (
                f" [above {_LABEL[v['store']]} floor: "
                + " / ".join(f"{us:.1f} µs ({tool})" for tool, us in v["pair_over_floor"].items())
                + "]"
            )
        print(
            f"VERDICT {v['store']}: pair {pair} vs {v['pair_bar']}: {_word(v['pair_ok'])}{over}; "
            f"growth {growth} vs ≤ {v['growth_bar']}x: {_word(v['growth_ok'])}"
        )


# -- main ------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=(
            "Time turnkit's own cost per model+tool step pair (zero-latency model, no-op "
            "tool) on MemoryStore, SqliteStore and PostgresStore, and the raw commit floors."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--runs", type=int, default=5, help="runs per case; figures are medians")
    p.add_argument(
        "--steps",
        type=int,
        nargs="+",
        default=[10, 100, 1000],
        help="transcript lengths: model+tool step pairs per turn",
    )
    p.add_argument(
        "--window",
        type=int,
        default=100,
        help="pairs per timing window (first W vs last W; last only when steps ≥ 2W)",
    )
    p.add_argument(
        "--stores",
        nargs="+",
        choices=_ALL_STORES,
        default=None,
        help="stores to time (default: all; postgres is skipped if it cannot be reached)",
    )
    p.add_argument(
        "--dsn",
        default=os.environ.get("TURNKIT_BENCH_POSTGRES_DSN", _floor.DEFAULT_DSN),
        help="PostgreSQL to use (env TURNKIT_BENCH_POSTGRES_DSN); each run gets a fresh schema",
    )
    p.add_argument(
        "--tools",
        nargs="+",
        choices=["def", "async"],
        default=["def", "async"],
        help="no-op tool variants: plain def (local) and async def (remote)",
    )
    p.add_argument(
        "--tracer",
        choices=["none", "api", "sdk"],
        default="none",
        help="spans per turn and step: none; OtelTracer without an SDK; with the SDK's provider",
    )
    p.add_argument(
        "--history",
        action="store_true",
        help="time the history policies per model step over long sessions instead",
    )
    p.add_argument(
        "--history-turns",
        type=int,
        nargs="+",
        default=[100, 1000],
        help="session lengths (turns of two model steps each) for --history",
    )
    p.add_argument("--history-window", type=int, default=100, help="turns per --history window")
    p.add_argument(
        "--policies",
        nargs="+",
        choices=list(hb.POLICIES),
        default=list(hb.POLICIES),
        help="history policies for --history (none: the whole transcript is sent)",
    )
    p.add_argument(
        "--codec",
        choices=["none", "aes"],
        default="none",
        help="aes: time every case plain and with every payload sealed (EnvelopeCodec)",
    )
    p.add_argument(
        "--blobs",
        action="store_true",
        help="time every case without and with a blob store (small payloads: nothing spills)",
    )
    p.add_argument("--warmup", type=int, default=1, help="untimed turns per store/tool first")
    p.add_argument("--no-gc", action="store_true", help="disable the cyclic GC while timing")
    p.add_argument(
        "--full-collect",
        action="store_true",
        help="a full collection before every run (the old harness: see the docstring)",
    )
    p.add_argument(
        "--cold",
        action="store_true",
        help="time each turn on a store nothing ran on yet (default: after a one-pair turn "
        "on another session, so that opening connections is not counted)",
    )
    p.add_argument("--no-floor", action="store_true", help="skip the SQLite and PostgreSQL floors")
    p.add_argument("--json", type=Path, metavar="PATH", help="also write the results here")
    args = p.parse_args(argv)
    if args.runs < 1 or args.window < 1 or min(args.steps) < 1:
        p.error("--runs, --window and --steps must be positive")
    return args


def _resolve_stores(args: argparse.Namespace) -> tuple[list[StoreKind], dict[str, Any] | None]:
    """The stores to run and, with postgres among them, the server's description."""
    explicit = args.stores is not None
    stores: list[StoreKind] = list(args.stores) if explicit else list(_ALL_STORES)
    if "postgres" not in stores:
        return stores, None
    try:
        return stores, _floor.server_info(args.dsn)
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


async def run_cases(
    args: argparse.Namespace, stores: Sequence[StoreKind], where: Where
) -> list[CaseResult]:
    cases: list[CaseResult] = []
    for store in stores:
        for tool in args.tools:
            for _ in range(args.warmup):
                await _run_turn(store, tool, min(100, max(args.steps)), where)
            for steps in args.steps:
                cases.append(await _measure_case(store, tool, steps, args.runs, args.window, where))
    return cases


def measure_floors(
    args: argparse.Namespace, stores: Sequence[StoreKind], tmp: Path
) -> dict[StoreKind, Floor]:
    floors: dict[StoreKind, Floor] = {}
    if args.no_floor:
        return floors
    pairs = max(args.steps)
    if "sqlite" in stores:
        floors["sqlite"] = measure_floor(
            "sqlite", pairs, args.runs, args.window, _sqlite_timer(tmp)
        )
    if "postgres" in stores:
        floors["postgres"] = measure_pg_floor(args.dsn, pairs, args.runs, args.window)
    return floors


def _config(args: argparse.Namespace) -> dict[str, Any]:
    out = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    out["dsn"] = _floor.redact(args.dsn)
    return out


async def run_history_cases(
    args: argparse.Namespace, stores: Sequence[StoreKind], where: Where
) -> list[hb.HistoryCase]:
    cases: list[hb.HistoryCase] = []
    for store in stores:
        async with _fresh_store(store, where) as warm:
            await hb.run_session(warm, "summarize", min(50, max(args.history_turns)))
        for turns in args.history_turns:
            for policy in args.policies:
                runs = []
                for _ in range(args.runs):
                    async with _fresh_store(store, where) as fresh:
                        runs.append(await hb.run_session(fresh, policy, turns))
                cases.append(hb.summarize_runs(store, policy, turns, args.history_window, runs))
    return hb.with_policy_costs(cases)


def history_main(args: argparse.Namespace, stores: Sequence[StoreKind]) -> int:
    """``--history``: the policies' cost per model step, and the SQLite floor."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="turnkit-bench-") as d:
        tmp = Path(d)
        where = Where(tmp=tmp, dsn=args.dsn, warm=not args.cold)
        cases = asyncio.run(run_history_cases(args, stores, where))
        floor = None
        if "sqlite" in stores and not args.no_floor:
            floor = measure_floor("sqlite", 200, args.runs, 100, _sqlite_timer(tmp))
    print(
        f"turnkit history policy cost: python {platform.python_version()}, sqlite "
        f"{sqlite3.sqlite_version}, {platform.machine()}, {os.cpu_count()} CPUs, "
        f"median of {args.runs} runs"
    )
    print("(µs/step = session time / model steps; policy cost = µs/step - the none case's)")
    print()
    hb.print_history_table(cases, args.history_window)
    if floor is not None:
        print()
        print(
            f"SQLite floor (WAL, synchronous=NORMAL): one bare commit {floor.commit_3rows_us:.1f} "
            f"µs; a model+tool pair's exact rows {floor.pair_exact_us:.1f} µs"
        )
    # The bar is on the policy's own work per step: the whole step's time is noisier
    # than the policy's cost on a shared machine (both are reported above).
    growths = [
        (c, c.prepare_growth)
        for c in cases
        if c.prepare_growth is not None and c.policy not in ("none", "summarize")
    ]
    ok = all(g <= HISTORY_GROWTH_BAR for _, g in growths)
    shown = ", ".join(f"{c.store} {c.policy} {g:.2f}x" for c, g in growths) or "-"
    print(
        f"\nVERDICT history: prepare growth {shown} vs ≤ {HISTORY_GROWTH_BAR}x: "
        f"{_word(ok if growths else None)}"
    )
    print(f"(total {time.perf_counter() - started:.1f} s)")
    if args.json is not None:
        payload = {"config": _config(args), "history": [asdict(c) for c in cases]}
        args.json.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n")
        print(f"wrote {args.json}")
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    prepare_collector(args.full_collect)
    stores, pg_info = _resolve_stores(args)
    if args.history:
        return history_main(args, stores)
    if args.codec == "aes" or args.blobs:
        return codec_main(args, stores)
    started = time.perf_counter()
    if args.no_gc:
        gc.disable()
    with tempfile.TemporaryDirectory(prefix="turnkit-bench-") as d:
        tmp = Path(d)
        where = Where(tmp=tmp, dsn=args.dsn, tracer=args.tracer, warm=not args.cold)
        cases = asyncio.run(run_cases(args, stores, where))
        floors = measure_floors(args, stores, tmp)
        hop = None if args.no_floor else thread_hop.hop_floor(runs=args.runs)
    if args.no_gc:
        gc.enable()

    print(
        f"turnkit step overhead: python {platform.python_version()}, sqlite "
        f"{sqlite3.sqlite_version}, {platform.machine()}, {os.cpu_count()} CPUs, "
        f"median of {args.runs} runs, gc {'off' if args.no_gc else 'on'}"
        f"{', a full collection before each run' if args.full_collect else ''}"
    )
    if pg_info is not None:
        print(_floor.describe(pg_info))
    print("(turn µs/pair = whole turn / steps; windows from action.completed timestamps)")
    print()
    print_table(cases, args.window)
    for store, floor in floors.items():
        print()
        label = _LABEL[store]
        if store == "sqlite":
            label += f" (WAL, synchronous=NORMAL, sqlite {sqlite3.sqlite_version})"
        print_floor(floor, label)
    print()
    over = def_over_async(cases, hop) if hop is not None else []
    def_ok = print_def_over_async(over, hop) if hop is not None and over else True
    print()
    rows = verdicts(cases, stores, floors)
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
            "floors": {k: asdict(v) for k, v in floors.items()},
            "verdicts": rows,
            "thread_hop": asdict(hop) if hop is not None else None,
            "def_over_async": [asdict(r) for r in over],
            "bars": {
                "pair_factor_of_two_bare_commits": PAIR_FACTOR,
                "memory_async_cpu_us": MEMORY_CPU_BAR_US,
                "def_over_async_cpu_us": f"one hop + {DEF_OVER_HOP_US:g}",
                "growth": GROWTH_BAR,
            },
            "elapsed_s": elapsed,
        }
        args.json.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n")
        print(f"wrote {args.json}")
    ok = all(v["pair_ok"] is not False and v["growth_ok"] is not False for v in rows)
    return 0 if ok and def_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
