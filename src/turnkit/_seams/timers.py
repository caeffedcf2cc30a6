"""The ``TimerStore`` seam: what a store offers so parked turns can wait on the clock.

A parked turn whose requests have a deadline, a reminder or a sleep's end carries
the earliest of them as ``TurnRecord.wake_at``. The timer loop
(``turnkit._runtime.timers``) lists the turns whose time has come, from an index,
earliest first, and acts on each through ordinary commits; the store knows nothing
of deadlines beyond that column. Every built-in store has both reads.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from .._values.records import TurnRecord


@runtime_checkable
class TimerStore(Protocol):
    """A ``Store`` that can list parked turns by the time they wake."""

    async def due_turns(self, before: float, *, limit: int) -> list[TurnRecord]:
        """Up to ``limit`` ``suspended`` turns whose ``wake_at`` is at or before
        ``before`` (seconds since the epoch), earliest first."""
        ...

    async def next_wake(self) -> float | None:
        """The earliest ``wake_at`` of any parked turn (``None``: no turn waits on the
        clock)."""
        ...
