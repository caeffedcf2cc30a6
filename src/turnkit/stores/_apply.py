"""Applying a commit's writes (``turnkit._values.writes``) to a backend's transaction.

Each built-in store has a transaction object with one method per kind of write;
``apply_writes`` calls them in order. A third-party store needs none of this: it
may apply the write values however it likes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from .._values.events import TurnEvent
from .._values.messages import JsonObject, Message
from .._values.records import TurnRecord, TurnStatus
from .._values.writes import (
    AppendMessage,
    ArchiveGeneration,
    DropReset,
    LogEvent,
    OpenTurn,
    PutStep,
    QueueTurn,
    RequestCancel,
    RequestReset,
    SettleQueued,
    SetTurnStatus,
    Write,
)


class WriteTarget(Protocol):
    """A built-in store's open transaction: one method per kind of write."""

    def append_message(self, index: int, message: Message) -> None: ...

    def put_step(self, step_id: str, turn_id: str, result: Any) -> None: ...

    def log_event(self, event: TurnEvent) -> None: ...

    def queue_turn(self, record: TurnRecord, *, owner: str | None = None) -> None: ...

    def open_turn(self, record: TurnRecord, *, owner: str | None = None) -> None: ...

    def settle_queued(
        self, turn_id: str, status: TurnStatus, *, reason: str | None, error: str | None
    ) -> None: ...

    def set_turn_status(
        self,
        turn_id: str,
        status: TurnStatus,
        *,
        text: str | None,
        error: str | None,
        pending: JsonObject | None,
    ) -> None: ...

    def request_cancel(self, turn_id: str, reason: str) -> None: ...

    def request_reset(self) -> None: ...

    def drop_reset(self) -> None: ...

    def archive_generation(self, generation: int, agent: str) -> None: ...


def _append(tx: WriteTarget, w: AppendMessage) -> None:
    tx.append_message(w.index, w.message)


def _put(tx: WriteTarget, w: PutStep) -> None:
    tx.put_step(w.step_id, w.turn_id, w.result)


def _log(tx: WriteTarget, w: LogEvent) -> None:
    tx.log_event(w.event)


def _queue(tx: WriteTarget, w: QueueTurn) -> None:
    tx.queue_turn(w.record, owner=w.owner)


def _open(tx: WriteTarget, w: OpenTurn) -> None:
    tx.open_turn(w.record, owner=w.owner)


def _settle(tx: WriteTarget, w: SettleQueued) -> None:
    tx.settle_queued(w.turn_id, w.status, reason=w.reason, error=w.error)


def _status(tx: WriteTarget, w: SetTurnStatus) -> None:
    tx.set_turn_status(w.turn_id, w.status, text=w.text, error=w.error, pending=w.pending)


def _cancel(tx: WriteTarget, w: RequestCancel) -> None:
    tx.request_cancel(w.turn_id, w.reason)


def _reset(tx: WriteTarget, w: RequestReset) -> None:
    tx.request_reset()


def _drop(tx: WriteTarget, w: DropReset) -> None:
    tx.drop_reset()


def _archive(tx: WriteTarget, w: ArchiveGeneration) -> None:
    tx.archive_generation(w.generation, w.agent)


#: Each kind of write, and how a transaction makes it (looked up by exact type: one
#: dict lookup a write, on the path of every step).
_MAKE: dict[type[Any], Callable[[WriteTarget, Any], None]] = {
    AppendMessage: _append,
    PutStep: _put,
    LogEvent: _log,
    QueueTurn: _queue,
    OpenTurn: _open,
    SettleQueued: _settle,
    SetTurnStatus: _status,
    RequestCancel: _cancel,
    RequestReset: _reset,
    DropReset: _drop,
    ArchiveGeneration: _archive,
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
