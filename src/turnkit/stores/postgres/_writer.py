"""PostgresStore's single writer per session across processes: the process's lock
connection, which batches every session's advisory-lock acquisitions and releases,
and the bookkeeping of which sessions this process holds and with which token.

A delivery's reads need only the lock; its load and its commits also need its
token written to ``turnkit_writers`` (what every commit's fence checks). A delivery
that first loads takes both in one statement; one that first only reads (a resume
checking the parked turn) takes the lock alone, and its token is written by its
first load or commit, on the same lock connection, so a refused resume writes
nothing at all.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from time import time as now

import psycopg
from psycopg.pq.abc import PGresult

from ..._errors import SessionBusyError, StoreError
from .._locks import SessionLocks
from .._takeover import Takeover
from . import _wire as wire
from ._commit import Connect, Sender, close_quietly
from ._statements import LOAD_SQL, lock_key, pg_wire

log = logging.getLogger("turnkit.stores.postgres")

#: Take the lock and write a fresh token, in one statement (no row if the lock is
#: taken).
_ACQUIRE_SQL = (
    "WITH l AS (SELECT pg_try_advisory_lock(?::bigint) AS ok) "
    "INSERT INTO turnkit_writers (session_id, token, holder, since) "
    "SELECT ?::text, ?::text, ?::text, ?::float8 FROM l WHERE l.ok "
    "ON CONFLICT (session_id) DO UPDATE SET token = excluded.token, "
    "holder = excluded.holder, since = excluded.since RETURNING 1"
)
#: Take the lock alone (a read before any load or commit).
_LOCK_SQL = "SELECT pg_try_advisory_lock(?::bigint)"
#: Write the token of a lock a read took (on the connection holding it).
_CLAIM_SQL = (
    "INSERT INTO turnkit_writers (session_id, token, holder, since) "
    "VALUES (?, ?, ?, ?::float8) "
    "ON CONFLICT (session_id) DO UPDATE SET token = excluded.token, "
    "holder = excluded.holder, since = excluded.since"
)
_UNLOCK_SQL = "SELECT pg_advisory_unlock(?::bigint)"
#: Give back a tenant's concurrency slot (see ``_queue.CLAIM_SQL``).
_UNLOCK_SLOT_SQL = "SELECT pg_advisory_unlock(?::integer, ?::integer)"
#: The lock connection's settings, made when it opens.
LOCK_SESSION = (
    # Losing an acquisition in a server crash is harmless: a holder whose token did
    # not survive has committed nothing after it, and is fenced off.
    b"SET synchronous_commit = off",
    # The claim's plan is estimated dear (a lateral scan per tenant) though it runs in
    # milliseconds: compiling it with JIT would cost ~100 ms a claim. Nothing this
    # connection runs is long enough for JIT to pay.
    b"SET jit = off",
    # Every statement here finds its rows by key, whatever the values, so the plan
    # made once serves every run; with ``auto`` PostgreSQL plans the claim anew on
    # every run (it estimates a custom plan cheaper): ~2 ms of the server's CPU a
    # claim at a few thousand turns, against ~0.35 ms to run it.
    b"SET plan_cache_mode = force_generic_plan",
)
#: Prepared on the lock connection when it opens.
_PREPARED = {
    b"turnkit_acquire": _ACQUIRE_SQL,
    b"turnkit_lock": _LOCK_SQL,
    b"turnkit_claim": _CLAIM_SQL,
    b"turnkit_load": LOAD_SQL,
    b"turnkit_unlock": _UNLOCK_SQL,
    b"turnkit_unlock_slot": _UNLOCK_SLOT_SQL,
    b"turnkit_ping": "SELECT 1",
}

_Entry = tuple[wire.Statement, "asyncio.Future[PGresult] | None", "Sender | None"]


class LockLost(StoreError):
    """The connection that took a session's lock closed before its token was written."""


#: The sessions whose ``writer()`` the current task holds.
_holding: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
    "turnkit_pg_holding", default=frozenset()
)


