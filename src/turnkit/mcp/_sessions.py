"""Whose MCP session is whose: each session belongs to the principal that opened it,
and no principal holds more than its share.

The SDK's session manager knows sessions, not callers: any holder of a session id
could use it (as himself) or end it, and one caller opening sessions as fast as it
can would fill the manager's table until everyone else's ``initialize`` is refused.
``SessionGuard`` sits between ``create_app``'s authentication and the SDK's app. It
learns each new session's id from the SDK's answer, answers a request naming
another principal's session exactly as one naming no session (404), and, when a
principal opens one session more than its limit, ends that principal's least
recently used one with the protocol's own ``DELETE``.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .._access.principal import principal_of
from .._errors import ConfigurationError

#: The header the Streamable HTTP transport names a session in.
SESSION_HEADER = "mcp-session-id"


@dataclass(frozen=True, kw_only=True)
class McpLimits:
    """How many MCP sessions the endpoint keeps: ``per_principal`` for each caller
    (opening one more ends that caller's least recently used one), ``total`` in all
    (past it a new ``initialize`` is refused with 503 by the SDK), and how long an
    unused session lives (``idle_seconds``)."""

    per_principal: int = 16
    total: int = 1000
    idle_seconds: float = 600.0

    def __post_init__(self) -> None:
        for name in ("per_principal", "total"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"McpLimits.{name} must be a positive int, got {value!r}")
        idle = self.idle_seconds
        if isinstance(idle, bool) or not isinstance(idle, int | float) or not idle > 0:
            raise ConfigurationError(
                f"McpLimits.idle_seconds must be a positive number, got {idle!r}"
            )


class SessionGuard:
    """ASGI middleware in front of the SDK's Streamable HTTP app (see module doc)."""

    def __init__(
        self,
        app: ASGIApp,
        limits: McpLimits,
        *,
        path: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.app = app
        self.path = path
        self.limits = limits
        self._clock = clock
        #: Session id -> the principal that opened it, least recently used first.
        self._owners: OrderedDict[str, str] = OrderedDict()
        self._used: dict[str, float] = {}

    def sessions_of(self, principal_id: str) -> list[str]:
        """The open sessions of ``principal_id``, least recently used first."""
        self._forget_idle()
        return [sid for sid, owner in self._owners.items() if owner == principal_id]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        principal = principal_of(scope) if scope["type"] == "http" else None
        if principal is None:
            await self.app(scope, receive, send)  # the SDK refuses what it must
            return
        self._forget_idle()
        session_id = Headers(scope=scope).get(SESSION_HEADER)
        if session_id is not None:
            owner = self._owners.get(session_id)
            if owner is not None and owner != principal.id:
                # Another caller's session: the answer for one that does not exist.
                await _not_found(scope, receive, send)
                return
            if owner is not None:
                self._touch(session_id)
            await self.app(scope, receive, send)
            if scope["method"] == "DELETE" and owner is not None:
                self._drop(session_id)
            return
        mine = [sid for sid, owner in self._owners.items() if owner == principal.id]
        if len(mine) >= self.limits.per_principal:
            await self._end(mine[0])
        await self.app(scope, receive, self._learning(principal.id, send))

    def _learning(self, principal_id: str, send: Send) -> Send:
        """``send``, noting the session the SDK's answer opens as ``principal_id``'s."""

        async def learn(message: Message) -> None:
            if message["type"] == "http.response.start":
                opened = Headers(raw=message.get("headers", [])).get(SESSION_HEADER)
                if opened is not None:
                    self._owners[opened] = principal_id
                    self._touch(opened)
            await send(message)

        return learn

    async def _end(self, session_id: str) -> None:
        """End a session as its client would: a ``DELETE`` naming it, sent to the
        SDK's app directly (no network), answer discarded."""
        scope: Scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "DELETE",
            "scheme": "http",
            "path": self.path,
            "raw_path": self.path.encode(),
            "root_path": "",
            "query_string": b"",
            "headers": [(SESSION_HEADER.encode(), session_id.encode())],
            "client": None,
            "server": None,
        }

        async def receive() -> Message:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def discard(message: Message) -> None:
            return None

        await self.app(scope, receive, discard)
        self._drop(session_id)

    def _touch(self, session_id: str) -> None:
        self._owners.move_to_end(session_id)
        self._used[session_id] = self._clock()

    def _drop(self, session_id: str) -> None:
        self._owners.pop(session_id, None)
        self._used.pop(session_id, None)

    def _forget_idle(self) -> None:
        """Sessions unused for longer than the SDK keeps them are gone there too."""
        cutoff = self._clock() - self.limits.idle_seconds
        while self._owners:
            oldest = next(iter(self._owners))
            if self._used.get(oldest, 0.0) > cutoff:
                break
            self._drop(oldest)


async def _not_found(scope: Scope, receive: Receive, send: Send) -> None:
    refusal = JSONResponse(
        {
            "jsonrpc": "2.0",
            "id": None,
            "error": {"code": -32600, "message": "Session not found"},
        },
        status_code=404,
    )
    await refusal(scope, receive, send)
