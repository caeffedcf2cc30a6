"""PostgresStore's commit paths from the event loop: connections of the store's own
that stay registered with the loop (``Sender``), and the group committer that
merges concurrent sessions' commits."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import select
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import psycopg
from psycopg.pq.abc import PGresult

from ..._errors import StoreError
from . import _wire as wire
from ._queue import WAKE_SQL
from ._statements import (
    NoConnection,
    connection_lost,
    pg_wire,
    rollback_quietly_async,
)
from ._writes import (
    Rows,
    commit_error,
)

T = TypeVar("T")
log = logging.getLogger("turnkit.stores.postgres")

#: Opens a new connection to the store's database (the store must be open).
Connect = Callable[[], Awaitable[psycopg.AsyncConnection[Any]]]
#: A session's writer fence: its id and the token of its current acquisition.
Fence = tuple[str, str]


class Sender:
    """A connection of the group committer's own, outside the pool, that sends step
    commits from the event loop.

    Its socket stays registered with the loop for as long as it lives, so a commit
    pays no pool checkout and no reader registration: the reader wakes the commit
    waiting on it. A socket that turns readable while no commit is in flight means
    the server is closing the connection (a terminated backend, a restart); the
    sender is then discarded before any commit uses it, as the pool's checkout
    check does for the reads."""

    __slots__ = ("_busy", "_fd", "_loop", "_plans", "_waiter", "conn", "suspect")

    def __init__(self, conn: psycopg.AsyncConnection[Any], loop: asyncio.AbstractEventLoop) -> None:
        self.conn = conn
        self._loop = loop
        self._fd = wire.socket_of(conn)
        self._waiter: asyncio.Future[None] | None = None
        self._busy = False
        self.suspect = False
        #: Statements prepared on this connection (see ``wire.Plans``).
        self._plans = wire.Plans()
        loop.add_reader(self._fd, self._readable)

    def _readable(self) -> None:
        waiter = self._waiter
        if waiter is None:
            if not self._busy:
                self.suspect = True  # idle, yet the server spoke: it is hanging up
                self._unwatch()
            return
        # Read what came now, so the loop's next poll does not see the socket
        # readable again once the request has ended (which would look like a
        # hang-up); the request then takes the results.
        with contextlib.suppress(psycopg.Error):  # the request's own read raises it
            wire.consume(self.conn)
        self._waiter = None
        if not waiter.done():
            waiter.set_result(None)

    def _unwatch(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            if not self._loop.is_closed():
                self._loop.remove_reader(fd)

    def usable(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Fit to send a commit: alive, on this loop, and not being hung up on (the
        ``select`` never waits; it catches what the loop has not polled yet)."""
        if self.suspect or loop is not self._loop or connection_lost(self.conn):
            return False
        readable, _, _ = select.select([self._fd], [], [], 0)
        return not readable

    async def query(self, statements: Sequence[wire.Statement]) -> list[PGresult]:
        """``results``, with the first error raised."""
        results = await self.results(statements)
        wire.raise_first_error(results, self.conn.info.encoding)
        return results

    async def results(self, statements: Sequence[wire.Statement]) -> list[PGresult]:
        """Send ``statements`` as one pipelined request and return their results
        (one per statement), an error among them left unraised."""
        sent, fresh = self._plans.plan(statements)
        return self._plans.mine(statements, sent, fresh, await self._exchange(sent))

    async def _exchange(self, statements: Sequence[wire.Statement]) -> list[PGresult]:
        conn = self.conn
        got = wire.Results()
        self._busy = True
        try:
            wire.send(conn, statements)
            await wire.flush(conn, self._loop)
            while not got.feed(conn):
                waiter = self._waiter = self._loop.create_future()
                await waiter
        except BaseException:
            self.suspect = True  # lost or cancelled mid-request: its state is unknown
            raise
        finally:
            self._busy = False
            self._waiter = None
        return got.results

    async def close(self) -> None:
        self._unwatch()
        await self.conn.close()


#: What the group committer may merge of a commit: its writer fence, its step, message
#: and event rows, and the statements of its other writes, in their order.
Mergeable = tuple["Fence | None", Rows, list[wire.Statement]]
_Queued = tuple[str, list[wire.Statement], "asyncio.Future[None]", Mergeable]


