"""A cap on request bodies for a whole ASGI app, enforced before it is read past.

Every app turnkit serves (the HTTP surface, Slack's routes, the mounted MCP server,
the ops port) sits behind ``BodyLimit``: a declared ``Content-Length`` over the cap
is answered 413 without reading a byte of the body, and a body sent without one
(chunked) is cut off at the cap. An unauthenticated caller can so never make the
server hold more than the cap per request, whatever the route does with the body.
A client that hangs up mid-body is not an error of the server's: one debug line.

The refusal is sent at once, but before it ends, the rest of the body is read and
thrown away, up to ``DRAIN_BYTES`` for at most ``DRAIN_SECONDS``: hypercorn closes
an HTTP/1 connection as soon as a response ends while the request is still
arriving, and the kernel answers bytes that arrive on a closed socket with a
reset, which discards the answer before a client that sends its whole body first
(httpx, requests) reads it; over HTTP/2 it drops the connection on data for a
stream it has closed. Drained, the close is orderly; past the bounds the
connection is cut off, so no caller can make the server read without end.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .._errors import ConfigurationError

log = logging.getLogger("turnkit.server")

#: How much of a refused body is read past the refusal and thrown away, so that the
#: connection closes in order and the client reads the 413 (see the module's text).
DRAIN_BYTES = 1024 * 1024
#: How long that reading may take, in all; a client that stalls is cut off then.
DRAIN_SECONDS = 5.0


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` once a body passes the cap; as an ``HTTPException``
    the app's own exception handling answers it 413, whichever app reads the body."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"the body is larger than the limit of {max_bytes} bytes")


class BodyLimit:
    """ASGI middleware: refuse bodies over ``max_bytes`` with 413 before reading past
    the cap, drain a bounded rest of a refused body before the refusal ends, and log
    a client's disconnect mid-body at debug level."""

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise ConfigurationError(f"max_bytes must be a positive int, got {max_bytes!r}")
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # The header is HTTP/1's (later versions forbid it and end a stream alone).
        http1 = scope.get("http_version", "1.1") in ("1.0", "1.1")
        declared = Headers(scope=scope).get("content-length")
        # The HTTP server refuses a malformed Content-Length itself; only size matters.
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            refusal = JSONResponse(
                {"error": BodyTooLarge(self.max_bytes).detail, "code": "body_too_large"},
                status_code=413,
            )
            # Answered before a byte of the body is read; the drain after the answer
            # only helps when all of the body fits in it.
            drains = int(declared) <= DRAIN_BYTES
            ending = _ending(send, receive, lambda: True, drain=drains, close=http1)
            await refusal(scope, receive, ending)
            return
        received = 0
        # Whether part of the body is still to arrive: any response that ends before
        # it has (a refusal made from the headers alone, a body over the cap) must
        # drain it, or hypercorn drops the connection under the answer, and a client
        # reusing the connection finds it gone.
        # HTTP/1 says in its headers whether a body follows; HTTP/2 does not (a stream
        # ends on its own), so there a request counts as having one until the app has
        # read its end: a drain of a body that is not there returns at once.
        chunked = "chunked" in Headers(scope=scope).get("transfer-encoding", "").lower()
        sized = declared is not None and declared.isdigit() and int(declared) > 0
        pending = chunked or sized or not http1

        async def limited() -> Message:
            nonlocal received, pending
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if not message.get("more_body", False):
                    pending = False
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            elif message["type"] == "http.disconnect":
                pending = False
            return message

        try:
            await self.app(scope, limited, _ending(send, receive, lambda: pending, close=http1))
        except ClientDisconnect:
            log.debug(
                "%s %s: the client went away before its body arrived",
                scope.get("method"),
                scope.get("path"),
            )


def _ending(
    send: Send, receive: Receive, unread: Callable[[], bool], *, drain: bool = True, close: bool
) -> Send:
    """``send``, except that once ``unread()`` (part of the body is still arriving) the
    response's last message waits until the rest is drained (with ``drain``), and with
    ``close`` (HTTP/1) the response says the connection closes after it: what is
    left unread past the drain's bounds would be taken for the next request."""

    async def sending(message: Message) -> None:
        if not unread():
            await send(message)
        elif close and message["type"] == "http.response.start":
            headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"]
            await send({**message, "headers": [*headers, (b"connection", b"close")]})
        elif drain and message["type"] == "http.response.body" and not message.get("more_body"):
            await send({**message, "more_body": True})
            await _drain(receive)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        else:
            await send(message)

    return sending


async def _drain(receive: Receive) -> None:
    """Read and throw away the rest of a request's body, within the bounds."""
    drained = 0
    try:
        async with asyncio.timeout(DRAIN_SECONDS):
            while drained <= DRAIN_BYTES:
                message = await receive()
                if message["type"] != "http.request" or not message.get("more_body", False):
                    return
                drained += len(message.get("body", b""))
    except TimeoutError:
        pass
    log.debug("a refused body went on past %d bytes or %g s: cut off", DRAIN_BYTES, DRAIN_SECONDS)
