"""Applying a commit's writes (``turnkit._values.writes``) to a backend's transaction.

Each built-in store has a transaction object with one method per kind of write;
``apply_writes`` calls them in order. A third-party store needs none of this: it
may apply the write values however it likes.
"""

from __future__ import annotations

from collections.abc import Iterable
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


def apply_writes(tx: WriteTarget, writes: Iterable[Write]) -> None:
    """Make each write on ``tx``, in order."""
    for write in writes:
        match write:
            case AppendMessage(index, message):
                tx.append_message(index, message)
            case PutStep(step_id, turn_id, result):
                tx.put_step(step_id, turn_id, result)
            case LogEvent(event):
                tx.log_event(event)
            case QueueTurn(record, owner):
                tx.queue_turn(record, owner=owner)
            case OpenTurn(record, owner):
                tx.open_turn(record, owner=owner)
            case SettleQueued(turn_id, status, reason, error):
                tx.settle_queued(turn_id, status, reason=reason, error=error)
            case SetTurnStatus(turn_id, status, text, error, pending):
                tx.set_turn_status(turn_id, status, text=text, error=error, pending=pending)
            case RequestCancel(turn_id, reason):
                tx.request_cancel(turn_id, reason)
            case RequestReset():
                tx.request_reset()
            case DropReset():
                tx.drop_reset()
            case ArchiveGeneration(generation, agent):
                tx.archive_generation(generation, agent)
            case _:
                raise TypeError(f"not a store write: {write!r}")
