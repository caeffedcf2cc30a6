"""Engine overhead per model+tool step pair, on each store, at growing transcript lengths.

Run from the repo root::

    .venv/bin/python benchmarks/step_overhead.py            # full run, well under 3 minutes
    .venv/bin/python benchmarks/step_overhead.py --runs 3 --steps 10 100
    .venv/bin/python benchmarks/step_overhead.py --json results.json

Each case is ONE turn on a fresh session and store: a zero-latency model calls a
no-op tool once per model step for N steps and then answers with text, so the turn
commits N model steps, N tool steps and a final model step. The whole turn is timed
(``turn µs/pair`` = turn time / N, fixed per-turn costs included) and so are windows
inside it, from ``time.perf_counter()`` taken at each ``action.completed`` event: the
first pairs (from ``turn.started`` to the W-th ``action.completed``) and the last W
pairs. ``growth`` is last-window cost / first-window cost (median of the per-run
ratios); it shows whether a step costs more as the transcript grows. Every figure is
the median of ``--runs`` runs.

The floor is what SQLite alone charges on this machine for the rows the engine writes:
the same PRAGMAs and schema, ``BEGIN IMMEDIATE`` + one step, one message and one event
row + ``COMMIT``, with pre-encoded JSON bodies of the engine's own sizes, no turnkit code.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import turnkit
from turnkit import (
    ActionCompletedEvent,
    ActionRequestedEvent,
    AssistantMessage,
    Message,
    MessageCompletedEvent,
    ModelDelta,
    ModelDone,
    ModelReply,
    StopReason,
    TextDelta,
    ToolCall,
    ToolMessage,
    ToolSpec,
    TurnEvent,
)
from turnkit.stores import MemoryStore, SqliteStore, Store
from turnkit.stores._sqlite_schema import MIGRATIONS, migrate

StoreKind = Literal["memory", "sqlite"]
ToolKind = Literal["def", "async"]

PAIR_BAR_US = 250.0  # SQLite: engine cost per model+tool pair
GROWTH_BAR = 1.2  # last-window cost / first-window cost, any store

_TOOL_NAME = {"def": "noop", "async": "noop_async"}
_SESSION = "bench"
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


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


@dataclass
class CaseResult:
    store: StoreKind
    tool: ToolKind
    steps: int
    window: int
    turn_ms: float
    turn_us_per_pair: float
    head_pairs: int
    head_us_per_pair: float
    tail_us_per_pair: float | None
    growth: float | None
    runs: list[dict[str, Any]] = field(default_factory=list)


_db_numbers = itertools.count()


def _make_store(kind: StoreKind, tmp: Path) -> Store:
    """A fresh, empty store for every run: one turn on one new session."""
    if kind == "memory":
        return MemoryStore()
    return SqliteStore(tmp / f"bench-{next(_db_numbers)}.db")


async def _run_turn(store_kind: StoreKind, tool_kind: ToolKind, steps: int, tmp: Path) -> RunSample:
    tool = noop if tool_kind == "def" else noop_async
    agent = turnkit.Agent(name="bench", model=ZeroModel(steps, _TOOL_NAME[tool_kind]), tools=[tool])
    stamps: list[float] = []
    append, clock = stamps.append, time.perf_counter

    def on_event(event: TurnEvent) -> None:
        # Same tiny cost for every event at every position in the turn.
        kind = event.type
        if kind == "action.completed" or kind == "turn.started":
            append(clock())

    async with turnkit.Runtime(agent, store=_make_store(store_kind, tmp)) as runtime:
        session = runtime.session("bench", _SESSION)
        unsubscribe = session.subscribe(on_event)
        gc.collect()
        t0 = clock()
        tid = session.start("go")
        result = await session.result(tid)
        t1 = clock()
        unsubscribe()
    if result.status != "completed" or len(stamps) != steps + 1:
        raise RuntimeError(f"benchmark turn did not run as scripted: {result}, {len(stamps)}")
    return RunSample(turn_s=t1 - t0, stamps=stamps)


def _median(values: Sequence[float]) -> float:
    return statistics.median(values)


async def _measure_case(
    store_kind: StoreKind, tool_kind: ToolKind, steps: int, runs: int, window: int, tmp: Path
) -> CaseResult:
    samples = [await _run_turn(store_kind, tool_kind, steps, tmp) for _ in range(runs)]
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
        head_pairs=head_n,
        head_us_per_pair=med("head_us_per_pair"),
        tail_us_per_pair=med("tail_us_per_pair") if has_tail else None,
        growth=med("growth") if has_tail else None,
        runs=per_run,
    )


# -- the SQLite floor --------------------------------------------------------------

_SQL_STEP = "INSERT INTO turnkit_steps (session_id, step_id, turn_id, result) VALUES (?, ?, ?, ?)"
_SQL_MSG = "INSERT INTO turnkit_messages (session_id, idx, turn_id, body) VALUES (?, ?, ?, ?)"
_SQL_EVENT = "INSERT INTO turnkit_events (session_id, seq, turn_id, body) VALUES (?, ?, ?, ?)"

Row = tuple[str, tuple[Any, ...]]


def _pair_rows(k: int, turn_id: str) -> tuple[list[Row], list[Row]]:
    """The rows the engine writes for pair ``k``: (model commit, tool commit).

    Bodies are the engine's own ``to_dict()`` encodings, pre-encoded here so the timed
    loop does SQL only. The model commit has two events (message.completed and
    action.requested); the tool commit has one (action.completed).
    """
    idx = 1 + 2 * (k - 1)  # the opening is message 0
    seq = 2 + 3 * (k - 1)  # turn.started is seq 1
    call = ToolCall(id=f"c{idx}", name="noop", input={"k": idx})
    stop = StopReason(kind="tool_use")
    reply = ModelReply(text="ok", tool_calls=(call,), stop=stop)
    assistant = AssistantMessage(text="ok", turn_id=turn_id, tool_calls=(call,), stop=stop)
    completed = MessageCompletedEvent(
        turn_id=turn_id, session_id=_SESSION, message=assistant, seq=seq
    )
    requested = ActionRequestedEvent(turn_id=turn_id, session_id=_SESSION, call=call, seq=seq + 1)
    result = {"ok": True, "k": idx}
    tool_msg = ToolMessage(call_id=call.id, name=call.name, result=result, turn_id=turn_id)
    done = ActionCompletedEvent(
        turn_id=turn_id,
        session_id=_SESSION,
        call_id=call.id,
        name=call.name,
        result=result,
        seq=seq + 2,
    )
    model_rows: list[Row] = [
        (_SQL_STEP, (_SESSION, f"model:{idx}", turn_id, _dumps(reply.to_dict()))),
        (_SQL_MSG, (_SESSION, idx, turn_id, _dumps(assistant.to_dict()))),
        (_SQL_EVENT, (_SESSION, seq, turn_id, _dumps(completed.to_dict()))),
        (_SQL_EVENT, (_SESSION, seq + 1, turn_id, _dumps(requested.to_dict()))),
    ]
    tool_rows: list[Row] = [
        (
            _SQL_STEP,
            (_SESSION, f"tool:{idx}:{call.id}", turn_id, _dumps({"result": result, "error": None})),
        ),
        (_SQL_MSG, (_SESSION, idx + 1, turn_id, _dumps(tool_msg.to_dict()))),
        (_SQL_EVENT, (_SESSION, seq + 2, turn_id, _dumps(done.to_dict()))),
    ]
    return model_rows, tool_rows


def _open_floor_db(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    migrate(conn, MIGRATIONS)
    return conn


def _time_commits(path: Path, commits: list[list[Row]]) -> list[float]:
    """``perf_counter`` before the first commit and after each one, on a fresh database."""
    conn = _open_floor_db(path)
    try:
        execute = conn.execute
        clock = time.perf_counter
        stamps = [0.0] * (len(commits) + 1)
        gc.collect()
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


@dataclass
class Floor:
    pairs: int
    commit_3rows_us: float  # BEGIN + step + message + event + COMMIT
    pair_3rows_us: float  # two such commits
    pair_exact_us: float  # the engine's exact rows: model commit (4 rows) + tool commit (3)
    window: int
    head_pair_exact_us: float  # exact rows, first ``window`` pairs
    tail_pair_exact_us: float | None  # exact rows, last ``window`` pairs
    growth: float | None  # median of per-run tail/head
    body_bytes: dict[str, int]


def measure_floor(pairs: int, runs: int, window: int, tmp: Path) -> Floor:
    turn_id = "0" * 32  # a uuid4().hex-sized id
    model_commits: list[list[Row]] = []
    tool_commits: list[list[Row]] = []
    for k in range(1, pairs + 1):
        m, t = _pair_rows(k, turn_id)
        model_commits.append(m)
        tool_commits.append(t)
    # The brief's floor: one step, one message, one event row per commit (the model
    # commit minus its action.requested row), alternating model and tool commits.
    three: list[list[Row]] = []
    exact: list[list[Row]] = []
    for m, t in zip(model_commits, tool_commits, strict=True):
        three += [m[:3], t]
        exact += [m, t]
    n3, nx = len(three), len(exact)
    c3 = _median(
        [
            (s[-1] - s[0]) / n3
            for s in (_time_commits(tmp / f"f3-{r}.db", three) for r in range(runs))
        ]
    )
    head_n = min(window, pairs)
    has_tail = pairs >= 2 * window
    totals: list[float] = []
    heads: list[float] = []
    tails: list[float] = []
    for r in range(runs):
        st = _time_commits(tmp / f"fx-{r}.db", exact)  # st[2k] = after pair k
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


# -- report ----------------------------------------------------------------------


def _fmt(value: float | None, spec: str = ".1f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def print_table(cases: list[CaseResult], window: int) -> None:
    header = (
        f"{'store':<7} {'tool':<6} {'steps':>6} {'turn ms':>9} {'turn µs/pair':>13} "
        f"{'first ≤' + str(window) + ' µs/pair':>18} {'last ' + str(window) + ' µs/pair':>17} "
        f"{'growth':>7}"
    )
    print(header)
    print("-" * len(header))
    for c in cases:
        print(
            f"{c.store:<7} {c.tool:<6} {c.steps:>6} {c.turn_ms:>9.2f} {c.turn_us_per_pair:>13.1f} "
            f"{c.head_us_per_pair:>18.1f} {_fmt(c.tail_us_per_pair):>17} "
            f"{_fmt(c.growth, '.2f', 'x'):>7}"
        )


def print_floor(floor: Floor) -> None:
    print(
        f"SQLite floor ({floor.pairs} pairs, WAL, synchronous=NORMAL, sqlite "
        f"{sqlite3.sqlite_version}):"
    )
    print(
        f"  one commit (BEGIN IMMEDIATE + step + message + event row + COMMIT): "
        f"{floor.commit_3rows_us:.1f} µs"
    )
    print(
        f"  pair floor (2 such commits):                                      "
        f"{floor.pair_3rows_us:.1f} µs"
    )
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
    sizes = ", ".join(f"{k} {v}" for k, v in floor.body_bytes.items())
    print(f"  JSON body bytes: {sizes}")


def verdicts(
    cases: list[CaseResult], stores: Sequence[StoreKind], floor: Floor | None
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for store in stores:
        mine = [c for c in cases if c.store == store]
        if not mine:
            continue
        longest = max(c.steps for c in mine)
        top = [c for c in mine if c.steps == longest]
        pair = {c.tool: c.turn_us_per_pair for c in top}
        growth = {c.tool: c.growth for c in top if c.growth is not None}
        pair_ok = all(v <= PAIR_BAR_US for v in pair.values()) if store == "sqlite" else None
        growth_ok = all(v <= GROWTH_BAR for v in growth.values()) if growth else None
        out.append(
            {
                "store": store,
                "steps": longest,
                "pair_us": pair,
                "pair_bar_us": PAIR_BAR_US if store == "sqlite" else None,
                "pair_ok": pair_ok,
                "growth": growth,
                "growth_bar": GROWTH_BAR,
                "growth_ok": growth_ok,
                "pair_over_floor": (
                    {t: v - floor.pair_exact_us for t, v in pair.items()}
                    if floor is not None and store == "sqlite"
                    else None
                ),
            }
        )
    return out


def _word(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "FAIL")


def print_verdicts(rows: list[dict[str, Any]]) -> None:
    for v in rows:
        pair = " / ".join(f"{us:.1f} µs ({tool})" for tool, us in v["pair_us"].items())
        growth = " / ".join(f"{g:.2f}x ({tool})" for tool, g in v["growth"].items()) or "-"
        bar = f"≤ {v['pair_bar_us']:.0f} µs" if v["pair_bar_us"] is not None else "no bar"
        over = ""
        if v["pair_over_floor"]:
            over = (
                " [above SQLite floor: "
                + " / ".join(f"{us:.1f} µs ({tool})" for tool, us in v["pair_over_floor"].items())
                + "]"
            )
        print(
            f"VERDICT {v['store']}: pair {pair} vs {bar}: {_word(v['pair_ok'])}{over}; "
            f"growth {growth} vs ≤ {v['growth_bar']}x: {_word(v['growth_ok'])}"
        )


# -- main ------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=(
            "Time turnkit's own cost per model+tool step pair (zero-latency model, no-op "
            "tool) on MemoryStore and SqliteStore, and the raw SQLite commit floor."
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
        "--stores", nargs="+", choices=["memory", "sqlite"], default=["memory", "sqlite"]
    )
    p.add_argument(
        "--tools",
        nargs="+",
        choices=["def", "async"],
        default=["def", "async"],
        help="no-op tool variants: plain def (local) and async def (remote)",
    )
    p.add_argument("--warmup", type=int, default=1, help="untimed turns per store/tool first")
    p.add_argument("--no-gc", action="store_true", help="disable the cyclic GC while timing")
    p.add_argument("--no-floor", action="store_true", help="skip the SQLite floor")
    p.add_argument("--json", type=Path, metavar="PATH", help="also write the results here")
    args = p.parse_args(argv)
    if args.runs < 1 or args.window < 1 or min(args.steps) < 1:
        p.error("--runs, --window and --steps must be positive")
    return args


async def run_cases(args: argparse.Namespace, tmp: Path) -> list[CaseResult]:
    cases: list[CaseResult] = []
    for store in args.stores:
        for tool in args.tools:
            for _ in range(args.warmup):
                await _run_turn(store, tool, min(100, max(args.steps)), tmp)
            for steps in args.steps:
                cases.append(await _measure_case(store, tool, steps, args.runs, args.window, tmp))
    return cases


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    if args.no_gc:
        gc.disable()
    with tempfile.TemporaryDirectory(prefix="turnkit-bench-") as d:
        tmp = Path(d)
        cases = asyncio.run(run_cases(args, tmp))
        floor = (
            None if args.no_floor else measure_floor(max(args.steps), args.runs, args.window, tmp)
        )
    if args.no_gc:
        gc.enable()

    print(
        f"turnkit step overhead: python {platform.python_version()}, sqlite "
        f"{sqlite3.sqlite_version}, {platform.machine()}, median of {args.runs} runs, "
        f"gc {'off' if args.no_gc else 'on'}"
    )
    print("(turn µs/pair = whole turn / steps; windows from action.completed timestamps)")
    print()
    print_table(cases, args.window)
    if floor is not None:
        print()
        print_floor(floor)
    print()
    rows = verdicts(cases, args.stores, floor)
    print_verdicts(rows)
    elapsed = time.perf_counter() - started
    print(f"\n(total {elapsed:.1f} s)")

    if args.json is not None:
        payload: dict[str, Any] = {
            "python": sys.version,
            "sqlite": sqlite3.sqlite_version,
            "platform": platform.platform(),
            "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "cases": [asdict(c) for c in cases],
            "floor": asdict(floor) if floor is not None else None,
            "verdicts": rows,
            "bars": {"pair_us_sqlite": PAIR_BAR_US, "growth": GROWTH_BAR},
            "elapsed_s": elapsed,
        }
        args.json.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n")
        print(f"wrote {args.json}")
    ok = all(v["pair_ok"] is not False and v["growth_ok"] is not False for v in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
