"""``PostgresStore``: sessions in PostgreSQL, for deployments with many processes and hosts.

Needs ``turnkit[postgres]`` (psycopg 3 and its pool). Everything that runs no user
code (reads, the writer lock, and the commits of model steps, remote tools' results
and events) uses psycopg's asynchronous API on the event loop, which waits on the
socket and never blocks. A local tool's step (``run_tool``) runs on a private
worker thread, where the tool's synchronous SQL joins the step's transaction on a
connection of a second, blocking pool.

A step commit is one round trip: the writer fence and the step's rows go as one
pipelined request with bound values (one implicit transaction), on the group committer's own
connections; a local tool that touches ``ctx.store`` first opens the transaction
and runs its statements one by one. A session has one writer across every process:
a delivery holds a session-level advisory lock (taken with its first load, in the
same round trip, on a lock connection that batches every session's acquisitions
and releases), and every commit re-checks a per-acquisition token, so a process that
lost its lock (its lock connection died) can never interleave a step with the new
holder's.

This module holds the store and its sessions; the SQL it sends is in
``_statements``, how requests go on the wire in ``_wire`` (the one module that
touches libpq's connection), the transactions and the tool handle in ``_writes``,
the loop's commit paths (commit connections, the group committer) in ``_commit``,
the writer locks in ``_writer``, the schema's migrations in ``_schema``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from ..._errors import ConfigurationError, StoreError
from ..._seams.codec import Codec
from ..._seams.queue import PendingReset, Serving
from ..._seams.store import ToolStep
from ..._seams.worker_view import HeldSession, LiveWorker
from ..._values.budgets import Spend
from ..._values.events import TurnEvent, event_from_dict
from ..._values.messages import Message, message_from_dict
from ..._values.records import (
    Erasure,
    SessionInfo,
    SessionKey,
    SessionSnapshot,
    SessionStatus,
    TurnRecord,
)
from ..._values.step_results import StepResults
from ..._values.tenancy import UNCAPPED, Concurrency
from ..._values.writes import Write
from .. import _archive_sql as archive_sql
from .. import _retention_sql as retention_sql
from .. import _sql as sql
from .. import _usage_sql as usage_sql
from .._apply import apply_writes
from .._off_loop import on_thread
from .._payloads import Payloads
from .._spill import DEFAULT_BLOB_THRESHOLD
from .._sql_rows import session_info
from .._takeover import Takeover
from .._tool_threads import ToolThreads
from ._blobs import BlobReader
from ._election import PgElection
from ._faults import PgFaults
from ._listen import CancelListener, announce
from ._relay import PgEventRelay
from ._schema import migrate, read_relay_key, read_store_id

try:
    import psycopg
    from psycopg import conninfo
    from psycopg.pq.abc import PGresult
    from psycopg_pool import AsyncConnectionPool, ConnectionPool
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "PostgresStore needs psycopg 3 and psycopg-pool: pip install 'turnkit[postgres]'"
    ) from exc
from . import _wire as wire
from ._commit import GroupCommitter
from ._queue import (
    CLAIM_SQL,
    DUE_TURNS_SQL,
    EVENT_WRITERS_SQL,
    HELD_SESSIONS_SQL,
    LIVE_WORKERS_SQL,
    NEXT_WAKE_SQL,
    SESSIONS_OF_TENANT_SQL,
    UNSERVED_SQL,
    WORKER_ALIVE,
    WORKER_FORGOTTEN,
    WORKER_GONE_SQL,
    WORKER_SEEN_SQL,
)
from ._statements import (
    LOAD_SQL,
    SCHEMA_NAME,
    TURN_COLUMN_COUNT,
    as_text,
    check_idle_async,
    check_idle_connection,
    connection_lost,
    pg,
    pg_wire,
    qmark_to_pyformat,  # noqa: F401 - public for portable tools
    rollback_quietly,
    rollback_quietly_async,
    run_prepared,
    turn_row,
)
from ._writer import Writers
from ._writes import (
    FENCE,
    LoopTransaction,
    PgTransaction,
    Rows,
    commit_error,
)

T = TypeVar("T")
log = logging.getLogger("turnkit.stores.postgres")

#: The ``text`` field of a message's JSON body, in PostgreSQL. PostgreSQL cannot
#: extract a string holding NUL from JSON, so the escape is read as U+FFFD first: a
#: row stored before turnkit replaced NUL on the way in must not break a listing.
_TEXT_OF = (
    "(CASE WHEN left(m.body, 8) = '\"\\u0000~' THEN m.body "
    r"ELSE replace(m.body, '\u0000', '\ufffd')::json ->> 'text' END)"
)


#: At most how often, in seconds, a running turn reads whether another process
#: cancelled it (``cancel_reason``), for a cancellation whose announcement was lost.
CANCEL_POLL = 1.0


class _PgSession:
    def __init__(self, store: PostgresStore, session_id: str) -> None:
        self._store = store
        self._sid = session_id
        #: The last cancel_reason read: (turn id, when, reason).
        self._cancel_poll: tuple[str, float, str | None] = ("", 0.0, None)

    @property
    def session_id(self) -> str:
        return self._sid

    def writer(self) -> AbstractAsyncContextManager[None]:
        return self._store._writers.hold(self._sid)

    async def load(self, turn_id: str | None = None, *, from_index: int = 0) -> SessionSnapshot:
        snap = await self._load_once(turn_id, from_index)
        if turn_id is not None:
            # The turn's cancellation as of this read: the delivery's first step
            # boundary need not read it again (see cancel_reason).
            reason = snap.turn.cancel_reason if snap.turn is not None else None
            self._cancel_poll = (turn_id, time.monotonic(), reason)
        return snap

    async def _load_once(self, turn_id: str | None, from_index: int) -> SessionSnapshot:
        store = self._store
        if not store._writers.must_claim(self._sid):
            return await store._read(
                f"session {self._sid}", self._load, turn_id, from_index, of=self._sid
            )
        # A delivery's first load: the writer lock and the load in one round trip.
        await store._committer.settled(self._sid)
        sid = self._sid
        params = (sid, sid, sid, sid, from_index, sid, turn_id, sid, sid, turn_id)
        res = await store._writers.acquire(self._sid, wire.execute(b"turnkit_load", params))
        assert res is not None
        try:
            return self._snapshot(res, from_index)
        except ValueError as exc:
            raise StoreError(
                f"session {self._sid} holds data that is not valid JSON: {exc}"
            ) from exc

    async def _load(
        self, conn: psycopg.AsyncConnection[Any], turn_id: str | None, from_index: int
    ) -> SessionSnapshot:
        sid = self._sid
        params = (sid, sid, sid, sid, from_index, sid, turn_id, sid, sid, turn_id)
        statement = pg_wire(LOAD_SQL, self._store.schema)
        res = await run_prepared(conn, b"turnkit_load", statement, params)
        return self._snapshot(res, from_index)

    def _snapshot(self, res: PGresult, from_index: int) -> SessionSnapshot:
        agent, generation, seq, messages, steps = (res.get_value(0, c) for c in range(5))
        payloads, sid = self._store._payloads, self._sid
        value = payloads.value
        memo: dict[str, Any] = json.loads(b"{" + steps + b"}") if steps else {}
        return SessionSnapshot(
            messages=[
                message_from_dict(value(sid, "message", m))
                for m in json.loads(b"[" + messages + b"]")
            ]
            if messages
            else [],
            store_id=self._store.store_id,
            steps=StepResults({k: value(sid, "step", v) for k, v in memo.items()}),
            turn=turn_row(res, 0, 5, payloads) if res.get_value(0, 6) is not None else None,
            agent=as_text(agent),
            next_seq=(int(seq) if seq is not None else 0) + 1,
            generation=int(generation) if generation is not None else 0,
            from_index=from_index,
            owner=as_text(res.get_value(0, _OWNER)),
            reset_requested=res.get_value(0, _OWNER + 1) is not None,
            erased=_erasure(res),
        )

    async def commit(self, writes: Sequence[Write]) -> None:
        await self._send(writes, await self._fence_token())

    async def _fence_token(self) -> str | None:
        """This process's fencing token for the session, claiming the session first
        where it must be claimed (see ``_writer``)."""
        store = self._store
        if store._writers.must_claim(self._sid):
            await store._writers.acquire(self._sid)
        return store._writers.tokens.get(self._sid)

    async def _send(self, writes: Sequence[Write], token: str | None) -> None:
        """``writes`` from the event loop, in one pipelined request."""
        schema = self._store.schema
        tx = LoopTransaction(self._sid, schema, self._store._payloads)
        apply_writes(tx, writes)
        try:
            rest = tx.rest()
            statements = [*tx.rows.statements(schema), *rest]
        except psycopg.Error as exc:
            raise StoreError(f"session {self._sid}: commit failed: {exc}") from exc
        if statements:
            await self._flush(statements, token, tx.rows, rest)
        await self._store._announce_cancels(self._sid, tx.cancels)

    async def run_tool(self, step: ToolStep[T]) -> T:
        # The step runs on a worker thread, where the tool's SQL may block; if the
        # tool used ctx.store, its transaction commits there with the step's rows.
        store = self._store
        token = await self._fence_token()
        ran: tuple[T, Sequence[Write], PgTransaction] = await store._call(
            self._run_step, step, token
        )
        result, writes, thread_tx = ran
        if thread_tx.flushed:
            await store._announce_cancels(self._sid, thread_tx.cancels)
        else:  # the tool never used ctx.store: its rows go like any engine commit
            await self._send(writes, token)
        return result

    def _run_step(
        self, step: ToolStep[T], token: str | None
    ) -> tuple[T, Sequence[Write], PgTransaction]:
        store = self._store
        tx = PgTransaction(
            self._sid, store.schema, store._payloads, store.sync_pool, store.connect_timeout
        )
        try:
            try:
                result, writes = step(tx.handle)
                if tx.checkout_failed is not None:  # the tool caught it; the step cannot land
                    raise tx.no_connection(tx.checkout_failed)
                if tx.opened is not None:
                    apply_writes(tx, writes)
                    tx.flush(token)
            except BaseException as exc:
                if tx.checkout_failed is not None:
                    raise tx.no_connection(tx.checkout_failed) from exc
                conn = tx.opened
                if conn is None:
                    raise
                rollback_quietly(conn)
                raise commit_error(self._sid, connection_lost(conn), exc) from exc
        finally:
            tx.release()
        return result, writes, tx

    async def _flush(
        self,
        statements: list[wire.Statement],
        token: str | None,
        rows: Rows,
        rest: list[wire.Statement],
    ) -> None:
        """The fence and ``statements`` (``rows``' inserts, then ``rest``) as one
        pipelined request (one implicit transaction: any failing statement undoes
        them all), sent by the store's group committer, which may merge them with
        other sessions' commits."""
        fence = (self._sid, token) if token is not None else None
        if fence is not None:
            fenced = wire.Query(pg_wire(FENCE, self._store.schema), wire.values(fence))
            statements.insert(0, fenced)
        await self._store._committer.commit(self._sid, statements, (fence, rows, rest))

    async def turn(self, turn_id: str) -> TurnRecord | None:
        statement = pg_wire(sql.TURN, self._store.schema)

        async def read(conn: psycopg.AsyncConnection[Any]) -> TurnRecord | None:
            res = await run_prepared(conn, b"turnkit_turn", statement, (self._sid, turn_id))
            return turn_row(res, 0, 0, self._store._payloads) if res.ntuples else None

        return await self._store._read(f"turn {turn_id}", read, of=self._sid)

    async def spend(self, tenant: str) -> tuple[Spend, Spend]:
        """What this session spent, and what ``tenant`` did (see ``UsageLedger``)."""
        params = usage_sql.spend_params(self._sid, tenant)
        rows = await self._store._select(
            f"the spend of session {self._sid}", usage_sql.SPEND, params, tuple
        )
        return usage_sql.split_spend(rows)

    async def cancel_reason(self, turn_id: str) -> str | None:
        # Announced cancellations are heard at once (see _listen); the turn's row
        # is read besides at most every CANCEL_POLL seconds per delivery, for one
        # whose announcement was lost. The step hot path pays no round trip between.
        now = time.monotonic()
        seen_turn, polled, reason = self._cancel_poll
        announced = self._store._listener.heard(self._sid, turn_id)
        fresh = now - polled < CANCEL_POLL
        if seen_turn == turn_id and not announced and (reason is not None or fresh):
            return reason
        record = await self.turn(turn_id)
        reason = record.cancel_reason if record is not None else None
        self._cancel_poll = (turn_id, now, reason)
        return reason

    async def events(self, *, turn_id: str | None = None, after: int = 0) -> list[TurnEvent]:
        what = f"events of session {self._sid}"
        load, sid = self._store._payloads.load, self._sid

        def event(row: Any) -> TurnEvent:
            return event_from_dict(load(sid, "event", row[0]))

        if turn_id is None:
            return await self._select(what, sql.EVENTS, (after,), event)
        return await self._select(what, sql.TURN_EVENTS, (turn_id, after), event)

    async def generations(self) -> list[int]:
        what = f"generations of session {self._sid}"
        return await self._select(what, archive_sql.GENERATIONS, (), lambda r: int(r[0]))

    async def archived_messages(self, generation: int) -> list[Message]:
        what = f"session {self._sid} generation {generation}"
        load, sid = self._store._payloads.load, self._sid

        def message(row: Any) -> Message:
            return message_from_dict(load(sid, "message", row[0]))

        return await self._select(what, archive_sql.ARCHIVED_MESSAGES, (generation,), message)

    async def unfinished(self) -> list[TurnRecord]:
        # Every submission reads it: on the wire and prepared, as ``turn`` reads.
        statement = pg_wire(sql.UNFINISHED, self._store.schema)

        async def read(conn: psycopg.AsyncConnection[Any]) -> list[TurnRecord]:
            res = await run_prepared(conn, b"turnkit_unfinished", statement, (self._sid,))
            payloads = self._store._payloads
            return [turn_row(res, row, 0, payloads) for row in range(res.ntuples)]

        return await self._store._read(f"session {self._sid}", read, of=self._sid)

    async def status(self) -> SessionStatus:
        statement = pg_wire(sql.STATUS, self._store.schema)

        async def read(conn: psycopg.AsyncConnection[Any]) -> SessionStatus:
            res = await run_prepared(conn, b"turnkit_status", statement, (self._sid,))
            return cast(SessionStatus, as_text(res.get_value(0, 0))) if res.ntuples else "new"

        return await self._store._read(f"session {self._sid}", read, of=self._sid)

    async def _select(
        self, what: str, statement: str, params: tuple[Any, ...], row: Callable[[Any], T]
    ) -> list[T]:
        """The rows of a shared ``statement`` whose first value is this session's id."""
        return await self._store._select(what, statement, (self._sid, *params), row, of=self._sid)


#: Who holds (or last held) a session's writer lock.
_WRITER_OF = "SELECT holder, since FROM turnkit_writers WHERE session_id = ?"


@dataclass(frozen=True)
class SessionWriter:
    """The process that last took a session's writer lock (``holder``: ``host:pid:id``)
    and when it took it (``since``, seconds since the epoch)."""

    holder: str
    since: float


class PostgresStore:
    """Sessions in a PostgreSQL database (``dsn`` is a libpq connection string or URL).

    ``schema`` holds turnkit's tables (created if missing); local tools' statements
    resolve names in it first, then in ``public``. ``max_size`` bounds the event
    loop's connection pool, and also the second pool (opened lazily) and the worker
    threads that local tools using ``ctx.store`` run on; besides them the store keeps
    one lock connection and up to ``commit_senders`` commit connections. ``busy_timeout`` is how
    long, in seconds, a delivery waits for a session another process is running
    before raising ``SessionBusyError``. ``commit_senders`` is how many step
    commits are in flight at once (at most ``max_size``): commits that arrive while
    all are busy go out together, in one transaction, as soon as one is free (see
    ``GroupCommitter``). Few senders make big groups; on the two-core machine of
    the benchmarks two beat ten by 1.5-2x at 100 sessions. A server with many cores
    may want more. ``relay_events`` carries live events to the other processes
    (see ``relay``).
    ``takeover`` sets how soon PostgreSQL frees the sessions of a
    process that went silent (see ``Takeover``). ``codec`` (a ``turnkit.Codec``, such
    as ``turnkit.crypto.EnvelopeCodec``) seals every payload the tables keep (see
    docs/security.md); the relay's live events are not sealed. ``blobs=True`` keeps
    the large parts of messages, step results and events over ``blob_threshold``
    bytes in ``turnkit_blobs``, once per turn, with a reference in their rows (see
    docs/stores.md).

    It is also a ``TurnQueue``: workers (``turnkit.Worker``) claim the turns it holds.
    """

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "public",
        min_size: int = 1,
        max_size: int = 10,
        busy_timeout: float = 30.0,
        connect_timeout: float = 10.0,
        commit_senders: int = 2,
        relay_events: bool = True,
        takeover: Takeover | None = None,
        codec: Codec | None = None,
        blobs: bool = False,
        blob_threshold: int = DEFAULT_BLOB_THRESHOLD,
    ) -> None:
        if not SCHEMA_NAME.match(schema):
            raise ConfigurationError(
                f"PostgresStore schema {schema!r} must be a plain identifier "
                "(letters, digits and _, not starting with a digit)"
            )
        if commit_senders < 1:
            raise ConfigurationError(
                f"PostgresStore needs commit_senders >= 1, got {commit_senders}"
            )
        if not 1 <= min_size <= max_size:
            raise ConfigurationError(
                f"PostgresStore needs 1 <= min_size <= max_size, got {min_size} and {max_size}"
            )
        self.dsn = dsn
        self.schema = schema
        #: Reads what payloads over ``blob_threshold`` bytes left in ``turnkit_blobs``.
        #: It reads them whether or not this store writes any (``blobs``), so a
        #: store opened without ``blobs=True`` still reads rows that refer to them.
        self._blobs = BlobReader(self._connect_blobs, schema)
        #: What every payload goes through on its way in and out (see ``Codec``).
        self._payloads = Payloads(
            codec, threshold=blob_threshold if blobs else None, get_blob=self._blobs.get
        )
        self.min_size = min_size
        self.max_size = max_size
        self.connect_timeout = connect_timeout
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._apool: AsyncConnectionPool[Any] | None = None
        self._kwargs: dict[str, Any] | None = None
        self._pool: ConnectionPool[Any] | None = None
        self._store_id: str | None = None
        self._executor: ToolThreads | None = None
        if takeover is not None and not isinstance(takeover, Takeover):
            raise ConfigurationError(
                f"PostgresStore takeover must be a Takeover, got {type(takeover).__name__}"
            )
        #: How soon PostgreSQL frees the sessions of a process that went silent.
        self.takeover = takeover if takeover is not None else Takeover()
        self._writers = Writers(self._connect, schema, self.holder, busy_timeout, self.takeover)
        self._listener = CancelListener(self._connect, schema)
        self._relay = PgEventRelay(self._connect, schema) if relay_events else None
        self.commit_senders = commit_senders
        self._committer = GroupCommitter(
            self._connect, schema, senders=min(commit_senders, max_size)
        )

    # -- lifecycle ---------------------------------------------------------------

    def _connect_kwargs(self) -> dict[str, Any]:
        """What every connection of the store adds to the DSN: its search path is
        appended to the user's ``options`` (from the DSN, else ``PGOPTIONS``), so
        settings such as ``-c lock_timeout=300`` stay, and the user's
        ``application_name`` is kept if there is one."""
        if self._kwargs is None:
            given = conninfo.conninfo_to_dict(self.dsn)
            path = f"{self.schema},public" if self.schema != "public" else "public"
            theirs = str(given.get("options") or os.environ.get("PGOPTIONS") or "").strip()
            # The holder names the process on every event it logs (events.holder).
            named = self.holder.replace("\\", "\\\\").replace(" ", "\\ ")  # libpq's escapes
            ours = f"-c search_path={path} -c turnkit.holder={named}"
            name = given.get("application_name") or os.environ.get("PGAPPNAME")
            self._kwargs = {
                # TCP keepalives, unless the DSN chose its own.
                **{k: v for k, v in self.takeover.client_settings().items() if k not in given},
                "autocommit": True,
                "client_encoding": "utf8",
                "options": f"{theirs} {ours}".strip(),
                "application_name": str(name or f"turnkit-{self.schema}"[:63]),
                "connect_timeout": max(1, int(self.connect_timeout)),
            }
        return self._kwargs

    def _tool_connect_kwargs(self) -> dict[str, Any]:
        """The connections local tools run their step's transaction on: as every
        connection, plus ``idle_in_transaction_session_timeout`` (``Takeover.
        tool_idle_timeout``), so a process paused inside a ``def`` tool, whose open
        transaction would hold the session's fence for as long as it stays paused,
        loses that connection and the session can be taken over."""
        kwargs = dict(self._connect_kwargs())
        limit = self.takeover.tool_idle_limit
        if limit and "idle_in_transaction_session_timeout" not in kwargs["options"]:
            kwargs["options"] += f" -c idle_in_transaction_session_timeout={int(limit * 1000)}"
        return kwargs

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        """A new connection of the store's own (the lock and commit connections)."""
        if self._apool is None:
            raise self._not_open()
        return await psycopg.AsyncConnection.connect(self.dsn, **self._connect_kwargs())

    def _not_open(self) -> StoreError:
        return StoreError(
            "PostgresStore is not open: use it through `async with Runtime(...)` "
            "or await store.open() first"
        )

    @property
    def store_id(self) -> str:
        """The identity this schema was given when turnkit created its tables (random,
        kept in it): the same for every process and host that uses it."""
        if self._store_id is None:
            raise self._not_open()
        return self._store_id

    @property
    def async_pool(self) -> AsyncConnectionPool[Any]:
        if self._apool is None:
            raise self._not_open()
        return self._apool

    @property
    def sync_pool(self) -> ConnectionPool[Any]:
        if self._pool is None:
            raise self._not_open()
        return self._pool

    async def open(self) -> None:
        if self._apool is not None:
            return
        self._executor = ToolThreads(self.max_size + 1, "turnkit-pg")
        apool: AsyncConnectionPool[Any] | None = None
        try:
            await self._call(self._open_sync)
            apool = AsyncConnectionPool(
                self.dsn,
                min_size=self.min_size,
                max_size=self.max_size,
                kwargs=self._connect_kwargs(),
                check=check_idle_async,
                open=False,
                name=f"turnkit-{self.schema}-async",
            )
            try:
                await apool.open(wait=True, timeout=self.connect_timeout)
            except psycopg.Error as exc:
                raise StoreError(f"PostgresStore: cannot open the database: {exc}") from exc
            except Exception as exc:  # the pool's own timeout, for one
                raise StoreError(f"PostgresStore: cannot connect: {exc}") from exc
        except BaseException:
            if apool is not None:
                await apool.close()
            await self._shut()
            raise
        self._apool = apool
        self._listener.start()

    def _open_sync(self) -> None:
        try:
            with psycopg.connect(self.dsn, **self._connect_kwargs()) as conn:
                migrate(conn, self.schema)
                self._store_id = read_store_id(conn, self.schema)
                if self._relay is not None:
                    self._relay.key = read_relay_key(conn, self.schema)
            # Only local tools that use ctx.store take these connections: opened on demand.
            pool: ConnectionPool[Any] = ConnectionPool(
                self.dsn,
                min_size=0,
                max_size=self.max_size,
                kwargs=self._tool_connect_kwargs(),
                check=check_idle_connection,
                open=False,
                name=f"turnkit-{self.schema}",
            )
            pool.open(wait=False)
        except psycopg.Error as exc:
            raise StoreError(f"PostgresStore: cannot open the database: {exc}") from exc
        except Exception as exc:  # the pool's own timeout, for one
            raise StoreError(f"PostgresStore: cannot connect: {exc}") from exc
        self._pool = pool

    def _connect_blobs(self) -> psycopg.Connection[Any]:
        return psycopg.Connection.connect(self.dsn, **self._connect_kwargs())

    async def close(self) -> None:
        self._blobs.close()
        await self._listener.stop()
        if self._relay is not None:
            await self._relay.stop()
        await self._committer.close()
        await self._writers.close()
        apool, self._apool = self._apool, None
        if apool is not None:
            await apool.close()
        await self._shut()

    async def _shut(self) -> None:
        pool, self._pool = self._pool, None
        executor, self._executor = self._executor, None
        if executor is None:
            return
        if pool is not None:
            await on_thread(executor, pool.close)
        executor.shutdown()

    async def _announce_cancels(self, session_id: str, turn_ids: list[str]) -> None:
        """Tell every process listening that these turns' cancellation committed; a
        failure only delays it until their poll (see ``CANCEL_POLL``)."""
        if not turn_ids or self._apool is None:
            return
        payloads = [self._listener.payload(session_id, t) for t in turn_ids]
        try:
            async with self._apool.connection() as conn:
                await announce(conn, payloads)
        except psycopg.Error as exc:
            log.warning("announcing a cancellation on %s failed: %s", session_id, exc)

    # -- plumbing ----------------------------------------------------------------

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking ``fn`` on the store's threads, with the caller's context."""
        if self._executor is None:
            raise StoreError("PostgresStore is not open: await store.open() first")
        return await on_thread(self._executor, fn, *args)

    async def _read(
        self,
        what: str,
        fn: Callable[..., Awaitable[T]],
        *args: Any,
        of: str | None = None,
    ) -> T:
        """Run ``fn(conn, *args)`` on a connection of the event loop's pool, once the
        step commits in flight of session ``of`` (of every session if ``None``) have
        ended: a read never misses a commit this process sent before it."""
        if of is not None and self._writers.must_lock(of):
            await self._writers.acquire(of, claim=False)
        await self._committer.settled(of)
        pool = self.async_pool
        try:
            conn = await pool.getconn(timeout=self.connect_timeout)
        except Exception as exc:  # the pool's timeout, a failed reconnection
            raise StoreError(f"cannot read {what}: {exc}") from exc
        try:
            return await fn(conn, *args)
        except psycopg.Error as exc:
            await rollback_quietly_async(conn)
            raise StoreError(f"cannot read {what}: {exc}") from exc
        except ValueError as exc:
            raise StoreError(f"{what} holds data that is not valid JSON: {exc}") from exc
        except BaseException:
            await rollback_quietly_async(conn)
            raise
        finally:
            await pool.putconn(conn)

    async def _select(
        self,
        what: str,
        statement: str,
        params: tuple[Any, ...],
        row: Callable[[Any], T],
        *,
        of: str | None = None,
    ) -> list[T]:
        """The rows of a shared ``?``-style ``statement``, each made into ``row(r)``
        (a value that fails to decode is the read's ``StoreError``)."""
        query = pg(statement, self.schema)

        async def read(conn: psycopg.AsyncConnection[Any]) -> list[T]:
            cur = await conn.execute(query, params)
            return [row(r) for r in await cur.fetchall()]

        return await self._read(what, read, of=of)

    def election(self, name: str, *, interval: float = 1.0) -> PgElection:
        """The election for job ``name`` among every process on this schema: one
        leads at a time, through an advisory lock on a connection of its own; the
        others ask again every ``interval`` seconds (see ``_election``)."""
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"an election needs a non-empty name, got {name!r}")
        if isinstance(interval, bool) or not isinstance(interval, int | float) or interval <= 0:
            raise ConfigurationError(f"interval must be a positive number, got {interval!r}")
        return PgElection(self._connect, self.schema, name, interval=float(interval))

    @property
    def relay(self) -> PgEventRelay | None:
        """Carries live events (deltas, and hints that events were logged) to the other
        processes on this database over LISTEN/NOTIFY; ``None`` if ``relay_events``
        was turned off. Its connections open on first use (see ``_relay``)."""
        return self._relay

    @property
    def busy_timeout(self) -> float:
        """Seconds a delivery waits for a session another process is running."""
        return self._writers.busy_timeout

    @busy_timeout.setter
    def busy_timeout(self, seconds: float) -> None:
        self._writers.busy_timeout = seconds

    @property
    def largest_commit_group(self) -> int:
        """The most step commits (of any sessions) one transaction has carried so far:
        above 1 once commits queued behind busy senders went out together."""
        return self._committer.largest_group

    @property
    def faults(self) -> PgFaults:
        """Fault injection for tests of failure handling: see ``PgFaults``."""
        return PgFaults(self._writers)

    # -- the Store protocol ------------------------------------------------------

    def session(self, session_id: str) -> _PgSession:
        return _PgSession(self, session_id)

    async def session_page(
        self,
        *,
        agent: str | None = None,
        limit: int,
        after: SessionKey | None = None,
        owner: str | None = None,
    ) -> list[SessionInfo]:
        payloads = self._payloads if self._payloads.codec is not None else None
        text_of = _TEXT_OF if payloads is None else None
        query, params = sql.session_page_sql(agent, limit, after, text_of=text_of, owner=owner)
        return await self._select(
            "the session list", query, params, functools.partial(session_info, payloads=payloads)
        )

    async def unfinished_turns(self) -> list[TurnRecord]:
        return await self._select("unfinished turns", sql.UNFINISHED_TURNS, (), self._turn)

    async def due_turns(self, before: float, *, limit: int) -> list[TurnRecord]:
        """See ``turnkit.stores.TimerStore``."""
        return await self._select("due turns", DUE_TURNS_SQL, (before, limit), self._turn)

    async def next_wake(self) -> float | None:
        """See ``turnkit.stores.TimerStore``."""
        rows = await self._select("the next wake", NEXT_WAKE_SQL, (), tuple)
        return None if not rows or rows[0][0] is None else float(rows[0][0])

    def _turn(self, row: Any) -> TurnRecord:
        """A turn from a row of ``TURN_COLUMNS``, its payloads opened."""
        return self._payloads.turn_from_row(row)

    async def parked_turns(
        self, *, limit: int, after: tuple[float, str, str] | None = None
    ) -> list[TurnRecord]:
        """See ``turnkit.stores.InboxStore``."""
        start = after or (float("-inf"), "", "")
        return await self._select("parked turns", sql.PARKED_TURNS, (*start, limit), self._turn)

    async def idle_sessions(
        self, before: float, *, limit: int, after: tuple[float, str] | None = None
    ) -> list[tuple[float, str]]:
        """See ``turnkit.stores.PrunableStore``."""
        start = after or (float("-inf"), "")
        params = (before, *start, limit)
        rows = await self._select("idle sessions", retention_sql.IDLE_SESSIONS, params, tuple)
        return [(float(at), str(sid)) for at, sid in rows]

    async def old_generations(
        self, before: float, *, limit: int, after: tuple[float, str, int] | None = None
    ) -> list[tuple[float, str, int]]:
        """See ``turnkit.stores.PrunableStore``."""
        start = after or (float("-inf"), "", -1)
        params = (before, *start, limit)
        rows = await self._select("old generations", retention_sql.OLD_GENERATIONS, params, tuple)
        return [(float(at), str(sid), int(g)) for at, sid, g in rows]

    async def ended_turns(
        self, before: float, *, limit: int, after: tuple[float, str, str] | None = None
    ) -> list[tuple[float, str, str]]:
        """See ``turnkit.stores.PrunableStore``."""
        start = after or (float("-inf"), "", "")
        params = (before, *start, limit)
        rows = await self._select("ended turns", retention_sql.ENDED_TURNS, params, tuple)
        return [(float(at), str(sid), str(tid)) for at, sid, tid in rows]

    # -- the RateStore protocol (docs/tenants.md) --------------------------------

    async def rate_take(
        self,
        key: str,
        requests: int | None,
        tokens: int | None,
        window: float,
        slack: float,
        stale: float,
    ) -> tuple[float, int | None]:
        rows = await self._rate(
            "SELECT wait, taken FROM turnkit_rate_take(?, ?, ?, ?, ?, ?)",
            (key, requests, tokens, float(window), float(slack), float(stale)),
        )
        wait, taken = rows[0]
        return float(wait), (int(taken) if taken is not None else None)

    async def rate_done(self, key: str, ticket: int, tokens: int) -> None:
        await self._rate(
            "UPDATE turnkit_rate_log SET tokens = ?, "
            "done = extract(epoch FROM clock_timestamp()) WHERE key = ? AND ticket = ?",
            (tokens, key, ticket),
        )

    async def rate_block(self, key: str, until: float) -> None:
        await self._rate(
            "INSERT INTO turnkit_rate_blocks AS b (key, until) VALUES (?, ?) "
            "ON CONFLICT (key) DO UPDATE SET until = GREATEST(b.until, excluded.until)",
            (key, float(until)),
        )

    async def _rate(self, statement: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        """Run a rate-limit statement in a transaction of its own (a take's lock on its
        limit is held until that transaction ends)."""
        query = pg(statement, self.schema)
        try:
            pool = self.async_pool
            async with pool.connection(timeout=self.connect_timeout) as conn, conn.transaction():
                cur = await conn.execute(query, params)
                return list(await cur.fetchall()) if cur.description else []
        except psycopg.Error as exc:
            raise StoreError(f"rate limit: {exc}") from exc
        except Exception as exc:  # the pool's timeout
            raise StoreError(f"rate limit: {exc}") from exc

    async def usage_by_tenant(self) -> dict[str, Spend]:
        """What each tenant spent on model calls (see ``UsageLedger``)."""
        rows = await self._select("usage by tenant", usage_sql.BY_TENANT, (), tuple)
        return {str(r[0]): usage_sql.spend_of(r) for r in rows}

    async def turn_counts(self) -> dict[str, int]:
        """How many turns are ``queued``, ``running`` and ``suspended`` (for monitoring)."""
        rows = await self._select("turn counts", sql.TURN_COUNTS, (), tuple)
        return {"queued": 0, "running": 0, "suspended": 0} | {str(s): int(n) for s, n in rows}

    async def writer_of(self, session_id: str) -> SessionWriter | None:
        """The process that last took ``session_id``'s writer lock, and when: after a
        takeover, the one that took it over (``None`` if no process ever held it).
        ``holder`` is that process's ``PostgresStore.holder``, ``host:pid:id``, which a
        worker prints when it starts."""
        rows = await self._select(
            f"the writer of session {session_id}", _WRITER_OF, (session_id,), tuple
        )
        return SessionWriter(holder=str(rows[0][0]), since=float(rows[0][1])) if rows else None

    # -- the TurnQueue protocol --------------------------------------------------

    async def claim(
        self,
        agents: Sequence[str],
        *,
        limit: int,
        skip: Collection[str] = (),
        serving: Serving | None = None,
        concurrency: Concurrency = UNCAPPED,
    ) -> list[TurnRecord | PendingReset]:
        self._listener.work.clear()  # a notification from now on wakes the next wait
        if limit < 1 or not agents:
            return []
        serving = serving or Serving()
        names, skipped = json.dumps(list(agents)), json.dumps(list(skip))
        serves = None if serving.serves is None else json.dumps(sorted(serving.serves))
        own = json.dumps(dict(serving.own))
        caps = json.dumps(dict(concurrency.tenants))
        params = (
            *(caps, concurrency.per_tenant),  # tenants' caps
            *(names, skipped, serves, serves, limit),  # runnable turns
            limit,  # free slots
            *(names, skipped, limit),  # pending resets
            *(serving.retry_held, own, names, skipped, serves, serves, limit),  # held turns
            limit,
        )
        statement = wire.Query(pg_wire(CLAIM_SQL, self.schema), wire.values(params))
        try:
            res = await self._writers.claim(statement, slot_column=2 + TURN_COLUMN_COUNT)
        except StoreError as exc:
            raise StoreError(f"claiming turns failed: {exc}") from exc
        return [
            turn_row(res, row, 2, self._payloads)
            if res.get_value(row, 3) is not None
            else PendingReset(
                session_id=as_text(res.get_value(row, 0)) or "",
                agent=as_text(res.get_value(row, 1)) or "",
            )
            for row in range(res.ntuples)
        ]

    def unclaim(self, session_id: str) -> None:
        self._writers.unclaim(session_id)

    # -- the WorkerRegistry protocol ---------------------------------------------

    async def worker_seen(self, own: Mapping[str, str], serves: Collection[str] | None) -> None:
        served = None if serves is None else json.dumps(sorted(serves))
        params = (self.holder, json.dumps(dict(own)), served)
        await self._select("the live workers", WORKER_SEEN_SQL, params, tuple)

    async def worker_gone(self) -> None:
        params = (self.holder, WORKER_FORGOTTEN)
        await self._select("the live workers", WORKER_GONE_SQL, params, tuple)

    async def unserved_turns(self) -> list[tuple[str, str, int]]:
        rows = await self._select("unserved turns", UNSERVED_SQL, (WORKER_ALIVE,), tuple)
        return [(str(agent), str(version), int(n)) for agent, version, n in rows]

    # -- the WorkerView protocol -------------------------------------------------

    async def live_workers(self) -> list[LiveWorker]:
        rows = await self._select("the live workers", LIVE_WORKERS_SQL, (WORKER_ALIVE,), tuple)
        return [
            LiveWorker(
                holder=str(holder),
                agents={str(k): str(v) for k, v in json.loads(agents).items()},
                serves=None if serves is None else tuple(str(v) for v in json.loads(serves)),
                seen_at=float(seen),
            )
            for holder, agents, serves, seen in rows
        ]

    async def held_sessions(self, *, limit: int) -> list[HeldSession]:
        rows = await self._select("the running turns", HELD_SESSIONS_SQL, (limit,), tuple)
        return [
            HeldSession(
                session_id=str(sid),
                turn_id=str(tid),
                agent=str(agent),
                tenant=str(tenant),
                holder=None if holder is None else str(holder),
                since=None if since is None else float(since),
            )
            for sid, tid, agent, tenant, holder, since in rows
        ]

    async def sessions_of_tenant(self, tenant: str, session_ids: Sequence[str]) -> set[str]:
        """See ``turnkit.stores.TenantView``."""
        params = (tenant, json.dumps(list(session_ids)))
        what = f"the sessions of tenant {tenant!r}"
        rows = await self._select(what, SESSIONS_OF_TENANT_SQL, params, tuple)
        return {str(row[0]) for row in rows}

    async def event_writers(self, session_id: str) -> dict[int, str]:
        rows = await self._select(
            f"the writers of session {session_id}", EVENT_WRITERS_SQL, (session_id,), tuple
        )
        return {int(seq): str(holder) for seq, holder in rows}

    async def wait_for_turns(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._listener.work.wait(), timeout)


#: Where the session's columns start in a load's row: after the turn's, at column 5.
_OWNER = 5 + TURN_COLUMN_COUNT


def _erasure(res: PGresult) -> Erasure | None:
    """The tombstone columns of a load's row (see ``LOAD_SQL``)."""
    at = res.get_value(0, _OWNER + 3)
    return None if at is None else Erasure(as_text(res.get_value(0, _OWNER + 2)), float(at))
