"""The ``EventSink`` seam: where a turn's events go, and an in-process fan-out.

The engine emits every event to one sink; observers, feeds and channels subscribe.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol, TypeAlias, runtime_checkable

from .._values.events import TurnEvent

log = logging.getLogger("turnkit.events")

Subscriber: TypeAlias = Callable[[TurnEvent], None]


@runtime_checkable
class EventSink(Protocol):
    """Where the engine sends every event; observers subscribe to it.

    ``emit`` must not raise and must not block: it runs on the event loop between
    steps. ``subscribe`` returns a function that removes the subscription.
    """

    def emit(self, event: TurnEvent) -> None: ...

    def subscribe(self, callback: Subscriber) -> Callable[[], None]: ...


class LocalEventSink:
    """An in-process fan-out. A subscriber that raises is logged and skipped, never fatal."""

    def __init__(self) -> None:
        self._subscribers: dict[int, Subscriber] = {}
        #: The subscribers as emit walks them: a tuple made again on each change, so
        #: a callback that subscribes or unsubscribes changes only later events, and
        #: an emit (several a step) copies nothing.
        self._current: tuple[Subscriber, ...] = ()
        self._next = 0

    def emit(self, event: TurnEvent) -> None:
        for callback in self._current:
            try:
                callback(event)
            except Exception:
                log.exception("event subscriber %r raised on %s; ignored", callback, event.type)

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        key = self._next
        self._next += 1
        self._subscribers[key] = callback
        self._current = tuple(self._subscribers.values())

        def unsubscribe() -> None:
            if self._subscribers.pop(key, None) is not None:
                self._current = tuple(self._subscribers.values())

        return unsubscribe
