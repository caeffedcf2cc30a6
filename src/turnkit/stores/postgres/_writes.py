"""PostgresStore's transactions: the writes a step buffers (rendered to SQL as the
engine makes them), the loop and thread transactions that carry them, and the
handle a local tool sees as ``ctx.store``."""

from __future__ import annotations

import functools
import logging
import re
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any, TypeVar

import psycopg
from psycopg import errors as pg_errors
from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool

from ..._errors import (
    FatalToolError,
    FencedError,
    GenerationArchivedError,
    StoreError,
    TurnMoveError,
    WriteConflictError,
)
from ..._seams.store import StoreHandle
from ..._values.events import TurnEvent
from ..._values.messages import Message
from ..._values.records import SessionStatus, TurnRecord, TurnStatus
from ..._values.writes import CountUsage
from .. import _archive_sql as archive_sql
from .. import _erase_sql as erase_sql
from .. import _retention_sql as retention_sql
from .. import _sql as sql
from .. import _usage_sql as usage_sql
from .._payloads import Payloads
from .._sql_rows import move_values, new_turn_values, refused_move
from . import _blobs as blob_sql
from . import _wire as wire
from ._queue import CHANNEL as WAKE_CHANNEL
from ._queue import WAKE_SQL
from ._schema import FENCE_SQLSTATE, MISSING_SQLSTATE, MOVE_SQLSTATE
from ._statements import (
    ABORTED,
    ENDED,
    TRANSACTION_CONTROL,
    NoConnection,
    connection_lost,
    pg_wire,
    qmark_to_pyformat,
)

T = TypeVar("T")
log = logging.getLogger("turnkit.stores.postgres")


_Write = tuple[str, tuple[Any, ...]]
#: A step commit's writer fence (see ``_writer``).
FENCE = "SELECT turnkit_fence(?, ?)"
#: The table an archive writes a generation's row to: a unique violation there is a
#: generation another reset archived first.
GENERATIONS = "turnkit_generations"


class _Writes:
    """The engine's writes of one commit, buffered as the shared ``?``-style
    statements (``_sql``) and their values, to send in one request."""

    def __init__(self, session_id: str, schema: str, payloads: Payloads) -> None:
        self._sid = session_id
        self.schema = schema
        self._payloads = payloads
        self._dump = payloads.dumper(self._put_blob)
        self.writes: list[_Write] = []
        #: The turns whose cancellation this commit records (announced once it lands).
        self.cancels: list[str] = []
        self._wakes = False

    def _wake_workers(self) -> None:
        """Notify the workers in this commit: it makes a turn runnable."""
        if not self._wakes:
            self._wakes = True
            self.writes.append((WAKE_SQL, (WAKE_CHANNEL, self.schema)))

    def _put_blob(self, session_id: str, turn_id: str, name: str, data: bytes) -> None:
        """A blob goes in with the rows that refer to it, in the same transaction."""
        self.writes.append((blob_sql.PUT, (session_id, turn_id, name, blob_sql.as_text(data))))

    def statements(self) -> list[wire.Statement]:
        """Every write as one statement, its values bound."""
        schema = self.schema
        return [wire.Query(pg_wire(q, schema), wire.values(p)) for q, p in self.writes]

    def append_message(self, index: int, message: Message) -> None:
        turn_id = message.turn_id
        body = self._dump(self._sid, "message", message.to_dict(), turn_id)
        self.writes.append((sql.INSERT_MESSAGE, (self._sid, index, turn_id, body)))

    def put_step(self, step_id: str, turn_id: str, result: Any) -> None:
        stored = self._dump(self._sid, "step", result, turn_id)
        self.writes.append((sql.INSERT_STEP, (self._sid, turn_id, step_id, stored)))

    def count_usage(self, w: CountUsage) -> None:
        self.writes += usage_sql.count_statements(self._sid, w)

    def log_event(self, event: TurnEvent) -> None:
        turn_id = event.turn_id
        body = self._dump(self._sid, "event", event.to_dict(), turn_id)
        self.writes.append((sql.INSERT_EVENT, (self._sid, event.seq, turn_id, body)))

    def request_cancel(self, turn_id: str, reason: str) -> None:
        self.cancels.append(turn_id)
        missing = f"session {self._sid}: no turn {turn_id} to cancel"
        self.writes.append((_REQUEST_CANCEL_CHECKED, (reason, self._sid, turn_id, missing)))
        self._wake_workers()  # a parked turn is runnable once cancelled

    def archive_generation(self, generation: int, agent: str) -> None:
        self.writes += archive_sql.reset_statements(self._sid, agent, generation, time.time())
        self._wake_workers()  # queued turns stay, to run in the new generation

    def erase_session(self, by: str | None) -> None:
        self.writes += erase_sql.erase_statements(self._sid, by, time.time())
        self.writes.append((blob_sql.ERASE, (self._sid,)))

    def drop_generation(self, generation: int) -> None:
        # Its blobs first: which turns are the generation's is read from its rows.
        sid = self._sid
        self.writes.append((blob_sql.DROP_GENERATION, (sid, sid, generation, generation)))
        self.writes += retention_sql.drop_generation_statements(self._sid, generation)

    def trim_events(self, turn_id: str) -> None:
        self.writes += retention_sql.trim_events_statements(self._sid, turn_id)

    def prune_session(self, idle_before: float) -> None:
        self.writes += retention_sql.prune_session_statements(self._sid, idle_before)
        self.writes.append((blob_sql.PRUNE, (self._sid, self._sid)))

    def request_reset(self) -> None:
        self.writes += archive_sql.request_reset_statements(self._sid, time.time())
        self._wake_workers()  # parked turns it cancels are runnable

    def drop_reset(self) -> None:
        self.writes.append((archive_sql.DROP_RESET, (self._sid,)))
        self._wake_workers()  # the queued turns behind it may run

    def put_turn(
        self,
        record: TurnRecord,
        expect: TurnStatus | None,
        session_status: SessionStatus | None,
        owner: str | None,
    ) -> None:
        sid, now = self._sid, time.time()
        refusal = refused_move(sid, record, expect)
        new = expect is None
        if expect is None:
            values = new_turn_values(sid, record, None, self._payloads, self._dump)
        else:
            values = move_values(sid, record, expect, self._payloads, self._dump)
        # The session's row goes in the same statement as the turn's.
        session: tuple[str | None, tuple[Any, ...]] = (None, ())
        if session_status is not None:
            session = (sql.PUT_SESSION, (sid, record.agent, session_status, now, now, owner))
        elif new:
            session = (sql.SESSION_SEEN, (sid, record.agent, now, now, owner))
        statement = _PUT_TURN_CHECKED[new, session[0]]
        self.writes.append((statement, (*values, *session[1], refusal)))
        if record.status == "queued" or expect == "suspended":
            self._wake_workers()  # runnable by any worker: submitted, or answered