def _merged(group: list[_Queued], schema: str) -> list[wire.Statement]:
    """A group's commits as one request: one statement checks all their fences, their
    step, message and event rows share one INSERT per table, and the rest of each
    commit follows in its order (a wake of the workers only once): per commit, the
    fence, then the rows, then the rest, as it would go alone, which saves the server
    most of its per-statement work. Only sessions in the group once are merged: a
    session's several commits keep their order, after the merged ones."""
    counts = Counter(sid for sid, _, _, _ in group)
    fences: list[str] = []
    rows = Rows()
    rest: list[wire.Statement] = []
    alone: list[wire.Statement] = []
    wake = _wake_sql(schema)
    woken: set[wire.Statement] = set()
    for sid, statements, _, merge in group:
        if counts[sid] > 1:
            alone += statements
            continue
        fence, mine, others = merge
        if fence is not None:
            fences += fence
        rows.extend(mine)
        for statement in others:
            if type(statement) is wire.Query and statement.sql == wake:
                if statement in woken:
                    continue  # the same notification, already in this transaction
                woken.add(statement)
            rest.append(statement)
    merged = rows.statements(schema)
    if fences:
        merged.insert(0, wire.Query(_fences_sql(len(fences) // 2, schema), wire.values(fences)))
    return merged + rest + alone


@functools.cache
def _wake_sql(schema: str) -> bytes:
    return pg_wire(WAKE_SQL, schema)


@functools.cache
def _fences_sql(n: int, schema: str) -> bytes:
    """One statement checking ``n`` commits' writer fences."""
    pairs = ", ".join(["(?::text, ?::text)"] * n)
    return pg_wire(f"SELECT turnkit_fence(s, t) FROM (VALUES {pairs}) AS f(s, t)", schema)


class GroupCommitter:
    """Sends the engine's commits from the event loop, with at most ``senders`` in flight.

    A commit that finds a sender free goes out at once, alone. Commits that arrive
    while every sender is busy queue up, and the next free sender takes all of them
    in ONE transaction: one round trip and one WAL flush for many sessions' steps,
    which is what lets many concurrent sessions in one process outrun one (the
    server's per-commit cost is what bounds them). Each commit carries its own
    writer fence. If such a group fails on the server, nothing of it landed, and
    each of its commits is sent again alone, so one session's error (a fence, a
    taken position) is raised to that session only. A connection lost under a group
    fails all of its commits, each as a ``StoreError``, as it would have alone."""

    def __init__(self, connect: Connect, schema: str, senders: int) -> None:
        self._connect = connect
        self._schema = schema
        self._senders = senders
        self._busy = 0
        self._queue: list[_Queued] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._idle: list[Sender] = []
        self._inflight: dict[asyncio.Future[None], str] = {}
        #: The most commits one transaction has carried so far (for monitoring).
        self.largest_group = 0

    async def settled(self, sid: str | None) -> None:
        """Wait for the commits in flight now: of session ``sid``, or of all if ``None``."""
        if not self._inflight:
            return
        waits = [f for f, s in self._inflight.items() if sid is None or s == sid]
        if waits:
            await asyncio.wait(waits)

    async def commit(
        self,
        sid: str,
        statements: list[wire.Statement],
        merge: Mergeable,
    ) -> None:
        """Commit ``statements``; ``merge`` (its fence, its rows and the rest, which
        together are ``statements``) is what a group merges with others' commits."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._inflight[done] = sid
        try:
            await self._commit(sid, statements, merge)
        finally:
            del self._inflight[done]
            done.set_result(None)

    async def _commit(
        self,
        sid: str,
        statements: list[wire.Statement],
        merge: Mergeable,
    ) -> None:
        if self._busy < self._senders and not self._queue:
            self._busy += 1
            try:
                failed = await self._run(statements)
            finally:
                self._busy -= 1
                self._kick()
            if failed is not None:
                exc, lost = failed
                raise commit_error(sid, lost, exc) from exc
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append((sid, statements, future, merge))
        self._kick()
        await future

    async def drain(self) -> None:
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def close(self) -> None:
        await self.drain()
        idle, self._idle = self._idle, []
        for sender in idle:
            await close_quietly(sender)

    def _kick(self) -> None:
        while self._queue and self._busy < self._senders:
            self._busy += 1
            group, self._queue = self._queue, []
            task = asyncio.get_running_loop().create_task(self._send_group(group))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send_group(self, group: list[_Queued]) -> None:
        self.largest_group = max(self.largest_group, len(group))
        try:
            statements = group[0][1] if len(group) == 1 else _merged(group, self._schema)
            failed = await self._run(statements)
            if failed is None:
                for _, _, future, _ in group:
                    if not future.done():
                        future.set_result(None)
                return
            exc, lost = failed
            if len(group) == 1 or lost or isinstance(exc, NoConnection):
                for sid, _, future, _ in group:
                    if not future.done():
                        future.set_exception(commit_error(sid, lost, exc))
                return
            for sid, mine, future, _ in group:  # find whose it was: each alone
                alone = await self._run(mine)
                if future.done():
                    continue
                if alone is None:
                    future.set_result(None)
                else:
                    future.set_exception(commit_error(sid, alone[1], alone[0]))
        except BaseException as exc:  # cancelled with the loop, say
            for _, _, future, _ in group:
                if not future.done():
                    future.set_exception(
                        exc
                        if isinstance(exc, Exception)
                        else StoreError(f"commit not sent: {exc!r}")
                    )
            raise
        finally:
            self._busy -= 1
            self._kick()

    async def _sender(self) -> Sender:
        """An idle sender fit for use, or a new one (never more than ``senders``)."""
        loop = asyncio.get_running_loop()
        while self._idle:
            sender = self._idle.pop()
            if sender.usable(loop):
                return sender
            await close_quietly(sender)
        return Sender(await self._connect(), loop)

    async def _run(self, statements: list[wire.Statement]) -> tuple[BaseException, bool] | None:
        """Send ``statements`` on one of the committer's connections; the error and
        whether the connection was lost, or ``None`` if they committed."""
        try:
            sender = await self._sender()
        except Exception as exc:
            failure = NoConnection(str(exc))
            failure.__cause__ = exc
            return failure, False
        try:
            await sender.query(statements)
        except Exception as exc:
            conn = sender.conn
            lost = connection_lost(conn)
            await rollback_quietly_async(conn)
            if lost:
                sender.suspect = True
            return exc, lost
        finally:
            if sender.suspect:
                await close_quietly(sender)
            else:
                self._idle.append(sender)
        return None


async def close_quietly(sender: Sender) -> None:
    try:
        await sender.close()
    except Exception:
        log.debug("closing a commit connection failed", exc_info=True)
