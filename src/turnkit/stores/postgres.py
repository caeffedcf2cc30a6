"""``PostgresStore``: sessions in PostgreSQL, for deployments with many processes and hosts.

Needs ``turnkit[postgres]`` (psycopg 3 and its pool). Everything that runs no user
code (reads, the writer lock, and the commits of model steps, remote tools' results
and events) uses psycopg's asynchronous API on the event loop, which waits on the
socket and never blocks. A commit runs ``work`` on the loop first, with writes only
buffered; if ``work`` asks for ``tx.handle`` (the engine does so before it calls a
local tool, so no tool code has run yet) it is stopped there and run again on a
private worker thread, where a local tool's synchronous SQL joins the step's
transaction on a connection of a second, blocking pool.

A step commit is one round trip: the writer fence and the step's rows go as one
simple-protocol query (one implicit transaction), on the group committer's own
connections; a local tool that touches ``ctx.store`` first opens the transaction
and runs its statements one by one. A session has one writer across every process:
a delivery holds a session-level advisory lock (taken with its first load, in the
same round trip, on a lock connection that batches every session's acquisitions
and releases), and every commit re-checks a per-acquisition token, so a process that
lost its lock (its lock connection died) can never interleave a step with the new
holder's.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import hashlib
import json
import logging
import math
import os
import re
import select
import socket
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, TypeVar, cast

from .._errors import ConfigurationError, FatalToolError, SessionBusyError, StoreError
from .._events import TurnEvent, event_from_dict
from .._messages import JsonObject, Message, message_from_dict
from .._store import (
    TERMINAL_TURN_STATUSES,
    SessionInfo,
    SessionKey,
    SessionSnapshot,
    SessionStatus,
    StoreHandle,
    TurnRecord,
    TurnStatus,
    session_status_after,
)
from . import _archive_sql as archive_sql
from ._locks import SessionLocks
from ._postgres_schema import FENCE_SQLSTATE, MISSING_SQLSTATE, migrate
from ._sql_rows import TURN_COLUMNS as _TURN_COLUMNS
from ._sql_rows import dumps as _dumps
from ._sql_rows import session_page_sql
from ._sql_rows import turn_from_row as _turn_from_row

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg import generators as pg_generators
    from psycopg.pq import ExecStatus, TransactionStatus
    from psycopg.pq.abc import PGresult
    from psycopg_pool import AsyncConnectionPool, ConnectionPool
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "PostgresStore needs psycopg 3 and psycopg-pool: pip install 'turnkit[postgres]'"
    ) from exc

T = TypeVar("T")
log = logging.getLogger("turnkit.stores.postgres")

_SCHEMA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_TRANSACTION_CONTROL = re.compile(
    r"^\s*(BEGIN|START\s+TRANSACTION|COMMIT|END|ABORT|ROLLBACK(?!\s+(TRANSACTION\s+|WORK\s+)?TO\b)"
    r"|PREPARE\s+TRANSACTION)\b",
    re.IGNORECASE,
)
_ENDED = (
    "a local tool ended the step's transaction (commit or rollback on ctx.store); "
    "turnkit commits the step itself, so never end the transaction in a tool"
)
_ABORTED = (
    "a local tool left the step's transaction aborted (it caught a database error "
    "raised through ctx.store.unwrap()); use ctx.store.execute, which isolates each "
    "statement, or let the error propagate"
)


def qmark_to_pyformat(sql: str) -> str:
    """Rewrite ``?`` placeholders as psycopg's ``%s`` (and escape ``%``), leaving
    quoted strings, quoted identifiers, dollar-quoted bodies and comments alone.

    This is what lets one local tool's ``ctx.store.execute`` run on SQLite and
    PostgreSQL unchanged. PostgreSQL's ``?`` JSON operators therefore need
    ``unwrap()`` (or the equivalent functions, such as ``jsonb_exists``).
    """
    out: list[str] = []
    i, n = 0, len(sql)
    while i < n:
        ch = sql[i]
        if ch in "'\"":
            end = i + 1
            while end < n:
                if sql[end] == ch:
                    if end + 1 < n and sql[end + 1] == ch:  # doubled quote
                        end += 2
                        continue
                    break
                end += 1
            out.append(sql[i : end + 1].replace("%", "%%"))
            i = end + 1
        elif ch == "-" and sql.startswith("--", i):
            end = sql.find("\n", i)
            end = n if end < 0 else end
            out.append(sql[i:end].replace("%", "%%"))
            i = end
        elif ch == "/" and sql.startswith("/*", i):
            end = sql.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append(sql[i:end].replace("%", "%%"))
            i = end
        elif ch == "$" and (tag := re.match(r"\$([A-Za-z_][A-Za-z0-9_]*)?\$", sql[i:])):
            close = sql.find(tag.group(0), i + len(tag.group(0)))
            end = n if close < 0 else close + len(tag.group(0))
            out.append(sql[i:end].replace("%", "%%"))
            i = end
        elif ch == "?":
            out.append("%s")
            i += 1
        elif ch == "%":
            out.append("%%")
            i += 1
        else:
            out.append(ch)
            i += 1
    return "".join(out)


@functools.cache
def _pg(sql: str) -> str:
    """A shared ``?``-style statement in psycopg's placeholder style."""
    return qmark_to_pyformat(sql)