#: PostgreSQL checks an update's row count on the server (``turnkit_expect_one``), so
#: a pipelined commit fails before its end rather than after.
_REQUEST_CANCEL_CHECKED = (
    f"WITH t AS ({archive_sql.REQUEST_CANCEL} RETURNING 1) "
    "SELECT turnkit_expect_one(count(*), ?) FROM t"
)


def _put_turn_checked(new: bool, session: str | None) -> str:
    """A turn's put (its insert if ``new``, else its move) and, if given, the
    ``session`` statement putting its session's row, as ONE statement (one execution
    on the server instead of two), the turn's row count checked on the server
    (``turnkit_expect_moved``). The two touch different tables, so it does not
    matter that PostgreSQL runs a statement's parts in no set order; if the check
    fails, neither lands."""
    turn = sql.PG_NEW_TURN if new else sql.MOVE_TURN
    also = f", s AS ({session})" if session is not None else ""
    return f"WITH t AS ({turn} RETURNING 1){also} SELECT turnkit_expect_moved(count(*), ?) FROM t"


#: Every turn put's statement, by whether the turn is new and its session statement.
_PUT_TURN_CHECKED = {
    (new, session): _put_turn_checked(new, session)
    for new in (True, False)
    for session in (None, sql.PUT_SESSION, sql.SESSION_SEEN)
}


class LoopTransaction(_Writes):
    """A commit made from the event loop, its writes buffered until they go out in
    one pipelined request."""

    def __init__(self, session_id: str, schema: str, payloads: Payloads) -> None:
        super().__init__(session_id, schema, payloads)
        self.rows = Rows()

    # The rows of every step: the hot path. Each table's rows go in as one
    # multi-row INSERT (see ``statements``).

    def append_message(self, index: int, message: Message) -> None:
        turn_id = message.turn_id
        body = self._dump(self._sid, "message", message.to_dict(), turn_id)
        self.rows.messages += (self._sid, index, turn_id, body)

    def put_step(self, step_id: str, turn_id: str, result: Any) -> None:
        stored = self._dump(self._sid, "step", result, turn_id)
        self.rows.steps += (self._sid, turn_id, step_id, stored)

    def log_event(self, event: TurnEvent) -> None:
        turn_id = event.turn_id
        body = self._dump(self._sid, "event", event.to_dict(), turn_id)
        self.rows.events += (self._sid, event.seq, turn_id, body)

    def statements(self) -> list[wire.Statement]:
        return [*self.rows.statements(self.schema), *self.rest()]

    def rest(self) -> list[wire.Statement]:
        """The statements of every write but the step, message and event rows."""
        return super().statements()


