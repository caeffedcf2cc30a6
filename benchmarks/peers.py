"""turnkit beside LangGraph and DBOS: what one durable model+tool step pair costs in each.

Run from the repo root, with the ``bench`` extra installed (``pip install -e '.[bench]'``)::

    .venv/bin/python benchmarks/peers.py                         # 100 and 500 pairs, both stores
    .venv/bin/python benchmarks/peers.py --pairs 100 --runs 3 --stores sqlite
    .venv/bin/python benchmarks/peers.py --stores postgres --dsn postgresql://127.0.0.1:5432/test

Every framework runs the same agent: ONE turn (graph run, workflow) in which a
zero-latency fake model asks for one tool call with a ~300-byte argument, the tool
answers with a ~300-byte result, and after N such pairs the model answers with text.
Each framework checkpoints every step before the next one starts:

- turnkit: an ``Agent`` on ``SqliteStore`` / ``PostgresStore``, once with a ``def``
  tool and once with an ``async def`` tool (as ``step_overhead.py`` does).
- LangGraph: a ``StateGraph`` over ``MessagesState`` (a model node, a ``ToolNode`` and
  ``tools_condition`` between them), compiled with ``SqliteSaver`` / ``PostgresSaver``
  and invoked with ``durability="sync"`` (each step persisted before the next starts).
- DBOS: a workflow whose steps are the model call and the tool call, its system
  database on SQLite (through ``system_database_engine``, so WAL and
  ``synchronous=NORMAL`` can be set) or on PostgreSQL in a schema of its own.

Same durability everywhere: SQLite files in WAL mode with ``synchronous=NORMAL`` (each
run checks both PRAGMAs on the peer's connection), PostgreSQL with the server's
``synchronous_commit`` (printed). Every run starts on a fresh file or schema, and is
checked after the clock stops: the turn completed, the transcript or state read back
holds 2N+2 messages and the peer wrote the checkpoints or steps the run claims.

Reported per store and N: µs per pair (run time / N, median of ``--runs``), the floor
(two bare commits of one step, one message and one event row per pair, the engine's
bodies, with ``_floor.py``'s rows and ``step_overhead.py``'s timers) and each peer's time
over turnkit's (over the slower and over the faster turnkit tool). The floor is timed
like one more framework, and runs are interleaved (one of each, then the next round),
so a noisy neighbour or a slow disk minute weighs on all of them alike.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import _floor
import psycopg
import sqlalchemy as sa
import step_overhead as so
from dbos import DBOS, DBOSConfig, SetWorkflowID
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool as lc_tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Durability
from psycopg.rows import dict_row

import turnkit
from turnkit import Message, ModelDelta, ModelDone, ModelReply, StopReason, ToolCall, ToolSpec
from turnkit.stores import transcript as stored_transcript

StoreKind = Literal["sqlite", "postgres"]
Runner = Callable[[int], float]  # pairs -> seconds for one verified run

PAYLOAD_BYTES = 300
FRAMEWORKS = ("turnkit def", "turnkit async", "LangGraph", "DBOS")
_TEXT = "The quick brown fox jumps over the lazy dog while the durable agent keeps notes. "


def note(k: int, kind: str) -> str:
    """A ~300-byte payload, different for every call and every side of it."""
    head = f"{kind} {k}: "
    return (head + _TEXT * 4)[:PAYLOAD_BYTES]


def answer(argument: str) -> str:
    """What every framework's tool returns for ``argument``: a ~300-byte result."""
    return f"result for {argument}"[:PAYLOAD_BYTES]


def wants_tool(messages_so_far: int, pairs: int) -> bool:
    """The fake model's one decision: with the opening then (call, result) pairs in
    the transcript, ask for another tool call until ``pairs`` were made."""
    return (messages_so_far - 1) // 2 < pairs


# -- turnkit -----------------------------------------------------------------------


class PayloadModel:
    """turnkit's zero-latency model: a tool call with a ~300-byte argument per step."""

    def __init__(self, pairs: int, tool: str) -> None:
        self.pairs, self.tool = pairs, tool
        self._tool_use, self._end = StopReason(kind="tool_use"), StopReason(kind="end_turn")

    async def stream(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], *, system: str | None
    ) -> AsyncIterator[ModelDelta]:
        n = len(messages)
        if wants_tool(n, self.pairs):
            call = ToolCall(id=f"c{n}", name=self.tool, input={"note": note(n, "call")})
            yield ModelDone(reply=ModelReply(text="", tool_calls=(call,), stop=self._tool_use))
        else:
            yield ModelDone(reply=ModelReply(text="done", stop=self._end))


