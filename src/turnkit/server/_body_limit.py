"""A cap on request bodies for a whole ASGI app, enforced before it is read past.

Every app turnkit serves (the HTTP surface, Slack's routes, the mounted MCP server,
the ops port) sits behind ``BodyLimit``: a declared ``Content-Length`` over the cap
is answered 413 without reading a byte of the body, and a body sent without one
(chunked) is cut off at the cap. An unauthenticated caller can so never make the
server hold more than the cap per request, whatever the route does with the body.
A client that hangs up mid-body is not an error of the server's: one debug line.
"""

from __future__ import annotations

import logging

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .._errors import ConfigurationError

log = logging.getLogger("turnkit.server")


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` once a body passes the cap; as an ``HTTPException``
    the app's own exception handling answers it 413, whichever app reads the body."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"the body is larger than the limit of {max_bytes} bytes")


class BodyLimit:
    """ASGI middleware: refuse bodies over ``max_bytes`` with 413 before reading past
    the cap, and log a client's disconnect mid-body at debug level."""

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise ConfigurationError(f"max_bytes must be a positive int, got {max_bytes!r}")
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length")
        # The HTTP server refuses a malformed Content-Length itself; only size matters.
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            refusal = JSONResponse(
                {"error": BodyTooLarge(self.max_bytes).detail, "code": "body_too_large"},
                status_code=413,
                # The unread body stays on the socket: this connection cannot carry
                # another request.
                headers={"Connection": "close"},
            )
            await refusal(scope, receive, send)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        try:
            await self.app(scope, limited, send)
        except ClientDisconnect:
            log.debug(
                "%s %s: the client went away before its body arrived",
                scope.get("method"),
                scope.get("path"),
            )
