"""Applying a commit's writes (``turnkit._values.writes``) to a backend's transaction.

Each built-in store has a transaction object with one method per kind of write;
``apply_writes`` calls them in order. A third-party store needs none of this: it
may apply the write values however it likes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from .._values.events import TurnEvent
from .._values.messages import Message
from .._values.records import SessionStatus, TurnRecord, TurnStatus
from .._values.writes import (
    AppendMessage,
    ArchiveGeneration,
    CountUsage,
    DropGeneration,
    DropReset,
    EraseSession,
    LogEvent,
    PruneSession,
    PutStep,
    PutTurn,
    RequestCancel,
    RequestReset,
    TrimEvents,
    Write,
)


class WriteTarget(Protocol):
    """A built-in store's open transaction: one method per kind of write."""

    def append_message(self, index: int, message: Message) -> None: ...

    def put_step(self, step_id: str, turn_id: str, result: Any) -> None: ...

    def log_event(self, event: TurnEvent) -> None: ...

    def put_turn(
        self,
        record: TurnRecord,
        expect: TurnStatus | None,
        session_status: SessionStatus | None,
        owner: str | None,
    ) -> None: ...

    def request_cancel(self, turn_id: str, reason: str) -> None: ...

    def request_reset(self) -> None: ...

    def drop_reset(self) -> None: ...

    def archive_generation(self, generation: int, agent: str) -> None: ...

    def erase_session(self, by: str | None) -> None: ...

    def drop_generation(self, generation: int) -> None: ...

    def prune_session(self, idle_before: float) -> None: ...

    def trim_events(self, turn_id: str) -> None: ...

    def count_usage(self, w: CountUsage) -> None: ...


def _append(tx: WriteTarget, w: AppendMessage) -> None:
    tx.append_message(w.index, w.message)


def _put(tx: WriteTarget, w: PutStep) -> None:
    tx.put_step(w.step_id, w.turn_id, w.result)


def _log(tx: WriteTarget, w: LogEvent) -> None:
    tx.log_event(w.event)


def _put_turn(tx: WriteTarget, w: PutTurn) -> None:
    tx.put_turn(w.record, w.expect, w.session_status, w.owner)


def _cancel(tx: WriteTarget, w: RequestCancel) -> None:
    tx.request_cancel(w.turn_id, w.reason)


def _reset(tx: WriteTarget, w: RequestReset) -> None:
    tx.request_reset()


def _drop(tx: WriteTarget, w: DropReset) -> None:
    tx.drop_reset()


def _archive(tx: WriteTarget, w: ArchiveGeneration) -> None:
    tx.archive_generation(w.generation, w.agent)


def _erase(tx: WriteTarget, w: EraseSession) -> None:
    tx.erase_session(w.by)


def _drop_generation(tx: WriteTarget, w: DropGeneration) -> None:
    tx.drop_generation(w.generation)


def _prune(tx: WriteTarget, w: PruneSession) -> None:
    tx.prune_session(w.idle_before)


def _trim(tx: WriteTarget, w: TrimEvents) -> None:
    tx.trim_events(w.turn_id)


def _count(tx: WriteTarget, w: CountUsage) -> None:
    tx.count_usage(w)


#: Each kind of write, and how a transaction makes it (looked up by exact type: one
#: dict lookup a write, on the path of every step).
_MAKE: dict[type[Any], Callable[[WriteTarget, Any], None]] = {
    AppendMessage: _append,
    PutStep: _put,
    LogEvent: _log,
    PutTurn: _put_turn,
    RequestCancel: _cancel,
    RequestReset: _reset,
    DropReset: _drop,
    ArchiveGeneration: _archive,
    EraseSession: _erase,
    DropGeneration: _drop_generation,
    PruneSession: _prune,
    TrimEvents: _trim,
    CountUsage: _count,
}


def apply_writes(tx: WriteTarget, writes: Iterable[Write]) -> None:
    """Make each write on ``tx``, in order."""
    make = _MAKE
    for write in writes:
        try:
            maker = make[type(write)]
        except KeyError:
            raise TypeError(f"not a store write: {write!r}") from None
        maker(tx, write)
