"""The ``SessionStore`` seam: the contract every storage backend meets.

A backend (``Store``) hands out one ``SessionStore`` per session. All durable state
changes go through ``SessionStore.commit(work)``: the store opens a transaction,
calls the synchronous ``work(tx)``, and commits if it returns or rolls back and
re-raises the same exception if it raises. ``tx`` offers the engine's writes and,
through ``tx.handle``, the backend's own connection so a local tool's SQL joins
the same transaction; a ``work`` that runs a local tool is run off the event loop
(see ``SessionStore.commit``). See ``docs/stores.md`` for the full contract.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, TypeVar, runtime_checkable

from .._errors import FatalToolError
from .._values.events import TurnEvent
from .._values.messages import JsonObject, Message
from .._values.records import (
    SessionInfo,
    SessionKey,
    SessionSnapshot,
    SessionStatus,
    TurnRecord,
    TurnStatus,
)

T = TypeVar("T")

#: A transcript position past any session's end: ``load(turn_id, from_index=NO_MESSAGES)``
#: reads a turn's record and steps and the next event number, but no message.
NO_MESSAGES = 2**31 - 1  # the largest index every store takes (PostgreSQL: integer)


@runtime_checkable
class StoreHandle(Protocol):
    """What a local tool sees as ``ctx.store``.

    ``unwrap()`` returns the backend's own connection inside the open step
    transaction (``None`` where there is none). ``execute(sql, params)`` runs one
    statement in that transaction with ``?`` placeholders and returns the rows it
    produced (empty for writes). ``transient(exc)`` tells the engine whether an
    exception a local tool raised is the database failing for a passing reason.
    """

    def unwrap(self) -> Any: ...

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...

    def transient(self, exc: BaseException) -> bool:
        """Whether ``exc`` (raised by a local tool, or the cause it wraps) is this
        backend's database failing for a passing reason (a lock timeout, a
        serialization failure, a lost connection) rather than the tool's own answer.
        The engine then fails the step without recording it, so a redelivery runs
        the tool again; any other exception becomes the tool's error result."""
        ...


@runtime_checkable
class Transaction(Protocol):
    """The writes one ``commit`` may make. All of them land together or not at all."""

    @property
    def handle(self) -> StoreHandle: ...

    def append_message(self, index: int, message: Message) -> None:
        """Put ``message`` at transcript position ``index``; a taken index is an error."""

    def put_step(self, step_id: str, turn_id: str, result: Any) -> None:
        """Memoize a step's JSON result; a step id already stored is an error."""

    def log_event(self, event: TurnEvent) -> None:
        """Append a structural event; ``event.seq`` is set and unused in the session."""

    def request_cancel(self, turn_id: str, reason: str) -> None:
        """Record that the turn is to end ``cancelled`` (its ``cancel_reason``); the
        first reason recorded wins. A missing turn is an error."""

    def archive_generation(self, generation: int, agent: str) -> None:
        """Reset the session: move its messages, steps, events and turns to the archive
        under ``generation``, empty the live tables, set the status to ``new`` and the
        generation to ``generation + 1``, clearing a pending reset. Turns still
        ``queued`` stay live, with their steps: they run in the new generation.
        Refused if the live generation is not ``generation`` (someone else reset it
        first)."""

    def request_reset(self) -> None:
        """Mark the session as having a reset pending (a barrier every process reads
        in ``load``), and cancel (reason ``reset``) each of its unfinished turns that
        has no cancellation yet, in this same write: a turn stored before it ends
        with the old generation, one stored after it runs in the new one. A mark
        already there stays; a session the store has never seen is left alone.
        ``archive_generation`` and ``drop_reset`` clear the mark."""

    def drop_reset(self) -> None:
        """Clear the session's pending reset without archiving (it held nothing)."""

    def queue_turn(self, record: TurnRecord, *, owner: str | None = None) -> None:
        """Record a submitted turn as ``queued``: its opening and event are kept, the
        transcript is not touched. A session seen for the first time is created
        (status ``new``, agent ``record.agent``, recorded as ``owner``'s); an
        existing one keeps its status and owner. A turn id already taken is an error."""

    def open_turn(self, record: TurnRecord, *, owner: str | None = None) -> None:
        """Record a new running turn, or move the queued turn of that id to running,
        and mark the session ``running`` for ``record.agent``. A turn id taken by a
        turn that is not queued is an error.

        A session this creates is recorded as ``owner``'s; an existing session keeps
        the owner it has (the engine refuses a turn of another owner before this)."""

    def settle_queued(
        self,
        turn_id: str,
        status: TurnStatus,
        *,
        reason: str | None = None,
        error: str | None = None,
    ) -> None:
        """End a ``queued`` turn that will never open (``cancelled`` with ``reason``,
        or ``failed`` with ``error``), leaving the session's status alone. A turn
        that is not queued is an error."""

    def set_turn_status(
        self,
        turn_id: str,
        status: TurnStatus,
        *,
        text: str | None = None,
        error: str | None = None,
        pending: JsonObject | None = None,
    ) -> None:
        """Move a turn to ``status``; the session becomes ``running``, ``suspended``, or
        (if terminal) ``idle``. ``pending`` is the checkpoint a ``suspended`` turn keeps;
        any other status clears it."""


