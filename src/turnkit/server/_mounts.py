"""What ``create_app`` can mount beside its own endpoints (``turnkit.mcp.server(...)``):
an ASGI app behind the app's ``authenticate``, which finds the caller's principal in
the request's scope and decides with the app's ``authorize``."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Protocol, runtime_checkable

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from .._access.authorize import Authorize
from .._access.principal import PRINCIPAL_SCOPE_KEY, Authenticate, authenticated


@runtime_checkable
class Mountable(Protocol):
    """An app served at ``path``: ``asgi(authorize)`` builds it (once), ``running()``
    is entered for as long as the server runs (a mounted app's own lifespan never
    runs, so it starts its background work here)."""

    @property
    def path(self) -> str: ...

    def asgi(self, authorize: Authorize) -> ASGIApp: ...

    def running(self) -> AbstractAsyncContextManager[object]: ...


class Authenticated:
    """``app`` behind ``authenticate``: a request it refuses gets 401 and reaches
    nothing; one it accepts carries its principal in the scope. (A class, so that
    Starlette's ``Route`` treats it as an ASGI app.)"""

    def __init__(self, app: ASGIApp, authenticate: Authenticate) -> None:
        self._app = app
        self._authenticate = authenticate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        principal = await authenticated(self._authenticate, Request(scope, receive))
        if principal is None:
            refusal = JSONResponse(
                {"error": "authentication required", "code": "unauthenticated"}, status_code=401
            )
            await refusal(scope, receive, send)
            return
        await self._app({**scope, PRINCIPAL_SCOPE_KEY: principal}, receive, send)
