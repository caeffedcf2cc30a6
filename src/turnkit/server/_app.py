"""``create_app``: a ``Runtime`` (or a ``RuntimeClient``) behind HTTP, as a Starlette ASGI app.

Each request is authenticated first, its input checked next, and only then does
it reach the runtime, so a refused request changes nothing. Turns stream back as
server-sent events; ``…/events`` lets a dropped client catch up.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from importlib import resources
from typing import Any

from pydantic_core import to_jsonable_python
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from .._access.answerer import answering_as, parked_request
from .._access.authorize import (
    Action,
    Authorize,
    SessionAccess,
    allowed,
    checked_authorize,
    owner_only,
)
from .._access.principal import Authenticate, Principal, authenticated
from .._channels.channel import ChannelContext, mount_agent
from .._channels.local_user import named_answerer
from .._engine.tools import Tool
from .._errors import (
    ConfigurationError,
    InvalidAnswerError,
    ResumeAuthorizationError,
    ResumeConflictError,
    SessionOwnerError,
    SessionSuspendedError,
    StoreError,
    TurnError,
)
from .._runtime.client import RuntimeClient
from .._runtime.observe import TurnStream
from .._runtime.runtime import Runtime
from .._runtime.session_client import SessionClient
from .._seams.store import SessionStore, parked_turn
from .._values.answers import answer_records
from .._values.inbound import InboundEvent, User
from .._values.inputs import InputRequest
from .._values.records import SessionInfo
from ._bodies import (
    HttpError,
    ResumeBody,
    TurnBody,
    empty_body,
    error_response,
    identifier,
    non_negative_int,
    read_object,
    refusing,
    resume_body,
    turn_body,
    wake_body,
)
from ._body_limit import BodyLimit
from ._console import Console
from ._feed import EventFeed
from ._frontend import Frontend, Handler, Target, unknown_session
from ._hosts import HostGuard, checked_names
from ._inbox import inbox
from ._mounts import Authenticated, Mountable
from ._ops import healthz, readiness
from ._sessions_page import page_of_sessions
from ._streams import HEADERS as STREAM_HEADERS
from ._streams import event_stream, feed_stream
from ._transcript import transcript_body

log = logging.getLogger("turnkit.server")


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
    #: Deepest nesting of arrays and objects a request body may have (turn bodies and
    #: resume values alike); a deeper one is refused with 400 ``too_deep``.
    max_json_depth: int = 64

    def __post_init__(self) -> None:
        for name in (
            "max_body_bytes",
            "keepalive_seconds",
            "page_size_max",
            "feed_poll_seconds",
            "max_json_depth",
        ):
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
        if not isinstance(self.max_json_depth, int) or self.max_json_depth < 1:
            raise ConfigurationError(
                f"max_json_depth must be a positive int, got {self.max_json_depth!r}"
            )
        if not isinstance(self.page_size_max, int) or self.page_size_max < 1:
            raise ConfigurationError(
                f"page_size_max must be a positive int, got {self.page_size_max!r}"
            )


def create_app(
    runtime: RuntimeClient,
    *,
    authenticate: Authenticate,
    limits: ServerLimits | None = None,
    authorize: Authorize | None = None,
    allowed_hosts: Sequence[str] | None = None,
    allowed_origins: Sequence[str] = (),
    chat_page: bool = False,
    notice: str | None = None,
    source: str = "http",
    own_runtime: bool = False,
    mcp: Mountable | None = None,
    frontends: Sequence[Frontend] = (),
    console: Console | None = None,
) -> Starlette:
    """The HTTP surface of ``runtime`` (see docs/server.md).

    ``authenticate(request) -> Principal | None`` is required and runs before
    anything else but the probes, ``/healthz`` and ``/readyz``.
    ``authorize(principal, SessionAccess) -> bool`` (plain or async) decides who
    may use which session; without it a session is its owner's alone
    (``owner_only``), and every refusal answers 404 exactly as a session that does
    not exist. ``allowed_hosts`` lists the names the server answers to (any other
    ``Host`` is refused with 421; ``None`` checks none, for a proxy that already
    does). A POST whose ``Origin`` is neither the server's own nor in
    ``allowed_origins`` is refused with 403. ``chat_page`` serves the chat page at
    ``/``; ``notice`` is a line the page shows (``turnkit dev`` says which model
    runs). Turns opened here carry an inbound event from ``source``, which picks the
    agent's per-source policy.

    With ``own_runtime`` the app opens the runtime when the server starts (and
    recovers the turns a previous process left open, in the background) and closes
    it when the server stops: what ``uvicorn module:app`` needs.

    ``mcp`` (``turnkit.mcp.server(runtime, agent)``) is served at its path, ``/mcp``,
    behind ``authenticate`` and deciding with ``authorize`` like every endpoint; it
    runs while the app's lifespan does (see docs/mcp.md).

    Given a ``RuntimeClient`` instead of a ``Runtime``, the app is an HTTP node of a
    deployment with workers (``turnkit worker``): turns, resumes, cancellations and
    resets are stored for the workers, and streams and answers follow the turns
    through the store. The app never changes the runtime it is handed.

    ``frontends`` adds the routes of front-end protocols,
    ``turnkit.server.aisdk.ai_sdk()`` and ``turnkit.server.agui.ag_ui()`` (see
    docs/frontends.md), behind the same ``authenticate`` and ``authorize``.

    ``console`` (``turnkit.server.Console()``) serves the operator console at its
    path, ``/console``, behind ``authenticate``, each row and action decided with
    ``authorize`` and each action audited (see docs/console.md).
    """
    if not isinstance(runtime, RuntimeClient):
        raise ConfigurationError(
            "create_app needs a turnkit.Runtime or a turnkit.RuntimeClient, "
            f"got {type(runtime).__name__}"
        )
    if not callable(authenticate):
        raise ConfigurationError(
            "create_app needs authenticate=: a function from the request to a Principal or None"
        )
    if not isinstance(source, str) or not source:
        raise ConfigurationError(f"source must be a non-empty str, got {source!r}")
    hosts = checked_names(allowed_hosts, "allowed_hosts")
    origins = checked_names(allowed_origins, "allowed_origins") or []
    api = _Api(runtime, limits or ServerLimits(), source, notice, checked_authorize(authorize))
    guard = _Guard(authenticate, runtime)
    session = "/agents/{agent}/sessions/{session}"
    routes: list[BaseRoute] = [
        # For probes, which carry no credentials; they tell nothing about sessions.
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readiness(runtime), methods=["GET"]),
        Route("/agents", guard(api.agents), methods=["GET"]),
        Route("/inbox", guard(api.inbox), methods=["GET"]),
        Route("/agents/{agent}/sessions", guard(api.sessions), methods=["GET"]),
        Route(f"{session}/turns", guard(api.turns), methods=["POST"]),
        Route(f"{session}/chat", guard(api.chat), methods=["POST"]),
        Route(f"{session}/resume", guard(api.resume), methods=["POST"]),
        Route(f"{session}/reset", guard(api.reset), methods=["POST"]),
        Route(session, guard(api.erase), methods=["DELETE"]),
        Route(f"{session}/cancel", guard(api.cancel), methods=["POST"]),
        Route(f"{session}/wake", guard(api.wake), methods=["POST"]),
        Route(f"{session}/pending", guard(api.pending), methods=["GET"]),
        Route(f"{session}/answers", guard(api.answers), methods=["GET"]),
        Route(f"{session}/transcript", guard(api.transcript), methods=["GET"]),
        Route(f"{session}/events", guard(api.events), methods=["GET"]),
    ]
    host = _Host(api, guard)
    for frontend in frontends:
        if not isinstance(frontend, Frontend):
            raise ConfigurationError(
                "create_app: frontends= takes turnkit.server.aisdk.ai_sdk() or "
                f"turnkit.server.agui.ag_ui(), got {type(frontend).__name__}"
            )
        routes.extend(frontend.routes(host))
    if mcp is not None:
        if not isinstance(mcp, Mountable):
            raise ConfigurationError(
                f"create_app: mcp= takes turnkit.mcp.server(...), got {type(mcp).__name__}"
            )
        mounted = Authenticated(mcp.asgi(api.authorize), authenticate)
        routes.append(Route(mcp.path, mounted))
    if console is not None:
        if not isinstance(console, Console):
            raise ConfigurationError(
                f"create_app: console= takes turnkit.server.Console(), got {type(console).__name__}"
            )
        inner = Authenticated(console.asgi(runtime, api.authorize), authenticate)
        routes.append(Mount(console.path, inner))
    if chat_page:
        static = resources.files("turnkit.server") / "static"
        # Behind ``authenticate`` too: it sees every request the app serves.
        routes.append(Route("/", _page(str(static / "index.html"), authenticate), methods=["GET"]))
        files = StaticFiles(directory=str(static))
        routes.append(Mount("/static", _authenticated_asgi(files, authenticate), name="static"))
    return Starlette(
        routes=routes,
        middleware=[
            # Outermost: a body over the cap is refused before it is read, whoever
            # sent it, on every route (the mounted MCP app included), and the body of
            # any request answered before it was read (a refusal by the host guard
            # below, say) is drained in bounds, so the connection closes in order.
            Middleware(BodyLimit, max_bytes=api.limits.max_body_bytes),
            # Then, so a request from a rebound name or another site reaches nothing.
            Middleware(HostGuard, hosts=hosts, origins=origins),
        ],
        exception_handlers={HTTPException: _http_exception, Exception: _unexpected},
        lifespan=_lifespan(runtime if own_runtime else None, mcp),
    )


def _lifespan(
    runtime: RuntimeClient | None, mounted: Mountable | None
) -> Callable[[Starlette], AbstractAsyncContextManager[None]] | None:
    """Open the runtime (if the app owns it) and run the mounted app while serving."""
    if runtime is None and mounted is None:
        return None

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            if runtime is not None:
                await stack.enter_async_context(runtime)
                if isinstance(runtime, Runtime):  # a client's turns are the workers' to recover
                    recovering = runtime.spawn(recover_quietly(runtime))
                    stack.callback(recovering.cancel)
            if mounted is not None:
                await stack.enter_async_context(mounted.running())
            yield

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

    def __init__(self, authenticate: Authenticate, runtime: RuntimeClient) -> None:
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
                return await refusing(handler, request, principal)
            except TurnError as exc:
                # The runtime closed (or the delivery was interrupted) under the request.
                return error_response(503, "runtime_unavailable", str(exc))

        return endpoint


class _Host:
    """What a ``Frontend`` reaches the app through (``FrontendHost``)."""

    def __init__(self, api: _Api, guard: _Guard) -> None:
        self._api = api
        self._guard = guard

    @property
    def keepalive_seconds(self) -> float:
        return self._api.limits.keepalive_seconds

    @property
    def feed_poll_seconds(self) -> float | None:
        return self._api.limits.feed_poll_seconds

    def endpoint(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        return self._guard(handler)

    def agent_name(self, name: str) -> str:
        return self._api.agent_name(name)

    def agent_tools(self, name: str) -> list[Tool]:
        return [t for t in self._api.runtime.agents[name].tools if isinstance(t, Tool)]

    async def body(self, request: Request) -> dict[str, Any]:
        return await self._api.body(request)

    async def target(
        self, principal: Principal, agent: str, session_id: str, action: Action, *, refuse: bool
    ) -> Target:
        session_id = identifier(session_id, "session")
        return await self._api.target_of(agent, session_id, principal, action, refuse=refuse)

    async def start_turn(
        self, principal: Principal, target: Target, text: str, *, turn_id: str | None
    ) -> tuple[SessionClient, str]:
        if turn_id is not None:
            turn_id = identifier(turn_id, "turn_id")
        return await self._api.start_turn(principal, target, TurnBody(text=text, turn_id=turn_id))

    async def answer(
        self,
        principal: Principal,
        target: Target,
        turn_id: str,
        input_id: str,
        value: Any,
        *,
        source: str | None = None,
    ) -> TurnStream | None:
        body = ResumeBody(
            turn_id=identifier(turn_id, "turn_id"),
            input_id=identifier(input_id, "input_id"),
            value=value,
        )
        return await self._api.answer(principal, target, body, source=source)

    async def pending(self, target: Target) -> list[InputRequest]:
        record = await parked_turn(target.store)
        checkpoint = record.pending if record is not None else None
        return [] if checkpoint is None else list(checkpoint.requests)

    async def cancel(self, target: Target) -> list[str]:
        return await self._api.cancel_turns(target)

    def feed(self, target: Target, *, turn_id: str, after: int = 0) -> EventFeed:
        runtime = self._api.runtime
        return EventFeed(
            target.store, runtime.sink, after=after, turn_id=turn_id, relay=runtime.relay
        )


class _Api:
    """The endpoints, each a method taking the request and its principal."""

    def __init__(
        self,
        runtime: RuntimeClient,
        limits: ServerLimits,
        source: str,
        notice: str | None,
        authorize: Authorize,
    ) -> None:
        self.runtime = runtime
        self.limits = limits
        self.source = source
        self.notice = notice
        self.authorize = authorize
        self._contexts: dict[str, ChannelContext] = {}

    # -- reading ---------------------------------------------------------------

    async def agents(self, request: Request, principal: Principal) -> Response:
        names = sorted(self.runtime.agents)
        return JSONResponse({"agents": [{"name": n} for n in names], "notice": self.notice})

    async def inbox(self, request: Request, principal: Principal) -> Response:
        return await inbox(self.runtime, self.authorize, request, principal)

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
        if self.authorize is owner_only and not principal.aliases:
            # The default, answered from the store's (owner, agent, …) index.
            rows, cursor = await page_of_sessions(
                self.runtime.store, agent, limit, cursor, owner=principal.id
            )
        else:

            async def keep(info: SessionInfo) -> bool:
                access = SessionAccess(
                    agent=agent, session_id=info.session_id, owner=info.owner, action="list"
                )
                return await allowed(self.authorize, principal, access)

            rows, cursor = await page_of_sessions(
                self.runtime.store, agent, limit, cursor, keep=keep
            )
        return JSONResponse({"sessions": rows, "next": cursor})

    async def pending(self, request: Request, principal: Principal) -> Response:
        store = (await self._target(request, principal, "read")).store
        record = await parked_turn(store)
        checkpoint = record.pending if record is not None else None
        if checkpoint is None:
            return JSONResponse({"request": None, "requests": []})
        return JSONResponse(
            {
                "request": checkpoint.request.to_dict(),
                "requests": [r.to_dict() for r in checkpoint.requests],
            }
        )

    async def answers(self, request: Request, principal: Principal) -> Response:
        """Who answered the session's questions, when, through what, and what."""
        store = (await self._target(request, principal, "read")).store
        turn_id = request.query_params.get("turn_id")
        if turn_id is not None:
            turn_id = identifier(turn_id, "turn_id")
        records = answer_records(await store.events(turn_id=turn_id))
        return JSONResponse({"answers": [r.to_dict() for r in records]})

    async def transcript(self, request: Request, principal: Principal) -> Response:
        store = (await self._target(request, principal, "read")).store
        return JSONResponse(await transcript_body(store, request.query_params))

    async def events(self, request: Request, principal: Principal) -> Response:
        store = (await self._target(request, principal, "read")).store
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
        feed = EventFeed(
            store, self.runtime.sink, after=after, turn_id=turn_id, relay=self.runtime.relay
        )
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
        except SessionOwnerError:
            # Another owner's first turn opened the session since it was checked.
            raise unknown_session(session.agent.name, session.session_id) from None
        answer: dict[str, Any] = {"status": result.status, "turn_id": turn_id}
        if result.status == "completed":
            answer["text"] = result.text
            if result.output is not None:  # a typed answer, as JSON
                answer["output"] = to_jsonable_python(result.output)
        elif result.status == "suspended":
            answer["request"] = None if result.request is None else result.request.to_dict()
            answer["requests"] = [r.to_dict() for r in result.requests]
        elif result.status == "failed":
            answer["error"] = result.error
        else:
            answer["reason"] = result.reason
        return JSONResponse(answer)

    async def _start_turn(
        self, request: Request, principal: Principal
    ) -> tuple[SessionClient, str]:
        """Check the body of ``/turns`` or ``/chat`` and queue the turn it asks for."""
        body = turn_body(await self.body(request))
        target = await self._target(request, principal, "turn")
        return await self.start_turn(principal, target, body)

    async def start_turn(
        self, principal: Principal, target: Target, body: TurnBody
    ) -> tuple[SessionClient, str]:
        """Queue the turn ``body`` asks for on ``target`` (which ``authorize`` allowed
        to ``turn``); acknowledged once the store holds it."""
        ctx = self._writable(target)
        session = ctx.session(target.session_id)
        try:
            # Acknowledged only once the store holds the turn (see SessionClient.submit).
            turn_id = await session.submit(
                body.text,
                event=self._inbound(body.text, principal),
                replace=body.replace,
                turn_id=body.turn_id,
                # The session must still be the one authorized: a new one becomes the
                # caller's, and the engine refuses if another owner got there first.
                owner=target.owner if target.exists else principal.id,
                tenant=principal.tenant,
            )
        except SessionSuspendedError as exc:
            raise HttpError(409, "session_suspended", str(exc)) from None
        except ConfigurationError as exc:
            raise HttpError(409, "session_of_another_agent", str(exc)) from None
        except SessionOwnerError:
            # Another owner's first turn opened the session since it was checked.
            raise unknown_session(target.agent, target.session_id) from None
        return session, turn_id

    async def resume(self, request: Request, principal: Principal) -> Response:
        body = resume_body(await self.body(request))
        target = await self._target(request, principal, "resume", refuse=False)
        stream = await self.answer(principal, target, body)
        if stream is None:
            # Let in only as a named answerer: they learn that their answer was
            # taken, not what the session goes on to say (its owner's to read).
            return JSONResponse(
                {"status": "accepted", "turn_id": body.turn_id, "input_id": body.input_id}
            )
        return event_stream(stream, self.limits.keepalive_seconds)

    async def answer(
        self, principal: Principal, target: Target, body: ResumeBody, *, source: str | None = None
    ) -> TurnStream | None:
        """Answer the parked question ``body`` names, as ``/resume`` does: ``target``
        comes from ``_target(..., "resume", refuse=False)``. Returns the resumed
        turn's events, or ``None`` to a named answerer ``authorize`` does not let
        resume the session (their answer was taken; the rest is not theirs to read).
        Every refusal is an ``HttpError``, and nothing was applied. The answer is
        recorded as come through ``source`` (default: the app's)."""
        if not target.allowed and not await _names(target.store, body, principal):
            raise unknown_session(target.agent, target.session_id)
        ctx = self._writable(target)
        try:
            stream = await ctx.resume_stream(
                session=target.session_id,
                turn_id=body.turn_id,
                input_id=body.input_id,
                value=body.value,
                by=await answering_as(target.store, principal, body.turn_id, body.input_id),
                principal=principal,
                source=source or self.source,
            )
        except (ResumeAuthorizationError, ResumeConflictError, InvalidAnswerError) as exc:
            if not target.allowed:
                # Let in only as a named answerer: whatever else is wrong stays hidden.
                raise unknown_session(target.agent, target.session_id) from None
            raise _resume_refusal(exc) from None
        except StoreError:
            raise  # the store failed (or is busy): a 503, nothing was applied
        except Exception as exc:
            # authorize_answer failing (a database outage, say): nothing was applied.
            # Its text stays in the log: it may name hosts, queries or credentials.
            log.exception("resuming turn %s of %s failed", body.turn_id, target.session_id)
            raise HttpError(
                500,
                "resume_failed",
                f"the answer was not applied ({type(exc).__name__}); send it again",
            ) from None
        if not target.allowed:
            await stream.aclose()
            return None
        return stream

    async def reset(self, request: Request, principal: Principal) -> Response:
        empty_body(await self.body(request, optional=True), "reset")
        target = await self._target(request, principal, "reset")
        ctx = self._writable(target)
        done = await ctx.reset_session(session=target.session_id)
        return JSONResponse(
            {
                "previous_session": done.previous_session,
                "archived_generation": done.archived_generation,
                "generation": done.generation,
            }
        )

    async def erase(self, request: Request, principal: Principal) -> Response:
        empty_body(await self.body(request, optional=True), "erase")
        target = await self._target(request, principal, "erase")
        ctx = self._writable(target)
        # Cancels what runs (in any process), then deletes, leaving a tombstone.
        await ctx.session(target.session_id).erase(by=principal.id)
        return Response(status_code=204)

    async def cancel(self, request: Request, principal: Principal) -> Response:
        empty_body(await self.body(request, optional=True), "cancel")
        target = await self._target(request, principal, "turn")
        return JSONResponse({"cancelled": await self.cancel_turns(target)})

    async def wake(self, request: Request, principal: Principal) -> Response:
        """End the parked turn's waits on the clock now (``session.wake``), recorded
        as woken by the principal; ``woken`` says whether there was a wait to end.
        On an HTTP node the woken turn is left to the workers, like an answer."""
        turn_id = wake_body(await self.body(request, optional=True))
        target = await self._target(request, principal, "wake")
        if not target.exists:
            raise unknown_session(target.agent, target.session_id)
        session = self._writable(target).session(target.session_id)
        if turn_id is None:
            parked = await parked_turn(target.store)
            turn_id = parked.turn_id if parked is not None else None
        woken = turn_id is not None and await session.wake(turn_id, by=principal.id)
        return JSONResponse({"woken": woken, "turn_id": turn_id if woken else None})

    async def cancel_turns(self, target: Target) -> list[str]:
        """Cancel every unfinished turn of ``target`` (which ``authorize`` allowed to
        ``turn``), as ``/cancel`` does; the turn ids cancelled."""
        if not target.exists:
            # "turn" admits a new session, but there is nothing to cancel in one: the
            # same 404 as another's session, so cancel probes nothing.
            raise unknown_session(target.agent, target.session_id)
        ctx = self._writable(target)
        # Recorded in the store: a worker running one stops at its next boundary.
        return await ctx.session(target.session_id).cancel("requested")

    # -- helpers ---------------------------------------------------------------

    def _agent_name(self, request: Request) -> str:
        return self.agent_name(request.path_params["agent"])

    def agent_name(self, name: str) -> str:
        """``name`` if this server has that agent, else the 404 ``unknown_agent``."""
        if name not in self.runtime.agents:
            raise HttpError(
                404,
                "unknown_agent",
                f"no agent named {name!r}; this server has {sorted(self.runtime.agents)}",
            )
        return str(name)

    async def body(self, request: Request, *, optional: bool = False) -> dict[str, Any]:
        return await read_object(
            request,
            self.limits.max_body_bytes,
            max_depth=self.limits.max_json_depth,
            optional=optional,
        )

    async def _target(
        self, request: Request, principal: Principal, action: Action, *, refuse: bool = True
    ) -> Target:
        """The addressed session, once ``authorize`` allows ``action`` on it (with
        ``refuse=False`` the verdict is returned instead) and it is known to be this
        agent's, or no agent's yet. A refusal is the 404 of a missing session.
        Reading creates nothing, not even in memory."""
        return await self.target_of(
            self._agent_name(request), self._session_id(request), principal, action, refuse=refuse
        )

    async def target_of(
        self, name: str, session_id: str, principal: Principal, action: Action, *, refuse: bool
    ) -> Target:
        """``_target`` for an agent and session named some other way than the path."""
        store = self.runtime.store.session(session_id)
        # Only the session's agent and owner are wanted, not the transcript.
        snap = await store.load(from_index=_NO_MESSAGES)
        exists = snap.agent is not None
        access = SessionAccess(
            agent=name, session_id=session_id, owner=snap.owner, action=action, exists=exists
        )
        verdict = await allowed(self.authorize, principal, access)
        if not verdict and refuse:
            raise unknown_session(name, session_id)
        if verdict and snap.agent is not None and snap.agent != name:
            raise _another_agents(session_id, snap.agent, name)
        return Target(
            agent=name,
            session_id=session_id,
            store=store,
            owner=snap.owner,
            exists=exists,
            allowed=verdict,
        )

    def _writable(self, target: Target) -> ChannelContext:
        """The agent's channel context, once this process also holds the session as
        the agent's (not another's)."""
        ctx = self._contexts.get(target.agent)
        if ctx is None:
            ctx = self._contexts[target.agent] = mount_agent(
                self.runtime.agents[target.agent], self.runtime
            )
        try:
            ctx.session(target.session_id)
        except ConfigurationError as exc:
            raise HttpError(409, "session_of_another_agent", str(exc)) from None
        return ctx

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


async def _names(store: SessionStore, body: ResumeBody, principal: Principal) -> bool:
    """Whether the session's parked request, the one ``body`` answers, names who may
    answer it in a way that can admit ``principal``: as the named user, or through a
    policy (which ``authorize_answer`` decides). A request naming nobody admits only
    principals that ``authorize`` lets ``resume``."""
    pending = await parked_request(store, body.turn_id, body.input_id)
    if pending is None:
        return False
    return named_answerer(principal.names, pending.answerers) is not None or any(
        a.kind == "policy" for a in pending.answerers
    )


def _resume_refusal(exc: Exception) -> HttpError:
    if isinstance(exc, ResumeAuthorizationError):
        return HttpError(403, "not_an_answerer", str(exc))
    if isinstance(exc, InvalidAnswerError):
        return HttpError(422, "invalid_answer", str(exc))
    return HttpError(409, "resume_conflict", str(exc))


def _another_agents(session_id: str, owner: str, name: str) -> HttpError:
    return HttpError(
        409,
        "session_of_another_agent",
        f"session {session_id!r} belongs to agent {owner!r}, not {name!r}",
    )


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
    codes = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}
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
