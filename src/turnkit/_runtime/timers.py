"""Durable time: the loop that fires the deadlines, reminders, sleeps and retry
backoffs of parked turns.

Every wait on the clock is a request of a parked turn (``InputRequest.expires_at``,
``remind_at``), and the turn's record carries the earliest of them as ``wake_at``,
indexed by the store. One process per store fires them: this loop lists the turns
whose time has come (``TimerStore.due_turns``) and has each settled (``clock``)
under the session's writer lock, in one commit that is a compare-and-set on the
turn still being parked. So a deadline fires once however many processes try; a
process that was down fires what fell due meanwhile as it starts, and says how late.

On a store that holds elections (PostgreSQL) the loop runs only while its process
leads the election ``turnkit:timers`` (as the scheduler and retention do), so one
process per store lists and fires; another takes over when it dies. A fired turn is
then delivered by the firing process, or, where workers claim turns (``Worker``),
left to their claims so the work spreads across them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from .._errors import TurnMoveError
from .._seams.election import ElectingStore
from .._seams.store import Store
from .._seams.timers import TimerStore
from .._values.records import TurnRecord

log = logging.getLogger("turnkit.timers")


class TimerHost(Protocol):
    """What the loop needs of its runtime (``Runtime`` is one)."""

    @property
    def store(self) -> Store: ...

    async def settle(self, record: TurnRecord, now: float) -> str | None: ...


class TimerLoop:
    """Fires the due clocks of a runtime's store, in one process per store.

    ``poll`` bounds how long a clock set by another process waits to be noticed
    (this process's own parks wake the loop at once); ``batch`` is how many due
    turns one read lists, ``parallel`` how many are settled at once.
    """

    def __init__(
        self, runtime: TimerHost, *, poll: float = 1.0, batch: int = 200, parallel: int = 16
    ) -> None:
        self.runtime = runtime
        self.poll = poll
        self.batch = batch
        self.parallel = parallel
        #: How many parked turns this loop settled (for monitoring and tests).
        self.fired = 0
        #: Whether this process fires the store's timers now (it leads their election,
        #: or the store holds none).
        self.leading = False
        #: Whether a batch of due turns is being settled right now: a ``Worker`` in
        #: this process claims nothing meanwhile, so a burst of deadlines is fired at
        #: the pace of the firing alone and the turns it wakes run on the other workers.
        self.firing = False
        self._nudge = asyncio.Event()

    def nudge(self) -> None:
        """Look again now: a turn parked here with a clock that may come sooner."""
        self._nudge.set()

    async def run(self) -> None:
        """Fire clocks until cancelled; on an electing store, only while leading."""
        store = self.runtime.store
        if not isinstance(store, TimerStore):
            return
        await while_leading(store, "turnkit:timers", lambda lost: self._fire_until(store, lost))

    async def _fire_until(self, store: TimerStore, lost: asyncio.Future[None]) -> None:
        self.leading = True
        try:
            await self._fire_while(store, lost)
        finally:
            self.leading = False

    async def _fire_while(self, store: TimerStore, lost: asyncio.Future[None]) -> None:
        while not lost.done():
            self._nudge.clear()
            try:
                fired = await self.fire_due(store)
            except Exception:
                log.exception("firing due timers failed; trying again in %gs", self.poll)
                fired = 0
            if fired >= self.batch:
                continue  # more may be due
            pause = self.poll
            try:
                upcoming = await store.next_wake()
            except Exception:
                upcoming = None
            if upcoming is not None:
                pause = min(pause, max(0.0, upcoming - time.time()))
            nudged = asyncio.ensure_future(self._nudge.wait())
            waiting: set[asyncio.Future[Any]] = {lost, nudged}
            try:
                await asyncio.wait(waiting, timeout=pause)
            finally:
                nudged.cancel()

    async def fire_due(self, store: TimerStore, now: float | None = None) -> int:
        """Settle every parked turn whose clock has come by ``now``; how many."""
        now = time.time() if now is None else now
        due = await store.due_turns(now, limit=self.batch)
        if not due:
            return 0
        gate = asyncio.Semaphore(self.parallel)

        async def one(record: TurnRecord) -> None:
            async with gate:
                try:
                    if await self.runtime.settle(record, now) is not None:
                        self.fired += 1
                except TurnMoveError:
                    # Answered, cancelled or fired by another process meanwhile: the
                    # compare-and-set refused this firing whole, as it should.
                    log.debug("turn %s moved before its timer fired here", record.turn_id)
                except Exception as exc:
                    log.warning(
                        "turn %s of %s: firing its timer failed (tried again soon): %s",
                        record.turn_id,
                        record.session_id,
                        exc,
                    )

        self.firing = True
        try:
            await asyncio.gather(*(one(r) for r in due))
        finally:
            self.firing = False
        return len(due)


async def while_leading(
    store: Store | TimerStore,
    name: str,
    job: Callable[[asyncio.Future[None]], Awaitable[None]],
) -> None:
    """Run ``job(lost)`` whenever this process leads the election ``name`` on
    ``store`` (on a store without elections: always), until cancelled; ``lost``
    completes when the lead is lost, and ``job`` should return then."""
    election = store.election(name) if isinstance(store, ElectingStore) else None
    loop = asyncio.get_running_loop()
    while True:
        if election is not None:
            await election.lead()
        lost = asyncio.ensure_future(election.lost()) if election else loop.create_future()
        try:
            await job(lost)
        finally:
            lost.cancel()
            if election is not None:
                await election.resign()
