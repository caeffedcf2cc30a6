"""The operator console: every session of the store, a turn's timeline beside its
transcript, live counts, and actions (cancel, answer, reset, retry, erase).

``Console`` is mounted by ``create_app(..., console=Console())`` behind the app's
``authenticate``, and decides with its ``authorize`` like every endpoint: a row of
the list needs ``list``, a session's page ``read``, cancel and retry ``turn``,
answer ``resume``, reset ``reset`` and erase ``erase``. Every action, allowed or
refused, is audited: logged on ``turnkit.console`` and handed to ``audit``. The
actions go through the runtime's own session methods, so they act exactly as the
HTTP API's (on an HTTP node, by storing what workers then do). The page is plain
HTML and JavaScript (``static/console.html``), no build step.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import resources
from typing import Any

from pydantic_core import to_jsonable_python
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route

from .._access.authorize import Action, Authorize, SessionAccess, allowed
from .._access.principal import Authenticate, Principal, principal_of
from .._errors import (
    ConfigurationError,
    InvalidAnswerError,
    ResumeAuthorizationError,
    ResumeConflictError,
)
from .._runtime.client import RuntimeClient
from .._runtime.forking import fork_session
from .._runtime.recorded import read_recorded
from .._runtime.runtime import Runtime
from .._runtime.session import AgentSession
from .._runtime.session_client import SessionClient
from .._seams.store import NO_MESSAGES
from .._seams.tenant_view import TenantView
from .._seams.worker_view import WorkerView
from .._values.records import SessionKey
from .._values.turn_rules import move
from ._bodies import HttpError, error_response, refusing
from ._console_data import (
    STATUSES,
    SessionFilter,
    live_counts,
    session_detail,
    session_row,
    session_rows,
)
from ._console_live import step_latency, workers_now
from ._frontend import Handler
from ._hosts import HostGuard
from ._mounts import Authenticated

log = logging.getLogger("turnkit.console")

#: Each action, and what ``authorize`` is asked for it.
ACTIONS: dict[str, Action] = {
    "cancel": "turn",
    "answer": "resume",
    "reset": "reset",
    "retry": "turn",
    "erase": "erase",
    "fork": "read",
}


@dataclass(frozen=True, kw_only=True)
class ConsoleAudit:
    """One action asked of the console: who, what, on which session, whether
    ``authorize`` allowed it, and how it ended (``done``, ``refused`` or the error)."""

    principal: str
    action: str
    session_id: str
    agent: str | None
    allowed: bool
    outcome: str
    at: float
    detail: dict[str, Any]


class Console:
    """The operator console's options; ``create_app(..., console=Console())`` serves
    it at ``path``. ``audit`` is called with a ``ConsoleAudit`` for every action;
    ``metrics`` are the Prometheus ``/metrics`` URLs of the workers (their ops
    ports), whose step latencies and takeovers the live view sums."""

    def __init__(
        self,
        *,
        path: str = "/console",
        audit: Callable[[ConsoleAudit], None] | None = None,
        page_size: int = 50,
        metrics: Sequence[str] = (),
    ) -> None:
        if not isinstance(path, str) or not path.startswith("/") or path.endswith("/"):
            raise ConfigurationError(f"console path must start with / and not end with /: {path!r}")
        if audit is not None and not callable(audit):
            raise ConfigurationError("console audit must be a function of a ConsoleAudit")
        if not isinstance(page_size, int) or not 1 <= page_size <= 500:
            raise ConfigurationError(f"console page_size must be 1 to 500, got {page_size!r}")
        if isinstance(metrics, str) or not all(
            isinstance(u, str) and u.startswith(("http://", "https://")) for u in metrics
        ):
            raise ConfigurationError(
                f"console metrics must be a list of http(s) URLs of /metrics, got {metrics!r}"
            )
        self.path = path
        self.audit = audit
        self.page_size = page_size
        self.metrics = tuple(metrics)

    def asgi(self, runtime: RuntimeClient, authorize: Authorize) -> Starlette:
        """The console's routes, relative to where it is mounted; each request must
        carry the authenticated principal in its scope (``Authenticated`` puts it
        there)."""
        handlers = _Handlers(self, runtime, authorize)
        page = resources.files("turnkit.server") / "static" / "console.html"

        async def index(request: Request) -> Response:
            return FileResponse(str(page), media_type="text/html", headers=_NO_CACHE)

        return Starlette(
            routes=[
                Route("/", index, methods=["GET"]),
                Route("/api/sessions", handlers.guard(handlers.sessions), methods=["GET"]),
                Route("/api/live", handlers.guard(handlers.live), methods=["GET"]),
                Route("/api/metrics", handlers.guard(handlers.metrics), methods=["GET"]),
                Route("/api/sessions/{session}", handlers.guard(handlers.session), methods=["GET"]),
                Route(
                    "/api/sessions/{session}/{action}",
                    handlers.guard(handlers.act),
                    methods=["POST"],
                ),
            ]
        )


_NO_CACHE = {"Cache-Control": "no-cache"}


class _Handlers:
    def __init__(self, console: Console, runtime: RuntimeClient, authorize: Authorize) -> None:
        self.console = console
        self.runtime = runtime
        self.authorize = authorize

    def guard(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            principal = principal_of(request.scope)
            if principal is None:
                return error_response(401, "unauthenticated", "authentication required")
            return await refusing(handler, request, principal)

        return endpoint

    async def sessions(self, request: Request, principal: Principal) -> Response:
        q = request.query_params
        status = q.get("status") or None
        if status == "parked":
            status = "suspended"
        if status is not None and status not in STATUSES:
            raise HttpError(400, "bad_status", f"status must be one of {sorted(STATUSES)}")
        tenant = q.get("tenant")
        if tenant is not None and not isinstance(self.runtime.store, TenantView):
            raise HttpError(400, "no_tenants", "this store cannot list sessions by tenant")
        wanted = SessionFilter(
            agent=q.get("agent") or None,
            status=status,
            tenant=tenant,
            newer_than=_seconds(q.get("newer_than"), "newer_than"),
            older_than=_seconds(q.get("older_than"), "older_than"),
            limit=self.console.page_size,
        )
        rows, after, scanned = await session_rows(self.runtime.store, wanted, _key(q.get("after")))
        shown = []
        for info in rows:
            access = SessionAccess(
                agent=info.agent, session_id=info.session_id, owner=info.owner, action="list"
            )
            if await allowed(self.authorize, principal, access):
                shown.append(session_row(info))
        return JSONResponse(
            {
                "sessions": shown,
                "next": None if after is None else f"{after[0]!r}|{after[1]}",
                "scanned": scanned,
            }
        )

    async def live(self, request: Request, principal: Principal) -> Response:
        store = self.runtime.store
        counts, workers = await asyncio.gather(live_counts(store), workers_now(store))
        return JSONResponse({**counts, "workers": workers})

    async def metrics(self, request: Request, principal: Principal) -> Response:
        return JSONResponse(await step_latency(self.runtime, self.console.metrics))

    async def session(self, request: Request, principal: Principal) -> Response:
        session_id = request.path_params["session"]
        agent = await self._allowed(principal, session_id, "read")
        store = self.runtime.store.session(session_id)
        recorded = await read_recorded(store)
        shared = self.runtime.store
        writers = await shared.event_writers(session_id) if isinstance(shared, WorkerView) else None
        detail = session_detail(recorded, await store.status(), await store.generations(), writers)
        detail["loaded"] = agent in self.runtime.agents
        return JSONResponse(to_jsonable_python(detail))

    async def act(self, request: Request, principal: Principal) -> Response:
        session_id = request.path_params["session"]
        action = request.path_params["action"]
        if action not in ACTIONS:
            raise HttpError(404, "unknown_action", f"no console action {action!r}")
        body = await _body(request)
        try:
            agent = await self._allowed(principal, session_id, ACTIONS[action])
        except HttpError as exc:
            self._audit(principal, action, session_id, None, False, "refused", body)
            raise exc
        try:
            if action == "fork":
                result = await self._fork(principal, agent, session_id, body)
            else:
                result = await self._do(action, self._session(agent, session_id), principal, body)
        except HttpError as exc:
            allowed_it = exc.status != 403  # a 403: authorize refused the new session
            self._audit(principal, action, session_id, agent, allowed_it, f"refused: {exc}", body)
            raise
        except (ResumeConflictError, ConfigurationError, ValueError) as exc:
            self._audit(principal, action, session_id, agent, True, f"conflict: {exc}", body)
            raise HttpError(409, "conflict", str(exc)) from None
        except InvalidAnswerError as exc:
            self._audit(principal, action, session_id, agent, True, f"invalid: {exc}", body)
            raise HttpError(400, "invalid_answer", str(exc)) from None
        except ResumeAuthorizationError as exc:
            self._audit(principal, action, session_id, agent, True, f"not admitted: {exc}", body)
            raise HttpError(403, "not_an_answerer", str(exc)) from None
        self._audit(principal, action, session_id, agent, True, "done", body)
        return JSONResponse(to_jsonable_python(result))

    async def _do(
        self, action: str, session: SessionClient, principal: Principal, body: dict[str, Any]
    ) -> dict[str, Any]:
        if action == "cancel":
            return {"cancelled": await session.cancel("requested")}
        if action == "reset":
            done = await session.reset()
            return {"archived_generation": done.archived_generation}
        if action == "erase":
            await session.erase(by=principal.id)
            return {"erased": session.session_id}
        turn_id = _text(body, "turn_id")
        if action == "answer":
            input_id = _text(body, "input_id")
            if "value" not in body:
                raise HttpError(400, "bad_body", "answer needs a value")
            await session.resume(
                turn_id, input_id, body["value"], by=principal.id, source="console"
            )
            return {"turn_id": turn_id}
        return {"turn_id": await self._retry(session, turn_id)}

    async def _fork(
        self, principal: Principal, agent: str, session_id: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        """A new session from this one's history up to ``at`` (``fork_session``): the
        source must be readable, and the new session one ``authorize`` lets the
        operator open (``turn`` on a session that does not exist)."""
        at = body.get("at") or None  # null or "": everything
        if at is not None and (isinstance(at, bool) or not isinstance(at, int | str)):
            raise HttpError(400, "bad_body", "at must be a position, a step id or null")
        if isinstance(at, str) and at.isdigit():
            at = int(at)
        new_id = _text(body, "new_session")
        source = await self.runtime.store.session(session_id).load(from_index=NO_MESSAGES)
        access = SessionAccess(
            agent=agent, session_id=new_id, owner=source.owner, action="turn", exists=False
        )
        if not await allowed(self.authorize, principal, access):
            raise HttpError(403, "refused", f"you may not open session {new_id!r}")
        made = await fork_session(self.runtime.store, session_id, at=at, new_session=new_id)
        runtime = self.runtime
        if isinstance(runtime, Runtime) and made.status == "running" and agent in runtime.agents:
            # Carry the cut turn on here (a worker claims it on an HTTP node).
            runtime.session(agent, new_id).start("", turn_id=made.turn_id)
        return {"session_id": made.session_id, "at": made.at, "status": made.status}

    async def _retry(self, session: SessionClient, turn_id: str) -> str:
        """Deliver a failed turn again from its last committed step: here, or (on an
        HTTP node) by storing it ``running`` for the workers to take up."""
        store = self.runtime.store.session(session.session_id)
        record = await store.turn(turn_id)
        if record is None or record.status != "failed":
            found = "no such turn" if record is None else record.status
            raise ConfigurationError(f"only a failed turn is retried; turn {turn_id} is {found}")
        if isinstance(session, AgentSession):
            return session.run_stored(record)
        await store.commit([move(record, "running")])
        return turn_id

    async def _allowed(self, principal: Principal, session_id: str, action: Action) -> str:
        """The session's agent, once ``authorize`` allows ``action`` on it; a refusal
        answers as a session that does not exist."""
        snap = await self.runtime.store.session(session_id).load(from_index=NO_MESSAGES)
        if snap.agent is None:
            raise HttpError(404, "unknown_session", f"no session {session_id!r}")
        access = SessionAccess(
            agent=snap.agent, session_id=session_id, owner=snap.owner, action=action
        )
        if not await allowed(self.authorize, principal, access):
            raise HttpError(404, "unknown_session", f"no session {session_id!r}")
        return snap.agent

    def _session(self, agent: str, session_id: str) -> SessionClient:
        if agent not in self.runtime.agents:
            raise HttpError(
                409, "agent_not_loaded", f"agent {agent!r} is not loaded in this console"
            )
        return self.runtime.session(agent, session_id)

    def _audit(
        self,
        principal: Principal,
        action: str,
        session_id: str,
        agent: str | None,
        was_allowed: bool,
        outcome: str,
        body: dict[str, Any],
    ) -> None:
        entry = ConsoleAudit(
            principal=principal.id,
            action=action,
            session_id=session_id,
            agent=agent,
            allowed=was_allowed,
            outcome=outcome,
            at=time.time(),
            detail={k: v for k, v in body.items() if k in ("turn_id", "input_id")},
        )
        log.info("console: %s %s session %s: %s", entry.principal, action, session_id, outcome)
        if self.console.audit is not None:
            try:
                self.console.audit(entry)
            except Exception:
                log.exception("the console's audit hook failed")


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        raise HttpError(400, "bad_json", "the body is not JSON") from None
    if not isinstance(data, dict):
        raise HttpError(400, "bad_body", "the body must be a JSON object")
    return data


def _text(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise HttpError(400, "bad_body", f"{name} must be a non-empty string")
    return value


def _seconds(text: str | None, name: str) -> float | None:
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise HttpError(400, "bad_age", f"{name} must be seconds, got {text!r}") from None
    if not value >= 0:
        raise HttpError(400, "bad_age", f"{name} must be at least 0, got {text!r}")
    return value


def _key(text: str | None) -> SessionKey | None:
    """The ``next`` a page handed out: ``<updated_at>|<session_id>``."""
    if not text:
        return None
    stamp, sep, session_id = text.partition("|")
    try:
        return (float(stamp), session_id) if sep else None
    except ValueError:
        raise HttpError(400, "bad_cursor", f"after {text!r} is not a cursor this gave") from None


def console_app(
    runtime: RuntimeClient,
    *,
    authenticate: Authenticate,
    authorize: Authorize,
    console: Console | None = None,
    allowed_hosts: Sequence[str] | None = None,
    own_runtime: bool = False,
) -> Starlette:
    """The console alone, served at ``/`` (what ``turnkit console`` runs): behind
    ``authenticate`` and ``authorize``, answering only ``allowed_hosts`` (``None``:
    any) and refusing a cross-site POST. With ``own_runtime`` the app opens and
    closes the runtime with the server."""
    options = console or Console()
    inner = Authenticated(options.asgi(runtime, authorize), authenticate)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if not own_runtime:
            yield
            return
        async with runtime:
            yield

    return Starlette(
        routes=[Mount("/", inner)],
        middleware=[Middleware(HostGuard, hosts=allowed_hosts)],
        lifespan=lifespan,
    )
