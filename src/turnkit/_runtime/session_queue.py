"""``SessionQueue``: what one session has to do in this process, in order.

A job is a delivery of a turn (``DeliverJob``) or the archive of a reset
(``ResetJob``). While a reset records its barrier, new deliveries are held back
and queued behind it once it is queued; a parked turn being closed goes ahead.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

from .._values.turns import ResetResult, TurnRequest, TurnResult


@dataclass(frozen=True)
class Erase:
    """A reset that goes on to erase the session, asked by ``by``."""

    by: str | None


@dataclass(frozen=True)
class DeliverJob:
    """Deliver ``request`` here; ``future`` gets how the delivery ended."""

    request: TurnRequest
    future: asyncio.Future[TurnResult]


@dataclass(frozen=True)
class ResetJob:
    """Carry out a reset the store holds as pending: ``since`` is the live generation
    it found (``None``: unknown, a dead process's reset), ``future`` its result, and
    ``erase`` set when the session is erased instead of archived."""

    since: int | None
    future: asyncio.Future[ResetResult]
    erase: Erase | None = None


Job = DeliverJob | ResetJob


class SessionQueue:
    """One session's jobs in this process, first in first out, and the delivery
    running now. It schedules nothing itself: the session drains it."""

    def __init__(self) -> None:
        self._jobs: deque[Job] = deque()
        #: Jobs waiting for a reset that is still recording its barrier; ``None``
        #: when no reset is.
        self._held: list[Job] | None = None
        #: The delivery being run now, if any.
        self.current: TurnRequest | None = None

    def __len__(self) -> int:
        return len(self._jobs)

    @property
    def idle(self) -> bool:
        """Whether nothing is queued here nor held behind a reset."""
        return not self._jobs and self._held is None

    def put(self, job: Job, *, ahead: bool = False) -> bool:
        """Queue ``job``; return whether it is in the queue now (``False``: held
        until the reset recording its barrier is queued). ``ahead`` skips the hold:
        a reset's own job, or a parked turn it closes."""
        if self._held is not None and not ahead:
            self._held.append(job)
            return False
        self._jobs.append(job)
        return True

    def hold(self) -> bool:
        """Hold new jobs back while a reset records its barrier; return whether this
        call started holding (the first of overlapping resets: it releases them)."""
        if self._held is not None:
            return False
        self._held = []
        return True

    def release(self) -> None:
        """Queue what was held, in the order it came."""
        held, self._held = self._held or [], None
        self._jobs.extend(held)

    def pop(self) -> Job | None:
        """The next job to run, or ``None`` when there is none."""
        return self._jobs.popleft() if self._jobs else None

    def requests(self) -> list[TurnRequest]:
        """The delivery running now and every queued one, in order."""
        queued = [job.request for job in self._jobs if isinstance(job, DeliverJob)]
        return [self.current, *queued] if self.current is not None else queued