@turnkit.tool
def lookup(note: str) -> str:
    """Look the note up (locally)."""
    return answer(note)


@turnkit.tool
async def lookup_async(note: str) -> str:
    """Look the note up (remotely)."""
    return answer(note)


async def _turnkit_turn(store: StoreKind, tool: turnkit.Tool, pairs: int, where: so.Where) -> float:
    model = PayloadModel(pairs, tool.name)
    agent = turnkit.Agent(name="bench", model=model, tools=[tool])
    async with (
        so._fresh_store(store, where) as backend,
        turnkit.Runtime(agent, store=backend) as runtime,
    ):
        if where.warm:
            # Untimed, as the peers' savers and DBOS are connected before their clocks
            # start: one pair on another session opens the store's connections.
            model.pairs = 1
            warm = runtime.session("bench", "peers-warm-up")
            await warm.result(warm.start("warm up"))
            model.pairs = pairs
        session = runtime.session("bench", "peers")
        gc.collect()
        t0 = time.perf_counter()
        result = await session.result(session.start("go"))
        elapsed = time.perf_counter() - t0
        transcript = await stored_transcript(backend.session("peers"))
    results = [m for m in transcript if m.role == "tool"]
    if result.status != "completed" or len(transcript) != 2 * pairs + 2 or len(results) != pairs:
        raise RuntimeError(f"turnkit: {result.status}, {len(transcript)} messages")
    return elapsed


def turnkit_runner(store: StoreKind, tool: turnkit.Tool, where: so.Where) -> Runner:
    return lambda pairs: asyncio.run(_turnkit_turn(store, tool, pairs, where))


# -- LangGraph ---------------------------------------------------------------------


@lc_tool
def lg_lookup(note: str) -> str:
    """Look the note up."""
    return answer(note)


