"""PostgresStore's SQL: rendering the shared ``?``-style statements for PostgreSQL
(also what lets portable tools' ``?`` run), prepared reads run from the event loop,
connection checks, and the statements only PostgreSQL says (the one-statement load
and the writer acquire)."""

from __future__ import annotations

import functools
import hashlib
import logging
import re
import select
import weakref
from collections.abc import Sequence
from typing import Any, TypeVar

import psycopg
from psycopg import sql as pg_sql
from psycopg.pq import ExecStatus, TransactionStatus
from psycopg.pq.abc import PGresult
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from ..._values.records import TurnRecord
from .. import _sql as sql
from .._payloads import Payloads
from .._sql_rows import TURN_COLUMNS as _TURN_COLUMNS
from . import _wire as wire

T = TypeVar("T")
log = logging.getLogger("turnkit.stores.postgres")


SCHEMA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
TRANSACTION_CONTROL = re.compile(
    r"^\s*(BEGIN|START\s+TRANSACTION|COMMIT|END|ABORT|ROLLBACK(?!\s+(TRANSACTION\s+|WORK\s+)?TO\b)"
    r"|PREPARE\s+TRANSACTION)\b",
    re.IGNORECASE,
)
ENDED = (
    "a local tool ended the step's transaction (commit or rollback on ctx.store); "
    "turnkit commits the step itself, so never end the transaction in a tool"
)
ABORTED = (
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


#: turnkit's own tables and functions, wherever a statement names them unqualified.
_TURNKIT_NAME = re.compile(r'(?<![\w."])turnkit_\w+')


@functools.cache
def quoted_schema(schema: str) -> str:
    """The schema's name as an SQL identifier (psycopg's quoting), for statement text."""
    return pg_sql.Identifier(schema).as_string(None)


@functools.cache
def pg(sql: str, schema: str) -> str:
    """A ``?``-style statement (see ``_sql``) as PostgreSQL runs it for the store in
    ``schema``: psycopg's ``%s`` placeholders, and turnkit's tables and functions
    qualified with the schema, so a local tool that changes ``search_path`` in the
    step's transaction cannot redirect the store's own statements."""
    quoted = quoted_schema(schema)
    return qmark_to_pyformat(_TURNKIT_NAME.sub(lambda m: f"{quoted}.{m.group(0)}", sql))


@functools.cache
def pg_wire(sql: str, schema: str) -> bytes:
    """``pg(sql, schema)`` with ``$1``, ``$2``, ... placeholders, for ``_wire``."""
    return wire.numbered(pg(sql, schema))


def lock_key(schema: str, session_id: str) -> int:
    """The advisory-lock key of a session's writer: what ``turnkit_lock_key`` (in the
    schema) computes too, so a claim can lock sessions in SQL. Not a security
    boundary: md5 only spreads the ids over the key space."""
    where = f"{quoted_schema(schema)}/{session_id}"  # as the schema's function spells it
    digest = hashlib.md5(where.encode(), usedforsecurity=False).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def tenant_key(schema: str, tenant: str) -> int:
    """The first key of a tenant's slot locks: what ``turnkit_tenant_key`` computes."""
    where = f"{quoted_schema(schema)}/tenant/{tenant}"
    digest = hashlib.md5(where.encode(), usedforsecurity=False).digest()
    return int.from_bytes(digest[:4], "big", signed=True)


def connection_lost(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    return bool(conn.closed or conn.broken)


def rollback_quietly(conn: psycopg.Connection[Any]) -> None:
    if connection_lost(conn) or conn.info.transaction_status == TransactionStatus.IDLE:
        return
    try:
        conn.execute("ROLLBACK")
    except psycopg.Error:
        log.debug("rollback after a failed commit failed too", exc_info=True)


def check_idle_connection(conn: psycopg.Connection[Any]) -> None:
    """The sync pool's checkout check, free in the common case: an idle connection whose
    socket is readable has been sent something (a termination notice, EOF), so only
    then is it probed; a dead one is discarded before a step ever uses it."""
    if connection_lost(conn):
        raise psycopg.OperationalError("connection is closed")
    readable, _, _ = select.select([conn.fileno()], [], [], 0)
    if readable:
        ConnectionPool.check_connection(conn)


async def check_idle_async(conn: psycopg.AsyncConnection[Any]) -> None:
    """``check_idle_connection`` for the event loop's pool (the ``select`` never waits)."""
    if connection_lost(conn):
        raise psycopg.OperationalError("connection is closed")
    readable, _, _ = select.select([conn.fileno()], [], [], 0)
    if readable:
        await AsyncConnectionPool.check_connection(conn)


async def rollback_quietly_async(conn: psycopg.AsyncConnection[Any]) -> None:
    if connection_lost(conn) or conn.info.transaction_status == TransactionStatus.IDLE:
        return
    try:
        await conn.execute("ROLLBACK")
    except psycopg.Error:
        log.debug("rollback after a failed commit failed too", exc_info=True)


# -- the event loop's reads ----------------------------------------------------------

# The statements each connection has prepared (they die with it).
_prepared_on: weakref.WeakKeyDictionary[Any, set[bytes]] = weakref.WeakKeyDictionary()


async def run_prepared(
    conn: psycopg.AsyncConnection[Any], name: bytes, statement: bytes, params: Sequence[Any]
) -> PGresult:
    """Run one statement as a server-side prepared statement, preparing it (in the
    same round trip) the first time this connection sees it: a read that is planned
    once per connection rather than once per delivery (a delivery's load costs
    several times more to plan than to run)."""
    run = wire.execute(name, params)
    names = _prepared_on.setdefault(conn, set())
    if name in names:
        (res,) = await wire.exchange(conn, [run])
        return res
    prepare = wire.Prepare(name, statement)
    results = await wire.exchange(conn, [prepare, run], check=False)
    if results[0].status == ExecStatus.COMMAND_OK:
        names.add(name)
    wire.raise_first_error(results, conn.info.encoding)
    return results[1]


def as_text(value: bytes | None) -> str | None:
    return None if value is None else value.decode()


def _float(value: bytes | None) -> float | None:
    return None if value is None else float(value)


#: How many columns ``_TURN_COLUMNS`` selects.
TURN_WIDTH = len(_TURN_COLUMNS.split(","))


def turn_row(res: PGresult, row: int, first: int, payloads: Payloads) -> TurnRecord:
    """A ``TurnRecord`` from ``_TURN_COLUMNS`` at column ``first`` on."""
    v = [res.get_value(row, first + c) for c in range(TURN_COLUMN_COUNT)]
    return payloads.turn_from_row(
        [
            *(as_text(x) for x in v[:8]),
            _float(v[8]),
            _float(v[9]),
            *(as_text(x) for x in v[10:14]),
            _float(v[14]),
            as_text(v[15]),
        ]
    )


TURN_COLUMN_COUNT = len(_TURN_COLUMNS.split(","))
TURN_COLUMNS_T = ", ".join(f"t.{c.strip()}" for c in _TURN_COLUMNS.split(","))

# A delivery's whole read in one statement, so in one snapshot: the session, the
# next event number, the transcript from an index (as one JSON array's items), the
# turn's memoized steps (as one JSON object's members), the turn's record and, last,
# the session's owner, pending reset and tombstone.
LOAD_SQL = (
    f"SELECT s.agent, s.generation, {sql.LAST_SEQ}, "
    "(SELECT string_agg(body, ',' ORDER BY idx) FROM turnkit_messages "
    "WHERE session_id = ? AND idx >= ?), "
    "(SELECT string_agg(to_json(step_id)::text || ':' || result, ',') FROM turnkit_steps "
    "WHERE session_id = ? AND turn_id = ?), "
    f"{TURN_COLUMNS_T}, s.owner, s.reset_requested, s.erased_by, s.erased_at "
    "FROM (SELECT) AS one "
    "LEFT JOIN turnkit_sessions s ON s.session_id = ? "
    "LEFT JOIN turnkit_turns t ON t.session_id = ? AND t.turn_id = ?"
)


class NoConnection(Exception):
    """Internal: the pool had no connection to give (its cause says why)."""
