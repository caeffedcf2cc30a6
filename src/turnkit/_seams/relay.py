"""The ``EventRelay`` seam: live events carried between processes that share a store.

A turn's structural events reach other processes through the store's event log;
its deltas are never logged. A store that can carry them (PostgreSQL, over
LISTEN/NOTIFY) offers a relay: the runtime hands it every event it emits, and a
feed in another process follows a session through it. What crosses is a hint:
a relay may drop anything, and a feed must stay correct with the log alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeAlias, runtime_checkable

from .._values.events import MessageDeltaEvent, ReasoningDeltaEvent, TurnEvent


@dataclass(frozen=True, kw_only=True)
class Logged:
    """Another process logged the session's events up to ``seq`` (for ``turn_id``):
    a follower reads the log now instead of at its next poll."""

    session_id: str
    turn_id: str
    seq: int


#: What a follower hears: a delta of a turn running elsewhere, or a ``Logged`` hint.
Relayed: TypeAlias = TurnEvent | Logged


def place(item: Relayed) -> int | None:
    """Where a relayed item belongs among the session's logged events: a delta
    before its ``next_seq``, a ``Logged`` hint after its ``seq`` (so before
    ``seq + 1``); ``None`` for anything else."""
    if isinstance(item, Logged):
        return item.seq + 1
    if isinstance(item, MessageDeltaEvent | ReasoningDeltaEvent):
        return item.next_seq
    return None


@runtime_checkable
class EventRelay(Protocol):
    """Carries a process's live events to the other processes on the same store.

    ``publish`` takes every event the runtime emits; it must not block or raise
    (it runs on the step path), and sends on its own time. ``follow`` calls
    ``callback`` with what other processes relay about ``session_id``, never with
    this relay's own events, and returns the function that stops it.
    """

    def publish(self, event: TurnEvent) -> None: ...

    def follow(
        self, session_id: str, callback: Callable[[Relayed], None]
    ) -> Callable[[], None]: ...


@runtime_checkable
class RelayingStore(Protocol):
    """A ``Store`` that offers an ``EventRelay`` (``None`` when it is turned off)."""

    @property
    def relay(self) -> EventRelay | None: ...
