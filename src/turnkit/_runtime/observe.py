"""Following a turn's events: the live ones from the sink, the logged ones from the store.

``turn_events`` tells one turn as one story: logged events first when replaying,
then live ones without duplicates, ending after the terminal event, and never
waiting for an ending that cannot come.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

from .._errors import TurnError
from .._seams.relay import Relayed
from .._seams.sink import EventSink
from .._seams.store import SessionStore
from .._values.events import ENDING_EVENT_TYPES, TERMINAL_EVENT_TYPES, TurnEvent
from .._values.records import TurnRecord
from .._values.turns import TurnResult
from .remote import Remote, remote_turn_events


def event_filter(session_id: str, turn_id: str | None) -> Callable[[TurnEvent], bool]:
    """Whether an event belongs to the session (and to the turn, if one is given)."""

    def wanted(event: TurnEvent) -> bool:
        return event.session_id == session_id and (turn_id is None or event.turn_id == turn_id)

    return wanted


def filtered(
    callback: Callable[[TurnEvent], None], session_id: str, turn_id: str | None
) -> Callable[[TurnEvent], None]:
    """``callback``, called with the events ``event_filter`` wants and no others:
    one call an event rather than two, since a subscriber runs on every event the
    process emits."""
    if turn_id is None:

        def of_session(event: TurnEvent) -> None:
            if event.session_id == session_id:
                callback(event)

        return of_session

    def of_turn(event: TurnEvent) -> None:
        if event.session_id == session_id and event.turn_id == turn_id:
            callback(event)

    return of_turn


#: Relayed items a stream keeps queued at most; past it they are dropped (the log
#: has every event, a logged message its whole text), so a slow reader costs
#: bounded memory.
RELAYED_LIMIT = 2_000


def _enqueuer(
    queue: asyncio.Queue[Any], session_id: str, turn_id: str, *, limit: int = 0
) -> Callable[[Any], None]:
    """A callback putting what concerns ``turn_id`` on ``queue`` (at most ``limit``
    items waiting, if a limit is given)."""

    def enqueue(item: Relayed) -> None:
        if item.session_id != session_id or item.turn_id != turn_id:
            return
        if not limit or queue.qsize() < limit:
            queue.put_nowait(item)

    return enqueue


class TurnStream:
    """One delivery's events as an async iterator that is listening from the moment it
    is made, so nothing the turn emits after ``start()`` can be missed.

    It ends after the turn's terminal event or its ``input.requested``. ``turn_id``
    is known at once. Stop early with ``await stream.aclose()``.
    """

    def __init__(
        self,
        *,
        sink: EventSink,
        store: SessionStore,
        turn_id: str,
        future: asyncio.Future[TurnResult] | None,
        replay: bool,
        remote: Remote | None = None,
    ) -> None:
        self.turn_id = turn_id
        self.session_id = store.session_id
        self._unfollow: Callable[[], None] | None = None
        self._unsubscribe: Callable[[], None] | None
        if remote is not None and future is None:
            # Run by a worker elsewhere: followed through the store, and the relay.
            heard: asyncio.Queue[Relayed] = asyncio.Queue()
            self._unsubscribe = sink.subscribe(_enqueuer(heard, store.session_id, turn_id))
            if remote.relay is not None:
                relayed = _enqueuer(heard, store.session_id, turn_id, limit=RELAYED_LIMIT)
                self._unfollow = remote.relay.follow(store.session_id, relayed)
            after = 0 if replay else remote.after
            self._events = remote_turn_events(store, heard, turn_id, after=after, poll=remote.poll)
            return
        queue: asyncio.Queue[TurnEvent] = asyncio.Queue()
        self._unsubscribe = sink.subscribe(_enqueuer(queue, store.session_id, turn_id))
        self._events = turn_events(store, queue, turn_id, future, replay=replay)

    def __aiter__(self) -> TurnStream:
        return self

    async def __anext__(self) -> TurnEvent:
        try:
            return await self._events.__anext__()
        except BaseException:
            self._stop_listening()
            raise

    async def aclose(self) -> None:
        """Stop following the turn (the turn itself keeps running)."""
        self._stop_listening()
        await self._events.aclose()

    def _stop_listening(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        if self._unfollow is not None:
            self._unfollow()
            self._unfollow = None

    def __del__(self) -> None:
        self._stop_listening()


async def finished_record(store: SessionStore, turn_id: str) -> TurnRecord:
    """The turn's record if it has ended; otherwise a ``TurnError`` saying what to do."""
    record = await store.turn(turn_id)
    if record is None:
        raise TurnError(f"session {store.session_id} has no turn {turn_id}")
    if record.status == "running":
        raise TurnError(
            f"turn {turn_id} is unfinished and not running in this process; if no other "
            "process runs it, redeliver it with start(..., turn_id=...) or call runtime.recover()"
        )
    return record


