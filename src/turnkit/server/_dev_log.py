"""What ``turnkit dev`` says while it serves: one line per request, one per turn ending.

Request lines give the method, the path, the status and the time taken; turn lines
give the outcome (completed, parked, failed, cancelled), marked when the turn was
one a previous process left open. Bodies, query strings, headers and error texts
stay out of the log, and text from the client is shown with its control
characters escaped, so a request cannot forge a line.
"""

from __future__ import annotations

import logging
import shlex
import time
from collections.abc import Callable, Iterable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .._channels.printable import printable_line
from .._seams.sink import EventSink
from .._values.events import TurnEvent

log = logging.getLogger("turnkit.dev")

#: The events that end a turn's delivery here, and how the log line names each.
_ENDINGS = {
    "turn.completed": "completed",
    "input.requested": "parked",
    "turn.failed": "failed",
    "turn.cancelled": "cancelled",
}
#: Start times kept for turns still running, at most (a turn that never ends here
#: must not grow the table forever).
_MAX_STARTED = 10_000


def logged_requests(app: ASGIApp) -> ASGIApp:
    """``app`` logging one line per HTTP request when its response ends: method,
    path, status and milliseconds (``-`` for a status never sent)."""

    async def logging_app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        started = time.perf_counter()
        status: int | None = None

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await app(scope, receive, sending)
        finally:
            took = (time.perf_counter() - started) * 1000
            log.info(
                "%s %s %s %.0f ms",
                printable_line(str(scope.get("method", "?"))),
                printable_line(str(scope.get("path", "?"))),
                status if status is not None else "-",
                took,
            )

    return logging_app


class TurnLog:
    """Logs each turn ending the sink carries; ``recovering`` marks the turns a
    previous process left open, which this one finishes."""

    def __init__(self) -> None:
        self._started: dict[str, float] = {}
        self._recovering: set[str] = set()

    def watch(self, sink: EventSink) -> Callable[[], None]:
        """Subscribe to ``sink``; returns the unsubscribe function."""
        return sink.subscribe(self._seen)

    def recovering(self, turn_ids: Iterable[str]) -> None:
        self._recovering.update(turn_ids)

    def _seen(self, event: TurnEvent) -> None:
        if event.type == "turn.started":
            if len(self._started) >= _MAX_STARTED:
                self._started.pop(next(iter(self._started)))
            self._started[event.turn_id] = time.perf_counter()
            return
        outcome = _ENDINGS.get(event.type)
        if outcome is None:
            return
        started = self._started.pop(event.turn_id, None)
        took = f" in {time.perf_counter() - started:.1f} s" if started is not None else ""
        recovered = " (recovered)" if event.turn_id in self._recovering else ""
        self._recovering.discard(event.turn_id)
        session = printable_line(event.session_id)
        # A failure's text stays out: it may quote what a user typed or a tool returned.
        more = f"; turnkit show {shlex.quote(session)} has the error" if outcome == "failed" else ""
        log.info(
            "turn %s on session %s %s%s%s%s",
            event.turn_id,
            session,
            outcome,
            recovered,
            took,
            more,
        )


def configure(quiet: bool) -> Callable[[], None]:
    """Send the ``turnkit.dev`` lines to stderr (none with ``quiet``); returns the
    function that undoes it."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S"))
    previous = (log.level, log.propagate)
    log.setLevel(logging.WARNING if quiet else logging.INFO)
    log.propagate = False
    log.addHandler(handler)

    def undo() -> None:
        log.removeHandler(handler)
        log.setLevel(previous[0])
        log.propagate = previous[1]

    return undo
