"""How ``turnkit dev``, ``turnkit console`` and a worker's ops port serve HTTP
(``turnkit.server._serving``): on sockets bound beforehand, stopped by the caller
through hypercorn's documented ``shutdown_trigger``, an endless response cut and
ended cleanly ``grace`` seconds after the stop, and signals the caller's own.

Real hypercorn on 127.0.0.1, real httpx clients, real signals to this process.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, StreamingResponse
from starlette.routing import Route

from turnkit.server._serving import Signals, listen, serve_until, until_started

#: The most any wait below may take; every one of them ends far sooner when all is well.
DEADLINE = 30.0


def endless_app(lifespans: list[str]) -> Starlette:
    """``/stream`` never ends by itself (as an event feed); ``/`` answers at once."""

    async def forever() -> AsyncIterator[bytes]:
        yield b"first\n"
        await asyncio.Event().wait()  # nothing ever sets it
        yield b"never\n"

    async def stream(request: Request) -> StreamingResponse:
        return StreamingResponse(forever(), media_type="text/plain")

    async def hello(request: Request) -> PlainTextResponse:
        return PlainTextResponse("hello")

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        lifespans.append("started")
        yield
        lifespans.append("stopped")

    return Starlette(routes=[Route("/", hello), Route("/stream", stream)], lifespan=lifespan)


def url_of(listener: socket.socket) -> str:
    host, port = listener.getsockname()[:2]
    return f"http://{host}:{port}"


async def test_a_stream_is_ended_cleanly_grace_seconds_after_the_stop() -> None:
    lifespans: list[str] = []
    listener = listen("127.0.0.1", 0)
    stop, started = asyncio.Event(), asyncio.Event()
    serving = asyncio.ensure_future(
        serve_until(endless_app(lifespans), [listener], stop, started=started, grace=0.3)
    )
    try:
        assert await asyncio.wait_for(until_started(serving, started), DEADLINE)
        assert lifespans == []  # served without its lifespan unless asked
        async with httpx.AsyncClient(base_url=url_of(listener), timeout=DEADLINE) as client:
            assert (await client.get("/")).text == "hello"
            async with client.stream("GET", "/stream") as response:
                lines = response.aiter_lines()
                assert await anext(lines) == "first"
                stop.set()
                # The response ends as a complete chunked body: a server that gave up on
                # the connection instead would break it (httpx: RemoteProtocolError).
                rest = [line async for line in lines]
        assert rest == []
        await asyncio.wait_for(serving, DEADLINE)
    finally:
        serving.cancel()
        listener.close()


async def test_the_lifespan_runs_when_asked_and_started_waits_for_it() -> None:
    lifespans: list[str] = []
    listener = listen("127.0.0.1", 0)
    stop, started = asyncio.Event(), asyncio.Event()
    serving = asyncio.ensure_future(
        serve_until(endless_app(lifespans), [listener], stop, started=started, lifespan=True)
    )
    try:
        assert await asyncio.wait_for(until_started(serving, started), DEADLINE)
        assert lifespans == ["started"]
        async with httpx.AsyncClient(base_url=url_of(listener), timeout=DEADLINE) as client:
            assert (await client.get("/")).text == "hello"
        stop.set()
        await asyncio.wait_for(serving, DEADLINE)
        assert lifespans == ["started", "stopped"]
    finally:
        serving.cancel()
        listener.close()


async def test_a_lifespan_that_fails_ends_the_serving_with_started_never_set() -> None:
    @asynccontextmanager
    async def broken(app: Starlette) -> AsyncIterator[None]:
        raise RuntimeError("the store is unreachable")
        yield

    listener = listen("127.0.0.1", 0)
    stop, started = asyncio.Event(), asyncio.Event()
    serving = asyncio.ensure_future(
        serve_until(Starlette(lifespan=broken), [listener], stop, started=started, lifespan=True)
    )
    try:
        assert not await asyncio.wait_for(until_started(serving, started), DEADLINE)
        assert serving.exception() is not None
    finally:
        serving.cancel()
        listener.close()


async def test_a_second_ctrl_c_cuts_the_drain_short() -> None:
    """With a grace far beyond the deadline, only the second SIGINT can end the
    serving in time; the first one alone stops taking requests."""
    listener = listen("127.0.0.1", 0)
    signals = Signals()
    started = asyncio.Event()
    serving = asyncio.ensure_future(
        serve_until(endless_app([]), [listener], signals.stop, started=started, grace=3600)
    )
    try:
        with signals.handling(serving):
            assert await asyncio.wait_for(until_started(serving, started), DEADLINE)
            async with (
                httpx.AsyncClient(base_url=url_of(listener), timeout=DEADLINE) as client,
                client.stream("GET", "/stream") as response,
            ):
                assert await anext(response.aiter_lines()) == "first"
                os.kill(os.getpid(), signal.SIGINT)
                await asyncio.wait_for(signals.stop.wait(), DEADLINE)
                assert signals.stopped_by == signal.SIGINT and not serving.done()
                os.kill(os.getpid(), signal.SIGINT)
                await asyncio.wait({serving}, timeout=DEADLINE)
        assert serving.done(), "still serving"
        assert signals.cut_short
    finally:
        serving.cancel()
        listener.close()


def test_a_listener_names_tcp_and_disables_nagle() -> None:
    """asyncio sets TCP_NODELAY on accepted sockets only when the listener names
    IPPROTO_TCP; Linux also hands the listener's own TCP_NODELAY on."""
    listener = listen("127.0.0.1", 0)
    try:
        assert listener.proto == socket.IPPROTO_TCP
        assert listener.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        listener.close()


def test_a_busy_port_is_an_oserror() -> None:
    taken = listen("127.0.0.1", 0)
    try:
        with pytest.raises(OSError):
            listen("127.0.0.1", taken.getsockname()[1])
    finally:
        taken.close()