@runtime_checkable
class SessionStore(Protocol):
    """One session's durable state. Methods are coroutines so a networked store never
    blocks the event loop; ``commit``'s ``work`` is synchronous and must not await."""

    @property
    def session_id(self) -> str: ...

    def writer(self) -> AbstractAsyncContextManager[None]:
        """Hold the session's single-writer lock for one delivery of a turn.

        While it is held no other delivery, in this process or (for a networked
        store) any other, runs a step of this session; a second one waits, and
        past the store's timeout fails with ``SessionBusyError``.
        """
        ...

    async def load(self, turn_id: str | None = None, *, from_index: int = 0) -> SessionSnapshot:
        """Read what a delivery needs. Only messages at positions ``>= from_index``
        are returned, so a caller that kept the transcript reads just what is new."""
        ...

    async def commit(self, work: Callable[[Transaction], T]) -> T:
        """Run ``work(tx)`` in one transaction: commit if it returns, roll back and
        re-raise the same exception if it raises.

        A ``work`` that runs a local tool may block; it asks for ``tx.handle`` before
        anything else (no other ``work`` asks), so a store can stop it there and run
        it again on a worker thread with its transaction, keeping the loop free.
        """
        ...

    async def turn(self, turn_id: str) -> TurnRecord | None: ...

    async def cancel_reason(self, turn_id: str) -> str | None:
        """The cancellation recorded for the turn, by any process, if there is one.

        The engine asks at every step boundary of a running turn, so it must be
        cheap: a store may answer from a change signal it watches (a file's time,
        a notification) and read the turn only when that moved, as long as a
        cancellation committed before the call is seen within a bounded delay.
        """
        ...

    async def messages(self) -> list[Message]: ...

    async def events(self, *, turn_id: str | None = None, after: int = 0) -> list[TurnEvent]: ...

    async def status(self) -> SessionStatus: ...

    async def parked(self) -> TurnRecord | None:
        """The session's ``suspended`` turn, if it is parked on one."""
        ...

    async def unfinished(self) -> list[TurnRecord]:
        """This session's ``queued``, ``running`` and ``suspended`` turns, oldest first."""
        ...

    async def generations(self) -> list[int]:
        """The archived generations of this session, oldest first."""
        ...

    async def archived_messages(self, generation: int) -> list[Message]:
        """The transcript of an archived generation (empty if there is none)."""
        ...


@runtime_checkable
class Store(Protocol):
    """A storage backend: many sessions behind one connection or pool."""

    async def open(self) -> None:
        """Connect and bring the schema up to date. Called by ``Runtime.__aenter__``."""

    async def close(self) -> None: ...

    def session(self, session_id: str) -> SessionStore: ...

    async def sessions(self) -> list[SessionInfo]: ...

    async def session_page(
        self,
        *,
        agent: str | None = None,
        limit: int,
        after: SessionKey | None = None,
        owner: str | None = None,
    ) -> list[SessionInfo]:
        """At most ``limit`` sessions (of ``agent`` and owned by ``owner``, if given),
        most recently updated first (ties by id), strictly after the
        ``(updated_at, session_id)`` key ``after``: keyset paging that stays stable
        while sessions are added."""

    async def unfinished_turns(self) -> list[TurnRecord]:
        """Turns to run again after a restart, oldest first: ``running`` ones (a
        process died under them) and ``queued`` ones (submitted, never opened)."""


class NoHandle:
    """``ctx.store`` where no transaction is open: remote tools, and the memory store."""

    def __init__(self, reason: str) -> None:
        self._reason = reason

    def unwrap(self) -> None:
        return None

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        # A deployment mistake the model cannot correct, so it fails the turn.
        raise FatalToolError(f"ctx.store.execute is unavailable: {self._reason}")

    def transient(self, exc: BaseException) -> bool:
        return False  # no database behind it
