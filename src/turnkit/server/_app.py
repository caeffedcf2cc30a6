"""``create_app``: a ``Runtime`` behind HTTP, as a Starlette ASGI app.

Each request is authenticated first, its input checked next, and only then does
it reach the runtime, so a refused request changes nothing. Turns stream back as
server-sent events; ``…/events`` lets a dropped client catch up.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from .._channels.channel import ChannelContext, mount_agent
from .._errors import (
    ConfigurationError,
    InvalidAnswerError,
    ResumeAuthorizationError,
    ResumeConflictError,
    SessionBusyError,
    SessionSuspendedError,
    StoreError,
    TurnError,
)
from .._runtime.runtime import AgentSession, Runtime
from .._seams.store import SessionStore
from .._values.checkpoints import checkpoint_of
from .._values.inbound import InboundEvent, User
from ._bodies import (
    HttpError,
    empty_body,
    identifier,
    non_negative_int,
    read_object,
    resume_body,
    turn_body,
)
from ._feed import EventFeed
from ._principal import Authenticate, Principal, authenticated
from ._sessions_page import page_of_sessions
from ._streams import HEADERS as STREAM_HEADERS
from ._streams import event_stream, feed_stream
from ._transcript import transcript_body

log = logging.getLogger("turnkit.server")

Handler = Callable[[Request, Principal], Awaitable[Response]]


@dataclass(frozen=True, kw_only=True)
class ServerLimits:
    """How much the app accepts and how it keeps streams alive."""

    #: Largest request body, in bytes; a larger one is refused with 413.
    max_body_bytes: int = 64 * 1024
    #: Seconds of quiet on a stream before a keep-alive comment is sent.
    keepalive_seconds: float = 15.0
    #: Most sessions one page of ``GET /agents/{agent}/sessions`` may hold.
    page_size_max: int = 200
    #: While a feed hears nothing live, how often it asks the store for newer logged
    #: events (a turn running in another process is seen only that way); ``None``
    #: never asks.
    feed_poll_seconds: float | None = 1.0

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "keepalive_seconds", "page_size_max", "feed_poll_seconds"):
            if isinstance(getattr(self, name), bool):
                raise ConfigurationError(f"{name} must be a number, not a bool")
        if not isinstance(self.max_body_bytes, int) or self.max_body_bytes < 1:
            raise ConfigurationError(
                f"max_body_bytes must be a positive int, got {self.max_body_bytes!r}"
            )
        if not isinstance(self.keepalive_seconds, int | float) or not self.keepalive_seconds > 0:
            raise ConfigurationError(
                f"keepalive_seconds must be a positive number, got {self.keepalive_seconds!r}"
            )
        poll = self.feed_poll_seconds
        if poll is not None and (not isinstance(poll, int | float) or not poll > 0):
            raise ConfigurationError(
                f"feed_poll_seconds must be a positive number or None, got {poll!r}"
            )
        if not isinstance(self.page_size_max, int) or self.page_size_max < 1:
            raise ConfigurationError(
                f"page_size_max must be a positive int, got {self.page_size_max!r}"
            )


def create_app(
    runtime: Runtime,
    *,
    authenticate: Authenticate,
    limits: ServerLimits | None = None,
    chat_page: bool = False,
    notice: str | None = None,
    source: str = "http",
    own_runtime: bool = False,
) -> Starlette:
    """The HTTP surface of ``runtime`` (see docs/server.md).

    ``authenticate(request) -> Principal | None`` is required and runs before
    anything else. ``chat_page`` serves the chat page at ``/``; ``notice`` is a line
    the page shows (``turnkit dev`` says which model runs). Turns opened here carry
    an inbound event from ``source``, which picks the agent's per-source policy.

    With ``own_runtime`` the app opens the runtime when the server starts (and
    recovers the turns a previous process left open, in the background) and closes
    it when the server stops: what ``uvicorn module:app`` needs.
    """
    if not isinstance(runtime, Runtime):
        raise ConfigurationError(
            f"create_app needs a turnkit.Runtime, got {type(runtime).__name__}"
        )
    if not callable(authenticate):
        raise ConfigurationError(
            "create_app needs authenticate=: a function from the request to a Principal or None"
        )
    if not isinstance(source, str) or not source:
        raise ConfigurationError(f"source must be a non-empty str, got {source!r}")
    api = _Api(runtime, limits or ServerLimits(), source, notice)
    guard = _Guard(authenticate, runtime)
    session = "/agents/{agent}/sessions/{session}"
    routes: list[BaseRoute] = [
        Route("/agents", guard(api.agents), methods=["GET"]),
        Route("/agents/{agent}/sessions", guard(api.sessions), methods=["GET"]),
        Route(f"{session}/turns", guard(api.turns), methods=["POST"]),
        Route(f"{session}/chat", guard(api.chat), methods=["POST"]),
        Route(f"{session}/resume", guard(api.resume), methods=["POST"]),
        Route(f"{session}/reset", guard(api.reset), methods=["POST"]),
        Route(f"{session}/pending", guard(api.pending), methods=["GET"]),
        Route(f"{session}/transcript", guard(api.transcript), methods=["GET"]),
        Route(f"{session}/events", guard(api.events), methods=["GET"]),
    ]
    if chat_page:
        static = resources.files("turnkit.server") / "static"
        # Behind ``authenticate`` too: it sees every request the app serves.
        routes.append(Route("/", _page(str(static / "index.html"), authenticate), methods=["GET"]))
        files = StaticFiles(directory=str(static))
        routes.append(Mount("/static", _authenticated_asgi(files, authenticate), name="static"))
    return Starlette(
        routes=routes,
        exception_handlers={HTTPException: _http_exception, Exception: _unexpected},
        lifespan=_owning(runtime) if own_runtime else None,
    )


def _owning(runtime: Runtime) -> Callable[[Starlette], AbstractAsyncContextManager[None]]:
    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with runtime:
            recovering = runtime.spawn(recover_quietly(runtime))
            yield
            recovering.cancel()

    return lifespan


async def recover_quietly(runtime: Runtime) -> None:
    """Finish what a previous process left open; a failure is logged, never fatal."""
    try:
        results = await runtime.recover()
    except Exception:
        log.exception("recovering unfinished turns failed")
        return
    if results:
        log.info("recovered %d unfinished turn(s)", len(results))


class _Guard:
    """Wraps a handler: authenticate, then run it, turning refusals and the runtime's
    passing troubles (a closed runtime, a busy or unreachable store) into JSON errors."""

    def __init__(self, authenticate: Authenticate, runtime: Runtime) -> None:
        self._authenticate = authenticate
        self._runtime = runtime

    def __call__(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            principal = await authenticated(self._authenticate, request)
            if principal is None:
                return error_response(401, "unauthenticated", "authentication required")
            if not self._runtime.is_open:  # not opened yet, or closed already
                return error_response(
                    503, "runtime_unavailable", "the runtime is not open; try again later"
                )
            try:
                return await handler(request, principal)
            except HttpError as exc:
                return error_response(exc.status, exc.code, exc.message)
            except SessionBusyError as exc:
                return error_response(503, "session_busy", str(exc))
            except StoreError as exc:
                log.warning("%s %s: the store failed: %s", request.method, request.url.path, exc)
                return error_response(503, "store_unavailable", str(exc))
            except TurnError as exc:
                # The runtime closed (or the delivery was interrupted) under the request.
                return error_response(503, "runtime_unavailable", str(exc))

        return endpoint


class _Api:
    """The endpoints, each a method taking the request and its principal."""

    def __init__(
        self, runtime: Runtime, limits: ServerLimits, source: str, notice: str | None
    ) -> None:
        self.runtime = runtime
        self.limits = limits
        self.source = source
        self.notice = notice
        self._contexts: dict[str, ChannelContext] = {}

    # -- reading ---------------------------------------------------------------

    async def agents(self, request: Request, principal: Principal) -> Response:
        names = sorted(self.runtime.agents)
        return JSONResponse({"agents": [{"name": n} for n in names], "notice": self.notice})

    async def sessions(self, request: Request, principal: Principal) -> Response:
        agent = self._agent_name(request)
        limit = non_negative_int(request.query_params.get("limit"), "limit", default=50)
        if not 1 <= limit <= self.limits.page_size_max:
            raise HttpError(
                400,
                "invalid_parameter",
                f"limit must be between 1 and {self.limits.page_size_max}, got {limit}",
            )
        cursor = request.query_params.get("cursor")
        rows, cursor = await page_of_sessions(self.runtime.store, agent, limit, cursor)
        return JSONResponse({"sessions": rows, "next": cursor})

    async def pending(self, request: Request, principal: Principal) -> Response:
        store = await self._readable(request)
        record = await store.parked()
        checkpoint = checkpoint_of(record) if record is not None else None
        if checkpoint is None:
            return JSONResponse({"request": None})
        return JSONResponse({"request": checkpoint.request.to_dict()})

    async def transcript(self, request: Request, principal: Principal) -> Response:
        store = await self._readable(request)
        return JSONResponse(await transcript_body(store, request.query_params))

    async def events(self, request: Request, principal: Principal) -> Response:
        store = await self._readable(request)
        header = request.headers.get("last-event-id")
        if header is not None:
            after = non_negative_int(header.strip(), "Last-Event-ID", default=0)
        else:
            after = non_negative_int(request.query_params.get("after"), "after", default=0)
        turn_id = request.query_params.get("turn_id")
        if turn_id is not None:
            turn_id = identifier(turn_id, "turn_id")
            known = await store.turn(turn_id)
            if known is None and not self._delivering(request, turn_id):
                raise HttpError(
                    404, "unknown_turn", f"session {store.session_id!r} has no turn {turn_id!r}"
                )
        if request.method == "HEAD":
            # The headers a GET would answer with, and no feed: one would never end.
            return Response(media_type="text/event-stream", headers=STREAM_HEADERS)
        feed = EventFeed(store, self.runtime.sink, after=after, turn_id=turn_id)
        return feed_stream(feed, self.limits.keepalive_seconds, self.limits.feed_poll_seconds)

    # -- turns -----------------------------------------------------------------

    async def turns(self, request: Request, principal: Principal) -> Response:
        session, turn_id = await self._start_turn(request, principal)
        return event_stream(session.observe(turn_id), self.limits.keepalive_seconds)

    async def chat(self, request: Request, principal: Principal) -> Response:
        if "text/event-stream" in request.headers.get("accept", ""):
            return await self.turns(request, principal)
        session, turn_id = await self._start_turn(request, principal)
        try:
            result = await session.result(turn_id)
        except ConfigurationError as exc:
            # Another process claimed the session for another agent since it was checked.
            raise HttpError(409, "session_of_another_agent", str(exc)) from None
        answer: dict[str, Any] = {"status": result.status, "turn_id": turn_id}
        if result.status == "completed":
            answer["text"] = result.text
        elif result.status == "suspended":
            answer["request"] = None if result.request is None else result.request.to_dict()
        elif result.status == "failed":
            answer["error"] = result.error
        else:
            answer["reason"] = result.reason
        return JSONResponse(answer)

    async def _start_turn(self, request: Request, principal: Principal) -> tuple[AgentSession, str]:
        """Check the body of ``/turns`` or ``/chat`` and queue the turn it asks for."""
        ctx, session_id = await self._writable(request)
        body = turn_body(await read_object(request, self.limits.max_body_bytes))
        session = ctx.session(session_id)
        try:
            turn_id = session.start(
                body.text,
                event=self._inbound(body.text, principal),
                replace=body.replace,
                turn_id=body.turn_id,
            )
        except SessionSuspendedError as exc:
            raise HttpError(409, "session_suspended", str(exc)) from None
        return session, turn_id

    async def resume(self, request: Request, principal: Principal) -> Response:
        ctx, session_id = await self._writable(request)
        body = resume_body(await read_object(request, self.limits.max_body_bytes))
        try:
            stream = await ctx.resume_stream(
                session=session_id,
                turn_id=body.turn_id,
                input_id=body.input_id,
                value=body.value,
                by=principal.id,
                principal=principal,
            )
        except ResumeAuthorizationError as exc:
            raise HttpError(403, "not_an_answerer", str(exc)) from None
        except ResumeConflictError as exc:
            raise HttpError(409, "resume_conflict", str(exc)) from None
        except InvalidAnswerError as exc:
            raise HttpError(422, "invalid_answer", str(exc)) from None
        except StoreError:
            raise  # the store failed (or is busy): a 503, nothing was applied
        except Exception as exc:
            # authorize_answer failing (a database outage, say): nothing was applied.
            log.exception("resuming turn %s of %s failed", body.turn_id, session_id)
            raise HttpError(
                500,
                "resume_failed",
                f"the answer was not applied ({type(exc).__name__}: {exc}); send it again",
            ) from None
        return event_stream(stream, self.limits.keepalive_seconds)

    async def reset(self, request: Request, principal: Principal) -> Response:
        ctx, session_id = await self._writable(request)
        data = await read_object(request, self.limits.max_body_bytes, optional=True)
        empty_body(data, "reset")
        done = await ctx.reset_session(session=session_id)
        return JSONResponse(
            {
                "previous_session": done.previous_session,
                "archived_generation": done.archived_generation,
                "generation": done.generation,
            }
        )

    # -- helpers ---------------------------------------------------------------

    def _agent_name(self, request: Request) -> str:
        name = request.path_params["agent"]
        if name not in self.runtime.agents:
            raise HttpError(
                404,
                "unknown_agent",
                f"no agent named {name!r}; this server has {sorted(self.runtime.agents)}",
            )
        return str(name)

    async def _readable(self, request: Request) -> SessionStore:
        """The addressed session's store, once it is known to be this agent's (or no
        agent's yet). Reading creates nothing, not even in memory."""
        name = self._agent_name(request)
        session_id = self._session_id(request)
        store = self.runtime.store.session(session_id)
        # Only the owner is wanted, not the transcript: ask for no messages.
        owner = (await store.load(from_index=_NO_MESSAGES)).agent
        if owner is not None and owner != name:
            raise _another_agents(session_id, owner, name)
        return store

    async def _writable(self, request: Request) -> tuple[ChannelContext, str]:
        """The agent's channel context and the session id, once the session is known
        to be this agent's (or no agent's yet), in the store and in this process."""
        name = self._agent_name(request)
        session_id = (await self._readable(request)).session_id
        ctx = self._contexts.get(name)
        if ctx is None:
            ctx = self._contexts[name] = mount_agent(self.runtime.agents[name], self.runtime)
        try:
            ctx.session(session_id)
        except ConfigurationError as exc:
            raise HttpError(409, "session_of_another_agent", str(exc)) from None
        return ctx, session_id

    def _delivering(self, request: Request, turn_id: str) -> bool:
        """Whether this process has the turn queued or running (not yet in the store)."""
        try:
            session = self.runtime.session(self._agent_name(request), self._session_id(request))
        except ConfigurationError as exc:
            raise HttpError(409, "session_of_another_agent", str(exc)) from None
        return session.delivering(turn_id)

    @staticmethod
    def _session_id(request: Request) -> str:
        return identifier(request.path_params["session"], "session")

    def _inbound(self, text: str, principal: Principal) -> InboundEvent:
        return InboundEvent(
            source=self.source,
            text=text,
            user=User(id=principal.id, attested=principal.attested),
        )


#: A transcript position past any session's end: ``load`` then reads no messages.
_NO_MESSAGES = 2**31 - 1  # the largest index every store takes (PostgreSQL: integer)


def _another_agents(session_id: str, owner: str, name: str) -> HttpError:
    return HttpError(
        409,
        "session_of_another_agent",
        f"session {session_id!r} belongs to agent {owner!r}, not {name!r}",
    )


def error_response(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": message, "code": code}, status_code=status)


def _page(path: str, authenticate: Authenticate) -> Callable[[Request], Awaitable[Response]]:
    async def page(request: Request) -> Response:
        if await authenticated(authenticate, request) is None:
            return error_response(401, "unauthenticated", "authentication required")
        return FileResponse(path, media_type="text/html", headers={"Cache-Control": "no-cache"})

    return page


def _authenticated_asgi(app: ASGIApp, authenticate: Authenticate) -> ASGIApp:
    """``app`` (the page's static files) behind ``authenticate``."""

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and await authenticated(authenticate, Request(scope, receive)) is None
        ):
            refusal = error_response(401, "unauthenticated", "authentication required")
            await refusal(scope, receive, send)
            return
        await app(scope, receive, send)

    return guarded


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    codes = {404: "not_found", 405: "method_not_allowed"}
    return error_response(
        exc.status_code,
        codes.get(exc.status_code, "http_error"),
        f"{request.method} {request.url.path}: {exc.detail}",
    )


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.exception("%s %s failed", request.method, request.url.path, exc_info=exc)
    # The exception's text stays in the log: it may name hosts, queries or credentials.
    return error_response(
        500, "internal_error", f"internal error ({type(exc).__name__}); the server log has more"
    )
