"""Serving an ASGI app on sockets this process bound, until its caller says stop.

``turnkit dev``, ``turnkit console`` and a worker's ops port each own their signals
(a drain, a Ctrl-C, a second Ctrl-C) and their listening sockets (bound before
anything opens, so a busy port is a clear error and port 0 names its real port).
hypercorn lets a caller keep both through its documented API:
``hypercorn.asyncio.serve(app, config, shutdown_trigger=...)`` serves until the
trigger returns, and ``Config.bind = ["fd://N"]`` serves a socket already bound.

Two things are added around the app, both plain ASGI:

- ``started`` is set once the app's lifespan has started (or at once, for an app
  served without one), so the caller announces a server that answers.
- Once ``stop`` is set, a request still running ``grace`` seconds later (an event
  stream, which never ends by itself) is cancelled and its response ended. The
  server's own graceful timeout is not relied on: on Python 3.12 and later,
  hypercorn waits for open connections before it applies it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import Iterator, Sequence
from typing import Any, cast

from hypercorn.asyncio import serve
from hypercorn.config import Config
from starlette.types import ASGIApp, Message, Receive, Scope, Send


async def serve_until(
    app: ASGIApp,
    listeners: Sequence[socket.socket],
    stop: asyncio.Event,
    *,
    started: asyncio.Event | None = None,
    lifespan: bool = False,
    grace: float = 2.0,
) -> None:
    """Serve ``app`` on ``listeners`` (bound and listening) until ``stop`` is set and
    the requests under way have ended or been cut after ``grace`` seconds.

    ``lifespan``: run the app's lifespan (an app that opens its runtime with the
    server needs it). The listeners stay the caller's to close."""
    config = Config()
    # Each listener duplicated: the server closes its copy when it stops, the caller
    # closes the original.
    config.bind = [f"fd://{os.dup(listener.fileno())}" for listener in listeners]
    config.loglevel = "WARNING"
    config.accesslog = None
    config.graceful_timeout = grace + 1.0  # a backstop behind the cut below
    served = _draining(_lifespan(app, lifespan, started or asyncio.Event()), stop, grace)
    await serve(cast(Any, served), config, shutdown_trigger=stop.wait, mode="asgi")


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port``; ``OSError`` if it cannot bind."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, not 0: asyncio sets TCP_NODELAY only on sockets that say so
    # (an accepted socket inherits the listener's protocol), and without it a
    # kept-alive connection waits 40 ms for a delayed ACK between a response's
    # headers and its body. The option is also set on the listener, which Linux
    # hands on to every connection it accepts.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def _lifespan(app: ASGIApp, run_it: bool, started: asyncio.Event) -> ASGIApp:
    """``app`` with ``started`` set once its lifespan has started; without
    ``run_it`` the lifespan is answered here and never reaches the app."""

    async def with_lifespan(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return
        if not run_it:
            while (await receive())["type"] != "lifespan.shutdown":
                started.set()
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return

        async def sending(message: Message) -> None:
            await send(message)
            if message["type"] == "lifespan.startup.complete":
                started.set()

        await app(scope, receive, sending)

    return with_lifespan


def _draining(app: ASGIApp, stop: asyncio.Event, grace: float) -> ASGIApp:
    """``app`` whose HTTP requests end at the latest ``grace`` seconds after ``stop``."""

    async def draining(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        state = {"started": False, "ended": False}

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                state["started"] = True
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                state["ended"] = True
            await send(message)

        request = asyncio.ensure_future(app(scope, receive, sending))
        cut = asyncio.ensure_future(_after_stop(stop, grace))
        try:
            await asyncio.wait({request, cut}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the server gave up on the connection
            cut.cancel()
            request.cancel()
            raise
        cut.cancel()
        if not request.done():
            request.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await request
        if not request.cancelled():
            request.result()  # the app's own error, for the server to log
            return
        if not state["started"]:
            await send({"type": "http.response.start", "status": 503, "headers": []})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        elif not state["ended"]:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    return draining


async def _after_stop(stop: asyncio.Event, grace: float) -> None:
    await stop.wait()
    await asyncio.sleep(grace)


class Signals:
    """SIGINT and SIGTERM stop a server the way a service manager and a terminal
    expect: the first sets ``stop`` (``stopped_by`` says which), and a second
    Ctrl-C cuts the drain short by cancelling the serving task."""

    def __init__(self) -> None:
        self.stop = asyncio.Event()
        self.stopped_by: int | None = None
        #: Whether a second Ctrl-C cancelled the serving task.
        self.cut_short = False
        self._serving: asyncio.Future[None] | None = None

    @contextlib.contextmanager
    def handling(self, serving: asyncio.Future[None]) -> Iterator[None]:
        """Handle both signals on the running loop while ``serving`` runs."""
        loop = asyncio.get_running_loop()
        self._serving = serving
        for signum in _STOPPING:
            loop.add_signal_handler(signum, self._received, signum)
        try:
            yield
        finally:
            for signum in _STOPPING:
                loop.remove_signal_handler(signum)

    def _received(self, signum: int) -> None:
        if self.stop.is_set() and signum == signal.SIGINT and self._serving is not None:
            self.cut_short = True
            self._serving.cancel()
        self.stopped_by = self.stopped_by or signum
        self.stop.set()


_STOPPING = (signal.SIGINT, signal.SIGTERM)


async def until_started(serving: asyncio.Future[None], started: asyncio.Event) -> bool:
    """Wait until ``started`` is set (``True``) or ``serving`` ended first (``False``)."""
    waiting: asyncio.Future[Any] = asyncio.ensure_future(started.wait())
    try:
        await asyncio.wait({serving, waiting}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiting.cancel()
    return started.is_set()