def _lock_key(schema: str, session_id: str) -> int:
    digest = hashlib.blake2b(f"{schema}\0{session_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _connection_lost(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    return bool(conn.closed or conn.broken)


def _rollback_quietly(conn: psycopg.Connection[Any]) -> None:
    if _connection_lost(conn) or conn.info.transaction_status == TransactionStatus.IDLE:
        return
    try:
        conn.execute("ROLLBACK")
    except psycopg.Error:
        log.debug("rollback after a failed commit failed too", exc_info=True)


def _check_idle_connection(conn: psycopg.Connection[Any]) -> None:
    """The sync pool's checkout check, free in the common case: an idle connection whose
    socket is readable has been sent something (a termination notice, EOF), so only
    then is it probed; a dead one is discarded before a step ever uses it."""
    if _connection_lost(conn):
        raise psycopg.OperationalError("connection is closed")
    readable, _, _ = select.select([conn.fileno()], [], [], 0)
    if readable:
        ConnectionPool.check_connection(conn)


async def _check_idle_async(conn: psycopg.AsyncConnection[Any]) -> None:
    """``_check_idle_connection`` for the event loop's pool (the ``select`` never waits)."""
    if _connection_lost(conn):
        raise psycopg.OperationalError("connection is closed")
    readable, _, _ = select.select([conn.fileno()], [], [], 0)
    if readable:
        await AsyncConnectionPool.check_connection(conn)


async def _rollback_quietly_async(conn: psycopg.AsyncConnection[Any]) -> None:
    if _connection_lost(conn) or conn.info.transaction_status == TransactionStatus.IDLE:
        return
    try:
        await conn.execute("ROLLBACK")
    except psycopg.Error:
        log.debug("rollback after a failed commit failed too", exc_info=True)


# -- the event loop's queries ---------------------------------------------------------
#
# The hot path (a delivery's load, the writer lock, every engine-only commit) sends
# each request as one simple-protocol query, its values quoted by libpq, and reads
# the raw results: psycopg's cursor layer costs several times the CPU of the round
# trip itself, and with many sessions in one process that CPU is what bounds the
# turns per second. Values are only ever str, int, float or None.


@functools.cache
def _template(sql: str) -> tuple[str, ...]:
    """``sql`` cut at its ``%s`` placeholders (``%%`` read as ``%``)."""
    out = [""]
    for part in re.split(r"(%s|%%)", sql):
        if part == "%s":
            out.append("")
        elif part == "%%":
            out[-1] += "%"
        else:
            out[-1] += part
    return tuple(out)


def _literal(value: Any) -> str:
    """``value`` as a SQL literal. Strings use the ``E''`` form, whose escaping (quotes
    and backslashes doubled) means the same whatever ``standard_conforming_strings``
    says; the query is sent as UTF-8, the connections' client encoding. A NUL, which
    no text field can hold, is refused when the whole query is encoded (``_encode``)."""
    if type(value) is str:
        return "E'" + value.replace("\\", "\\\\").replace("'", "''") + "'"
    if type(value) is int:
        return int.__repr__(value)
    if value is None:
        return "NULL"
    if isinstance(value, str):
        return _literal(str.__str__(value))
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        text = float.__repr__(value)
        return text if math.isfinite(value) else f"'{text}'::float8"
    raise TypeError(f"PostgresStore cannot send a {type(value).__name__} as a literal")


def _render(sql: str, params: Sequence[Any]) -> str:
    """One statement with its values inlined as SQL literals."""
    parts = _template(sql)
    if len(parts) != len(params) + 1:
        raise ValueError(f"{len(params)} values for {len(parts) - 1} placeholders: {sql}")
    out = [parts[0]]
    for value, part in zip(params, parts[1:], strict=True):
        out.append(_literal(value))
        out.append(part)
    return "".join(out)


def _encode(statements: Sequence[str]) -> bytes:
    """Statements as one simple-protocol query, in UTF-8."""
    query = ";\n".join(statements)
    if "\0" in query:
        raise psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes")
    return query.encode()


async def _query(conn: psycopg.AsyncConnection[Any], query: bytes) -> list[PGresult]:
    """Send ``query`` (one or more statements) and return its results; the first error
    is raised as psycopg would raise it. The caller owns ``conn`` for the duration."""
    conn.pgconn.send_query(query)
    return await _results(conn)


async def _results(conn: psycopg.AsyncConnection[Any]) -> list[PGresult]:
    results: list[PGresult] = await conn.wait(pg_generators.execute(conn.pgconn))
    for res in results:
        if res.status == ExecStatus.FATAL_ERROR:
            raise pg_errors.error_from_result(res, encoding=conn.info.encoding)
    return results


@functools.cache
def _numbered(sql: str) -> bytes:
    """``sql`` with ``$1``, ``$2``, ... for its ``%s`` placeholders."""
    parts = _template(sql)
    return (parts[0] + "".join(f"${i}{part}" for i, part in enumerate(parts[1:], 1))).encode()


def _param(value: Any) -> bytes | None:
    """``value`` as a text-format parameter."""
    if value is None:
        return None
    if isinstance(value, str):
        if "\0" in value:
            raise psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes")
        return value.encode()
    if isinstance(value, bool):
        return b"true" if value else b"false"
    if isinstance(value, int | float):
        return repr(value).encode()
    raise TypeError(f"PostgresStore cannot send a {type(value).__name__} as a parameter")


# The statements each connection has prepared (they die with it).
_prepared_on: weakref.WeakKeyDictionary[Any, set[bytes]] = weakref.WeakKeyDictionary()


async def _run_prepared(
    conn: psycopg.AsyncConnection[Any], name: bytes, sql: str, params: Sequence[Any]
) -> PGresult:
    """Run one statement as a server-side prepared statement, preparing it the first
    time this connection sees it: a read that is planned once per connection rather
    than once per delivery (a delivery's load costs several times more to plan than
    to run)."""
    values = [_param(p) for p in params]
    names = _prepared_on.setdefault(conn, set())
    if name not in names:
        conn.pgconn.send_prepare(name, _numbered(sql))
        await _results(conn)
        names.add(name)
    conn.pgconn.send_query_prepared(name, values)
    (res,) = await _results(conn)
    return res


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode()


def _float(value: bytes | None) -> float | None:
    return None if value is None else float(value)


def _turn_row(res: PGresult, row: int, first: int = 0) -> TurnRecord:
    """A ``TurnRecord`` from ``_TURN_COLUMNS`` at column ``first`` on."""
    v = [res.get_value(row, first + c) for c in range(12)]
    return _turn_from_row(
        [*(_text(x) for x in v[:8]), _float(v[8]), _float(v[9]), _text(v[10]), _text(v[11])]
    )


_TURN_COLUMNS_T = ", ".join(f"t.{c.strip()}" for c in _TURN_COLUMNS.split(","))

_TURN_SQL = f"SELECT {_TURN_COLUMNS} FROM turnkit_turns WHERE session_id = %s AND turn_id = %s"
_STATUS_SQL = "SELECT status FROM turnkit_sessions WHERE session_id = %s"
_ACQUIRE_SQL = (
    "WITH l AS (SELECT pg_try_advisory_lock(%s::bigint) AS ok) "
    "INSERT INTO turnkit_writers (session_id, token, holder, since) "
    "SELECT %s::text, %s::text, %s::text, %s::float8 FROM l WHERE l.ok "
    "ON CONFLICT (session_id) DO UPDATE SET token = excluded.token, "
    "holder = excluded.holder, since = excluded.since RETURNING 1"
)

# A delivery's whole read in one statement, so in one snapshot: the session, the
# next event number, the transcript from an index (as one JSON array's items), the
# turn's memoized steps (as one JSON object's members) and the turn's record.
_LOAD_SQL = (
    "SELECT s.agent, s.generation, "
    # Event numbers carry on across resets: with no live event, the archive's last.
    "coalesce((SELECT max(seq) FROM turnkit_events WHERE session_id = %s), "
    "(SELECT seq FROM turnkit_archived_events WHERE session_id = %s "
    "ORDER BY generation DESC, seq DESC LIMIT 1)), "
    "(SELECT string_agg(body, ',' ORDER BY idx) FROM turnkit_messages "
    "WHERE session_id = %s AND idx >= %s), "
    "(SELECT string_agg(to_json(step_id)::text || ':' || result, ',') FROM turnkit_steps "
    "WHERE session_id = %s AND turn_id = %s), "
    f"{_TURN_COLUMNS_T} FROM (SELECT) AS one "
    "LEFT JOIN turnkit_sessions s ON s.session_id = %s "
    "LEFT JOIN turnkit_turns t ON t.session_id = %s AND t.turn_id = %s"
)


class _NeedsConnection(BaseException):
    """Internal: ``work`` asked for ``tx.handle`` while running on the event loop.

    A ``BaseException``, so no ``except Exception`` in between can swallow it. The
    engine asks for the handle before a local tool runs, so no tool code has run
    when this is raised; the commit is then run again on a worker thread."""


_Write = tuple[str, tuple[Any, ...]]


class _Writes:
    """The engine's writes of one commit, buffered as SQL to send in one pipeline."""

    def __init__(self, session_id: str) -> None:
        self._sid = session_id
        self.writes: list[_Write] = []

    def statements(self) -> list[str]:
        """Every write as one SQL statement, values inlined."""
        return [_render(sql, params) for sql, params in self.writes]

    def append_message(self, index: int, message: Message) -> None:
        self.writes.append(
            (
                "INSERT INTO turnkit_messages (session_id, idx, turn_id, body) "
                "VALUES (%s, %s, %s, %s)",
                (self._sid, index, message.turn_id, _dumps(message.to_dict())),
            )
        )

    def put_step(self, step_id: str, turn_id: str, result: Any) -> None:
        self.writes.append(
            (
                "INSERT INTO turnkit_steps (session_id, turn_id, step_id, result) "
                "VALUES (%s, %s, %s, %s)",
                (self._sid, turn_id, step_id, _dumps(result)),
            )
        )

    def log_event(self, event: TurnEvent) -> None:
        self.writes.append(
            (
                "INSERT INTO turnkit_events (session_id, seq, turn_id, body) "
                "VALUES (%s, %s, %s, %s)",
                (self._sid, event.seq, event.turn_id, _dumps(event.to_dict())),
            )
        )

    def request_cancel(self, turn_id: str, reason: str) -> None:
        self.writes.append(
            (
                "WITH t AS (" + _pg(archive_sql.REQUEST_CANCEL) + " RETURNING 1) "
                "SELECT turnkit_expect_one(count(*), %s) FROM t",
                (reason, self._sid, turn_id, f"session {self._sid}: no turn {turn_id} to cancel"),
            )
        )

    def archive_generation(self, generation: int, agent: str) -> None:
        for sql, params in archive_sql.reset_statements(self._sid, agent, generation, time.time()):
            self.writes.append((_pg(sql), params))

    def open_turn(self, record: TurnRecord) -> None:
        now = time.time()
        self.writes.append(
            (
                "INSERT INTO turnkit_turns (session_id, turn_id, agent, status, opening, "
                "event, created_at) VALUES (%s, %s, %s, 'running', %s, %s, %s)",
                (
                    self._sid,
                    record.turn_id,
                    record.agent,
                    _dumps(record.opening),
                    _dumps(record.event) if record.event is not None else None,
                    record.created_at or now,
                ),
            )
        )
        self.writes.append(
            (
                "INSERT INTO turnkit_sessions (session_id, agent, status, created_at, "
                "updated_at) VALUES (%s, %s, 'running', %s, %s) ON CONFLICT (session_id) "
                "DO UPDATE SET agent = excluded.agent, status = 'running', "
                "updated_at = excluded.updated_at",
                (self._sid, record.agent, now, now),
            )
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
        now = time.time()
        terminal = status in TERMINAL_TURN_STATUSES
        kept = _dumps(pending) if status == "suspended" and pending is not None else None
        self.writes.append(
            (
                "WITH t AS (UPDATE turnkit_turns SET status = %s, text = %s, error = %s, "
                "finished_at = %s, pending = %s WHERE session_id = %s AND turn_id = %s "
                "RETURNING 1), "
                "s AS (UPDATE turnkit_sessions SET status = %s, updated_at = %s "
                "WHERE session_id = %s AND EXISTS (SELECT 1 FROM t)) "
                "SELECT turnkit_expect_one(count(*), %s) FROM t",
                (
                    status,
                    text,
                    error,
                    now if terminal else None,
                    kept,
                    self._sid,
                    turn_id,
                    session_status_after(status),
                    now,
                    self._sid,
                    f"session {self._sid}: no turn {turn_id} to update",
                ),
            )
        )


class _LoopTransaction(_Writes):
    """The transaction ``work`` first sees: on the event loop, writes only buffered.

    Engine-only commits (model steps, remote tools' results, events, turn moves)
    never touch ``handle``, so they run here and their rows go out in one
    asynchronous pipeline. Asking for ``handle`` stops ``work`` at once."""

    def __init__(self, session_id: str, sid_literal: str) -> None:
        super().__init__(session_id)
        self._sid_lit = sid_literal
        self.rows = _Rows()

    @property
    def handle(self) -> StoreHandle:
        raise _NeedsConnection

    # The rows of every step, rendered as they come: the hot path. Each table's rows
    # go in as one multi-row INSERT (see ``statements``).

    def append_message(self, index: int, message: Message) -> None:
        self.rows.messages.append(
            f"({self._sid_lit}, {_literal(index)}, {_literal(message.turn_id)}, "
            f"{_literal(_dumps(message.to_dict()))})"
        )

    def put_step(self, step_id: str, turn_id: str, result: Any) -> None:
        self.rows.steps.append(
            f"({self._sid_lit}, {_literal(turn_id)}, {_literal(step_id)}, "
            f"{_literal(_dumps(result))})"
        )

    def log_event(self, event: TurnEvent) -> None:
        self.rows.events.append(
            f"({self._sid_lit}, {_literal(event.seq)}, {_literal(event.turn_id)}, "
            f"{_literal(_dumps(event.to_dict()))})"
        )

    def statements(self) -> list[str]:
        return [*self.rows.statements(), *super().statements()]


class _Rows:
    """A commit's step, message and event rows, as SQL row literals: rows of several
    commits can share one INSERT per table (see ``_GroupCommitter``)."""

    __slots__ = ("events", "messages", "steps")

    def __init__(self) -> None:
        self.steps: list[str] = []
        self.messages: list[str] = []
        self.events: list[str] = []

    def statements(self) -> list[str]:
        out = []
        if self.steps:
            out.append(_STEPS_INSERT + ", ".join(self.steps))
        if self.messages:
            out.append(_MESSAGES_INSERT + ", ".join(self.messages))
        if self.events:
            out.append(_EVENTS_INSERT + ", ".join(self.events))
        return out


_STEPS_INSERT = "INSERT INTO turnkit_steps (session_id, turn_id, step_id, result) VALUES "
_MESSAGES_INSERT = "INSERT INTO turnkit_messages (session_id, idx, turn_id, body) VALUES "
_EVENTS_INSERT = "INSERT INTO turnkit_events (session_id, seq, turn_id, body) VALUES "


class _PgHandle:
    """``ctx.store`` for local tools on PostgreSQL."""

    def __init__(self, tx: _PgTransaction) -> None:
        self._tx = tx

    def unwrap(self) -> psycopg.Connection[Any]:
        """The psycopg connection, inside the step's open transaction."""
        self._tx.begin()
        return self._tx.conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one statement with ``?`` placeholders in the step's transaction.

        The statement runs under a savepoint: if it fails, only it is undone and the
        error propagates, just as one failed statement does on SQLite.
        """
        if _TRANSACTION_CONTROL.match(sql):
            raise FatalToolError(f"{_ENDED}: refused {sql.split()[0].upper()}")
        self._tx.begin()
        conn = self._tx.conn
        query = qmark_to_pyformat(sql) if params else sql
        try:
            with conn.pipeline():
                conn.execute("SAVEPOINT turnkit_statement")
                cur = conn.execute(query, tuple(params) if params else None)
                conn.execute("RELEASE SAVEPOINT turnkit_statement")
        except psycopg.Error:
            if not _connection_lost(conn):
                conn.execute("ROLLBACK TO SAVEPOINT turnkit_statement")
                conn.execute("RELEASE SAVEPOINT turnkit_statement")
            raise
        rows = cur.fetchall() if cur.description is not None else []
        self._tx.check_open()
        return rows


class _PgTransaction(_Writes):
    """A commit whose ``work`` uses ``tx.handle``, run on a worker thread.

    A connection is taken from the sync pool, and ``BEGIN`` sent, only when the
    tool first touches ``ctx.store``; a tool that never does leaves its rows
    buffered, to be sent from the event loop like any engine-only commit."""

    def __init__(self, store: PostgresStore, session_id: str) -> None:
        super().__init__(session_id)
        self._store = store
        self._conn: psycopg.Connection[Any] | None = None
        self._begun = False
        self.checkout_failed: BaseException | None = None
        self.flushed = False

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
                raise self._no_connection(self.checkout_failed)
            try:
                self._conn = self._store.sync_pool.getconn(timeout=self._store.connect_timeout)
            except Exception as exc:
                self.checkout_failed = exc
                raise self._no_connection(exc) from exc
        return self._conn

    def _no_connection(self, exc: BaseException) -> StoreError:
        return StoreError(f"session {self._sid}: no database connection: {exc}")

    def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._store.sync_pool.putconn(conn)

    def begin(self) -> None:
        if not self._begun:
            self.conn.execute("BEGIN")
            self._begun = True
        else:
            self.check_open()

    def check_open(self) -> None:
        if self.conn.info.transaction_status == TransactionStatus.IDLE:
            raise FatalToolError(_ENDED)

    def flush(self, token: str | None) -> None:
        """Send the fence, the buffered writes and the COMMIT in one round trip."""
        conn = self.conn
        if conn.info.transaction_status == TransactionStatus.INERROR:
            raise FatalToolError(_ABORTED)
        self.check_open()
        with conn.pipeline():
            if token is not None:
                conn.execute("SELECT turnkit_fence(%s, %s)", (self._sid, token))
            for sql, params in self.writes:
                conn.execute(sql, params)
            conn.execute("COMMIT")
        self.flushed = True


def _commit_error(sid: str, lost: bool, exc: BaseException) -> BaseException:
    """What a failed commit raises: the engine's own exceptions unchanged, unless the
    connection died under them (``lost``: a store outage, not a tool's failure)."""
    if isinstance(exc, _NoConnection):
        return StoreError(f"session {sid}: no database connection: {exc.__cause__}")
    if lost:
        return StoreError(
            f"session {sid}: lost the database connection during a commit "
            f"({exc}); nothing of this step was kept: deliver the turn again"
        )
    if isinstance(exc, psycopg.Error):
        state = exc.sqlstate
        if state == FENCE_SQLSTATE:
            return SessionBusyError(
                f"session {sid}: another process took over this session's "
                "writer lock; this step was not written"
            )
        if state == MISSING_SQLSTATE:
            return StoreError(str(exc.diag.message_primary or exc))
        if isinstance(exc, pg_errors.UniqueViolation) and "turnkit_generations" in str(
            exc.diag.table_name or ""
        ):
            return StoreError(
                f"session {sid}: this generation was already archived (another reset came first)"
            )
        if isinstance(exc, pg_errors.UniqueViolation):
            return StoreError(
                f"session {sid}: commit failed: {exc.diag.message_primary} "
                "(another writer advanced this session)"
            )
        if isinstance(exc, pg_errors.InFailedSqlTransaction):
            return FatalToolError(_ABORTED)
        return StoreError(f"session {sid}: commit failed: {exc}")
    return exc


class _NoConnection(Exception):
    """Internal: the pool had no connection to give (its cause says why)."""


_WAIT_W = 2  # psycopg's Wait.W bit
_READY_R = 1  # psycopg's Ready.R


class _Sender:
    """A connection of the group committer's own, outside the pool, that sends step
    commits from the event loop.

    Its socket stays registered with the loop for as long as it lives, so a commit
    pays no pool checkout and no reader registration: the reader wakes the commit
    waiting on it. A socket that turns readable while no commit is in flight means
    the server is closing the connection (a terminated backend, a restart); the
    sender is then discarded before any commit uses it, as the pool's checkout
    check does for the reads."""

    __slots__ = ("_busy", "_fd", "_loop", "_waiter", "conn", "suspect")

    def __init__(self, conn: psycopg.AsyncConnection[Any], loop: asyncio.AbstractEventLoop) -> None:
        self.conn = conn
        self._loop = loop
        self._fd = conn.pgconn.socket
        self._waiter: asyncio.Future[None] | None = None
        self._busy = False
        self.suspect = False
        loop.add_reader(self._fd, self._readable)

    def _readable(self) -> None:
        waiter = self._waiter
        if waiter is None:
            if not self._busy:
                self.suspect = True  # idle, yet the server spoke: it is hanging up
                self._unwatch()
            return
        # Read what came; wake the commit only once a whole result is in. This also
        # skips a stale call, queued by the loop's poll before the query was sent.
        pgconn = self.conn.pgconn
        try:
            pgconn.consume_input()
            if pgconn.is_busy():
                return
        except psycopg.Error:
            pass  # the commit's own read raises it
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
        if self.suspect or loop is not self._loop or _connection_lost(self.conn):
            return False
        readable, _, _ = select.select([self._fd], [], [], 0)
        return not readable

    async def query(self, query: bytes) -> list[PGresult]:
        """``_query`` on this connection, waited on through the standing reader."""
        results = await self.results(query)
        for res in results:
            if res.status == ExecStatus.FATAL_ERROR:
                raise pg_errors.error_from_result(res, encoding=self.conn.info.encoding)
        return results

    async def results(self, query: bytes) -> list[PGresult]:
        """Send ``query`` and return its results, an error among them left unraised."""
        pgconn = self.conn.pgconn
        self._busy = True
        try:
            pgconn.send_query(query)
            results = await self._drive(pg_generators.execute(pgconn))
        except psycopg.Error:
            raise
        except BaseException:
            self.suspect = True  # cancelled mid-query, say: its state is unknown
            raise
        finally:
            self._busy = False
            self._waiter = None
        return results

    async def _drive(self, gen: Any) -> list[PGresult]:
        try:
            state = next(gen)
            while True:
                if state & _WAIT_W:
                    # The query did not fit the socket's buffer: rare, so waited on
                    # the plain way.
                    ready = await _wait_writable(self._loop, self._fd, state)
                else:
                    waiter = self._waiter = self._loop.create_future()
                    await waiter
                    ready = _READY_R
                state = gen.send(ready)
        except StopIteration as done:
            return cast(list[PGresult], done.value)

    async def close(self) -> None:
        self._unwatch()
        await self.conn.close()


async def _wait_writable(loop: asyncio.AbstractEventLoop, fd: int, state: int) -> int:
    """Wait until ``fd`` can take more of a query; the ``Ready`` bits to send on."""
    readable, writable, _ = select.select([fd] if state & 1 else [], [fd], [], 0)
    if readable or writable:
        return (1 if readable else 0) | (2 if writable else 0)
    future: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not future.done():
            future.set_result(None)

    loop.add_writer(fd, wake)
    try:
        await future
    finally:
        loop.remove_writer(fd)
    return 2


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

    def __init__(self, store: PostgresStore) -> None:
        self._store = store
        self.sender: _Sender | None = None
        self._queue: list[tuple[str, asyncio.Future[PGresult] | None]] = []
        self._pumping = False
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self, statements: Sequence[str]) -> list[PGresult]:
        """Run ``statements`` in order in the next batch; their results."""
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in statements]
        self._queue.extend(zip(statements, futures, strict=True))
        self._kick()
        return [await future for future in futures]

    def post(self, statement: str) -> None:
        """Run ``statement`` in the next batch, unwaited (a failure is logged)."""
        self._queue.append((statement, None))
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

    async def _send(self, batch: list[tuple[str, asyncio.Future[PGresult] | None]]) -> None:
        try:
            sender = await self._connection()
            results = await sender.results(_encode([statement for statement, _ in batch]))
            if len(results) != len(batch) or any(
                r.status == ExecStatus.FATAL_ERROR for r in results
            ):
                bad = [r for r in results if r.status == ExecStatus.FATAL_ERROR]
                if bad:
                    raise pg_errors.error_from_result(bad[0], encoding=sender.conn.info.encoding)
                raise psycopg.InterfaceError(f"{len(results)} results for {len(batch)} statements")
        except BaseException as exc:
            await self._drop()
            failure = StoreError(f"the writer lock connection failed: {exc}")
            for _, future in batch:
                if future is not None and not future.done():
                    future.set_exception(failure)
            if any(future is None for _, future in batch):
                log.warning(
                    "releasing writer locks failed (they went with the connection): %s", exc
                )
            if not isinstance(exc, Exception):
                raise
            return
        for (_, future), res in zip(batch, results, strict=True):
            if future is not None and not future.done():
                future.set_result(res)

    async def _connection(self) -> _Sender:
        loop = asyncio.get_running_loop()
        if self.sender is not None:
            if self.sender.usable(loop):
                return self.sender
            await self._drop()
        store = self._store
        if store._apool is None:
            raise store._not_open()
        conn = await psycopg.AsyncConnection.connect(store.dsn, **store._connect_kwargs())
        try:
            # Losing an acquisition in a server crash is harmless: a holder whose token
            # did not survive has committed nothing after it, and is fenced off.
            await conn.execute(b"SET synchronous_commit = off")
            await conn.execute(b"PREPARE turnkit_acquire AS " + _numbered(_ACQUIRE_SQL))
            await conn.execute(b"PREPARE turnkit_load AS " + _numbered(_LOAD_SQL))
        except BaseException:
            await conn.close()
            raise
        self.sender = _Sender(conn, loop)
        return self.sender

    async def _drop(self) -> None:
        sender, self.sender = self.sender, None
        if sender is not None:
            await _close_quietly(sender)

    async def close(self) -> None:
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._drop()


_Queued = tuple[str, bytes, "asyncio.Future[None]", "tuple[str | None, _Rows] | None"]


def _merged(group: list[_Queued]) -> bytes:
    """A group's commits as one query: the step, message and event rows of those that
    have only such rows share one INSERT per table (and one statement checks all
    their fences), which saves the server most of its per-statement work; the others
    go in as they are."""
    fences: list[str] = []
    rows = _Rows()
    alone: list[bytes] = []
    for _, query, _, merge in group:
        if merge is None:
            alone.append(query)
            continue
        fence, mine = merge
        if fence is not None:
            fences.append(fence)
        rows.steps += mine.steps
        rows.messages += mine.messages
        rows.events += mine.events
    statements = rows.statements()
    if fences:
        statements.insert(
            0, f"SELECT turnkit_fence(s, t) FROM (VALUES {', '.join(fences)}) AS f(s, t)"
        )
    parts = [_encode(statements)] if statements else []
    return b";\n".join(parts + alone)


class _GroupCommitter:
    """Sends engine-only commits from the event loop, with at most ``senders`` in flight.

    A commit that finds a sender free goes out at once, alone. Commits that arrive
    while every sender is busy queue up, and the next free sender takes all of them
    in ONE transaction: one round trip and one WAL flush for many sessions' steps,
    which is what lets many concurrent sessions in one process outrun one (the
    server's per-commit cost is what bounds them). Each commit carries its own
    writer fence. If such a group fails on the server, nothing of it landed, and
    each of its commits is sent again alone, so one session's error (a fence, a
    taken position) is raised to that session only. A connection lost under a group
    fails all of its commits, each as a ``StoreError``, as it would have alone."""

    def __init__(self, store: PostgresStore, senders: int) -> None:
        self._store = store
        self._senders = senders
        self._busy = 0
        self._queue: list[_Queued] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._idle: list[_Sender] = []
        self._inflight: dict[asyncio.Future[None], str] = {}

    async def settled(self, sid: str | None) -> None:
        """Wait for the commits in flight now: of session ``sid``, or of all if ``None``."""
        if not self._inflight:
            return
        waits = [f for f, s in self._inflight.items() if sid is None or s == sid]
        if waits:
            await asyncio.wait(waits)

    async def commit(
        self, sid: str, query: bytes, merge: tuple[str | None, _Rows] | None = None
    ) -> None:
        """Commit ``query``; ``merge`` (its fence row and its rows) if its writes are
        only step, message and event rows, which a group may merge with others'."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._inflight[done] = sid
        try:
            await self._commit(sid, query, merge)
        finally:
            del self._inflight[done]
            done.set_result(None)

    async def _commit(self, sid: str, query: bytes, merge: tuple[str | None, _Rows] | None) -> None:
        if self._busy < self._senders and not self._queue:
            self._busy += 1
            try:
                failed = await self._run(query)
            finally:
                self._busy -= 1
                self._kick()
            if failed is not None:
                exc, lost = failed
                raise _commit_error(sid, lost, exc) from exc
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append((sid, query, future, merge))
        self._kick()
        await future

    async def drain(self) -> None:
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def close(self) -> None:
        await self.drain()
        idle, self._idle = self._idle, []
        for sender in idle:
            await _close_quietly(sender)

    def _kick(self) -> None:
        while self._queue and self._busy < self._senders:
            self._busy += 1
            group, self._queue = self._queue, []
            task = asyncio.get_running_loop().create_task(self._send_group(group))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send_group(self, group: list[_Queued]) -> None:
        try:
            query = group[0][1] if len(group) == 1 else _merged(group)
            failed = await self._run(query)
            if failed is None:
                for _, _, future, _ in group:
                    if not future.done():
                        future.set_result(None)
                return
            exc, lost = failed
            if len(group) == 1 or lost or isinstance(exc, _NoConnection):
                for sid, _, future, _ in group:
                    if not future.done():
                        future.set_exception(_commit_error(sid, lost, exc))
                return
            for sid, query, future, _ in group:  # find whose it was: each alone
                alone = await self._run(query)
                if future.done():
                    continue
                if alone is None:
                    future.set_result(None)
                else:
                    future.set_exception(_commit_error(sid, alone[1], alone[0]))
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

    async def _sender(self) -> _Sender:
        """An idle sender fit for use, or a new one (never more than ``senders``)."""
        loop = asyncio.get_running_loop()
        while self._idle:
            sender = self._idle.pop()
            if sender.usable(loop):
                return sender
            await _close_quietly(sender)
        store = self._store
        if store._apool is None:
            raise store._not_open()
        conn = await psycopg.AsyncConnection.connect(store.dsn, **store._connect_kwargs())
        return _Sender(conn, loop)

    async def _run(self, query: bytes) -> tuple[BaseException, bool] | None:
        """Send ``query`` on one of the committer's connections; the error and whether
        the connection was lost, or ``None`` if it committed."""
        try:
            sender = await self._sender()
        except Exception as exc:
            failure = _NoConnection(str(exc))
            failure.__cause__ = exc
            return failure, False
        try:
            await sender.query(query)
        except Exception as exc:
            conn = sender.conn
            lost = _connection_lost(conn)
            await _rollback_quietly_async(conn)
            if lost:
                sender.suspect = True
            return exc, lost
        finally:
            if sender.suspect:
                await _close_quietly(sender)
            else:
                self._idle.append(sender)
        return None


async def _close_quietly(sender: _Sender) -> None:
    try:
        await sender.close()
    except Exception:
        log.debug("closing a commit connection failed", exc_info=True)


class _PgSession:
    def __init__(self, store: PostgresStore, session_id: str) -> None:
        self._store = store
        self._sid = session_id
        self._sid_lit = _literal(session_id)

    @property
    def session_id(self) -> str:
        return self._sid

    def writer(self) -> AbstractAsyncContextManager[None]:
        return self._store._writer(self._sid)

    async def load(self, turn_id: str | None = None, *, from_index: int = 0) -> SessionSnapshot:
        store = self._store
        if not store._must_acquire(self._sid):
            return await store._read(
                f"session {self._sid}", self._load, turn_id, from_index, of=self._sid
            )
        # A delivery's first load: the writer lock and the load in one round trip.
        await store._committer.settled(self._sid)
        sid = self._sid_lit
        tid = _literal(turn_id)
        args = ", ".join([sid, sid, sid, _literal(from_index), sid, tid, sid, sid, tid])
        res = await store._acquire(self._sid, f"EXECUTE turnkit_load({args})")
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
        params = (sid, sid, sid, from_index, sid, turn_id, sid, sid, turn_id)
        res = await _run_prepared(conn, b"turnkit_load", _LOAD_SQL, params)
        return self._snapshot(res, from_index)

    def _snapshot(self, res: PGresult, from_index: int) -> SessionSnapshot:
        agent, generation, seq, messages, steps = (res.get_value(0, c) for c in range(5))
        return SessionSnapshot(
            messages=[message_from_dict(m) for m in json.loads(b"[" + messages + b"]")]
            if messages
            else [],
            steps=json.loads(b"{" + steps + b"}") if steps else {},
            turn=_turn_row(res, 0, 5) if res.get_value(0, 6) is not None else None,
            agent=_text(agent),
            next_seq=(int(seq) if seq is not None else 0) + 1,
            generation=int(generation) if generation is not None else 0,
            from_index=from_index,
        )

    async def commit(self, work: Callable[[Any], T]) -> T:
        store = self._store
        if store._must_acquire(self._sid):
            await store._acquire(self._sid)
        token = store._tokens.get(self._sid)
        tx = _LoopTransaction(self._sid, self._sid_lit)
        try:
            result = work(tx)
            writes: _Writes = tx
        except _NeedsConnection:
            # A local tool: it runs on a worker thread, where its SQL may block.
            result, thread_tx = await store._call(self._commit_on_thread, work, token)
            if thread_tx.flushed:
                return result
            writes = thread_tx
        try:
            statements = writes.statements()
        except psycopg.Error as exc:
            raise StoreError(f"session {self._sid}: commit failed: {exc}") from exc
        if statements:
            rows = tx.rows if writes is tx and not tx.writes else None
            await self._flush(statements, token, rows)
        return result

    def _commit_on_thread(
        self, work: Callable[[Any], T], token: str | None
    ) -> tuple[T, _PgTransaction]:
        tx = _PgTransaction(self._store, self._sid)
        try:
            try:
                result = work(tx)
                if tx.checkout_failed is not None:  # the tool caught it; the step cannot land
                    raise tx._no_connection(tx.checkout_failed)
                if tx.opened is not None:
                    tx.flush(token)
            except BaseException as exc:
                if tx.checkout_failed is not None:
                    raise tx._no_connection(tx.checkout_failed) from exc
                conn = tx.opened
                if conn is None:
                    raise
                _rollback_quietly(conn)
                raise _commit_error(self._sid, _connection_lost(conn), exc) from exc
        finally:
            tx.release()
        return result, tx

    async def _flush(self, statements: list[str], token: str | None, rows: _Rows | None) -> None:
        """The fence and ``statements`` as one multi-statement query (one implicit
        transaction: any failing statement undoes them all), sent by the store's
        group committer."""
        fence = f"({self._sid_lit}, {_literal(token)})" if token is not None else None
        if fence is not None:
            statements.insert(0, f"SELECT turnkit_fence{fence}")
        try:
            query = _encode(statements)
        except (psycopg.Error, UnicodeError) as exc:
            raise StoreError(f"session {self._sid}: commit failed: {exc}") from exc
        merge = (fence, rows) if rows is not None else None
        await self._store._committer.commit(self._sid, query, merge)

    async def turn(self, turn_id: str) -> TurnRecord | None:
        async def read(conn: psycopg.AsyncConnection[Any]) -> TurnRecord | None:
            res = await _run_prepared(conn, b"turnkit_turn", _TURN_SQL, (self._sid, turn_id))
            return _turn_row(res, 0) if res.ntuples else None

        return await self._store._read(f"turn {turn_id}", read, of=self._sid)

    async def messages(self) -> list[Message]:
        async def read(conn: psycopg.AsyncConnection[Any]) -> list[Message]:
            cur = await conn.execute(
                "SELECT body FROM turnkit_messages WHERE session_id = %s ORDER BY idx",
                (self._sid,),
            )
            return [message_from_dict(json.loads(r[0])) for r in await cur.fetchall()]

        return await self._store._read(f"session {self._sid}", read, of=self._sid)

    async def events(self, *, turn_id: str | None = None, after: int = 0) -> list[TurnEvent]:
        async def read(conn: psycopg.AsyncConnection[Any]) -> list[TurnEvent]:
            if turn_id is None:
                cur = await conn.execute(
                    "SELECT body FROM turnkit_events WHERE session_id = %s AND seq > %s "
                    "ORDER BY seq",
                    (self._sid, after),
                )
            else:
                cur = await conn.execute(
                    "SELECT body FROM turnkit_events WHERE session_id = %s AND turn_id = %s "
                    "AND seq > %s ORDER BY seq",
                    (self._sid, turn_id, after),
                )
            return [event_from_dict(json.loads(r[0])) for r in await cur.fetchall()]

        return await self._store._read(f"events of session {self._sid}", read, of=self._sid)

    async def generations(self) -> list[int]:
        async def read(conn: psycopg.AsyncConnection[Any]) -> list[int]:
            cur = await conn.execute(_pg(archive_sql.GENERATIONS), (self._sid,))
            return [int(r[0]) for r in await cur.fetchall()]

        return await self._store._read(f"generations of session {self._sid}", read, of=self._sid)

    async def archived_messages(self, generation: int) -> list[Message]:
        async def read(conn: psycopg.AsyncConnection[Any]) -> list[Message]:
            cur = await conn.execute(_pg(archive_sql.ARCHIVED_MESSAGES), (self._sid, generation))
            return [message_from_dict(json.loads(r[0])) for r in await cur.fetchall()]

        return await self._store._read(
            f"session {self._sid} generation {generation}", read, of=self._sid
        )

    async def unfinished(self) -> list[TurnRecord]:
        async def read(conn: psycopg.AsyncConnection[Any]) -> list[TurnRecord]:
            cur = await conn.execute(
                f"SELECT {_TURN_COLUMNS} FROM turnkit_turns WHERE session_id = %s "
                "AND status IN ('running', 'suspended') ORDER BY created_at",
                (self._sid,),
            )
            return [_turn_from_row(r) for r in await cur.fetchall()]

        return await self._store._read(f"session {self._sid}", read, of=self._sid)

    async def parked(self) -> TurnRecord | None:
        async def read(conn: psycopg.AsyncConnection[Any]) -> TurnRecord | None:
            cur = await conn.execute(
                f"SELECT {_TURN_COLUMNS} FROM turnkit_turns WHERE session_id = %s "
                "AND status = 'suspended' ORDER BY created_at DESC LIMIT 1",
                (self._sid,),
            )
            row = await cur.fetchone()
            return _turn_from_row(row) if row else None

        return await self._store._read(f"session {self._sid}", read, of=self._sid)

    async def status(self) -> SessionStatus:
        async def read(conn: psycopg.AsyncConnection[Any]) -> SessionStatus:
            res = await _run_prepared(conn, b"turnkit_status", _STATUS_SQL, (self._sid,))
            return cast(SessionStatus, _text(res.get_value(0, 0))) if res.ntuples else "new"

        return await self._store._read(f"session {self._sid}", read, of=self._sid)


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
    ``_GroupCommitter``). Few senders make big groups; on the two-core machine of
    the benchmarks two beat ten by 1.5-2x at 100 sessions. A server with many cores
    may want more.
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
    ) -> None:
        if not _SCHEMA_NAME.match(schema):
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
        self.min_size = min_size
        self.max_size = max_size
        self.busy_timeout = busy_timeout
        self.connect_timeout = connect_timeout
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._apool: AsyncConnectionPool[Any] | None = None
        self._pool: ConnectionPool[Any] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._lockch = _LockChannel(self)
        self._locks = SessionLocks()
        self._tokens: dict[str, str] = {}
        #: Sessions whose writer() is held but whose lock is not taken yet.
        self._pending: set[str] = set()
        #: The lock connection that took each held session's lock.
        self._held: dict[str, _Sender] = {}
        self.commit_senders = commit_senders
        self._committer = _GroupCommitter(self, senders=min(commit_senders, max_size))

    # -- lifecycle ---------------------------------------------------------------

    def _connect_kwargs(self) -> dict[str, Any]:
        path = f"{self.schema},public" if self.schema != "public" else "public"
        return {
            "autocommit": True,
            "client_encoding": "utf8",
            "options": f"-c search_path={path}",
            "application_name": f"turnkit-{self.schema}"[:63],
            "connect_timeout": max(1, int(self.connect_timeout)),
        }

    def _not_open(self) -> StoreError:
        return StoreError(
            "PostgresStore is not open: use it through `async with Runtime(...)` "
            "or await store.open() first"
        )

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
        self._executor = ThreadPoolExecutor(
            max_workers=self.max_size + 1, thread_name_prefix="turnkit-pg"
        )
        apool: AsyncConnectionPool[Any] | None = None
        try:
            await self._call(self._open_sync)
            apool = AsyncConnectionPool(
                self.dsn,
                min_size=self.min_size,
                max_size=self.max_size,
                kwargs=self._connect_kwargs(),
                check=_check_idle_async,
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

    def _open_sync(self) -> None:
        try:
            with psycopg.connect(self.dsn, **self._connect_kwargs()) as conn:
                migrate(conn, self.schema)
            # Only local tools that use ctx.store take these connections: opened on demand.
            pool: ConnectionPool[Any] = ConnectionPool(
                self.dsn,
                min_size=0,
                max_size=self.max_size,
                kwargs=self._connect_kwargs(),
                check=_check_idle_connection,
                open=False,
                name=f"turnkit-{self.schema}",
            )
            pool.open(wait=False)
        except psycopg.Error as exc:
            raise StoreError(f"PostgresStore: cannot open the database: {exc}") from exc
        except Exception as exc:  # the pool's own timeout, for one
            raise StoreError(f"PostgresStore: cannot connect: {exc}") from exc
        self._pool = pool

    async def close(self) -> None:
        await self._committer.close()
        await self._lockch.close()
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
            await asyncio.get_running_loop().run_in_executor(executor, pool.close)
        executor.shutdown(wait=False)

    # -- plumbing ----------------------------------------------------------------

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking ``fn`` on the store's threads, with the caller's context."""
        if self._executor is None:
            raise StoreError("PostgresStore is not open: await store.open() first")
        context = contextvars.copy_context()
        call = functools.partial(context.run, fn, *args)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

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
        if of is not None and self._must_acquire(of):
            await self._acquire(of)
        await self._committer.settled(of)
        pool = self.async_pool
        try:
            conn = await pool.getconn(timeout=self.connect_timeout)
        except Exception as exc:  # the pool's timeout, a failed reconnection
            raise StoreError(f"cannot read {what}: {exc}") from exc
        try:
            return await fn(conn, *args)
        except psycopg.Error as exc:
            await _rollback_quietly_async(conn)
            raise StoreError(f"cannot read {what}: {exc}") from exc
        except ValueError as exc:
            raise StoreError(f"{what} holds data that is not valid JSON: {exc}") from exc
        except BaseException:
            await _rollback_quietly_async(conn)
            raise
        finally:
            await pool.putconn(conn)

    # -- the single writer -------------------------------------------------------

    @asynccontextmanager
    async def _writer(self, session_id: str) -> AsyncIterator[None]:
        """Hold the session for one delivery. The lock itself is taken by the
        delivery's first load, read or commit (a load takes it in the same round
        trip), and released without waiting when the delivery ends."""
        async with self._locks.hold(session_id):
            self._pending.add(session_id)
            holding = _holding.set(_holding.get() | {session_id})
            try:
                yield
            finally:
                _holding.reset(holding)
                self._pending.discard(session_id)
                self._tokens.pop(session_id, None)
                sender = self._held.pop(session_id, None)
                if sender is not None and sender is self._lockch.sender and not sender.suspect:
                    # (A lock whose connection is gone went with it.)
                    key = _lock_key(self.schema, session_id)
                    self._lockch.post(f"SELECT pg_advisory_unlock({key})")

    def _must_acquire(self, session_id: str) -> bool:
        """Whether the caller holds ``writer()`` of this session and its lock is not
        taken yet (only the holder's own reads and commits take it: an observer's
        read in another task never does)."""
        return session_id in self._pending and session_id in _holding.get()

    async def _acquire(self, session_id: str, load: str | None = None) -> PGresult | None:
        """Take the writer lock of a session whose ``writer()`` is held, polling while
        another process has it; with ``load``, run that statement right after the
        acquisition, in the same round trip, and return its result."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.busy_timeout
        delay = 0.005
        key = _lock_key(self.schema, session_id)
        while True:
            token = uuid.uuid4().hex
            acquire = (
                f"EXECUTE turnkit_acquire({key}, {_literal(session_id)}, {_literal(token)}, "
                f"{_literal(self.holder)}, {_literal(time.time())})"
            )
            try:
                results = await self._lockch.run([acquire, load] if load else [acquire])
            except StoreError as exc:
                raise StoreError(
                    f"session {session_id}: cannot take the writer lock: {exc}"
                ) from exc
            if results[0].ntuples:
                self._tokens[session_id] = token
                if self._lockch.sender is not None:
                    self._held[session_id] = self._lockch.sender
                self._pending.discard(session_id)
                return results[1] if load else None
            if loop.time() >= deadline:
                raise SessionBusyError(
                    f"session {session_id} is being run by another process; waited "
                    f"{self.busy_timeout:g}s for it (deliver the turn again later)"
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.2)

    @property
    def _lock_conn(self) -> psycopg.AsyncConnection[Any] | None:
        sender = self._lockch.sender
        return sender.conn if sender is not None else None

    # -- the Store protocol ------------------------------------------------------

    def session(self, session_id: str) -> _PgSession:
        return _PgSession(self, session_id)

    async def sessions(self) -> list[SessionInfo]:
        async def read(conn: psycopg.AsyncConnection[Any]) -> list[SessionInfo]:
            cur = await conn.execute(
                "SELECT session_id, agent, status, updated_at FROM turnkit_sessions "
                "ORDER BY session_id"
            )
            return [
                SessionInfo(session_id=r[0], agent=r[1], status=r[2], updated_at=r[3])
                for r in await cur.fetchall()
            ]

        return await self._read("the session list", read)

    async def session_page(
        self, *, agent: str | None = None, limit: int, after: SessionKey | None = None
    ) -> list[SessionInfo]:
        sql, params = session_page_sql(agent, limit, after, placeholder="%s")

        async def read(conn: psycopg.AsyncConnection[Any]) -> list[SessionInfo]:
            cur = await conn.execute(sql, params)
            return [
                SessionInfo(session_id=r[0], agent=r[1], status=r[2], updated_at=r[3])
                for r in await cur.fetchall()
            ]

        return await self._read("the session list", read)

    async def unfinished_turns(self) -> list[TurnRecord]:
        async def read(conn: psycopg.AsyncConnection[Any]) -> list[TurnRecord]:
            cur = await conn.execute(
                f"SELECT {_TURN_COLUMNS} FROM turnkit_turns WHERE status = 'running' "
                "ORDER BY created_at"
            )
            return [_turn_from_row(r) for r in await cur.fetchall()]

        return await self._read("unfinished turns", read)