def langgraph_agent(
    pairs: int, saver: BaseCheckpointSaver[Any]
) -> CompiledStateGraph[Any, Any, Any, Any]:
    """The usual tool loop: model node, ``ToolNode``, ``tools_condition`` between them."""

    def model(state: MessagesState) -> dict[str, list[AIMessage]]:
        n = len(state["messages"])
        if not wants_tool(n, pairs):
            return {"messages": [AIMessage(content="done")]}
        call = {"name": "lg_lookup", "args": {"note": note(n, "call")}, "id": f"c{n}"}
        return {"messages": [AIMessage(content="", tool_calls=[call])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", model)
    graph.add_node("tools", ToolNode([lg_lookup]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
    graph.add_edge("tools", "model")
    return graph.compile(checkpointer=saver)


def _langgraph_run(saver: BaseCheckpointSaver[Any], pairs: int, durability: Durability) -> float:
    graph = langgraph_agent(pairs, saver)
    config: Any = {"configurable": {"thread_id": "peers"}, "recursion_limit": 2 * pairs + 10}
    gc.collect()
    t0 = time.perf_counter()
    graph.invoke({"messages": [HumanMessage("go")]}, config, durability=durability)
    elapsed = time.perf_counter() - t0
    messages = graph.get_state(config).values["messages"]
    results = [m for m in messages if isinstance(m, ToolMessage)]
    checkpoints = sum(1 for _ in saver.list(config))
    # One checkpoint for the input, one per superstep: 2N+1 node runs and the start.
    if len(messages) != 2 * pairs + 2 or len(results) != pairs or checkpoints != 2 * pairs + 3:
        raise RuntimeError(f"LangGraph: {len(messages)} messages, {checkpoints} checkpoints")
    return elapsed


def _check_sqlite_durability(conn: sqlite3.Connection, who: str) -> None:
    mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    sync = conn.execute("PRAGMA synchronous").fetchone()[0]
    if (mode, sync) != ("wal", 1):
        raise RuntimeError(f"{who}: journal_mode={mode}, synchronous={sync}; want wal, 1")


@contextmanager
def langgraph_saver(store: StoreKind, where: so.Where) -> Iterator[BaseCheckpointSaver[Any]]:
    """A fresh checkpointer: SqliteSaver on a new file in WAL mode with
    synchronous=NORMAL, or PostgresSaver on a new schema."""
    if store == "sqlite":
        conn = sqlite3.connect(
            where.tmp / f"langgraph-{uuid.uuid4().hex}.db", check_same_thread=False
        )
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            saver = SqliteSaver(conn)
            saver.setup()
            yield saver
            _check_sqlite_durability(conn, "LangGraph")
        finally:
            conn.close()
        return
    # What PostgresSaver.from_conn_string opens, on the run's own schema.
    with (
        fresh_pg_schema(where.dsn, "langgraph") as schema,
        psycopg.connect(
            where.dsn,
            autocommit=True,
            prepare_threshold=0,
            row_factory=dict_row,
            options=f"-c search_path={schema}",
        ) as pg,
    ):
        pg_saver = PostgresSaver(pg)
        pg_saver.setup()
        yield pg_saver


def langgraph_runner(store: StoreKind, where: so.Where, durability: Durability) -> Runner:
    def run(pairs: int) -> float:
        with langgraph_saver(store, where) as saver:
            return _langgraph_run(saver, pairs, durability)

    return run


@contextmanager
def fresh_pg_schema(dsn: str, prefix: str) -> Iterator[str]:
    """A new, empty schema for one run, dropped afterwards."""
    schema = _floor.fresh_schema(prefix)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield schema
    finally:
        _floor.drop_schema(dsn, schema)


# -- DBOS ----------------------------------------------------------------------------


@DBOS.step()
def dbos_model(messages: list[dict[str, Any]], pairs: int) -> dict[str, Any]:
    """The zero-latency model as a DBOS step: its reply is the step's checkpoint."""
    n = len(messages)
    if not wants_tool(n, pairs):
        return {"role": "assistant", "content": "done"}
    call = {"id": f"c{n}", "name": "lookup", "args": {"note": note(n, "call")}}
    return {"role": "assistant", "content": "", "tool_call": call}


@DBOS.step()
def dbos_tool(argument: str) -> str:
    return answer(argument)


@DBOS.workflow()
def dbos_agent(prompt: str, pairs: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    while True:
        reply = dbos_model(messages, pairs)
        messages.append(reply)
        call = reply.get("tool_call")
        if call is None:
            return messages
        result = dbos_tool(call["args"]["note"])
        messages.append({"role": "tool", "id": call["id"], "content": result})


def _dbos_sqlite_engine(path: Path) -> sa.Engine:
    """DBOS's own SQLite engine settings (IMMEDIATE transactions, busy timeout, foreign
    keys), plus WAL and synchronous=NORMAL, which DBOS leaves at SQLite's defaults."""
    engine = sa.create_engine(f"sqlite:///{path}")

    @sa.event.listens_for(engine, "connect")
    def pragmas(dbapi_conn: Any, record: Any) -> None:
        dbapi_conn.isolation_level = "IMMEDIATE"
        for pragma in ("busy_timeout=30000", "foreign_keys=ON", "journal_mode=WAL"):
            dbapi_conn.execute(f"PRAGMA {pragma}")
        dbapi_conn.execute("PRAGMA synchronous=NORMAL")  # per connection, unlike WAL

    return engine


def _dbos_run(config: DBOSConfig, pairs: int) -> float:
    DBOS(config=config)
    DBOS.launch()
    try:
        workflow_id = uuid.uuid4().hex
        gc.collect()
        t0 = time.perf_counter()
        with SetWorkflowID(workflow_id):
            messages = dbos_agent("go", pairs)
        elapsed = time.perf_counter() - t0
        status = DBOS.get_workflow_status(workflow_id)
        steps = DBOS.list_workflow_steps(workflow_id, load_output=False)
    finally:
        DBOS.destroy()
    if status is None or status.status != "SUCCESS" or len(messages) != 2 * pairs + 2:
        raise RuntimeError(f"DBOS: {status and status.status}, {len(messages)} messages")
    if len(steps) != 2 * pairs + 1:
        raise RuntimeError(f"DBOS: {len(steps)} steps recorded, want {2 * pairs + 1}")
    return elapsed


def dbos_runner(store: StoreKind, where: so.Where) -> Runner:
    base: DBOSConfig = {"name": "turnkit-peers", "log_level": "WARNING"}

    def run(pairs: int) -> float:
        if store == "sqlite":
            path = where.tmp / f"dbos-{uuid.uuid4().hex}.db"
            engine = _dbos_sqlite_engine(path)
            try:
                url = f"sqlite:///{path}"
                config: DBOSConfig = {
                    **base,
                    "system_database_url": url,
                    "system_database_engine": engine,
                }
                elapsed = _dbos_run(config, pairs)
                with engine.connect() as conn:
                    _check_sqlite_durability(conn.connection.dbapi_connection, "DBOS")  # type: ignore[arg-type]
                return elapsed
            finally:
                engine.dispose()
        with fresh_pg_schema(where.dsn, "dbos") as schema:
            config = {**base, "system_database_url": where.dsn, "dbos_system_schema": schema}
            return _dbos_run(config, pairs)

    return run


# -- measuring and reporting ---------------------------------------------------------


@dataclass(frozen=True)
class Row:
    store: StoreKind
    pairs: int
    us_per_pair: dict[str, float]  # "floor" or framework -> median µs per pair


def floor_runner(store: StoreKind, where: so.Where) -> Runner:
    """Two bare commits per pair (one step, one message, one event row each, the
    engine's bodies), with _floor.py's rows and step_overhead.py's timers, on a fresh
    database or schema: timed as one more framework, so it shares the same rounds."""

    def run(pairs: int) -> float:
        commits = _floor.bare_commits(pairs, so._TURN_ID, "peers")
        if store == "sqlite":
            stamps = so._sqlite_timer(where.tmp)("floor", commits)
        else:
            with _floor.floor_pool(where.dsn) as pool:
                stamps = so._pg_timer(pool)("floor", commits)
        if len(stamps) != 2 * pairs + 1:
            raise RuntimeError(f"floor: {len(stamps) - 1} commits, want {2 * pairs}")
        return stamps[-1] - stamps[0]

    return run


def runners(store: StoreKind, where: so.Where, durability: Durability) -> dict[str, Runner]:
    return {
        "floor": floor_runner(store, where),
        "turnkit def": turnkit_runner(store, lookup, where),
        "turnkit async": turnkit_runner(store, lookup_async, where),
        "LangGraph": langgraph_runner(store, where, durability),
        "DBOS": dbos_runner(store, where),
    }


def measure(
    store: StoreKind, pairs: int, runs: int, where: so.Where, durability: Durability
) -> dict[str, float]:
    """Median µs per pair for the floor and each framework, runs interleaved (one of
    each per round), after one warm-up each."""
    todo = runners(store, where, durability)
    for run in todo.values():
        run(min(pairs, 20))
    samples: dict[str, list[float]] = {name: [] for name in todo}
    for _ in range(runs):
        for name, run in todo.items():
            samples[name].append(run(pairs) / pairs * 1e6)
    return {name: statistics.median(values) for name, values in samples.items()}


def print_table(rows: Sequence[Row]) -> None:
    columns = ["floor", *FRAMEWORKS]
    print("| store | pairs | " + " | ".join(columns) + " | LangGraph / turnkit | DBOS / turnkit |")
    print("|---|---:|" + "---:|" * (len(columns) + 2))
    for r in rows:
        us = r.us_per_pair
        slow, fast = sorted((us["turnkit def"], us["turnkit async"]), reverse=True)
        cells = [f"{us[name]:,.0f}" for name in columns]
        ratios = [f"{us[p] / slow:.1f}-{us[p] / fast:.1f}x" for p in ("LangGraph", "DBOS")]
        print(f"| {r.store} | {r.pairs} | " + " | ".join(cells + ratios) + " |")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--pairs", type=int, nargs="+", default=[100, 500], help="pairs per turn")
    p.add_argument("--runs", type=int, default=5, help="runs per case; figures are medians")
    p.add_argument(
        "--stores", nargs="+", choices=["sqlite", "postgres"], default=["sqlite", "postgres"]
    )
    p.add_argument(
        "--dsn",
        default=os.environ.get("TURNKIT_TEST_POSTGRES_DSN", _floor.DEFAULT_DSN),
        help="PostgreSQL server (env TURNKIT_TEST_POSTGRES_DSN); each run gets a fresh schema",
    )
    p.add_argument(
        "--langgraph-durability",
        choices=["sync", "async", "exit"],
        default="sync",
        help="sync: each step persisted before the next starts, as turnkit and DBOS do",
    )
    args = p.parse_args(argv)
    if args.runs < 1 or min(args.pairs) < 1:
        p.error("--runs and --pairs must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="turnkit-peers-") as d:
        where = so.Where(tmp=Path(d), dsn=args.dsn)
        for store in args.stores:
            for pairs in args.pairs:
                medians = measure(store, pairs, args.runs, where, args.langgraph_durability)
                rows.append(Row(store, pairs, medians))
                print(f"({store} {pairs} pairs done, {time.perf_counter() - started:.0f} s)")
    print(
        f"\nturnkit beside its peers: python {platform.python_version()}, sqlite "
        f"{sqlite3.sqlite_version}, {platform.machine()}, {os.cpu_count()} CPUs, "
        f"median of {args.runs} runs, µs per model+tool pair (~{PAYLOAD_BYTES}-byte payloads)"
    )
    if "postgres" in args.stores:
        print(_floor.describe(_floor.server_info(args.dsn)))
    print(
        f"(floor: two bare commits; ratios: peer / slower turnkit tool - peer / faster; "
        f"LangGraph durability={args.langgraph_durability})\n"
    )
    print_table(rows)
    print(f"\n(total {time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
