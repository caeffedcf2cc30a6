"""The local deployment example (examples/deploy) runs: an HTTP node and three
workers from its Procfile on the test PostgreSQL, turns posted over HTTP, a feed
on the HTTP node showing a worker's text as it grows, each lookup noted once."""

from __future__ import annotations

import os
import re
import shlex
import socket
import string
import subprocess
import sys

import httpx
import psycopg
import pytest
from eventually import eventually_blocking
from psycopg import sql
from suite_paths import ROOT

RUNNER = ROOT / "examples" / "deploy" / "run_local.py"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.slow
def test_the_local_deployment_runs_turns_on_its_workers(pg_dsn: str, pg_schema: str) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(RUNNER),
            "--dsn",
            pg_dsn,
            "--schema",
            pg_schema,
            "--port",
            str(free_port()),
            "--sessions",
            "2",
            "--turns",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "runner | the HTTP node is ready" in out
    assert len(re.findall(r"worker_\d \| turnkit worker: running orders", out)) == 3
    feed = [line.split("|", 1)[1].strip() for line in out.splitlines() if "s0 feed |" in line]
    # The last turn of s0 began after the feed was listening: its answer came word
    # by word, before its end.
    last_start = len(feed) - 1 - feed[::-1].index("[turn.started]")
    assert feed[-1] == "[turn.completed]"
    assert feed[last_start + 1 : last_start + 3] == ["Order", "A01"]
    lookups = [tuple(map(int, m)) for m in re.findall(r"(\d+) turns \((\d+) lookups\)", out)]
    assert sum(turns for turns, _ in lookups) == 4
    assert all(turns == noted for turns, noted in lookups)  # each lookup once
    assert "runner | stopped" in out


@pytest.mark.slow
def test_the_procfile_alone_serves_a_turn_on_a_fresh_schema(pg_dsn: str, pg_schema: str) -> None:
    """Issue 37 item 3: started as the Procfile starts it (no run_local.py to create
    tables first), the HTTP node and a worker answer a turn from the tool's result."""
    folder = RUNNER.parent
    port = free_port()
    sep = "&" if "?" in pg_dsn else "?"
    env = {
        **os.environ,
        "DATABASE_URL": pg_dsn,
        "TURNKIT_SCHEMA": pg_schema,
        "WORKER_URL": f"{pg_dsn}{sep}options=-csearch_path%3D{pg_schema}",
        "PORT": str(port),
        "TURNKIT_POOL_SIZE": "4",
    }
    commands = dict(
        line.split(":", 1) for line in (folder / "Procfile").read_text().splitlines() if line
    )
    started = []
    try:
        for name in ("web", "worker_1"):
            words = [string.Template(w).substitute(env) for w in shlex.split(commands[name])]
            program = {"uvicorn": ["-m", "uvicorn"], "turnkit": ["-m", "turnkit.cli"]}[words[0]]
            started.append(
                subprocess.Popen(
                    [sys.executable, *program, *words[1:]],
                    cwd=folder,
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        url = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=url, timeout=60) as client:

            def ready() -> bool:
                exited = [p for p in started if p.poll() is not None]
                assert not exited, [p.communicate()[1] for p in exited]
                return client.get("/readyz").status_code == 200

            eventually_blocking(
                ready,
                what="the HTTP node ready",
                timeout=60,
                ignoring=(httpx.TransportError,),
            )
            reply = client.post(
                "/agents/orders/sessions/s1/chat", json={"text": "A01"}, headers={"X-User": "ann"}
            )
        assert reply.status_code == 200, reply.text
        assert re.fullmatch(r"Order A01 is \w+, handled by worker \d+\.", reply.json()["text"])
        with psycopg.connect(pg_dsn) as conn:
            rows = conn.execute(
                sql.SQL("SELECT order_id FROM {}.order_lookups").format(sql.Identifier(pg_schema))
            ).fetchall()
        assert rows == [("A01",)]
    finally:
        for proc in started:
            proc.terminate()
        for proc in started:
            proc.wait(30)
