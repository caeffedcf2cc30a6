"""A turnkit deployment on this machine: one HTTP node and three workers on one
PostgreSQL database, started from the ``Procfile`` beside this file.

    .venv/bin/pip install -e '.[server,postgres]' httpx   # what it needs, from a checkout
    .venv/bin/python examples/deploy/run_local.py             # runs a demo, then stops
    .venv/bin/python examples/deploy/run_local.py --keep      # keeps serving until Ctrl-C
    .venv/bin/python examples/deploy/run_local.py --dsn postgresql://…  # default: $DATABASE_URL

It creates turnkit's tables in ``--schema`` (as the schema's owner would, once per
release; the HTTP node creates the tool's table itself), starts every process of
the Procfile (any Procfile runner, such as honcho or foreman, would start the same
ones), waits for the HTTP node's ``/readyz``, then posts turns to several sessions
over HTTP while following one session's feed, whose text grows live although a
worker writes it. At the end it
says which worker ran which turn (each lookup is noted once, whichever worker ran
it) and stops the processes with SIGTERM, as an orchestrator would.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import signal
import string
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psycopg

import turnkit
from turnkit.stores import PostgresStore

HERE = Path(__file__).resolve().parent
USER = {"X-User": "ann"}


def procfile() -> list[tuple[str, str]]:
    """The ``name: command`` lines of the Procfile."""
    found = []
    for line in (HERE / "Procfile").read_text().splitlines():
        name, colon, command = line.partition(":")
        if colon and not name.startswith("#"):
            found.append((name.strip(), command.strip()))
    return found


def start(name: str, command: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """Start one Procfile process, its output prefixed with its name."""
    args = [string.Template(word).safe_substitute(env) for word in shlex.split(command)]
    if args[0] == "turnkit":
        args = [sys.executable, "-m", "turnkit.cli", *args[1:]]
    elif args[0] == "uvicorn":
        args = [sys.executable, "-m", "uvicorn", *args[1:]]
    proc = subprocess.Popen(
        args, cwd=HERE, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )

    def echo() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            print(f"{name:>9} | {line.rstrip()}", flush=True)

    threading.Thread(target=echo, daemon=True).start()
    return proc


async def prepare(dsn: str, schema: str) -> None:
    """Create turnkit's tables (the schema owner's job, once per release); the tool's
    own table is the HTTP node's to create when it starts."""
    store = PostgresStore(dsn, schema=schema)
    await store.open()
    await store.close()


async def demo(url: str, sessions: int, turns: int) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        while True:
            try:
                if (await client.get("/readyz")).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.2)
        print("runner | the HTTP node is ready", flush=True)
        path = "/agents/orders/sessions/{}/{}"
        ended = asyncio.Queue[None]()
        watching = asyncio.create_task(watch(client, path.format("s0", "events"), ended))

        async def session(n: int) -> None:
            for k in range(turns):
                body = {"text": f"A{n}{k}"}
                async with client.stream(
                    "POST", path.format(f"s{n}", "turns"), json=body, headers=USER
                ) as response:
                    response.raise_for_status()
                    async for _ in response.aiter_lines():
                        pass  # the turn's stream ends when the turn does

        await asyncio.gather(*(session(n) for n in range(sessions)))
        with contextlib.suppress(TimeoutError):  # the feed shows s0's last ending too
            for _ in range(turns):
                await asyncio.wait_for(ended.get(), 10)
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)


async def watch(client: httpx.AsyncClient, path: str, ended: asyncio.Queue[None]) -> None:
    """Print one session's feed: each answer's words as they come."""
    while True:  # the session exists once its first turn is stored
        async with client.stream("GET", path, headers=USER) as response:
            if response.status_code == 404:
                await asyncio.sleep(0.1)
                continue
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                event = json.loads(line.removeprefix("data: "))
                if event["type"] == "message.delta":
                    print(f"  s0 feed | {event['text']}", flush=True)
                elif event["type"] in ("turn.started", "turn.completed"):
                    print(f"  s0 feed | [{event['type']}]", flush=True)
                    if event["type"] == "turn.completed":
                        ended.put_nowait(None)


def report(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            f'SELECT pid, count(*), count(DISTINCT turn_id) FROM "{schema}".order_lookups '
            "GROUP BY pid ORDER BY pid"
        ).fetchall()
    for pid, lookups, turns in rows:
        print(f"runner | worker {pid}: {turns} turns ({lookups} lookups)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--dsn", default=os.environ.get("DATABASE_URL", "postgresql://127.0.0.1:5432/test")
    )
    parser.add_argument("--schema", default="turnkit_deploy_example")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--turns", type=int, default=3, help="turns per session")
    parser.add_argument("--keep", action="store_true", help="keep serving until Ctrl-C")
    args = parser.parse_args()
    asyncio.run(prepare(args.dsn, args.schema))
    sep = "&" if "?" in args.dsn else "?"
    env = {
        **os.environ,
        "DATABASE_URL": args.dsn,
        "TURNKIT_SCHEMA": args.schema,
        "WORKER_URL": f"{args.dsn}{sep}options=-csearch_path%3D{args.schema}",
        "PORT": str(args.port),
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(Path(turnkit.__file__).parents[1]), os.environ.get("PYTHONPATH")])
        ),
    }
    processes = [start(name, command, env) for name, command in procfile()]
    try:
        url = f"http://127.0.0.1:{args.port}"
        asyncio.run(demo(url, args.sessions, args.turns))
        report(args.dsn, args.schema)
        if args.keep:
            print(f"runner | serving on {url}; Ctrl-C stops everything", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(3600)
    finally:
        for proc in processes:
            proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(timeout=60) for proc in processes]
        print(f"runner | stopped; exit codes {codes}", flush=True)


if __name__ == "__main__":
    main()
