"""Following a turn that another process runs (a ``RuntimeClient`` hands its turns
to workers): its end read from the store's record, its events from
the store's log as they land, plus whatever live events reach this process's sink.

A turn's log is the authority. A live event with a number is taken only if it is
the next one, so it can never make the log read skip one; live deltas (unnumbered)
pass through as they come. A logged ending counts only once the record agrees: a
``turn.failed`` followed by a takeover, or an ``input.requested`` already answered,
is not the end of the story.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

from .._errors import TurnError
from .._seams.relay import EventRelay, Logged, Relayed, place
from .._seams.store import SessionStore
from .._values.events import (
    ENDING_EVENT_TYPES,
    InputRequestedEvent,
    TurnCancelledEvent,
    TurnCompletedEvent,
    TurnEvent,
    TurnFailedEvent,
    TurnHeldEvent,
)
from .._values.records import TurnRecord
from .._values.turns import result_from_record

#: The first wait between two reads of a remote turn; it doubles while nothing
#: changes, up to the client's ``poll``.
FIRST_POLL = 0.02
#: Statuses of a turn that some process still has to run.
_ONGOING = ("queued", "running")


def ongoing(record: TurnRecord) -> bool:
    """Whether some process still has to run the turn: it is queued or running, or
    parked with a cancellation recorded that a delivery has yet to close."""
    if record.status == "suspended":
        return record.cancel_reason is not None
    return record.status in _ONGOING


T = TypeVar("T")


async def _whole(read: Awaitable[T]) -> T:
    """``read``, left to finish if the follower is cancelled meanwhile (a client
    that went away): a read cut off mid-query costs the pool its connection."""
    task = asyncio.ensure_future(read)
    task.add_done_callback(_seen)
    return await asyncio.shield(task)


def _seen(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # a failure nobody awaits any more is not worth a warning


@dataclass(frozen=True)
class Remote:
    """How to follow a turn run elsewhere: from which event (``None``: from now on),
    at most how many seconds apart to read the store, and the store's relay that
    carries the turn's deltas (and hints that it logged events), if it has one."""

    after: int | None
    poll: float
    relay: EventRelay | None = None


async def wait_for_end(store: SessionStore, turn_id: str, poll: float) -> TurnRecord:
    """The turn's record once it is no longer queued or running."""
    delay = FIRST_POLL
    while True:
        record = await _whole(store.turn(turn_id))
        if record is None:
            raise TurnError(f"session {store.session_id} has no turn {turn_id}")
        if not ongoing(record):
            return record
        await asyncio.sleep(delay)
        delay = min(delay * 2, poll)


async def remote_turn_events(
    store: SessionStore,
    queue: asyncio.Queue[Relayed],
    turn_id: str,
    *,
    after: int | None,
    poll: float,
) -> AsyncGenerator[TurnEvent, None]:
    """The turn's events numbered above ``after`` (``None``: from now on), ending
    after its ending event (or one made from its record, for a turn that ended
    without logging one: a queued turn cancelled before it opened).

    ``queue`` brings what this process hears live: the sink's events, and what the
    store's relay carries (deltas, and hints that the turn logged events, which
    make the log be read at once). A delta is placed by its ``next_seq``: one whose
    reply was already told whole is dropped, one ahead of events not told yet
    waits for the log to be read.
    """
    if after is None:
        after = max((e.seq or 0 for e in await _whole(store.events(turn_id=turn_id))), default=0)
    last = after
    delay = FIRST_POLL
    waiting: list[TurnEvent] = []  # deltas ahead of the log as last read
    placed = 0  # the latest place the log was read for
    while True:
        for event in await _whole(store.events(turn_id=turn_id, after=last)):
            last = event.seq or last
            delay = FIRST_POLL
            if event.type in ENDING_EVENT_TYPES:
                record = await _whole(store.turn(turn_id))
                if record is not None and ongoing(record):
                    continue  # taken over, or already resumed: the story goes on
            yield event
            if event.type in ENDING_EVENT_TYPES:
                return
        for delta in waiting:
            if (place(delta) or 0) > last:
                yield delta
        waiting.clear()
        record = await _whole(store.turn(turn_id))
        if record is None:
            raise TurnError(f"session {store.session_id} has no turn {turn_id}")
        if not ongoing(record):
            for event in await _whole(store.events(turn_id=turn_id, after=last)):
                yield event
                if event.type in ENDING_EVENT_TYPES:
                    return
            yield ending_of(record)
            return
        try:
            live = await asyncio.wait_for(queue.get(), delay)
        except TimeoutError:
            delay = min(delay * 2, poll)
            continue
        while True:
            where = place(live)
            if where is not None and where > last + 1 and where != placed:
                placed = where  # logged meanwhile: read the log before going on
                if not isinstance(live, Logged):
                    waiting.append(live)
                break
            if isinstance(live, Logged):
                pass  # nothing new to read
            elif where is not None:
                if where > last:
                    yield live  # else its reply was already told whole
            elif live.seq is None:
                yield live  # another live-only event
            elif live.seq == last + 1 and live.type not in ENDING_EVENT_TYPES:
                last = live.seq
                yield live
            if queue.empty():
                break
            live = queue.get_nowait()
        delay = FIRST_POLL


def ending_of(record: TurnRecord) -> TurnEvent:
    """The ending event a finished turn's record stands for (unnumbered: not logged)."""
    sid, tid = record.session_id, record.turn_id
    result = result_from_record(record)
    if result.status == "completed":
        return TurnCompletedEvent(turn_id=tid, session_id=sid, text=result.text or "")
    if result.status == "cancelled":
        return TurnCancelledEvent(turn_id=tid, session_id=sid, reason=result.reason or "requested")
    if result.status == "suspended" and result.request is not None:
        return InputRequestedEvent(turn_id=tid, session_id=sid, request=result.request)
    if result.status == "suspended":
        return TurnHeldEvent(
            turn_id=tid,
            session_id=sid,
            from_version=record.version,
            by_version=(record.held_by or "").rsplit(",", 1)[-1],
            reason=result.error or "held",
        )
    return TurnFailedEvent(turn_id=tid, session_id=sid, error=result.error or "failed")
