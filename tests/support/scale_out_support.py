"""A scale-out cluster on the test PostgreSQL server: an HTTP node in this process and
``turnkit worker`` processes running the queue agent (``fixtures/queue_agent``), with
what a test reads of them (rows, worker logs, held locks). The scale-out tests and
the ops port's share it."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
from cli_support import OFFLINE_ENV
from eventually import eventually
from server_support import serving
from suite_paths import FIXTURES

import turnkit
from turnkit.stores import PostgresStore

AGENT_DIR = FIXTURES / "queue_agent"
AGENT = "queued"
USER = {"X-User": "ann"}


@dataclass
class Cluster:
    """The HTTP node (in this process) and the workers (subprocesses) on one schema."""

    dsn: str
    schema: str
    hold: Path
    logs: Path
    client: httpx.AsyncClient
    runtime: turnkit.RuntimeClient
    workers: list[subprocess.Popen[str]]

    @property
    def store_dsn(self) -> str:
        return f"{self.dsn}?options=-csearch_path%3D{self.schema}"

    def start_worker(self, *extra: str) -> subprocess.Popen[str]:
        n = len(self.workers)
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "turnkit.cli",
                "worker",
                str(AGENT_DIR),
                "--store",
                self.store_dsn,
                "--poll",
                "0.5",
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=(self.logs / f"worker-{n}.log").open("w"),
            text=True,
            env={**OFFLINE_ENV, "PYTHONUNBUFFERED": "1", "TURNKIT_TEST_HOLD_DIR": str(self.hold)},
        )
        self.workers.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("turnkit worker: running queued"), (line, self.log(n))
        return proc

    def log(self, n: int) -> str:
        return (self.logs / f"worker-{n}.log").read_text()

    def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{self.schema}"')
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else []

    def path(self, session: str, verb: str) -> str:
        return f"/agents/{AGENT}/sessions/{session}/{verb}"

    async def submit(self, session: str, text: str) -> str:
        """POST a turn and leave once it is stored (the stream's first line)."""
        body = {"text": text}
        async with self.client.stream(
            "POST", self.path(session, "turns"), json=body, headers=USER
        ) as response:
            assert response.status_code == 200, await response.aread()
        rows = self.sql(
            "SELECT turn_id FROM turnkit_turns "
            "WHERE session_id = %s AND opening::json->>'text' = %s",
            session,
            text,
        )
        assert len(rows) == 1, rows
        return str(rows[0][0])

    def logs_of_all(self) -> str:
        return "\n".join(self.log(n) for n in range(len(self.workers)))

    async def wait_for(self, query: str, *params: Any, timeout: float = 60.0) -> None:
        await eventually(
            lambda: self.sql(query, *params),
            what=lambda: f"{query} {params}\n{self.logs_of_all()}",
            timeout=timeout,
        )

    async def wait_for_line(self, n: int, text: str, timeout: float = 60.0) -> None:
        """Wait until worker ``n``'s log has a line with ``text``."""
        await eventually(
            lambda: text in self.log(n), what=lambda: f"{text!r} in {self.log(n)}", timeout=timeout
        )

    async def wait_for_claims(self, workers: int) -> None:
        """Wait until ``workers`` workers have each claimed at least once: a worker
        registers as alive right after its first claim."""
        await self.wait_for("SELECT 1 FROM turnkit_workers HAVING count(*) >= %s", workers)

    async def wait_for_file(self, pattern: str, timeout: float = 60.0) -> Path:
        found = await eventually(
            lambda: sorted(self.hold.glob(pattern)),
            what=lambda: f"{pattern} in {self.hold}\n{self.logs_of_all()}",
            timeout=timeout,
        )
        return found[0]

    def held_sessions(self) -> list[tuple[Any, ...]]:
        """The sessions whose writer lock some connection holds."""
        return self.sql(
            "SELECT s.session_id FROM turnkit_sessions s JOIN pg_locks l "
            "ON l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
            "AND ((l.classid::bigint << 32) | l.objid::bigint) = turnkit_lock_key(s.session_id)"
        )

    def effects(self, turn_id: str) -> list[tuple[Any, ...]]:
        return self.sql("SELECT label, pid FROM scale_effects WHERE turn_id = %s", turn_id)

    def status(self, turn_id: str) -> str:
        return str(self.sql("SELECT status FROM turnkit_turns WHERE turn_id = %s", turn_id)[0][0])


@asynccontextmanager
async def cluster(dsn: str, schema: str, hold: Path, logs: Path) -> AsyncIterator[Cluster]:
    """The node on ``schema`` with no worker yet (``Cluster.start_worker``); held calls
    wait on files in ``hold``, workers log to ``logs``. Every worker is killed after."""
    agent = turnkit.load_agent(AGENT_DIR)
    store = PostgresStore(dsn, schema=schema, busy_timeout=30.0)
    runtime = turnkit.RuntimeClient([agent], store=store, poll=0.2)
    async with runtime, serving(runtime) as served:
        node = Cluster(dsn, schema, hold, logs, served.client, runtime, [])
        node.sql(
            "CREATE TABLE scale_effects (session_id text, turn_id text, label text, pid integer)"
        )
        try:
            yield node
        finally:
            (hold / "release").touch()
            for proc in node.workers:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGCONT)
                    proc.kill()
                proc.wait()
