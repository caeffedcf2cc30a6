"""One writer per SQLite file per process, taken in arrival order.

SQLite lets one connection write at a time. When each of a process's connections
waited for that lock in its own way (SQLite's busy handler on tool threads, a
sleep-and-retry loop on the event loop), the one that happened to retry at the
right moment won, and under load a commit could lose for the whole busy timeout
and fail its turn. Here every writer of the process queues for one ``WriteTurns``
token instead, first come first served, and writes on the one connection the
token goes with; SQLite's own lock (and its timeout) is then met only when
another process holds it.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections import deque
from collections.abc import Callable


class _Waiter:
    """One place in the queue: woken by ``grant`` on whichever thread releases."""

    __slots__ = ("granted", "wake")

    def __init__(self, wake: Callable[[], None]) -> None:
        self.wake = wake
        self.granted = False


class WriteTurns:
    """A first-come-first-served token shared by event-loop tasks and threads.

    ``take`` (a coroutine) and ``take_blocking`` (on a thread) wait their turn;
    ``release`` hands the token straight to the longest waiter, so no newcomer can
    overtake one already queued. No wait times out: every holder releases once its
    transaction ends, and the waits for other processes are bounded where the
    holder meets SQLite's lock.
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._held = False
        self._queue: deque[_Waiter] = deque()

    @property
    def waiting(self) -> int:
        """How many are queued for the token now (for monitoring and tests)."""
        return len(self._queue)

    def _enqueue_or_take(self, wake: Callable[[], None]) -> _Waiter | None:
        with self._mutex:
            if not self._held and not self._queue:
                self._held = True
                return None
            waiter = _Waiter(wake)
            self._queue.append(waiter)
            return waiter

    async def take(self) -> None:
        with self._mutex:
            if not self._held and not self._queue:  # free: the usual case, taken at once
                self._held = True
                return
        loop = asyncio.get_running_loop()
        granted: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            loop.call_soon_threadsafe(_resolve, granted)

        waiter = self._enqueue_or_take(wake)
        if waiter is None:
            return
        try:
            await granted
        except asyncio.CancelledError:
            with self._mutex:
                if not waiter.granted:
                    self._queue.remove(waiter)
                    raise
            self.release()  # granted as it was cancelled: pass it on
            raise

    def take_blocking(self) -> None:
        event = threading.Event()
        waiter = self._enqueue_or_take(event.set)
        if waiter is not None:
            event.wait()

    def release(self) -> None:
        with self._mutex:
            if not self._queue:
                self._held = False
                return
            waiter = self._queue.popleft()
            waiter.granted = True  # the token passes on without being let go
        waiter.wake()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class SqliteWriter:
    """A store's write connection and the token that goes with it: only the holder
    of ``turns`` may use ``conn``.

    One per ``SqliteStore`` object (a process opens one per file: its ``Runtime``'s).
    Two store objects on one file in one process write through two connections and
    meet at SQLite's lock, as two processes do; each still waits for the other no
    longer than its ``busy_timeout``.
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.turns = WriteTurns()
