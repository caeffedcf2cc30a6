"""A session's event feed: the logged events after a sequence number, then the live ones.

This is what lets a client that dropped mid-turn reconnect and see the rest: the
feed subscribes to the sink (and to the store's relay, which carries the deltas of
turns running in other processes) before it reads the store's event log, then
joins them without a gap, a duplicate, or a delta out of its place.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable

from .._runtime.observe import event_filter
from .._seams.relay import EventRelay, Logged, Relayed, place
from .._seams.sink import EventSink
from .._seams.store import SessionStore
from .._values.events import (
    ENDING_EVENT_TYPES,
    TERMINAL_EVENT_TYPES,
    TurnEvent,
)
from .._values.records import TERMINAL_TURN_STATUSES

#: Relayed items a feed keeps queued at most; past it they are dropped (a logged
#: message carries its whole text, the poll finds what a hint said), so a slow
#: client costs bounded memory.
RELAYED_LIMIT = 2_000


class EventFeed:
    """Follows one session (or one turn of it) from the event numbered ``after``.

    Iterate ``feed.events(idle=…)``: it subscribes to the sink before it reads the
    log, yields ``None`` after ``idle`` seconds of quiet (the caller's cue for a
    keep-alive), and for a single turn it ends after that turn's terminal event or
    its ``input.requested``. It stops listening when the iteration ends, however it
    ends; a feed that is never iterated never listens. With a ``relay`` it also
    hears the deltas of the session's turns running in other processes, and reads
    the log as soon as one of them says it logged something.
    """

    def __init__(
        self,
        store: SessionStore,
        sink: EventSink,
        *,
        after: int,
        turn_id: str | None = None,
        relay: EventRelay | None = None,
    ) -> None:
        self._store = store
        self._sink = sink
        self._relay = relay
        self._after = after
        self._turn_id = turn_id
        self._queue: asyncio.Queue[Relayed] = asyncio.Queue()
        self._stops: list[Callable[[], None]] = []

    def close(self) -> None:
        """Stop listening (idempotent)."""
        while self._stops:
            self._stops.pop()()

    def _listen(self) -> None:
        wanted = event_filter(self._store.session_id, self._turn_id)
        queue = self._queue
        turn_id = self._turn_id

        def enqueue(event: TurnEvent) -> None:
            if wanted(event):
                queue.put_nowait(event)

        def enqueue_relayed(item: Relayed) -> None:
            if turn_id is not None and item.turn_id != turn_id:
                return
            if queue.qsize() < RELAYED_LIMIT:
                queue.put_nowait(item)

        self._stops.append(self._sink.subscribe(enqueue))
        if self._relay is not None:
            self._stops.append(self._relay.follow(self._store.session_id, enqueue_relayed))

    async def events(
        self, *, idle: float, poll: float | None = None
    ) -> AsyncGenerator[TurnEvent | None, None]:
        self._listen()  # before the log is read, so nothing falls between the two
        try:
            every, logged = await self._logged()
            # Everything queued so far arrived before the log was read: such a live
            # event may already be in ``logged``.
            read_mark = self._queue.qsize()
            last = self._after
            for event in logged:
                yield event
                last = event.seq or last
            if self._turn_id is not None:
                status = await self._turn_status()
                if status in TERMINAL_TURN_STATUSES:
                    # It ended while the log was read (or while the client took what
                    # was logged), or with an ending the store could not log: send
                    # what was logged since, each message after the deltas heard for
                    # it meanwhile (the live text, once), and stop.
                    fresh = await self._store.events(turn_id=self._turn_id, after=last)
                    for event in _after_their_deltas(fresh, self._heard_deltas(last)):
                        yield event
                    return
                if every and _ends(every[-1], status):
                    return
            async for item in self._live(read_mark, last, idle, poll):
                yield item
                if item is not None and self._ends_turn(item):
                    return
        finally:
            self.close()

    async def _logged(self) -> tuple[list[TurnEvent], list[TurnEvent]]:
        """The followed turn's whole log (empty when following the session) and the
        logged events to send."""
        if self._turn_id is None:
            return [], await self._store.events(after=self._after)
        every = await self._store.events(turn_id=self._turn_id)
        return every, [e for e in every if (e.seq or 0) > self._after]

    async def _turn_status(self) -> str | None:
        assert self._turn_id is not None
        record = await self._store.turn(self._turn_id)
        return None if record is None else record.status

    async def _live(
        self, read_mark: int, last: int, idle: float, poll: float | None
    ) -> AsyncIterator[TurnEvent | None]:
        """Live events, less those the log already held.

        A delta knows its place (``next_seq``, the number its reply will be logged
        under): one whose reply was already sent whole is dropped, and one that comes
        ahead of events the feed has not sent (a turn running in another process,
        whose log is read only now) waits for a read of the log. A delta that does not
        know its place and arrived before the log was read is held until the next
        event says whether its message was logged (then it is dropped) or is still
        being written (then it is sent); numbers never go back, even across a reset.
        While nothing comes for ``poll`` seconds, or when another process says it
        logged something, the store is asked for newer logged events.
        """
        held: list[TurnEvent] = []
        taken = 0
        quiet = 0.0
        placed = 0  # the latest place a read of the log was made for
        wait = min(idle, poll) if poll is not None else idle
        while True:
            try:
                item = await asyncio.wait_for(self._queue.get(), timeout=wait)
            except TimeoutError:
                quiet += wait
                if poll is not None:
                    fresh = await self._store.events(turn_id=self._turn_id, after=last)
                    # What was queued while the store answered may be in ``fresh``:
                    # judge it as what was queued while the log was first read.
                    read_mark = taken + self._queue.qsize()
                    if fresh:
                        held.clear()
                        quiet = 0.0
                        for event in fresh:
                            last = event.seq or last
                            yield event
                        continue
                if quiet >= idle:
                    quiet = 0.0
                    yield None
                continue
            quiet = 0.0
            taken += 1
            where = place(item)
            if where is not None and where > last + 1 and where != placed:
                # Logged elsewhere and not sent yet: the log first.
                placed = where
                fresh = await self._store.events(turn_id=self._turn_id, after=last)
                read_mark = taken + self._queue.qsize()
                if fresh:
                    held.clear()
                for event in fresh:
                    last = event.seq or last
                    yield event
            if isinstance(item, Logged):
                continue
            event = item
            if where is not None:
                if where > last:  # else its reply was already sent whole
                    yield event
                continue
            if event.seq is None:
                if taken <= read_mark and _is_delta(event):
                    held.append(event)
                    continue
                for early in held:
                    yield early
                held.clear()
                yield event
                continue
            if event.seq <= last:
                held.clear()  # the log held this event, and the deltas before it
                continue
            for early in held:
                yield early
            held.clear()
            last = event.seq
            yield event

    def _heard_deltas(self, last: int) -> list[TurnEvent]:
        """The deltas queued so far whose reply was not sent yet (placed after
        ``last``), in the order they were heard; the rest of the queue is dropped."""
        deltas: list[TurnEvent] = []
        while not self._queue.empty():
            item = self._queue.get_nowait()
            where = place(item)
            if where is not None and where > last and not isinstance(item, Logged):
                deltas.append(item)
        return deltas

    def _ends_turn(self, event: TurnEvent) -> bool:
        return self._turn_id is not None and event.type in ENDING_EVENT_TYPES


def _after_their_deltas(logged: list[TurnEvent], deltas: list[TurnEvent]) -> list[TurnEvent]:
    """``logged``, each event preceded by the ``deltas`` placed before it (a delta
    whose reply was never logged, as in a turn that failed mid-reply, is left out)."""
    joined: list[TurnEvent] = []
    for event in logged:
        joined.extend(d for d in deltas if place(d) == event.seq)
        joined.append(event)
    return joined


def _is_delta(event: TurnEvent) -> bool:
    return event.type in ("message.delta", "reasoning.delta")


def _ends(event: TurnEvent, status: str | None) -> bool:
    """Whether a turn whose log ends with ``event`` and whose record says ``status``
    has nothing more to say: it ended, or it is parked. A logged ending of a turn
    running again is not the end of its story: a parked turn was resumed since (its
    next events are still to come), or a failed one is being redelivered."""
    if event.type in TERMINAL_EVENT_TYPES:
        return status != "running"
    return event.type == "input.requested" and status != "running"