class Rows:
    """A commit's step, message and event rows (four values a row, in column order):
    rows of several commits can share one INSERT per table (see ``GroupCommitter``)."""

    __slots__ = ("events", "messages", "steps")

    def __init__(self) -> None:
        self.steps: list[Any] = []
        self.messages: list[Any] = []
        self.events: list[Any] = []

    def extend(self, other: Rows) -> None:
        self.steps += other.steps
        self.messages += other.messages
        self.events += other.events

    def statements(self, schema: str) -> list[wire.Statement]:
        out: list[wire.Statement] = []
        for insert, values in (
            (sql.INSERT_STEP, self.steps),
            (sql.INSERT_MESSAGE, self.messages),
            (sql.INSERT_EVENT, self.events),
        ):
            if values:
                statement = _multi_row(insert, len(values) // 4, schema)
                out.append(wire.Query(statement, wire.values(values)))
        return out


@functools.cache
def _multi_row(insert: str, rows: int, schema: str) -> bytes:
    """``insert`` (a one-row INSERT of four values) for ``rows`` rows."""
    head, one = insert.split(" VALUES ")
    return pg_wire(f"{head} VALUES {', '.join([one] * rows)}", schema)


class _PgHandle:
    """``ctx.store`` for local tools on PostgreSQL."""

    def __init__(self, tx: PgTransaction) -> None:
        self._tx = tx

    def unwrap(self) -> psycopg.Connection[Any]:
        """The psycopg connection, inside the step's open transaction."""
        self._tx.begin()
        self._tx.exposed = True
        return self._tx.conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one statement with ``?`` placeholders in the step's transaction.

        The statement runs under a savepoint: if it fails, only it is undone and the
        error propagates, just as one failed statement does on SQLite.
        """
        if TRANSACTION_CONTROL.match(sql):
            raise FatalToolError(f"{ENDED}: refused {sql.split()[0].upper()}")
        if _DROPS_PREPARED.match(sql):
            self._tx.exposed = True
        conn = self._tx.conn
        opening = self._tx.begin_with_next()
        query = qmark_to_pyformat(sql) if params else sql
        try:
            with conn.pipeline():  # one round trip, the step's BEGIN included
                if opening:
                    conn.execute("BEGIN")
                conn.execute("SAVEPOINT turnkit_statement")
                cur = conn.execute(query, tuple(params) if params else None)
                conn.execute("RELEASE SAVEPOINT turnkit_statement")
        except psycopg.Error:
            if not connection_lost(conn):
                conn.execute("ROLLBACK TO SAVEPOINT turnkit_statement")
                conn.execute("RELEASE SAVEPOINT turnkit_statement")
            raise
        rows = cur.fetchall() if cur.description is not None else []
        self._tx.check_open()
        return rows

    def transient(self, exc: BaseException) -> bool:
        """A lock timeout, a serialization failure or deadlock, the server shutting
        down, or a lost connection: a retry may well succeed."""
        if not isinstance(exc, psycopg.Error):
            return False
        state = exc.sqlstate or ""
        if state in _TRANSIENT_STATES or state[:2] in _TRANSIENT_CLASSES:
            return True
        conn = self._tx.opened
        return isinstance(exc, psycopg.OperationalError) and (conn is None or connection_lost(conn))


#: SQLSTATEs of passing failures: lock_not_available (``lock_timeout``), the server
#: shutting down or restarting, too many connections.
_TRANSIENT_STATES = frozenset({"55P03", "57P01", "57P02", "57P03", "53300"})
#: ... and whole classes: connection exceptions, transaction rollbacks
#: (serialization failure, deadlock).
_TRANSIENT_CLASSES = frozenset({"08", "40"})


class PgTransaction(_Writes):
    """A local tool's step (``run_tool``), run on a worker thread.

    A connection is taken from the sync pool, and ``BEGIN`` sent, only when the
    tool first touches ``ctx.store``; a tool that never does leaves its rows
    buffered, to be sent from the event loop like any engine-only commit."""

    def __init__(
        self,
        session_id: str,
        schema: str,
        payloads: Payloads,
        pool: ConnectionPool[Any],
        timeout: float,
    ) -> None:
        super().__init__(session_id, schema, payloads)
        self._pool = pool
        self._timeout = timeout
        self._conn: psycopg.Connection[Any] | None = None
        self._begun = False
        self.checkout_failed: BaseException | None = None
        self.flushed = False
        #: Whether the tool had the connection to itself (``unwrap``) or ran a
        #: statement that drops prepared statements: then the step's own statements
        #: go unprepared (the ones prepared before may be gone).
        self.exposed = False

    @property
    def handle(self) -> StoreHandle:
        return _PgHandle(self)

    @property
    def opened(self) -> psycopg.Connection[Any] | None:
        return self._conn

    @property
    def conn(self) -> psycopg.Connection[Any]:
        if self._conn is None:
            if self.checkout_failed is not None:
                raise self.no_connection(self.checkout_failed)
            try:
                self._conn = self._pool.getconn(timeout=self._timeout)
            except Exception as exc:
                self.checkout_failed = exc
                raise self.no_connection(exc) from exc
        return self._conn

    def no_connection(self, exc: BaseException) -> StoreError:
        return StoreError(f"session {self._sid}: no database connection: {exc}")

    def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            if self.exposed:
                _plans_of(conn).forget()
            self._pool.putconn(conn)

    def begin_with_next(self) -> bool:
        """Whether the step's ``BEGIN`` is still to be sent: then the caller sends it
        ahead of its first statement, in the same round trip, and from here on the
        transaction counts as begun; else the transaction is checked to be open."""
        if self._begun:
            self.check_open()
            return False
        self._begun = True
        return True

    def begin(self) -> None:
        if not self._begun:
            self.conn.execute("BEGIN")
            self._begun = True
        else:
            self.check_open()

    def check_open(self) -> None:
        if self.conn.info.transaction_status == TransactionStatus.IDLE:
            raise FatalToolError(ENDED)

    def flush(self, token: str | None) -> None:
        """Send the fence, the buffered writes and the COMMIT in one round trip."""
        conn = self.conn
        if conn.info.transaction_status == TransactionStatus.INERROR:
            raise FatalToolError(ABORTED)
        self.check_open()
        statements = self.statements()
        if token is not None:
            fence = wire.Query(pg_wire(FENCE, self.schema), wire.values((self._sid, token)))
            statements.insert(0, fence)
        statements.append(_COMMIT)
        # On libpq directly, as the loop's commits go: psycopg's cursor layer would
        # cost more CPU than the round trip itself (see ``_wire``).
        # A tool that had the connection to itself may have dropped what was prepared
        # on it: then nothing is (see ``release``).
        plans = wire.Plans() if self.exposed else _plans_of(conn)
        wire.exchange_blocking(conn, statements, plans)
        self.flushed = True


_COMMIT = wire.Query(b"COMMIT", ())
#: Statements that drop a connection's prepared statements (DISCARD cannot run in
#: the step's transaction; DEALLOCATE can).
_DROPS_PREPARED = re.compile(r"\s*(DEALLOCATE|DISCARD)\b", re.IGNORECASE)

#: The statements prepared on each connection of the tools' pool (they go with it).
_PLANS: weakref.WeakKeyDictionary[psycopg.Connection[Any], wire.Plans] = weakref.WeakKeyDictionary()
_PLANS_LOCK = threading.Lock()


def _plans_of(conn: psycopg.Connection[Any]) -> wire.Plans:
    with _PLANS_LOCK:
        plans = _PLANS.get(conn)
        if plans is None:
            plans = _PLANS[conn] = wire.Plans()
        return plans


def commit_error(sid: str, lost: bool, exc: BaseException) -> BaseException:
    """What a failed commit raises: the engine's own exceptions unchanged, unless the
    connection died under them (``lost``: a store outage, not a tool's failure)."""
    if isinstance(exc, NoConnection):
        return StoreError(f"session {sid}: no database connection: {exc.__cause__}")
    if lost:
        return StoreError(
            f"session {sid}: lost the database connection during a commit "
            f"({exc}); nothing of this step was kept: deliver the turn again"
        )
    if isinstance(exc, psycopg.Error):
        state = exc.sqlstate
        if state == FENCE_SQLSTATE:
            return FencedError(
                f"session {sid}: another process took the session over "
                f"({exc.diag.message_primary}); this step was not written"
            )
        if state == MISSING_SQLSTATE:
            return StoreError(str(exc.diag.message_primary or exc))
        if state == MOVE_SQLSTATE:
            return TurnMoveError(str(exc.diag.message_primary or exc))
        # Told apart by the violated table, a field of the server's diagnostics.
        if isinstance(exc, pg_errors.UniqueViolation) and exc.diag.table_name == GENERATIONS:
            return GenerationArchivedError(
                f"session {sid}: this generation was already archived (another reset came first)"
            )
        if isinstance(exc, pg_errors.UniqueViolation):
            return WriteConflictError(
                f"session {sid}: commit failed: {exc.diag.message_primary} "
                "(another writer advanced this session)"
            )
        if isinstance(exc, pg_errors.InFailedSqlTransaction):
            return FatalToolError(ABORTED)
        return StoreError(f"session {sid}: commit failed: {exc}")
    return exc
