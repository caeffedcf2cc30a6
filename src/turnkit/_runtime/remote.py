"""Following a turn that another process runs (a runtime with ``run_turns=False``
hands its turns to workers): its end read from the store's record, its events from
the store's log as they land, plus whatever live events reach this process's sink.

A turn's log is the authority. A live event with a number is taken only if it is
the next one, so it can never make the log read skip one; live deltas (unnumbered)
pass through as they come. A logged ending counts only once the record agrees: a
``turn.failed`` followed by a takeover, or an ``input.requested`` already answered,
is not the end of the story.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from .._errors import TurnError
from .._seams.store import SessionStore
from .._values.events import (
    ENDING_EVENT_TYPES,
    InputRequestedEvent,
    TurnCancelledEvent,
    TurnCompletedEvent,
    TurnEvent,
    TurnFailedEvent,
)
from .._values.records import TurnRecord
from .._values.turns import result_from_record

#: The first wait between two reads of a remote turn; it doubles while nothing
#: changes, up to the runtime's ``remote_poll``.
FIRST_POLL = 0.02
#: Statuses of a turn that some process still has to run.
_ONGOING = ("queued", "running")


@dataclass(frozen=True)
class Remote:
    """How to follow a turn run elsewhere: from which event (``None``: from now on),
    and at most how many seconds apart to read the store."""

    after: int | None
    poll: float


async def wait_for_end(store: SessionStore, turn_id: str, poll: float) -> TurnRecord:
    """The turn's record once it is no longer queued or running."""
    delay = FIRST_POLL
    while True:
        record = await store.turn(turn_id)
        if record is None:
            raise TurnError(f"session {store.session_id} has no turn {turn_id}")
        if record.status not in _ONGOING:
            return record
        await asyncio.sleep(delay)
        delay = min(delay * 2, poll)


async def remote_turn_events(
    store: SessionStore,
    queue: asyncio.Queue[TurnEvent],
    turn_id: str,
    *,
    after: int | None,
    poll: float,
) -> AsyncGenerator[TurnEvent, None]:
    """The turn's events numbered above ``after`` (``None``: from now on), ending
    after its ending event (or one made from its record, for a turn that ended
    without logging one: a queued turn cancelled before it opened)."""
    if after is None:
        after = max((e.seq or 0 for e in await store.events(turn_id=turn_id)), default=0)
    last = after
    delay = FIRST_POLL
    while True:
        for event in await store.events(turn_id=turn_id, after=last):
            last = event.seq or last
            delay = FIRST_POLL
            if event.type in ENDING_EVENT_TYPES:
                record = await store.turn(turn_id)
                if record is not None and record.status in _ONGOING:
                    continue  # taken over, or already resumed: the story goes on
            yield event
            if event.type in ENDING_EVENT_TYPES:
                return
        record = await store.turn(turn_id)
        if record is None:
            raise TurnError(f"session {store.session_id} has no turn {turn_id}")
        if record.status not in _ONGOING:
            for event in await store.events(turn_id=turn_id, after=last):
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
            if live.seq is None:
                yield live  # a delta: never logged
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
    return TurnFailedEvent(turn_id=tid, session_id=sid, error=result.error or "failed")