class _LockChannel:
    """The process's lock connection. The writer acquisitions of every session (each
    with its delivery's load, when it has one) and their releases are batched on it:
    what arrives while a batch is out goes in the next one, one multi-statement query,
    so many sessions share a round trip. A release is posted and never waited for;
    the connection's order keeps it ahead of a later acquisition of the same session.

    Each operation is one statement that only a broken connection or schema makes
    fail. If a batch fails anyway, the connection is dropped, and with it every lock
    it held: a delivery that still runs is then fenced off at its next commit if
    another process takes its session over, exactly as when the connection dies."""

    def __init__(self, connect: Connect, prepared: dict[bytes, bytes], takeover: Takeover) -> None:
        self._connect = connect
        self._prepared = prepared
        self._takeover = takeover
        self.sender: Sender | None = None
        self._queue: list[_Entry] = []
        self._pumping = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._beat: asyncio.Task[None] | None = None
        #: The connection each watched statement ran on (see ``run_here``).
        self._ran_on: dict[asyncio.Future[PGresult], Sender | None] = {}

    async def run(
        self, statements: Sequence[wire.Statement], *, on: Sender | None = None
    ) -> list[PGresult]:
        """Run ``statements`` in order in the next batch; their results. With ``on``,
        only on that connection: if it is gone, they fail unsent (``LockLost``)."""
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in statements]
        self._queue.extend((s, f, on) for s, f in zip(statements, futures, strict=True))
        self._kick()
        await asyncio.wait(futures)
        for future in futures:
            future.exception()  # each one's failure counts as seen
        return [future.result() for future in futures]

    async def run_here(self, statement: wire.Statement) -> tuple[PGresult, Sender]:
        """Run ``statement`` in the next batch; its result and the connection it ran
        on (whose session-level locks it took are held there)."""
        future: asyncio.Future[PGresult] = asyncio.get_running_loop().create_future()
        self._ran_on[future] = None
        self._queue.append((statement, future, None))
        self._kick()
        try:
            res = await future
            sender = self._ran_on[future]
        finally:
            self._ran_on.pop(future, None)
        assert sender is not None
        return res, sender

    def post(self, statement: wire.Statement) -> None:
        """Run ``statement`` in the next batch, unwaited (a failure is logged)."""
        self._queue.append((statement, None, None))
        self._kick()

    def _kick(self) -> None:
        if not self._pumping and self._queue:
            self._pumping = True
            task = asyncio.get_running_loop().create_task(self._pump())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(self) -> None:
        try:
            while self._queue:
                batch, self._queue = self._queue, []
                await self._send(batch)
        finally:
            self._pumping = False

    async def _send(self, batch: list[_Entry]) -> None:
        try:
            sender = await self._connection()
            batch = self._pinned_elsewhere(batch, sender)
            if not batch:
                return
            results = await sender.query([statement for statement, _, _ in batch])
            if len(results) != len(batch):
                raise psycopg.InterfaceError(f"{len(results)} results for {len(batch)} statements")
        except BaseException as exc:
            await self._drop()
            failure = StoreError(f"the writer lock connection failed: {exc}")
            for _, future, _ in batch:
                if future is not None and not future.done():
                    future.set_exception(failure)
            if any(future is None for _, future, _ in batch):
                log.warning(
                    "releasing writer locks failed (they went with the connection): %s", exc
                )
            if not isinstance(exc, Exception):
                raise
            return
        for (_, future, _), res in zip(batch, results, strict=True):
            if future is not None and not future.done():
                if future in self._ran_on:
                    self._ran_on[future] = sender
                future.set_result(res)

    @staticmethod
    def _pinned_elsewhere(batch: list[_Entry], sender: Sender) -> list[_Entry]:
        """``batch`` without the statements meant for another (a lost) connection,
        which fail unsent."""
        kept = []
        for entry in batch:
            _, future, on = entry
            if on is None or on is sender:
                kept.append(entry)
            elif future is not None and not future.done():
                future.set_exception(LockLost("its lock connection closed"))
        return kept

    async def _connection(self) -> Sender:
        """The lock connection, opened if there is none (or it is unfit). Only the
        pump calls it: a check while a batch is out would take its results for a
        hang-up."""
        loop = asyncio.get_running_loop()
        if self.sender is not None:
            if self.sender.usable(loop):
                return self.sender
            await self._drop()
        conn = await self._connect()
        try:
            for setting in LOCK_SESSION:
                await conn.execute(setting)
            # How soon the server frees this connection's locks if we go silent.
            await conn.execute(self._takeover.lock_settings(conn.info.server_version))
            await wire.exchange(
                conn,
                [wire.Prepare(name, statement) for name, statement in self._prepared.items()],
            )
        except BaseException:
            await conn.close()
            raise
        self.sender = Sender(conn, loop)
        self._beat = loop.create_task(self._heartbeat(self.sender), name="turnkit-lock-heartbeat")
        return self.sender

    async def _heartbeat(self, sender: Sender) -> None:
        """Speak on ``sender`` every ``heartbeat`` seconds while it is the lock
        connection, so its ``idle_session_timeout`` ends it only if this process
        stops running."""
        ping = wire.execute(b"turnkit_ping", ())
        while True:
            await asyncio.sleep(self._takeover.heartbeat)
            if self.sender is not sender:
                return
            self._queue.append((ping, None, sender))  # never sent on another connection
            self._kick()

    async def _drop(self) -> None:
        sender, self.sender = self.sender, None
        beat, self._beat = self._beat, None
        if beat is not None and beat is not asyncio.current_task():
            beat.cancel()
        if sender is not None:
            await close_quietly(sender)

    async def close(self) -> None:
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._drop()


