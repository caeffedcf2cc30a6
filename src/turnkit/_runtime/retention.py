"""Retention: deleting what a store has kept longer than the app wants.

``Retention`` says how long to keep archived generations and idle sessions;
``prune`` finds what aged out (``PrunableStore``: from indexes, oldest first, a page
at a time) and deletes it one session at a time, each in its own short commit under
the session's writer lock, so no delivery is between its read and its write and no
lock is held for long. A session with a turn queued, running or parked is never
deleted, whatever its age: the check is part of the deleting statement.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from .._errors import ConfigurationError, SessionBusyError
from .._seams.retention import PrunableStore
from .._seams.store import NO_MESSAGES, Store
from .._values.writes import DropGeneration, PruneSession, TrimEvents, Write

log = logging.getLogger("turnkit.retention")

#: How many idle sessions one prune deletes at a time (each under its own lock).
_AT_ONCE = 8


def _duration(name: str, value: timedelta | float | None) -> timedelta | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, timedelta | int | float):
        raise ConfigurationError(
            f"Retention({name}=...) must be a timedelta or seconds, got {value!r}"
        )
    span = value if isinstance(value, timedelta) else timedelta(seconds=value)
    if span <= timedelta(0):
        raise ConfigurationError(f"Retention({name}=...) must be more than zero, got {value!r}")
    return span


@dataclass(frozen=True)
class Retention:
    """How long a store keeps what is done with.

    ``archives_for``: an archived generation (what a reset retired) is deleted
    this long after the reset. ``keep_events_for``: the event log of a turn that
    ended this long ago is cut to its last event (the one that says how it ended,
    which a redelivery re-announces); the transcript and steps stay.
    ``sessions_idle_for``: a session nobody has used for this long, with nothing
    queued, running or parked, is deleted whole (its row too: the id is free
    again). ``None`` keeps that kind forever. Durations are
    ``timedelta``s or seconds. ``every`` is how often a ``Worker`` prunes (one
    worker per store, elected), and ``batch`` how many candidates one read lists.
    """

    archives_for: timedelta | float | None = None
    sessions_idle_for: timedelta | float | None = None
    keep_events_for: timedelta | float | None = None
    every: timedelta | float = timedelta(hours=1)
    batch: int = 200

    def __post_init__(self) -> None:
        for name in ("archives_for", "sessions_idle_for", "keep_events_for", "every"):
            object.__setattr__(self, name, _duration(name, getattr(self, name)))
        if self.every is None:
            raise ConfigurationError("Retention(every=...) must be a duration, not None")
        if isinstance(self.batch, bool) or not isinstance(self.batch, int) or self.batch < 1:
            raise ConfigurationError(
                f"Retention(batch=...) must be an int >= 1, got {self.batch!r}"
            )

    def cutoffs(self, now: float) -> tuple[float | None, float | None]:
        """The archive and idle-session cutoffs at ``now`` (``None``: kept forever)."""
        archives, idle = self.archives_for, self.sessions_idle_for
        assert not isinstance(archives, float | int) and not isinstance(idle, float | int)
        return (
            now - archives.total_seconds() if archives is not None else None,
            now - idle.total_seconds() if idle is not None else None,
        )


@dataclass(frozen=True)
class PruneReport:
    """What one ``prune`` deleted (or, with ``applied`` false, would delete)."""

    applied: bool
    #: Archived generations deleted.
    generations: int
    #: Idle sessions deleted whole.
    sessions: int
    #: Ended turns whose event log was cut to its last event.
    trimmed: int
    #: Sessions listed as idle that were not deleted: used again before their turn.
    kept: int
    #: How long the prune took, and the longest one session's writer lock was held.
    seconds: float
    longest_hold: float


async def prune(
    store: Store, retention: Retention, *, apply: bool = True, now: float | None = None
) -> PruneReport:
    """Delete (``apply``) or count what ``retention`` has aged out of ``store`` at
    ``now`` (default: the current time)."""
    if not isinstance(retention, Retention):
        raise ConfigurationError(f"prune needs a turnkit.Retention, got {retention!r}")
    if not isinstance(store, PrunableStore):
        raise ConfigurationError(
            f"{type(store).__name__} cannot list what aged out (it is no PrunableStore)"
        )
    started = time.monotonic()
    moment = time.time() if now is None else now
    archived_before, idle_before = retention.cutoffs(moment)
    generations = sessions = kept = trimmed = 0
    longest = 0.0
    if archived_before is not None:
        async for old in _pages(store.old_generations, archived_before, retention.batch):
            drops = [(sid, DropGeneration(generation)) for _, sid, generation in old]
            longest = max(longest, await _commit_each(store, drops, apply))
            generations += len(old)
    if retention.keep_events_for is not None:
        assert isinstance(retention.keep_events_for, timedelta)
        ended_before = moment - retention.keep_events_for.total_seconds()
        async for ended in _pages(store.ended_turns, ended_before, retention.batch):
            trims = [(sid, TrimEvents(turn_id)) for _, sid, turn_id in ended]
            longest = max(longest, await _commit_each(store, trims, apply))
            trimmed += len(ended)
    if idle_before is not None:
        async for idle in _pages(store.idle_sessions, idle_before, retention.batch):
            if not apply:
                sessions += len(idle)
                continue
            # Each session is its own lock and commit: a few at once, never many.
            gate = asyncio.Semaphore(_AT_ONCE)
            outcomes = await asyncio.gather(
                *(_prune_one(store, sid, idle_before, gate) for _, sid in idle)
            )
            for deleted, held in outcomes:
                sessions += deleted
                kept += not deleted
                longest = max(longest, held)
    report = PruneReport(
        applied=apply,
        generations=generations,
        sessions=sessions,
        trimmed=trimmed,
        kept=kept,
        seconds=time.monotonic() - started,
        longest_hold=longest,
    )
    log.info(
        "retention %s %d archived generation(s), %d idle session(s) and the early "
        "events of %d ended turn(s) in %.2fs (%d kept)",
        "deleted" if apply else "would delete",
        generations,
        sessions,
        trimmed,
        report.seconds,
        kept,
    )
    return report


async def _prune_one(
    store: Store, session_id: str, idle_before: float, gate: asyncio.Semaphore
) -> tuple[bool, float]:
    """Delete one idle session if it still is; whether it went, and how long its
    writer lock was held."""
    session = store.session(session_id)
    async with gate:
        try:
            async with session.writer():  # no delivery of it between check and delete
                began = time.monotonic()
                await session.commit([PruneSession(idle_before)])
                held = time.monotonic() - began
        except SessionBusyError:
            return False, 0.0  # a turn holds it: not idle after all
        gone = (await session.load(from_index=NO_MESSAGES)).agent is None
    return gone, held


Key = TypeVar("Key", bound=tuple[Any, ...])


async def _pages(
    read: Callable[..., Awaitable[list[Key]]], before: float, batch: int
) -> AsyncIterator[list[Key]]:
    """The pages ``read`` lists of what aged out before ``before``, each starting
    after the previous one's last key."""
    key: Key | None = None
    while page := await read(before, limit=batch, after=key):
        yield page
        key = page[-1]


async def _commit_each(store: Store, writes: Sequence[tuple[str, Write]], apply: bool) -> float:
    """Commit each session's write on its own (with ``apply``); the longest commit."""
    longest = 0.0
    for session_id, write in writes if apply else ():
        began = time.monotonic()
        await store.session(session_id).commit([write])
        longest = max(longest, time.monotonic() - began)
    return longest
