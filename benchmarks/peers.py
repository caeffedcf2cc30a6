"""turnkit beside LangGraph and DBOS: the cost of one durable model+tool step pair.

Run from the repo root, with the ``bench`` extra installed::

    .venv/bin/pip install -e '.[bench]'
    .venv/bin/python benchmarks/peers.py                           # SQLite and PostgreSQL
    .venv/bin/python benchmarks/peers.py --stores sqlite --pairs 100 500 --runs 5

Each framework drives one agent turn of ``N`` pairs: a zero-latency fake model asks
for one tool call (a ~300-byte argument), the tool answers (~300 bytes), and so on
until ``N`` calls were made, then the model answers. Every step is checkpointed the
way the framework does it in its own idiom:

- turnkit: a ``Runtime`` on ``SqliteStore`` / ``PostgresStore``, with a ``def`` tool
  and with an ``async`` one;
- LangGraph: a ``StateGraph`` (model node, tool node, a conditional edge) compiled
  with ``SqliteSaver`` / ``PostgresSaver``: one checkpoint per super-step;
- DBOS: a workflow whose steps are the model call and the tool call, on a SQLite
  or PostgreSQL system database.

The same durability for all: SQLite in WAL mode with ``synchronous=NORMAL`` (every
connection of every framework), PostgreSQL with ``synchronous_commit`` on (the
server's default). Each run checks that the framework did what it claims (the
answer, and the steps or checkpoints it stored), so a broken setup cannot report a
fast number. Figures are µs per pair, medians of ``--runs``, beside the floor (two
bare commits per pair, ``step_overhead.py``'s) measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import operator
import os
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, TypedDict

import psycopg
import step_overhead
from _floor import DEFAULT_DSN, drop_schema, fresh_schema

import turnkit
from turnkit import ModelDone, ModelReply, TextDelta, ToolCall
from turnkit.stores import PostgresStore, SqliteStore, Store

#: What the model sends as the tool's argument and the tool returns: ~300 bytes each.
PAYLOAD = "x" * 300
_TOOL = "lookup"


def _sqlite_pragmas(conn: Any) -> None:
    """The durability every framework gets on SQLite: WAL, ``synchronous=NORMAL``."""
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")


# -- turnkit -----------------------------------------------------------------------


class PayloadModel:
    """Asks for one ``lookup`` call per step (a 300-byte argument) until ``pairs``
    results exist, then answers; it reads ``len(messages)`` only."""

    def __init__(self, pairs: int, tool: str) -> None:
        self.pairs = pairs
        self.tool = tool

    async def stream(self, messages: Sequence[Any], tools: Any, *, system: str | None) -> Any:
        n = len(messages)
        if (n - 1) // 2 < self.pairs:
            call = ToolCall(id=f"c{n}", name=self.tool, input={"q": PAYLOAD})
            yield TextDelta(text="ok")
            yield ModelDone(reply=ModelReply(text="ok", tool_calls=(call,)))
        else:
            yield ModelDone(reply=ModelReply(text="done"))


@turnkit.tool(name=_TOOL)
def lookup(q: str) -> str:
    """Answer with 300 bytes."""
    return PAYLOAD


@turnkit.tool(name=_TOOL)
async def lookup_async(q: str) -> str:
    """Answer with 300 bytes, asynchronously."""
    return PAYLOAD


async def turnkit_turn(store: Store, pairs: int, kind: str) -> float:
    """One turn of ``pairs`` pairs; its seconds. Checks the stored transcript."""
    tool = lookup if kind == "def" else lookup_async
    agent = turnkit.Agent(name="bench", model=PayloadModel(pairs, _TOOL), tools=[tool])
    async with turnkit.Runtime(agent, store=store) as runtime:
        session = runtime.session("bench", "s1")
        gc.collect()
        start = time.perf_counter()
        answer = await session.turn("go")
        elapsed = time.perf_counter() - start
        stored = await session.messages()
    if answer != "done" or len(stored) != 2 * pairs + 2:
        raise RuntimeError(f"turnkit did not run as scripted: {answer!r}, {len(stored)} messages")
    return elapsed


# -- LangGraph ---------------------------------------------------------------------


class GraphState(TypedDict):
    messages: Annotated[list[dict[str, Any]], operator.add]


def langgraph_app(checkpointer: Any, pairs: int) -> Any:
    from langgraph.graph import END, START, StateGraph

    def model(state: GraphState) -> dict[str, Any]:
        done = sum(1 for m in state["messages"] if m["role"] == "tool")
        if done < pairs:
            call = {"id": f"c{done}", "name": _TOOL, "args": {"q": PAYLOAD}}
            return {"messages": [{"role": "assistant", "text": "ok", "tool_calls": [call]}]}
        return {"messages": [{"role": "assistant", "text": "done", "tool_calls": []}]}

    def tools(state: GraphState) -> dict[str, Any]:
        call = state["messages"][-1]["tool_calls"][0]
        return {"messages": [{"role": "tool", "call_id": call["id"], "result": PAYLOAD}]}

    def route(state: GraphState) -> str:
        return "tools" if state["messages"][-1]["tool_calls"] else END

    graph = StateGraph(GraphState)
    graph.add_node("model", model)
    graph.add_node("tools", tools)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", route, ["tools", END])
    graph.add_edge("tools", "model")
    return graph.compile(checkpointer=checkpointer)


def langgraph_turn(checkpointer: Any, pairs: int) -> float:
    app = langgraph_app(checkpointer, pairs)
    config = {"configurable": {"thread_id": uuid.uuid4().hex}, "recursion_limit": 2 * pairs + 10}
    gc.collect()
    start = time.perf_counter()
    final = app.invoke({"messages": [{"role": "user", "text": "go", "tool_calls": []}]}, config)
    elapsed = time.perf_counter() - start
    last = final["messages"][-1]
    saved = sum(1 for _ in checkpointer.list(config))
    # One checkpoint per super-step: the input, each model and tool node, the end.
    if last["text"] != "done" or saved < 2 * pairs + 1:
        raise RuntimeError(f"LangGraph did not run as scripted: {last}, {saved} checkpoints")
    return elapsed


@contextmanager
def langgraph_sqlite(path: Path) -> Iterator[Any]:
    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(path, check_same_thread=False)
    _sqlite_pragmas(conn)
    try:
        yield SqliteSaver(conn)
    finally:
        conn.close()


@contextmanager
def langgraph_postgres(dsn: str) -> Iterator[Any]:
    from langgraph.checkpoint.postgres import PostgresSaver

    schema = fresh_schema("bench_lg")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        with PostgresSaver.from_conn_string(_in_schema(dsn, schema)) as saver:
            saver.setup()
            yield saver
    finally:
        drop_schema(dsn, schema)


def _in_schema(dsn: str, schema: str) -> str:
    joiner = "&" if "?" in dsn else "?"
    return f"{dsn}{joiner}options=-csearch_path%3D{schema}"


# -- DBOS --------------------------------------------------------------------------


def _dbos_workflow() -> Callable[[int], str]:
    """The DBOS turn: a workflow of model and tool steps (registered once)."""
    from dbos import DBOS

    @DBOS.step()
    def model_step(done: int, pairs: int) -> dict[str, Any]:
        if done < pairs:
            call = {"id": f"c{done}", "name": _TOOL, "args": {"q": PAYLOAD}}
            return {"role": "assistant", "text": "ok", "tool_calls": [call]}
        return {"role": "assistant", "text": "done", "tool_calls": []}

    @DBOS.step()
    def tool_step(call: dict[str, Any]) -> dict[str, Any]:
        return {"role": "tool", "call_id": call["id"], "result": PAYLOAD}

    @DBOS.workflow()
    def turn(pairs: int) -> str:
        done = 0
        while True:
            reply = model_step(done, pairs)
            if not reply["tool_calls"]:
                return str(reply["text"])
            tool_step(reply["tool_calls"][0])
            done += 1

    return turn


_DBOS_TURN: Callable[[int], str] | None = None


@contextmanager
def dbos_running(url: str | None, engine: Any | None, schema: str | None) -> Iterator[Any]:
    from dbos import DBOS, DBOSConfig

    global _DBOS_TURN
    if _DBOS_TURN is None:
        _DBOS_TURN = _dbos_workflow()
    config: DBOSConfig = {"name": "turnkit-peers", "log_level": "ERROR", "run_migrations": True}
    if engine is not None:
        config["system_database_engine"] = engine
        config["system_database_url"] = str(engine.url)
    if url is not None:
        config["system_database_url"] = url
    if schema is not None:
        config["dbos_system_schema"] = schema
    DBOS(config=config)
    DBOS.launch()
    try:
        yield DBOS
    finally:
        DBOS.destroy(destroy_registry=False)


def dbos_turn(dbos: Any, pairs: int) -> float:
    assert _DBOS_TURN is not None
    gc.collect()
    workflow_id = uuid.uuid4().hex
    from dbos import SetWorkflowID

    start = time.perf_counter()
    with SetWorkflowID(workflow_id):
        answer = _DBOS_TURN(pairs)
    elapsed = time.perf_counter() - start
    steps = dbos.list_workflow_steps(workflow_id)
    if answer != "done" or len(steps) != 2 * pairs + 1:
        raise RuntimeError(f"DBOS did not run as scripted: {answer!r}, {len(steps)} steps")
    return elapsed


@contextmanager
def dbos_sqlite(path: Path) -> Iterator[Any]:
    import sqlalchemy as sa

    engine = sa.create_engine(f"sqlite:///{path}")
    sa.event.listen(engine, "connect", lambda conn, _record: _sqlite_pragmas(conn))
    with dbos_running(None, engine, None) as dbos:
        yield dbos
    engine.dispose()


@contextmanager
def dbos_postgres(dsn: str) -> Iterator[Any]:
    schema = fresh_schema("bench_dbos")
    url = dsn.replace("postgresql://", "postgresql+psycopg://", 1)
    try:
        with dbos_running(url, None, schema) as dbos:
            yield dbos
    finally:
        drop_schema(dsn, schema)


# -- the runs ----------------------------------------------------------------------


def _median_us(seconds: list[float], pairs: int) -> float:
    return statistics.median(seconds) / pairs * 1e6


def measure(store: str, pairs: int, runs: int, dsn: str, tmp: Path) -> dict[str, float]:
    """µs per pair for every framework on ``store``, medians of ``runs``."""
    row: dict[str, float] = {}
    for kind in ("def", "async"):
        times = []
        for n in range(runs + 1):  # the first run warms up, uncounted
            fresh: Store = (
                SqliteStore(tmp / f"tk-{kind}-{pairs}-{n}.db")
                if store == "sqlite"
                else PostgresStore(dsn, schema=fresh_schema("bench_tk"))
            )
            try:
                elapsed = asyncio.run(turnkit_turn(fresh, pairs, kind))
            finally:
                if isinstance(fresh, PostgresStore):
                    drop_schema(dsn, fresh.schema)
            if n:
                times.append(elapsed)
        row[f"turnkit {kind}"] = _median_us(times, pairs)
    saver = langgraph_sqlite if store == "sqlite" else langgraph_postgres
    times = []
    for n in range(runs + 1):
        where: Any = tmp / f"lg-{pairs}-{n}.db" if store == "sqlite" else dsn
        with saver(where) as checkpointer:
            elapsed = langgraph_turn(checkpointer, pairs)
        if n:
            times.append(elapsed)
    row["LangGraph"] = _median_us(times, pairs)
    running = dbos_sqlite if store == "sqlite" else dbos_postgres
    times = []
    for n in range(runs + 1):
        where = tmp / f"dbos-{pairs}-{n}.db" if store == "sqlite" else dsn
        with running(where) as dbos:
            elapsed = dbos_turn(dbos, pairs)
        if n:
            times.append(elapsed)
    row["DBOS"] = _median_us(times, pairs)
    row["floor"] = _floor_us(store, pairs, runs, dsn, tmp)
    return row


def _floor_us(store: str, pairs: int, runs: int, dsn: str, tmp: Path) -> float:
    """Two bare commits per pair, as ``step_overhead.py`` measures them."""
    if store == "sqlite":
        timer = step_overhead._sqlite_timer(tmp)
        floor = step_overhead.measure_floor("sqlite", pairs, runs, pairs, timer)
    else:
        floor = step_overhead.measure_pg_floor(dsn, pairs, runs, pairs)
    return floor.pair_3rows_us


def print_table(rows: dict[tuple[str, int], dict[str, float]]) -> None:
    names = ["turnkit def", "turnkit async", "LangGraph", "DBOS", "floor"]
    print("| store | pairs | " + " | ".join(names) + " | LangGraph / turnkit | DBOS / turnkit |")
    print("|---" * (len(names) + 4) + "|")
    for (store, pairs), row in rows.items():
        ours = max(row["turnkit def"], row["turnkit async"])  # the slower of the two
        cells = " | ".join(f"{row[n]:,.0f}" for n in names)
        print(
            f"| {store} | {pairs} | {cells} | {row['LangGraph'] / ours:.1f}x "
            f"| {row['DBOS'] / ours:.1f}x |"
        )
    print(
        "\nµs per model+tool pair, medians; the ratios divide by turnkit's slower tool "
        "kind; floor: two bare commits per pair in the same run."
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stores", nargs="+", default=["sqlite", "postgres"])
    parser.add_argument("--pairs", nargs="+", type=int, default=[100, 500])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--dsn", default=os.environ.get("TURNKIT_TEST_POSTGRES_DSN", DEFAULT_DSN))
    args = parser.parse_args(argv)
    print(f"python {sys.version.split()[0]}, sqlite {sqlite3.sqlite_version}", flush=True)
    rows: dict[tuple[str, int], dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for store in args.stores:
            for pairs in args.pairs:
                rows[(store, pairs)] = measure(store, pairs, args.runs, args.dsn, Path(tmp))
                print(f"  {store} @{pairs}: {rows[(store, pairs)]}", flush=True)
    print_table(rows)


if __name__ == "__main__":
    main()
