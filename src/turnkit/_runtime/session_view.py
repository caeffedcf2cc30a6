"""What a session shows: its state and results read from the store, and its
events as they happen. ``SessionClient`` and ``AgentSession`` get these methods
from ``SessionView``; each says where a turn's end and its live events come from.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, Protocol

from .._engine.agent import Agent
from .._engine.output import with_output
from .._seams.sink import EventSink
from .._seams.store import SessionStore, parked_turn, transcript
from .._values.answers import AnswerRecord, answer_records
from .._values.events import TurnEvent
from .._values.inputs import InputRequest
from .._values.messages import Message
from .._values.records import SessionStatus, TurnRecord
from .._values.turns import TurnResult, result_from_record
from .._values.usage import Usage
from .observe import TurnStream, event_filter, filtered, session_events, turn_events
from .remote import Remote
from .usage import session_usage, turn_usage

log = logging.getLogger("turnkit.runtime")


class ViewHost(Protocol):
    """What showing a session needs of its runtime."""

    @property
    def sink(self) -> EventSink: ...

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]: ...


class SessionView(ABC):
    """Reading and observing one session."""

    runtime: ViewHost
    agent: Agent
    _store: SessionStore

    def _local(self, turn_id: str) -> asyncio.Future[TurnResult] | None:
        """This process's delivery of the turn, if it has one."""
        return None

    @abstractmethod
    async def _ended(self, turn_id: str) -> TurnRecord:
        """The turn's record once it has ended, for a turn not delivered here."""

    @abstractmethod
    def _remote(self, turn_id: str) -> Remote | None:
        """How to follow the turn run by another process (``None``: it runs here)."""

    @property
    def session_id(self) -> str:
        return self._store.session_id

    async def turn_record(self, turn_id: str) -> TurnRecord | None:
        """What the store holds about turn ``turn_id`` of this session, if anything."""
        return await self._store.turn(turn_id)

    async def pending(self) -> InputRequest | None:
        """The input request this session is parked on (the first still open, when
        several calls asked), or ``None``."""
        parked = await self._parked_input()
        return parked[0][0] if parked is not None else None

    async def pending_all(self) -> list[InputRequest]:
        """Every input request this session is parked on, in the order of the calls
        that asked; empty when it is not parked. Each is answered on its own with
        ``resume``; the turn goes on once the last one is answered."""
        parked = await self._parked_input()
        return list(parked[0]) if parked is not None else []

    async def _parked_input(self) -> tuple[tuple[InputRequest, ...], int] | None:
        """The requests this session is parked on and the generation they wait in."""
        record = await parked_turn(self._store)
        checkpoint = record.pending if record is not None else None
        if checkpoint is None:
            return None
        return checkpoint.requests, checkpoint.generation

    async def generations(self) -> list[int]:
        """The archived generations of this session (one per reset), oldest first."""
        return await self._store.generations()

    async def archived_messages(self, generation: int) -> list[Message]:
        """The transcript the session had in ``generation`` (``"s1#g0"`` is 0)."""
        return await self._store.archived_messages(generation)

    # -- reading results and state -----------------------------------------------

    async def result(self, turn_id: str) -> TurnResult:
        """Wait for the turn to end here, or read how it ended from the store (a typed
        answer's ``output`` is parsed from the answer the store holds)."""
        future = self._local(turn_id)
        if future is not None:
            return await asyncio.shield(future)
        record = await self._ended(turn_id)
        usage = await turn_usage(self._store, turn_id)
        return with_output(self.agent._output, result_from_record(record, usage))

    async def usage(self) -> Usage:
        """What the live generation's model calls used in all, read from the store."""
        return await session_usage(self._store)

    async def messages(self) -> list[Message]:
        """The live transcript, oldest first."""
        return await transcript(self._store)

    async def status(self) -> SessionStatus:
        """``new``, ``running``, ``suspended`` or ``idle``."""
        return await self._store.status()

    async def events(self, *, turn_id: str | None = None, after: int = 0) -> list[TurnEvent]:
        """Structural events logged for the session (or one turn) with ``seq > after``."""
        return await self._store.events(turn_id=turn_id, after=after)

    async def answers(self, *, turn_id: str | None = None) -> list[AnswerRecord]:
        """Every answer given in the live generation (or to one turn), oldest first:
        who, when, through which channel, and what was answered or decided. Read
        from the logged ``input.answered`` events, so retention that trims an ended
        turn's events (``keep_events_for``) trims its answers with them."""
        return answer_records(await self._store.events(turn_id=turn_id))

    # -- observing ---------------------------------------------------------------

    def observe(self, turn_id: str, *, replay: bool = False) -> TurnStream:
        """The turn's events as they happen, ending after its terminal event (or its
        ``input.requested``): ``async for event in session.observe(turn_id)``.

        It listens from the moment it is called, before the first iteration. With
        ``replay=True`` the events already logged for the turn come first, so a late
        observer misses nothing structural (live deltas are never replayed).
        """
        return TurnStream(
            sink=self.runtime.sink,
            store=self._store,
            turn_id=turn_id,
            future=self._local(turn_id),
            replay=replay,
            remote=self._remote(turn_id),
        )

    def subscribe(
        self,
        callback: Callable[[TurnEvent], None],
        *,
        turn_id: str | None = None,
        replay: bool = False,
    ) -> Callable[[], None]:
        """Call ``callback`` with this session's events (one turn's, if given).

        Returns the function that unsubscribes. A callback that raises is logged and
        skipped; it never breaks the turn or other subscribers.
        """
        if not replay:
            return self.runtime.sink.subscribe(filtered(callback, self.session_id, turn_id))

        async def forward() -> None:
            try:
                async for event in self._stream(turn_id, replay=True):
                    try:
                        callback(event)
                    except Exception:
                        log.exception("subscriber %r raised on %s; ignored", callback, event.type)
            except Exception as exc:
                log.warning("replaying subscription on session %s ended: %s", self.session_id, exc)

        task = self.runtime.spawn(forward())

        def unsubscribe() -> None:
            task.cancel()

        return unsubscribe

    async def _stream(self, turn_id: str | None, *, replay: bool) -> AsyncIterator[TurnEvent]:
        queue: asyncio.Queue[TurnEvent] = asyncio.Queue()
        wanted = event_filter(self.session_id, turn_id)

        def enqueue(event: TurnEvent) -> None:
            if wanted(event):
                queue.put_nowait(event)

        # Subscribe before reading the log, so nothing falls between the two.
        unsubscribe = self.runtime.sink.subscribe(enqueue)
        try:
            if turn_id is None:
                events = session_events(self._store, queue, replay=replay)
            else:
                future = self._local(turn_id)
                events = turn_events(self._store, queue, turn_id, future, replay=replay)
            async for event in events:
                yield event
        finally:
            unsubscribe()