class Writers:
    """Which sessions this process holds the writer of, and how far: ``writer()``
    held with the lock not taken yet (pending), the lock taken by a read with no
    token written yet (unclaimed), or both (a token to fence commits with)."""

    def __init__(
        self,
        connect: Connect,
        schema: str,
        holder: str,
        busy_timeout: float,
        takeover: Takeover,
    ) -> None:
        prepared = {name: pg_wire(sql, schema) for name, sql in _PREPARED.items()}
        self.channel = _LockChannel(connect, prepared, takeover)
        self._schema = schema
        self._holder = holder
        self.busy_timeout = busy_timeout
        self._locks = SessionLocks()
        self.tokens: dict[str, str] = {}
        self._pending: set[str] = set()
        #: The lock connection that took each held session's lock.
        self._held: dict[str, Sender] = {}
        #: Sessions a claim locked for a delivery that has not begun to hold them.
        self._claimed: set[str] = set()
        #: The tenant slot (key, number) each claimed session holds, with its sender.
        self._slots: dict[str, tuple[int, int, Sender]] = {}

    @asynccontextmanager
    async def hold(self, session_id: str) -> AsyncIterator[None]:
        """Hold the session for one delivery. The lock itself is taken by the
        delivery's first load, read or commit (a load takes it in the same round
        trip), and released without waiting when the delivery ends."""
        async with self._locks.hold(session_id):
            if session_id in self._claimed:
                self._claimed.discard(session_id)  # locked by the claim: not pending
            else:
                self._pending.add(session_id)
            holding = _holding.set(_holding.get() | {session_id})
            try:
                yield
            finally:
                _holding.reset(holding)
                self._pending.discard(session_id)
                self.tokens.pop(session_id, None)
                sender = self._held.pop(session_id, None)
                if sender is not None and sender is self.channel.sender and not sender.suspect:
                    # (A lock whose connection is gone went with it.)
                    key = lock_key(self._schema, session_id)
                    self.channel.post(wire.execute(b"turnkit_unlock", (key,)))
                self._free_slot(session_id)

    async def claim(self, statement: wire.Statement, *, slot_column: int | None = None) -> PGresult:
        """Run a claim (a statement that takes the writer locks of the sessions it
        returns, first column their ids) on the lock connection, and hold each
        session it returns for the delivery that will hold its ``writer()`` next.
        With ``slot_column``, that column and the next are the tenant slot lock each
        row took too (NULL: none), given back with the session."""
        res, sender = await self.channel.run_here(statement)
        for row in range(res.ntuples):
            session_id = res.get_value(row, 0)
            assert session_id is not None
            sid = session_id.decode()
            self._held[sid] = sender
            self._claimed.add(sid)
            if slot_column is not None:
                key, slot = res.get_value(row, slot_column), res.get_value(row, slot_column + 1)
                if key is not None and slot is not None:
                    self._slots[sid] = (int(key), int(slot), sender)
        return res

    def _free_slot(self, session_id: str) -> None:
        """Give back the tenant slot a claim took with the session, if any."""
        taken = self._slots.pop(session_id, None)
        if taken is None:
            return
        key, slot, sender = taken
        if sender is self.channel.sender and not sender.suspect:
            self.channel.post(wire.execute(b"turnkit_unlock_slot", (key, slot)))

    def unclaim(self, session_id: str) -> None:
        """Release a claimed session whose delivery never held it (no-op otherwise)."""
        if session_id not in self._claimed:
            return
        self._claimed.discard(session_id)
        sender = self._held.pop(session_id, None)
        if sender is not None and sender is self.channel.sender and not sender.suspect:
            key = lock_key(self._schema, session_id)
            self.channel.post(wire.execute(b"turnkit_unlock", (key,)))
        self._free_slot(session_id)

    def must_lock(self, session_id: str) -> bool:
        """Whether the caller holds ``writer()`` of this session and its lock is not
        taken yet (only the holder's own reads and commits take it: an observer's
        read in another task never does)."""
        return session_id in self._pending and session_id in _holding.get()

    def must_claim(self, session_id: str) -> bool:
        """Whether the caller holds ``writer()`` of this session and has no token yet."""
        return session_id not in self.tokens and session_id in _holding.get()

    async def acquire(
        self, session_id: str, load: wire.Statement | None = None, *, claim: bool = True
    ) -> PGresult | None:
        """Take the writer lock of a session whose ``writer()`` is held, polling while
        another process has it, and (with ``claim``) write a fresh token; with
        ``load``, run that statement in the same round trip and return its result."""
        try:
            if session_id in self._held:  # locked by an earlier read: claim it there
                return await self._claim(session_id, load)
            return await self._lock(session_id, load, claim)
        except LockLost as exc:
            raise StoreError(
                f"session {session_id}: lost the writer lock before writing ({exc}); "
                "nothing was written: deliver the turn again"
            ) from exc
        except StoreError as exc:
            if isinstance(exc, SessionBusyError):
                raise
            raise StoreError(f"session {session_id}: cannot take the writer lock: {exc}") from exc

    async def _lock(
        self, session_id: str, load: wire.Statement | None, claim: bool
    ) -> PGresult | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.busy_timeout
        delay = 0.005
        key = lock_key(self._schema, session_id)
        while True:
            token = uuid.uuid4().hex
            take = (
                wire.execute(b"turnkit_acquire", (key, session_id, token, self._holder, now()))
                if claim
                else wire.execute(b"turnkit_lock", (key,))
            )
            results = await self.channel.run([take, load] if load else [take])
            if results[0].ntuples and results[0].get_value(0, 0) != b"f":
                if claim:
                    self.tokens[session_id] = token
                if self.channel.sender is not None:
                    self._held[session_id] = self.channel.sender
                self._pending.discard(session_id)
                return results[1] if load else None
            if loop.time() >= deadline:
                raise SessionBusyError(
                    f"session {session_id} is being run by another process; waited "
                    f"{self.busy_timeout:g}s for it (deliver the turn again later)"
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.2)

    async def _claim(self, session_id: str, load: wire.Statement | None) -> PGresult | None:
        """Write a token for a lock an earlier read took, on the connection holding
        it (if that connection is gone, so is the lock, and nothing is written)."""
        token = uuid.uuid4().hex
        claim = wire.execute(b"turnkit_claim", (session_id, token, self._holder, now()))
        on = self._held[session_id]
        results = await self.channel.run([claim, load] if load else [claim], on=on)
        self.tokens[session_id] = token
        return results[1] if load else None

    @property
    def lock_conn(self) -> psycopg.AsyncConnection[object] | None:
        sender = self.channel.sender
        return sender.conn if sender is not None else None

    async def close(self) -> None:
        await self.channel.close()
