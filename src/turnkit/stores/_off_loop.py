"""Running a commit's ``work`` off the event loop, where a local tool may block.

The engine asks for ``tx.handle`` first thing in a commit that runs a local tool,
and in no other. A store's loop-side transaction answers that by raising
``RunsTool`` (so no tool code has run yet), and the store runs ``work`` again on a
worker thread against ``RecordedWrites``: the tool runs there, and the engine's
writes are kept to be made wherever the store's transaction lives (on that thread
when the tool began one there, back on the event loop otherwise).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, TypeVar

from .._seams.store import StoreHandle, Transaction
from .._values.events import TurnEvent
from .._values.messages import JsonObject, Message
from .._values.records import TurnRecord, TurnStatus

T = TypeVar("T")

_Write = Callable[[Transaction], None]


class RunsTool(BaseException):
    """Internal: ``work`` asked for ``tx.handle`` on the event loop, so it runs tool
    code. A ``BaseException``, so no ``except Exception`` in between swallows it."""


class RecordedWrites:
    """A ``Transaction`` that keeps the writes made on it, to make them later with
    ``replay`` on a real one: all of them, in order, in that one transaction."""

    def __init__(self, handle: StoreHandle | None) -> None:
        self._handle = handle
        self._writes: list[_Write] = []

    @property
    def handle(self) -> StoreHandle:
        """The handle given, or (given ``None``, on the event loop) ``RunsTool``."""
        if self._handle is None:
            raise RunsTool
        return self._handle

    def replay(self, tx: Transaction) -> None:
        for write in self._writes:
            write(tx)

    def append_message(self, index: int, message: Message) -> None:
        self._writes.append(lambda tx: tx.append_message(index, message))

    def put_step(self, step_id: str, turn_id: str, result: Any) -> None:
        self._writes.append(lambda tx: tx.put_step(step_id, turn_id, result))

    def log_event(self, event: TurnEvent) -> None:
        self._writes.append(lambda tx: tx.log_event(event))

    def request_cancel(self, turn_id: str, reason: str) -> None:
        self._writes.append(lambda tx: tx.request_cancel(turn_id, reason))

    def archive_generation(self, generation: int, agent: str) -> None:
        self._writes.append(lambda tx: tx.archive_generation(generation, agent))

    def request_reset(self) -> None:
        self._writes.append(lambda tx: tx.request_reset())

    def drop_reset(self) -> None:
        self._writes.append(lambda tx: tx.drop_reset())

    def queue_turn(self, record: TurnRecord, *, owner: str | None = None) -> None:
        self._writes.append(lambda tx: tx.queue_turn(record, owner=owner))

    def open_turn(self, record: TurnRecord, *, owner: str | None = None) -> None:
        self._writes.append(lambda tx: tx.open_turn(record, owner=owner))

    def settle_queued(
        self,
        turn_id: str,
        status: TurnStatus,
        *,
        reason: str | None = None,
        error: str | None = None,
    ) -> None:
        self._writes.append(
            lambda tx: tx.settle_queued(turn_id, status, reason=reason, error=error)
        )

    def set_turn_status(
        self,
        turn_id: str,
        status: TurnStatus,
        *,
        text: str | None = None,
        error: str | None = None,
        pending: JsonObject | None = None,
    ) -> None:
        self._writes.append(
            lambda tx: tx.set_turn_status(turn_id, status, text=text, error=error, pending=pending)
        )


async def on_thread(executor: Executor | None, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on ``executor``'s threads (the loop's default if ``None``), in a
    copy of the caller's context variables, as ``asyncio.to_thread`` does."""
    call = functools.partial(contextvars.copy_context().run, fn, *args)
    return await asyncio.get_running_loop().run_in_executor(executor, call)