async def session_events(
    store: SessionStore, queue: asyncio.Queue[TurnEvent], *, replay: bool
) -> AsyncIterator[TurnEvent]:
    """Every event of the session, logged ones first if ``replay``; never ends by itself."""
    last_seq = 0
    if replay:
        for event in await store.events():
            last_seq = event.seq or last_seq
            yield event
    while True:
        event = await queue.get()
        if event.seq is None or event.seq > last_seq:
            yield event


async def turn_events(
    store: SessionStore,
    queue: asyncio.Queue[TurnEvent],
    turn_id: str,
    future: asyncio.Future[TurnResult] | None,
    *,
    replay: bool,
) -> AsyncGenerator[TurnEvent, None]:
    """One turn's events; ``future`` is this process's delivery of it, if there is one.

    The story of one delivery ends at a terminal event or at ``input.requested``
    (the turn parked; a resume starts a new delivery).
    """
    heard_seq = 0
    if future is not None and future.done() and not replay:
        # The delivery ran to its end before the first read, but the stream was
        # already listening: tell what it heard, as it would have live.
        while not queue.empty():
            heard = queue.get_nowait()
            heard_seq = heard.seq or heard_seq
            yield heard
            if heard.type in ENDING_EVENT_TYPES:
                return
    if future is None or future.done():
        # Not running here: the log holds everything there is to see.
        logged = fold_attempts(await store.events(turn_id=turn_id))
        if not logged or logged[-1].type not in ENDING_EVENT_TYPES:
            if future is not None and not future.cancelled() and future.exception():
                # This process's delivery broke before it could log an ending.
                raise TurnError(f"turn {turn_id} delivery failed") from future.exception()
            await finished_record(store, turn_id)
        for event in logged if replay else logged[-1:]:
            if (event.seq or 0) > heard_seq:
                yield event
        return
    last_seq, started = 0, False
    if replay:
        logged = fold_attempts(await store.events(turn_id=turn_id), live=True)
        for event in logged:
            last_seq = event.seq or last_seq
            started = started or event.type == "turn.started"
            yield event
        if logged and logged[-1].type in TERMINAL_EVENT_TYPES:
            return  # it ended already (this delivery only re-announces it)
    while True:
        live = await next_event(queue, future)
        if live is None:
            # The delivery ended without a terminal event reaching us: it was emitted
            # before we subscribed (the delivery was still releasing the session), so
            # the log has it; or the delivery broke.
            exc = future.exception() if not future.cancelled() else None
            if exc is None:
                logged = fold_attempts(await store.events(turn_id=turn_id))
                if logged and logged[-1].type in ENDING_EVENT_TYPES:
                    if (logged[-1].seq or 0) > last_seq:
                        yield logged[-1]
                    return
            raise exc or TurnError(f"turn {turn_id} ended without a terminal event")
        if live.seq is not None and live.seq <= last_seq:
            continue
        if live.type == "turn.started" and started:
            continue  # a retry restarting: the story already began
        started = started or live.type == "turn.started"
        yield live
        if live.type in ENDING_EVENT_TYPES:
            return


def fold_attempts(events: list[TurnEvent], *, live: bool = False) -> list[TurnEvent]:
    """One turn's logged events as one story, however many deliveries it took.

    A failed turn that was redelivered logs ``turn.failed`` and then ``turn.started``
    again; both markers are dropped, every step event is kept. With ``live=True``
    (a retry is under way) a trailing ``turn.failed`` is dropped as well.
    """
    last_start = max((i for i, e in enumerate(events) if e.type == "turn.started"), default=-1)
    folded: list[TurnEvent] = []
    for i, event in enumerate(events):
        if event.type == "turn.started" and folded:
            continue
        if event.type == "turn.failed" and (i < last_start or (live and i == len(events) - 1)):
            continue
        folded.append(event)
    return folded


async def next_event(
    queue: asyncio.Queue[TurnEvent], future: asyncio.Future[TurnResult]
) -> TurnEvent | None:
    """The next queued event, or ``None`` once the delivery is over and nothing is left."""
    if not queue.empty():
        return queue.get_nowait()
    if future.done():
        return None
    getter = asyncio.ensure_future(queue.get())
    waiting: set[asyncio.Future[Any]] = {getter, future}
    try:
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not getter.done():
            getter.cancel()
    if getter.done() and not getter.cancelled():
        return getter.result()
    return queue.get_nowait() if not queue.empty() else None
