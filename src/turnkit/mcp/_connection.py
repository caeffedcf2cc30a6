"""Connections to an MCP server through the official SDK's ``Client``.

A ``Connection`` is one SDK client, opened by a task of its own (anyio's scopes
must be left by the task that entered them) and used by any number of concurrent
calls: the SDK's session tells the answers apart by request id. It knows two
things the SDK does not say in public: that the server went away (the stream of
messages from it ended, seen before the SDK sees it), and which calls over HTTP
never reached the tool (the TCP connection was refused, or the server no longer
knew the session). Both let a caller tell a call that
was never sent, and may be sent again, from one whose fate is unknown.

``Connections`` keeps one connection per server and event loop while something
(a ``Runtime``) holds the source open, replacing it when it is lost; with no
holder each operation opens its own and closes it after.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
import httpx2
from mcp import Client, StdioServerParameters
from mcp.client import Transport
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from ._servers import HttpServer, McpServer, StdioServer

log = logging.getLogger("turnkit.mcp")

#: Where a call carries its idempotency key (see ``_tools``); the HTTP watcher reads
#: it back out of a request that could not be sent.
IDEMPOTENCY_KEY = "turnkit/idempotency_key"
#: The header naming the HTTP session a request belongs to (MCP's Streamable HTTP).
SESSION_HEADER = "mcp-session-id"


class Unreachable(Exception):
    """The server could not be reached or did not finish its handshake: nothing was
    sent to it, so no tool ran."""


class Connection:
    """One SDK ``Client`` connected to ``server``, shared by concurrent calls."""

    def __init__(self, server: McpServer, *, connect_timeout: float, call_timeout: float) -> None:
        self._server = server
        self._connect_timeout = connect_timeout
        self._call_timeout = call_timeout
        #: The server went away, or the connection closed: no call may be sent on it.
        self.lost = False
        #: Calls in progress on it (a retired connection closes once they end).
        self.users = 0
        #: Idempotency keys of calls whose HTTP request could not be sent at all.
        self.unsent: set[str] = set()
        #: Its closing has begun.
        self.closing = False
        self._stop = asyncio.Event()
        self._ready: asyncio.Future[Client] | None = None
        self._task: asyncio.Task[None] | None = None

    async def client(self) -> Client:
        """The connected client, opening it on first use (callers share one opening);
        ``Unreachable`` if it cannot be had within the connect timeout."""
        if self._task is None:
            loop = asyncio.get_running_loop()
            ready: asyncio.Future[Client] = loop.create_future()
            # Read the outcome even if nobody waits for it (no "never retrieved" noise).
            ready.add_done_callback(lambda f: f.cancelled() or f.exception())
            self._ready = ready
            self._task = loop.create_task(self._run(ready), name="turnkit-mcp-connection")
        assert self._ready is not None
        return await asyncio.shield(self._ready)

    async def _run(self, ready: asyncio.Future[Client]) -> None:
        """Open the client, hold it until ``close`` (or until the transport fails)."""
        try:
            async with AsyncExitStack() as stack:
                try:
                    async with asyncio.timeout(self._connect_timeout):
                        client = self._build(stack)
                        await stack.enter_async_context(client)
                except TimeoutError:
                    raise Unreachable(f"no answer within {self._connect_timeout:g}s") from None
                except Exception as exc:
                    raise Unreachable(reason(exc)) from exc
                ready.set_result(client)
                await self._stop.wait()
        except Unreachable as exc:
            ready.set_exception(exc)
        except Exception as exc:  # the transport failed, or closing it did
            if not ready.done():
                ready.set_exception(Unreachable(reason(exc)))
            log.debug("the connection to MCP server %s ended: %s", self._server.label, reason(exc))
        finally:
            self.lost = True
            if not ready.done():
                ready.set_exception(Unreachable("the connection was closed while opening"))

    def _build(self, stack: AsyncExitStack) -> Client:
        if isinstance(self._server, HttpServer):
            http = httpx2.AsyncClient(
                headers=dict(self._server.headers),
                timeout=httpx2.Timeout(30.0, read=self._call_timeout + 5.0),
                transport=_Watching(httpx2.AsyncHTTPTransport(), self),
            )
            # The HTTP client is ours to close: the stack closes it after the MCP client.
            stack.push_async_callback(http.aclose)
            transport: Transport = streamable_http_client(self._server.url, http_client=http)
        else:
            transport = stdio_client(_stdio_parameters(self._server))
        return Client(self._watched(transport), read_timeout_seconds=self._call_timeout, cache=None)

    @asynccontextmanager
    async def _watched(self, transport: Transport) -> AsyncIterator[Any]:
        """``transport`` with its stream of messages from the server relayed, so that
        the end of it (the server went away) marks the connection lost before the
        SDK learns of it: a call that then finds it lost was never sent on it."""
        async with transport as (read, write):
            send, receive = anyio.create_memory_object_stream[Any](0)
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(self._relay, read, send)
                try:
                    yield receive, write
                finally:
                    tasks.cancel_scope.cancel()

    async def _relay(self, read: Any, send: Any) -> None:
        async with send:
            try:
                async for item in read:
                    await send.send(item)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
                pass
            finally:
                self.lost = True

    async def close(self) -> None:
        """Close the client (a stdio server's process ends with it); safe to repeat."""
        self.lost = True
        self._stop.set()
        if self._task is not None:
            await asyncio.shield(self._task)


class _Watching(httpx2.AsyncBaseTransport):
    """An HTTP transport noting the calls that never reached the server's tools: the
    server refused the TCP connection, or answered 404 to a request of a session it
    no longer knows (restarted, say), which the protocol has it refuse unread."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, connection: Connection) -> None:
        self._inner = inner
        self._connection = connection

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        try:
            response = await self._inner.handle_async_request(request)
        except httpx2.ConnectError:
            self._refused(request)
            raise
        if response.status_code == 404 and SESSION_HEADER in request.headers:
            self._refused(request)
        return response

    def _refused(self, request: httpx2.Request) -> None:
        self._connection.lost = True
        key = _call_key(request)
        if key is not None:
            self._connection.unsent.add(key)

    async def aclose(self) -> None:
        await self._inner.aclose()


def _call_key(request: httpx2.Request) -> str | None:
    """The idempotency key of the ``tools/call`` a request carries, if it does."""
    if request.method != "POST":
        return None
    try:
        message = json.loads(request.content)
        key = message["params"]["_meta"][IDEMPOTENCY_KEY]
    except (ValueError, TypeError, KeyError):
        return None
    return key if isinstance(key, str) else None


class Connections:
    """The connections of one server: one shared per event loop while held open."""

    def __init__(self, server: McpServer, *, connect_timeout: float, call_timeout: float) -> None:
        self._server = server
        self._connect_timeout = connect_timeout
        self._call_timeout = call_timeout
        self._loops: dict[asyncio.AbstractEventLoop, _Shared] = {}

    def hold(self) -> None:
        """Share one connection on the running loop until as many ``release`` calls."""
        loop = asyncio.get_running_loop()
        shared = self._loops.get(loop)
        if shared is None:
            shared = self._loops[loop] = _Shared()
        shared.holders += 1

    async def release(self) -> None:
        """Undo one ``hold``; the last one closes the loop's connections."""
        loop = asyncio.get_running_loop()
        shared = self._loops.get(loop)
        if shared is None:
            return
        shared.holders -= 1
        if shared.holders > 0:
            return
        del self._loops[loop]
        await shared.close_all()

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Connection]:
        """A connected ``Connection`` for one operation: the loop's shared one (a new
        one if it was lost before this operation), or without a holder one of its own.
        ``Unreachable`` if it cannot be opened."""
        shared = self._loops.get(asyncio.get_running_loop())
        if shared is None:
            own = self._new()
            try:
                await own.client()
                yield own
            finally:
                await own.close()
            return
        conn = shared.current
        if conn is None or conn.lost:
            if conn is not None:
                shared.retire(conn)
            conn = shared.current = self._new()
        conn.users += 1
        try:
            await conn.client()
            yield conn
        finally:
            conn.users -= 1
            if conn.lost:
                shared.retire(conn)

    def _new(self) -> Connection:
        return Connection(
            self._server, connect_timeout=self._connect_timeout, call_timeout=self._call_timeout
        )


