"""What a 1 MB tool result costs per step, kept in the rows (before) or as a blob (after).

Run from the repo root::

    .venv/bin/python benchmarks/large_payloads.py                  # sqlite, postgres, memory
    .venv/bin/python benchmarks/large_payloads.py --stores sqlite --runs 7 --size 1000000

Each run is ONE turn on a fresh store: a zero-latency model calls a tool ``--pairs``
times, each call returning a different ``--size``-byte document (random base64 text,
which compresses little), then answers. The
tool's result is kept three times (its step, its tool message and its
``action.completed`` event), so without blobs every call writes its document into
three rows; with ``blobs`` the rows keep a reference and the document is written once.

For each store it reports, as medians of ``--runs`` runs (the modes run by turns, run
by run, so drift on a shared machine hits them alike):

- ``ms/pair``: the turn's wall time divided by its pairs (the model+tool step pair
  that carries one large result, fixed per-turn costs included), and ``cpu/pair``:
  this process's CPU time over the turn, divided the same way (what other processes'
  load inflates least; PostgreSQL's own work is not in it);
- ``load ms``: a fresh store (as a new process) reading the session back, the way a
  resumed or replayed turn does (``load(turn_id)``: every message and the turn's steps);
- ``MB kept``: what the store holds afterwards (SQLite: the database file, its WAL and
  the blob directory; PostgreSQL: the schema's tables with their TOAST and indexes).

Modes: ``rows`` (no blobs: the code path before large payloads), ``blobs``
(``FileBlobStore`` with ``fsync``, the default, on SQLite; ``turnkit_blobs`` on
PostgreSQL; ``MemoryBlobStore`` on the memory store) and, on SQLite, ``blobs-nofsync``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from _floor import DEFAULT_DSN

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
)
from turnkit.stores import FileBlobStore, MemoryBlobStore, MemoryStore, SqliteStore, Store

_DOC: list[str] = [""]


class FetchingModel:
    """Calls ``fetch`` once per model step until ``pairs`` results exist, then answers."""

    def __init__(self, pairs: int) -> None:
        self.pairs = pairs

    async def stream(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], *, system: str | None
    ) -> AsyncIterator[ModelDelta]:
        n = len(messages)
        if (n - 1) // 2 < self.pairs:
            call = ToolCall(id=f"c{n}", name="fetch", input={"k": n})
            yield TextDelta(text="ok")
            stop = StopReason(kind="tool_use")
            yield ModelDone(reply=ModelReply(text="ok", tool_calls=(call,), stop=stop))
        else:
            yield TextDelta(text="done")
            yield ModelDone(reply=ModelReply(text="done", stop=StopReason(kind="end_turn")))


@turnkit.tool
async def fetch(k: int = 0) -> dict[str, Any]:
    """A large document, different on every call."""
    return {"k": k, "body": f"{k:08d}" + _DOC[0]}


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


class Case:
    """One store kind in one mode: makes its stores and measures what they keep."""

    def __init__(self, kind: str, mode: str, work: Path, dsn: str) -> None:
        self.kind, self.mode, self.work, self.dsn = kind, mode, work, dsn
        self.schema = ""
        self._memory: MemoryStore | None = None

    def fresh(self) -> None:
        self._memory = None
        self.db = self.work / f"{uuid.uuid4().hex}.db"
        self.blob_dir = self.work / f"{uuid.uuid4().hex}-blobs"
        if self.kind == "postgres":
            self.schema = f"bench_blobs_{uuid.uuid4().hex[:10]}"

    def store(self) -> Store:
        blobs = self.mode != "rows"
        if self.kind == "memory":
            if self._memory is None:
                self._memory = MemoryStore(blobs=MemoryBlobStore() if blobs else None)
            return self._memory
        if self.kind == "sqlite":
            fsync = self.mode != "blobs-nofsync"
            return SqliteStore(
                self.db, blobs=FileBlobStore(self.blob_dir, fsync=fsync) if blobs else None
            )
        from turnkit.stores import PostgresStore

        return PostgresStore(self.dsn, schema=self.schema, blobs=blobs)

    def kept_bytes(self) -> int:
        if self.kind == "memory":
            return 0
        if self.kind == "sqlite":
            files = [self.db, Path(f"{self.db}-wal")]
            return sum(f.stat().st_size for f in files if f.exists()) + _dir_bytes(self.blob_dir)
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relkind = 'r'",
                (self.schema,),
            ).fetchone()
        return int(row[0]) if row else 0

    def drop(self) -> None:
        if self.kind == "postgres" and self.schema:
            import psycopg

            with psycopg.connect(self.dsn, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')


async def one_run(case: Case, pairs: int) -> tuple[float, float, float, int]:
    """(ms per pair, CPU ms per pair, load ms, bytes kept) of one turn on a fresh store."""
    case.fresh()
    agent = turnkit.Agent(name="a", model=FetchingModel(pairs), tools=[fetch])
    try:
        async with turnkit.Runtime(agent, store=case.store()) as rt:
            session = rt.session("a", "bench")
            start, cpu = time.perf_counter(), time.process_time()
            result = await session.result(session.start("go"))
            turn_s = time.perf_counter() - start
            cpu_s = time.process_time() - cpu
            assert result.status == "completed", result
        store = case.store()
        async with turnkit.Runtime(agent, store=store):
            start = time.perf_counter()
            snap = await store.session("bench").load(result.turn_id)
            load_s = time.perf_counter() - start
            assert len(snap.messages) == 2 * pairs + 2 and len(snap.steps) >= 2 * pairs
        return turn_s / pairs * 1e3, cpu_s / pairs * 1e3, load_s * 1e3, case.kept_bytes()
    finally:
        case.drop()


def _postgres_reachable(dsn: str) -> bool:
    try:
        import psycopg

        with psycopg.connect(dsn, connect_timeout=3):
            return True
    except Exception:
        return False


async def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5, help="runs per case; figures are medians")
    p.add_argument("--pairs", type=int, default=5, help="model+tool pairs per turn")
    p.add_argument("--size", type=int, default=1_000_000, help="bytes of each tool result")
    p.add_argument("--stores", nargs="+", default=["sqlite", "postgres", "memory"])
    p.add_argument("--dsn", default=os.environ.get("TURNKIT_BENCH_POSTGRES_DSN", DEFAULT_DSN))
    args = p.parse_args(argv)
    # Random base64: text that compresses little (PostgreSQL compresses what it keeps).
    _DOC[0] = base64.b64encode(os.urandom(args.size)).decode()[: args.size - 8]
    stores = [s for s in args.stores if s != "postgres" or _postgres_reachable(args.dsn)]
    if len(stores) < len(args.stores):
        print(f"postgres skipped: {args.dsn} is not reachable", file=sys.stderr)
    print(
        f"{args.pairs} pairs a turn, each tool result {args.size:,} bytes; "
        f"medians of {args.runs} runs (python {sys.version.split()[0]})"
    )
    print(f"{'store':<9}{'mode':<15}{'ms/pair':>9}{'cpu/pair':>9}{'load ms':>9}{'MB kept':>9}")
    with tempfile.TemporaryDirectory(prefix="turnkit-blobs-bench-") as tmp:
        for kind in stores:
            modes = ["rows", "blobs"] + (["blobs-nofsync"] if kind == "sqlite" else [])
            cases = [Case(kind, mode, Path(tmp), args.dsn) for mode in modes]
            await one_run(cases[0], 1)  # warm-up: imports, first connections
            results: dict[str, list[tuple[float, float, float, int]]] = {m: [] for m in modes}
            for _ in range(args.runs):
                for case in cases:
                    results[case.mode].append(await one_run(case, args.pairs))
            for mode in modes:
                runs = results[mode]
                pair, cpu, load, kept = (statistics.median(r[i] for r in runs) for i in range(4))
                print(f"{kind:<9}{mode:<15}{pair:>9.2f}{cpu:>9.2f}{load:>9.2f}{kept / 1e6:>9.1f}")


if __name__ == "__main__":
    asyncio.run(main())
