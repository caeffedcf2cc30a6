"""What A2A costs over the app's own endpoint: one turn as an A2A task, and as ``/chat``.

Run from the repo root::

    .venv/bin/python benchmarks/a2a_tasks.py              # 5 runs of 200 turns each
    .venv/bin/python benchmarks/a2a_tasks.py --runs 9 --turns 500

One process serves an echo agent (``ScriptedModel``, no tools) on a SQLite file
with ``create_app(..., frontends=[a2a_server()])``, to clients in the same process
through httpx's ASGI transport (``--tcp``: over uvicorn on a loopback port, where
every request, ``/healthz`` included, costs a fixed ~44 ms on this machine's
loopback, which hides the rest); they send, one after another:

- ``A2A send``: ``SendMessage`` through the official ``a2a-sdk`` client (non-streaming,
  blocking until the task completes), each message opening a task in a new context;
- ``A2A get``: ``GetTask`` of a finished task;
- ``/chat``: ``POST /agents/{agent}/sessions/{id}/chat`` with a JSON answer, the
  app's own endpoint for the same turn;
- ``/healthz``: the floor, a request that reaches no handler of turnkit's.

The figures are milliseconds per call: the median over the runs of each run's median.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import uvicorn
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.helpers import new_text_part
from a2a.types import GetTaskRequest, Message, Role, SendMessageRequest
from starlette.requests import Request

import turnkit
from turnkit.a2a import a2a_server
from turnkit.server import Principal, create_app
from turnkit.stores import SqliteStore
from turnkit.testing import ScriptedModel


def by_header(request: Request) -> Principal | None:
    user = request.headers.get("x-user")
    return Principal(id=user) if user else None


async def one_run(folder: Path, turns: int, *, tcp: bool) -> dict[str, float]:
    agent = turnkit.Agent(name="echo", model=ScriptedModel(respond=lambda t: "ok"))
    runtime = turnkit.Runtime([agent], store=SqliteStore(str(folder / f"{uuid.uuid4().hex}.db")))
    app = create_app(runtime, authenticate=by_header, frontends=[a2a_server()])
    async with runtime:
        if not tcp:
            transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 1))
            async with httpx.AsyncClient(
                transport=transport, headers={"X-User": "bench"}, timeout=60
            ) as http:
                return await timed(http, "http://bench", turns)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            await asyncio.sleep(0.01)
        base = f"http://127.0.0.1:{sock.getsockname()[1]}"
        try:
            async with httpx.AsyncClient(headers={"X-User": "bench"}, timeout=60) as http:
                return await timed(http, base, turns)
        finally:
            server.should_exit = True
            await serving


async def timed(http: httpx.AsyncClient, base: str, turns: int) -> dict[str, float]:
    timings: dict[str, list[float]] = {"A2A send": [], "A2A get": [], "/chat": [], "/healthz": []}
    card = await A2ACardResolver(http, f"{base}/agents/echo/a2a").get_agent_card()
    client = ClientFactory(ClientConfig(httpx_client=http, streaming=False)).create(card)
    for n in range(turns):
        sent = Message(role=Role.ROLE_USER, message_id=f"m{n}", parts=[new_text_part("hi")])
        started = time.perf_counter()
        request = SendMessageRequest(message=sent)
        [response] = [r async for r in client.send_message(request)]
        timings["A2A send"].append(time.perf_counter() - started)
        started = time.perf_counter()
        await client.get_task(GetTaskRequest(id=response.task.id))
        timings["A2A get"].append(time.perf_counter() - started)
        started = time.perf_counter()
        reply = await http.post(f"{base}/agents/echo/sessions/c{n}/chat", json={"text": "hi"})
        timings["/chat"].append(time.perf_counter() - started)
        assert reply.json()["status"] == "completed"
        started = time.perf_counter()
        await http.get(f"{base}/healthz")
        timings["/healthz"].append(time.perf_counter() - started)
    return {name: statistics.median(values) * 1000 for name, values in timings.items()}


async def main(runs: int, turns: int, tcp: bool) -> None:
    results: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(runs):
            results.append(await one_run(Path(folder), turns, tcp=tcp))
    for name in results[0]:
        medians = [r[name] for r in results]
        print(
            f"{name:10s} median {statistics.median(medians):6.2f} ms"
            f"  (runs: {', '.join(f'{m:.2f}' for m in medians)})"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--tcp", action="store_true", help="over uvicorn on a loopback port")
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.turns, args.tcp))