class _Shared:
    """The connections of one server on one loop: the current one, and those taken
    out of use, each closed once no operation is left on it."""

    def __init__(self) -> None:
        self.holders = 0
        self.current: Connection | None = None
        self._old: set[Connection] = set()
        self._closing: set[asyncio.Task[None]] = set()

    def retire(self, conn: Connection) -> None:
        """No new operation on ``conn``; close it when the last one on it ends."""
        conn.lost = True
        if self.current is conn:
            self.current = None
        if conn.users > 0:
            self._old.add(conn)
            return
        self._old.discard(conn)
        if not conn.closing:
            conn.closing = True
            task = asyncio.get_running_loop().create_task(conn.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def close_all(self) -> None:
        conns = [*self._old, *([self.current] if self.current is not None else [])]
        self.current = None
        self._old.clear()
        results = await asyncio.gather(
            *(c.close() for c in conns), *self._closing, return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                log.debug("closing an MCP connection failed: %s", reason(result))


def _stdio_parameters(server: StdioServer) -> StdioServerParameters:
    return StdioServerParameters(
        command=server.command,
        args=list(server.args),
        env=dict(server.env) or None,
        cwd=server.cwd,
    )


def reason(exc: BaseException) -> str:
    """The first leaf of an exception group (anyio raises them), as ``Type: text``."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
