"""The seam a front-end protocol plugs into ``create_app`` through (``frontends=``).

A ``Frontend`` (the AI SDK's UI message stream, AG-UI) adds routes of its own; it
reaches the runtime only through ``FrontendHost``, the same code paths as the
app's endpoints: ``authenticate`` first, ``authorize`` for the session, the body
cap and checks, turns opened and questions answered exactly as ``/chat`` and
``/resume`` do.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from .._access.authorize import Action
from .._access.principal import Principal
from .._engine.tools import Tool
from .._errors import TurnError
from .._runtime.observe import TurnStream
from .._runtime.session_client import SessionClient
from .._seams.store import SessionStore
from .._values.events import TurnEvent
from .._values.inputs import InputRequest
from ._bodies import HttpError
from ._feed import EventFeed

Handler = Callable[[Request, Principal], Awaitable[Response]]


@dataclass(frozen=True, kw_only=True)
class Target:
    """The session a request addresses, once ``authorize`` was asked about it."""

    agent: str
    session_id: str
    store: SessionStore
    owner: str | None
    exists: bool
    #: Whether ``authorize`` allowed the action (always, unless asked not to refuse).
    allowed: bool


def unknown_session(agent: str, session_id: str) -> HttpError:
    """The one answer for a session that does not exist and for one the caller may
    not use: the same status, code and text, so neither tells the other apart."""
    return HttpError(
        404, "unknown_session", f"agent {agent!r} has no session {session_id!r} for you"
    )


class FrontendHost(Protocol):
    """What ``create_app`` lends a ``Frontend``; every refusal is raised as the
    app's own ``HttpError`` and answered as its endpoints answer it."""

    @property
    def keepalive_seconds(self) -> float:
        """Seconds of quiet on a stream before a keep-alive is sent."""
        ...

    @property
    def feed_poll_seconds(self) -> float | None:
        """How often a feed asks the store for newer logged events while quiet."""
        ...

    def endpoint(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        """``handler`` behind ``authenticate`` and the app's error answers."""
        ...

    def agent_name(self, name: str) -> str:
        """``name`` if the app serves that agent, else the 404 ``unknown_agent``."""
        ...

    def agent_tools(self, name: str) -> list[Tool]:
        """The tools agent ``name`` declares itself (tool sources, listed per turn,
        are not among them)."""
        ...

    async def body(self, request: Request) -> dict[str, Any]:
        """The body as a JSON object, checked as every endpoint checks one."""
        ...

    async def target(
        self, principal: Principal, agent: str, session_id: str, action: Action, *, refuse: bool
    ) -> Target:
        """The session, once ``authorize`` allows ``action`` (a refusal is the 404 of
        a missing session, unless ``refuse`` is false)."""
        ...

    async def start_turn(
        self, principal: Principal, target: Target, text: str, *, turn_id: str | None
    ) -> tuple[SessionClient, str]:
        """Queue a turn as ``/chat`` does; returns once the store holds it."""
        ...

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
        """Answer a parked question as ``/resume`` does (``target`` asked for
        ``resume`` with ``refuse=False``); ``None`` to a named answerer who may not
        read on. ``source`` names the front end in the answer's record."""
        ...

    async def pending(self, target: Target) -> list[InputRequest]:
        """Every question the session's parked turn waits on (none if not parked)."""
        ...

    async def cancel(self, target: Target) -> list[str]:
        """Cancel the session's unfinished turns as ``/cancel`` does."""
        ...

    def feed(self, target: Target, *, turn_id: str, after: int = 0) -> EventFeed:
        """The turn's logged events after ``after``, then its live ones, as the
        session's event feed serves them (from any process's delivery)."""
        ...


@runtime_checkable
class Frontend(Protocol):
    """A front-end protocol served beside the app's own endpoints."""

    def routes(self, host: FrontendHost) -> Sequence[BaseRoute]: ...


#: What ``followed`` yields: an event, ``None`` after a quiet spell (a keep-alive is
#: due), or the ``TurnError`` the delivery broke with (the last item).
Followed = TurnEvent | TurnError | None


async def followed(
    source: TurnStream | EventFeed, *, idle: float, poll: float | None
) -> AsyncIterator[Followed]:
    """A turn's events from a delivery's stream or a feed, with ``None`` after each
    ``idle`` seconds of quiet; stops following (never the turn) when closed."""
    if isinstance(source, EventFeed):
        events = source.events(idle=idle, poll=poll)
        try:
            async for event in events:
                yield event
        except TurnError as exc:
            yield exc
        finally:
            await events.aclose()
        return
    queue: asyncio.Queue[Followed | _End] = asyncio.Queue()

    async def pump() -> None:
        try:
            async for event in source:
                queue.put_nowait(event)
        except TurnError as exc:
            queue.put_nowait(exc)
        except Exception as exc:
            queue.put_nowait(TurnError(f"turn {source.turn_id} delivery failed: {exc!r}"))
        finally:
            queue.put_nowait(_End())

    reader = asyncio.create_task(pump())
    try:
        while True:
            try:
                item = await asyncio.wait_for(queue.get(), timeout=idle)
            except TimeoutError:
                yield None
                continue
            if isinstance(item, _End):
                return
            yield item
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        await source.aclose()


class _End:
    """The end of a followed stream."""
