"""A real server for the HTTP tests: hypercorn on a loopback port, in the test's loop.

Requests go over TCP through httpx; identity comes from an ``X-User`` header, which
is what the tests' ``authenticate`` trusts.
"""

from __future__ import annotations

import asyncio
import json
import queue
import sqlite3
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from starlette.requests import Request

import turnkit
from turnkit import tool
from turnkit.server import Principal, ServerLimits, create_app
from turnkit.server._serving import listen, serve_until, until_started
from turnkit.stores import parked_turn, transcript
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call


def by_header(request: Request) -> Principal | None:
    user = request.headers.get("x-user")
    return Principal(id=user) if user else None


@dataclass
class Served:
    url: str
    runtime: turnkit.RuntimeClient
    client: httpx.AsyncClient

    def path(self, agent: str, session: str, verb: str) -> str:
        return f"/agents/{agent}/sessions/{session}/{verb}"


@asynccontextmanager
async def serving(
    runtime: turnkit.RuntimeClient,
    *,
    authenticate: Callable[[Request], Principal | Awaitable[Principal | None] | None] = by_header,
    limits: ServerLimits | None = None,
    chat_page: bool = False,
    **options: Any,
) -> AsyncIterator[Served]:
    """``create_app(runtime, …, **options)`` served on a free loopback port."""
    app = create_app(
        runtime, authenticate=authenticate, limits=limits, chat_page=chat_page, **options
    )
    async with serve_app(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as client:
        yield Served(url=url, runtime=runtime, client=client)


@asynccontextmanager
async def serve_app(app: Any, *, lifespan: bool = False) -> AsyncIterator[str]:
    """Any ASGI app served on a free loopback port, by hypercorn as ``turnkit dev``
    serves (``serve_until``: stopped through its documented shutdown trigger);
    yields its base URL. ``lifespan``: run the app's lifespan with the server.

    A request still open when the test leaves (an event stream) is cut after a
    few seconds, so it fails the test instead of hanging it."""
    listener = listen("127.0.0.1", 0)
    stop, started = asyncio.Event(), asyncio.Event()
    serving = asyncio.ensure_future(
        serve_until(app, [listener], stop, started=started, lifespan=lifespan, grace=5.0)
    )
    try:
        if not await asyncio.wait_for(until_started(serving, started), STARTING):
            serving.result()  # the server's own error
            raise AssertionError("the server ended before it started")
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        try:
            await asyncio.wait_for(serving, STOPPING)
        finally:
            listener.close()


#: Deadlines for a test server to start and to stop (its open requests cut first).
STARTING = 30.0
STOPPING = 30.0


@contextmanager
def serve_app_in_thread(app: Any, *, lifespan: bool = False) -> Iterator[str]:
    """``serve_app`` on an event loop of its own in a thread, for a test that blocks
    (a browser's, or one driving a subprocess); yields the base URL."""
    told: queue.Queue[str | BaseException] = queue.Queue()
    loop = asyncio.new_event_loop()
    leave = asyncio.Event()

    async def serve() -> None:
        try:
            async with serve_app(app, lifespan=lifespan) as url:
                told.put(url)
                await leave.wait()
        except BaseException as exc:
            told.put(exc)
            raise

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    try:
        url = told.get(timeout=STARTING + 5)
        if isinstance(url, BaseException):
            raise url
        yield url
    finally:
        loop.call_soon_threadsafe(leave.set)
        thread.join(STOPPING + 5)
        assert not thread.is_alive(), "the test server did not stop"
        loop.close()


@dataclass(frozen=True)
class Frame:
    """One SSE event as it crossed the wire."""

    event: str
    data: dict[str, Any]
    id: str | None


async def snapshot(runtime: turnkit.Runtime) -> dict[str, Any]:
    """Everything the store holds for every session, to compare before and after."""
    state: dict[str, Any] = {}
    for info in await runtime.sessions():
        store = runtime.store.session(info.session_id)
        state[info.session_id] = {
            "status": await store.status(),
            "messages": [m.to_dict() for m in await transcript(store)],
            "events": [e.to_dict() for e in await store.events()],
            "parked": None
            if (p := await parked_turn(store)) is None or p.pending is None
            else p.pending.to_dict(),
        }
    return state


def dump(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table of the SQLite file ``db``, read on a connection of its
    own: the whole store, to show that a refused request changed nothing at all."""
    with closing(sqlite3.connect(db)) as conn:
        tables = [
            name
            for (name,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
            )
        ]
        return {
            t: sorted(conn.execute(f'SELECT * FROM "{t}"').fetchall(), key=repr) for t in tables
        }


def decode(frames: list[Any]) -> list[Frame]:
    """httpx-sse's ``ServerSentEvent``s as ``Frame``s."""
    return [Frame(event=f.event, data=json.loads(f.data), id=f.id or None) for f in frames]


def gated_agent(
    gate: asyncio.Event, *, answer: str = "Done.", chunks: int | None = None
) -> turnkit.Agent:
    """Agent ``w``: asks for its ``slow`` tool, which waits for ``gate``, then answers
    ``answer`` (streamed in ``chunks`` deltas), so a test can act mid-turn."""

    @tool
    async def slow(x: int) -> int:
        """Waits for the test."""
        await gate.wait()
        return x

    def respond(transcript: list[turnkit.Message]) -> ScriptedReply:
        if isinstance(transcript[-1], turnkit.UserMessage):
            return ScriptedReply(text="One moment.", tool_calls=[tool_call("slow", {"x": 1})])
        return ScriptedReply(text=answer, chunks=chunks)

    return turnkit.Agent(
        name="w", model=ScriptedModel(respond=respond), instructions=".", tools=[slow]
    )
