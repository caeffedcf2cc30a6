"""``Worker``: runs the turns a shared store holds, in any number of processes.

A worker claims runnable sessions from the store (``TurnQueue.claim``), oldest
runnable turn first, delivers each session's turn in its runtime, and claims again
when a delivery ends, when the store announces a runnable turn, or every ``poll``
seconds (what finds a dead process's sessions). A session is one worker's at a
time: the claim holds its writer lock for the delivery, and PostgreSQL releases it
if the worker dies, after which another worker replays the turn from its
checkpoints. Only the store decides what runs; the worker keeps nothing that
another could not rebuild.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Iterable
from datetime import timedelta

from .._errors import ConfigurationError, StoreError
from .._seams.queue import PendingReset, Serving, TurnQueue, WorkerRegistry
from .._values.records import TurnRecord
from .retention import Retention
from .runtime import Runtime
from .session import AgentSession
from .timers import while_leading

log = logging.getLogger("turnkit.worker")

#: The first pause before a session whose delivery broke is claimed again here; it
#: doubles with each failure in a row, up to ``_MAX_BACKOFF``.
_FIRST_BACKOFF = 1.0
_MAX_BACKOFF = 60.0
#: How often a worker looks for turns held by another version than its own (they
#: wait for a deploy, so a sweep now and then is soon enough), and how often it
#: tells a store that keeps a worker registry that it is alive.
_HELD_SWEEP = 15.0
_SEEN_EVERY = 10.0


class Worker:
    """Runs ``runtime``'s agents' turns from the runtime's store, at most
    ``concurrency`` sessions at once, until ``stop()``.

    The store must be a ``TurnQueue`` (``PostgresStore``). Use it inside the
    runtime: ``async with runtime: await worker.run()``. ``poll`` bounds how long a
    runnable turn nobody announced waits (a dead worker's, mostly); ``grace`` is
    how long ``run`` lets deliveries finish after ``stop()`` before it interrupts
    them, leaving their turns to another worker. ``serve_versions`` (the agent
    versions whose turns it takes; ``None``: every version) lets old and new workers
    share one store during a deploy, each draining its own turns (docs/deploying.md).
    """

    def __init__(
        self,
        runtime: Runtime,
        *,
        concurrency: int = 32,
        poll: float = 1.0,
        grace: float = 30.0,
        serve_versions: Iterable[str] | None = None,
    ) -> None:
        if not isinstance(runtime, Runtime):
            raise ConfigurationError(
                f"Worker runs turns, so it needs a turnkit.Runtime, got {type(runtime).__name__}"
            )
        if not isinstance(runtime.store, TurnQueue):
            raise ConfigurationError(
                f"a Worker claims turns from a shared store (PostgresStore); "
                f"{type(runtime.store).__name__} is not one"
            )
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ConfigurationError(f"concurrency must be an int >= 1, got {concurrency!r}")
        for name, value in (("poll", poll), ("grace", grace)):
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ConfigurationError(f"{name} must be a number >= 0, got {value!r}")
        if not poll > 0:
            raise ConfigurationError("poll must be more than 0")
        self.runtime = runtime
        self.serve_versions = _versions(serve_versions)
        # Turns the runtime's timers wake are claimed like any other, by every worker.
        runtime.claims_turns = True
        self.queue: TurnQueue = runtime.store
        self.concurrency = concurrency
        self.poll = float(poll)
        self.grace = float(grace)
        #: Sessions delivering here now, and the task following each delivery.
        self._running: dict[str, asyncio.Task[None]] = {}
        self._sessions: dict[str, AgentSession] = {}
        #: Sessions whose delivery broke: when this worker may claim each again, and
        #: how many times in a row it broke.
        self._backoff: dict[str, tuple[float, int]] = {}
        self._wake = asyncio.Event()
        self._stopping = False
        #: How many turns this worker has claimed (for monitoring), and how many of
        #: them were running already: left by a process that died or stalled.
        self.claimed = 0
        self.takeovers = 0
        #: Turns still running past the grace when it stopped, handed back to other
        #: workers (a local tool of theirs may still be running on a thread).
        self.handed_back = 0
        #: When this worker last looked for held turns, and last said it is alive.
        self._swept = float("-inf")
        self._seen = float("-inf")

    @property
    def running(self) -> int:
        """How many sessions this worker is delivering a turn of right now."""
        return len(self._running)

    def stop(self) -> None:
        """Stop claiming; ``run`` returns once the current deliveries are over."""
        self._stopping = True
        self._wake.set()

    async def run(self) -> None:
        """Claim and deliver turns until ``stop()``; then let the deliveries finish
        (for ``grace`` seconds at most, then interrupt them) and return."""
        self.runtime.running_loop()
        retention = self.runtime.retention
        retaining = (
            asyncio.create_task(self._retain(retention), name="turnkit:retention")
            if retention is not None
            else None
        )
        try:
            while not self._stopping:
                # Cleared before the claim, not after: a stop() or a delivery's end
                # that lands while the claim is awaited still wakes the wait below.
                self._wake.clear()
                claimed = await self._claim_once()
                await self._say_alive()
                if claimed and self.running < self.concurrency:
                    continue  # there may be more
                await self._wait()
        finally:
            if retaining is not None:
                retaining.cancel()
                await asyncio.gather(retaining, return_exceptions=True)
            await self._drain()
            await self._say_gone()

    def _own_versions(self) -> dict[str, str]:
        return {name: agent.turn_version for name, agent in self.runtime.agents.items()}

    async def _say_alive(self) -> None:
        """Tell a store that keeps a worker registry what this worker serves, every
        ``_SEEN_EVERY`` seconds (a failure is logged; claiming goes on)."""
        store = self.runtime.store
        now = time.monotonic()
        if not isinstance(store, WorkerRegistry) or now - self._seen < _SEEN_EVERY:
            return
        self._seen = now
        try:
            await store.worker_seen(self._own_versions(), self.serve_versions)
        except StoreError as exc:
            log.warning("could not record this worker as alive: %s", exc)

    async def _say_gone(self) -> None:
        store = self.runtime.store
        if isinstance(store, WorkerRegistry) and self._seen > float("-inf"):
            try:
                await store.worker_gone()
            except StoreError as exc:
                log.warning("could not remove this worker from the live ones: %s", exc)

    async def _retain(self, retention: Retention) -> None:
        """Prune by the runtime's retention every ``retention.every``; on a store that
        holds elections (PostgreSQL) only while this worker leads, so one worker per
        store prunes and another takes over if it dies. Two at once would do no harm
        (each deletion is its own checked commit), only double work."""
        every = retention.every.total_seconds() if isinstance(retention.every, timedelta) else 0.0

        async def prune_until(lost: asyncio.Future[None]) -> None:
            while not lost.done():
                try:
                    await self.runtime.prune()
                except Exception:
                    log.exception("retention: pruning failed; trying again in %ss", every)
                await asyncio.wait({lost}, timeout=every)

        await while_leading(self.runtime.store, "turnkit:retention", prune_until)

    async def _claim_once(self) -> int:
        free = self.concurrency - self.running
        if free <= 0 or self.runtime.timers.firing:
            return 0  # (while this process fires a batch of timers, the others claim)
        now = time.monotonic()
        for sid in [s for s, (at, _) in self._backoff.items() if at <= now]:
            if sid not in self._running:
                del self._backoff[sid]
        skip = {*self._running, *self._backoff}
        sweep = now - self._swept >= _HELD_SWEEP
        serving = Serving(own=self._own_versions(), serves=self.serve_versions, retry_held=sweep)
        try:
            records = await self.queue.claim(
                sorted(self.runtime.agents),
                limit=free,
                skip=skip,
                serving=serving,
                concurrency=self.runtime.concurrency,
            )
        except StoreError as exc:
            log.warning("claiming turns failed (trying again in %gs): %s", self.poll, exc)
            return 0
        if sweep:
            self._swept = now
        for record in records:
            self._deliver(record)
        self.claimed += len(records)
        self.takeovers += sum(isinstance(r, TurnRecord) and r.status == "running" for r in records)
        return len(records)

    async def _wait(self) -> None:
        """Until a turn may be runnable: announced by the store, a delivery here
        ended, ``stop()``, or ``poll`` seconds passed (``run`` clears the wake-up
        before each claim, so one that came during the claim counts)."""
        announced = asyncio.ensure_future(self.queue.wait_for_turns(self.poll))
        woken = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({announced, woken}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (announced, woken):
                task.cancel()

    def _deliver(self, record: TurnRecord | PendingReset) -> None:
        sid = record.session_id
        what = f"turn {record.turn_id}" if isinstance(record, TurnRecord) else "the reset"
        done: Awaitable[object]
        try:
            session = self.runtime.session(record.agent, sid)
            if isinstance(record, PendingReset):
                done = session.run_stored_reset()
            else:
                done = session.result(session.run_stored(record, claimed=True))
        except Exception as exc:
            self.queue.unclaim(sid)
            log.warning("cannot deliver %s of %s: %s", what, sid, exc)
            self._back_off(sid)
            return
        self._sessions[sid] = session
        task = asyncio.get_running_loop().create_task(
            self._follow(session, what, done), name=f"turnkit-worker:{sid}"
        )
        self._running[sid] = task

    async def _follow(self, session: AgentSession, what: str, done: Awaitable[object]) -> None:
        sid = session.session_id
        try:
            await done
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # The turn (or reset) stays open in the store; it is claimed again after
            # a pause (here), or sooner by another worker.
            if self._stopping:
                log.info("handed %s of %s back: %s", what, sid, exc)
            else:
                log.warning("delivering %s of %s broke: %s", what, sid, exc)
            self._back_off(sid)
        else:
            self._backoff.pop(sid, None)
        finally:
            self._running.pop(sid, None)
            self._sessions.pop(sid, None)
            self.queue.unclaim(sid)  # (a no-op once its delivery held it)
            self._wake.set()

    def _back_off(self, sid: str) -> None:
        failures = self._backoff.get(sid, (0.0, 0))[1] + 1
        pause = min(_FIRST_BACKOFF * 2 ** (failures - 1), _MAX_BACKOFF)
        self._backoff[sid] = (time.monotonic() + pause, failures)

    async def _drain(self) -> None:
        """Let the deliveries under way end, for ``grace`` seconds at most; then
        interrupt them (their turns stay open, for another worker to take over)."""
        tasks = list(self._running.values())
        if not tasks:
            return
        _, late = await asyncio.wait(tasks, timeout=self.grace)
        if late:
            log.warning(
                "%d turn(s) still running after %gs: handing them back", len(late), self.grace
            )
            self.handed_back += len(late)
            for session in list(self._sessions.values()):
                session.interrupt()
            await asyncio.wait(late)


def _versions(versions: Iterable[str] | None) -> frozenset[str] | None:
    """``serve_versions`` checked: ``None``, or non-empty strings (not one string)."""
    if versions is None:
        return None
    if isinstance(versions, str) or not isinstance(versions, Iterable):
        raise ConfigurationError(
            f"serve_versions must be a list of versions (or None), got {versions!r}"
        )
    found = frozenset(versions)
    bad = [v for v in found if not isinstance(v, str) or not v.strip()]
    if bad or not found:
        raise ConfigurationError(
            f"serve_versions must hold at least one non-empty version string, got {versions!r}"
        )
    return found
