"""One connection to an MCP server through the official SDK's ``Client``, opened for
one listing or one call and closed after it.

Opening is bounded by its own timeout, so a server that never answers (or never
starts) fails the step in bounded time instead of hanging the turn. A connection
per operation costs a process start for a stdio server; in exchange nothing is
shared between turns, event loops or processes, and a server that died is simply
started again by the next call.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from ._servers import HttpServer, McpServer, StdioServer

log = logging.getLogger("turnkit.mcp")


class Unreachable(Exception):
    """The server could not be reached or did not finish its handshake: nothing was
    sent to it, so no tool ran."""


@asynccontextmanager
async def connected(
    server: McpServer, *, connect_timeout: float, call_timeout: float
) -> AsyncIterator[Client]:
    """A ``Client`` connected to ``server``; ``Unreachable`` if it cannot be had within
    ``connect_timeout`` seconds. Each request then waits at most ``call_timeout``."""
    async with AsyncExitStack() as stack:
        try:
            async with asyncio.timeout(connect_timeout):
                if isinstance(server, HttpServer):
                    client = _http_client(server, stack, call_timeout)
                else:
                    client = _stdio_client(server, call_timeout)
                await stack.enter_async_context(client)
        except TimeoutError:
            raise Unreachable(f"no answer within {connect_timeout:g}s") from None
        except Exception as exc:
            raise Unreachable(reason(exc)) from exc
        yield client


def _http_client(server: HttpServer, stack: AsyncExitStack, call_timeout: float) -> Client:
    """A Streamable HTTP client with the server's headers (the HTTP client is ours to
    close, so the stack closes it after the MCP client)."""
    http = httpx2.AsyncClient(
        headers=dict(server.headers),
        timeout=httpx2.Timeout(30.0, read=call_timeout + 5.0),
    )
    stack.push_async_callback(http.aclose)
    transport = streamable_http_client(server.url, http_client=http)
    return Client(transport, read_timeout_seconds=call_timeout, cache=None)


def _stdio_client(server: StdioServer, call_timeout: float) -> Client:
    params = StdioServerParameters(
        command=server.command,
        args=list(server.args),
        env=dict(server.env) or None,
        cwd=server.cwd,
    )
    return Client(params, read_timeout_seconds=call_timeout, cache=None)


def reason(exc: BaseException) -> str:
    """The first leaf of an exception group (anyio raises them), as ``Type: text``."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
