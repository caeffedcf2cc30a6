"""PostgresStore's requests on the wire (the one module that touches libpq's
connection, ``conn.pgconn``): statements sent in libpq's pipeline mode
through psycopg's documented libpq wrapper (``psycopg.pq``), every value a bound
parameter in PostgreSQL's text format, and the results read without psycopg's
cursor layer (whose CPU per statement costs more than the round trip itself).

A request is a list of statements and one Sync: one round trip, and (outside an
explicit transaction) one implicit transaction, so a failing statement undoes
the whole request and the ones after it are skipped.
"""

from __future__ import annotations

import asyncio
import functools
import re
import select
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg.pq import DiagnosticField, ExecStatus, PipelineStatus
from psycopg.pq.abc import PGresult

#: A value in PostgreSQL's text format (``None`` is SQL NULL).
Value = bytes | None


@dataclass(frozen=True, slots=True)
class Query:
    """A statement with ``$1``, ``$2``, ... placeholders and their values."""

    sql: bytes
    values: tuple[Value, ...]


@dataclass(frozen=True, slots=True)
class Execute:
    """A run of the statement prepared on the connection as ``name``."""

    name: bytes
    values: tuple[Value, ...]


@dataclass(frozen=True, slots=True)
class Prepare:
    """Prepare ``sql`` (``$n`` placeholders) on the connection as ``name``."""

    name: bytes
    sql: bytes


Statement = Query | Execute | Prepare


def value(v: Any) -> Value:
    """``v`` as a text-format parameter: str, int, float, bool or None."""
    if v is None:
        return None
    if isinstance(v, str):
        if "\0" in v:
            raise psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes")
        try:
            return v.encode()
        except UnicodeEncodeError as exc:  # a lone surrogate, which UTF-8 cannot carry
            raise psycopg.DataError(f"text that is not valid Unicode: {exc}") from None
    if isinstance(v, bool):
        return b"true" if v else b"false"
    if isinstance(v, int):
        return int.__repr__(v).encode()
    if isinstance(v, float):
        return float.__repr__(v).encode()
    raise TypeError(f"PostgresStore cannot send a {type(v).__name__} as a parameter")


@functools.cache
def numbered(sql: str) -> bytes:
    """``sql`` written with psycopg's ``%s`` placeholders, with ``$1``, ``$2``, ...
    instead (``%%`` read as ``%``)."""
    out: list[str] = []
    n = 0
    for part in re.split(r"(%s|%%)", sql):
        if part == "%s":
            n += 1
            out.append(f"${n}")
        else:
            out.append("%" if part == "%%" else part)
    return "".join(out).encode()


def values(params: Sequence[Any]) -> tuple[Value, ...]:
    return tuple(map(value, params))


def query(sql: str, params: Sequence[Any]) -> Query:
    """``sql`` (``%s`` placeholders) with ``params`` bound."""
    return Query(numbered(sql), tuple(value(p) for p in params))


def execute(name: bytes, params: Sequence[Any]) -> Execute:
    return Execute(name, tuple(value(p) for p in params))


def socket_of(conn: psycopg.AsyncConnection[Any]) -> int:
    """The connection's socket, to watch on the event loop."""
    return conn.pgconn.socket


def consume(conn: psycopg.AsyncConnection[Any]) -> None:
    """Read what the server has sent so far (so the socket is not readable again)."""
    conn.pgconn.consume_input()


def send(
    conn: psycopg.AsyncConnection[Any] | psycopg.Connection[Any], statements: Sequence[Statement]
) -> None:
    """Queue ``statements`` and a Sync in pipeline mode (libpq flushes what fits)."""
    pgconn = conn.pgconn
    pgconn.enter_pipeline_mode()
    for s in statements:
        if type(s) is Query:
            pgconn.send_query_params(s.sql, s.values)
        elif type(s) is Execute:
            pgconn.send_query_prepared(s.name, s.values)
        else:
            assert type(s) is Prepare
            pgconn.send_prepare(s.name, s.sql)
    pgconn.pipeline_sync()


class Plans:
    """The statements prepared on one connection: each query it has prepared runs as
    its prepared statement, and one sent before is prepared the next time, in the
    same request (the server then parses and plans it once per connection, as
    psycopg does for repeated queries)."""

    __slots__ = ("_names", "_next", "_seen")

    def __init__(self) -> None:
        self._names: dict[bytes, bytes] = {}
        self._seen: set[bytes] = set()
        #: The number of the next name: never one given before, so a statement
        #: prepared after ``forget`` cannot collide with one the server still has.
        self._next = 0

    def plan(self, statements: Sequence[Statement]) -> tuple[list[Statement], dict[int, bytes]]:
        """What to send for ``statements``, and which of them are prepared in it (by
        their index: each is sent as a Prepare, then its Execute)."""
        sent: list[Statement] = []
        fresh: dict[int, bytes] = {}
        planned: dict[bytes, bytes] = {}  # prepared earlier in this request
        for i, s in enumerate(statements):
            if type(s) is not Query:
                sent.append(s)
                continue
            name = self._names.get(s.sql) or planned.get(s.sql)
            if name is not None:
                sent.append(Execute(name, s.values))
            elif s.sql in self._seen and len(self._names) + len(planned) < _MAX_PREPARED:
                name = planned[s.sql] = b"turnkit_c%d" % self._next
                self._next += 1
                sent += (Prepare(name, s.sql), Execute(name, s.values))
                fresh[i] = s.sql
            else:
                if len(self._seen) < 4 * _MAX_PREPARED:
                    self._seen.add(s.sql)
                sent.append(s)
        return sent, fresh

    def forget(self) -> None:
        """Prepare afresh: the connection may have lost its prepared statements."""
        self._names.clear()

    def mine(
        self,
        statements: Sequence[Statement],
        sent: Sequence[Statement],
        fresh: dict[int, bytes],
        results: list[PGresult],
    ) -> list[PGresult]:
        """The results of what ``plan`` sent, one per statement of ``statements``;
        the statements it prepared are known prepared from now on (those whose
        Prepare failed are not: that error stands for the statement's)."""
        if not fresh:
            return results
        mine: list[PGresult] = []
        at = 0
        for i in range(len(statements)):
            if i in fresh:  # a Prepare, then its Execute
                prepared = results[at]
                if prepared.status == ExecStatus.COMMAND_OK:
                    self._names[fresh[i]] = sent[at].name  # type: ignore[union-attr]
                    mine.append(results[at + 1])
                else:
                    mine.append(prepared)
                at += 2
            else:
                mine.append(results[at])
                at += 1
        return mine


#: SQLSTATE invalid_sql_statement_name: an Execute of a name not prepared.
_NO_SUCH_STATEMENT = "26000"
#: Statements one connection prepares at most (the commits of a step, and group
#: commits of up to some dozens of sessions, need far fewer).
_MAX_PREPARED = 64


class Results:
    """A pipeline's results, gathered as they arrive: one per statement (an error,
    or ``PIPELINE_ABORTED`` for those skipped after it), up to the Sync."""

    __slots__ = ("_in_one", "done", "results")

    def __init__(self) -> None:
        self.results: list[PGresult] = []
        self.done = False
        self._in_one = False  # a statement's result is in, its end not yet

    def feed(self, conn: psycopg.AsyncConnection[Any] | psycopg.Connection[Any]) -> bool:
        """Read what the server has sent; whether the Sync is in (the pipeline is
        then left, and the connection is idle again)."""
        pgconn = conn.pgconn
        pgconn.consume_input()
        while not pgconn.is_busy():
            res = pgconn.get_result()
            if res is None:
                if not self._in_one:
                    break  # nothing more has arrived
                self._in_one = False  # the end of one statement's results
                continue
            if res.status == ExecStatus.PIPELINE_SYNC:
                pgconn.exit_pipeline_mode()
                self.done = True
                return True
            if not self._in_one:
                self.results.append(res)
                self._in_one = True
        return False


def raise_first_error(results: Sequence[PGresult], encoding: str) -> None:
    for res in results:
        if res.status == ExecStatus.FATAL_ERROR:
            raise error(res, encoding)


def error(res: PGresult, encoding: str) -> psycopg.Error:
    """The exception psycopg raises for an error result (its SQLSTATE's class)."""
    state = (res.error_field(DiagnosticField.SQLSTATE) or b"").decode("ascii", "replace")
    try:
        cls = pg_errors.lookup(state)
    except KeyError:
        cls = psycopg.DatabaseError
    text = res.error_message.decode(encoding, "replace")
    return cls(_SEVERITY.sub("", text).rstrip(), info=res, encoding=encoding)


#: The severity libpq puts before an error's text, which psycopg's messages leave out.
_SEVERITY = re.compile(r"^(ERROR|FATAL|PANIC):\s+")


async def flush(conn: psycopg.AsyncConnection[Any], loop: asyncio.AbstractEventLoop) -> None:
    """Send what libpq still holds of a request that did not fit the socket's buffer
    (rare: waited on the plain way)."""
    pgconn = conn.pgconn
    while pgconn.flush():
        fd = pgconn.socket
        _, writable, _ = select.select([], [fd], [], 0)
        if not writable:
            await _ready(loop, fd, write=True)


async def exchange(
    conn: psycopg.AsyncConnection[Any], statements: Sequence[Statement], *, check: bool = True
) -> list[PGresult]:
    """Run ``statements`` as one request on ``conn`` (which the caller owns and no
    one else is reading) and return their results; with ``check``, the first error
    is raised. A request interrupted midway leaves the connection unusable, so it
    is closed."""
    pgconn = conn.pgconn
    loop = asyncio.get_running_loop()
    got = Results()
    try:
        send(conn, statements)
        await flush(conn, loop)
        while not got.feed(conn):
            await _ready(loop, pgconn.socket)
    except BaseException:
        if pgconn.pipeline_status != PipelineStatus.OFF:
            await conn.close()
        raise
    if check:
        raise_first_error(got.results, conn.info.encoding)
    return got.results


def exchange_blocking(
    conn: psycopg.Connection[Any], statements: Sequence[Statement], plans: Plans
) -> list[PGresult]:
    """``exchange`` on a blocking connection (a local tool's step, on its thread),
    with the statements ``plans`` (the connection's) has prepared: the thread waits
    on the socket, without the GIL, as psycopg's own waits do. A request
    interrupted midway leaves the connection unusable, so it is closed."""
    pgconn = conn.pgconn
    got = Results()
    sent, fresh = plans.plan(statements)
    try:
        send(conn, sent)
        while pgconn.flush():
            select.select([], [pgconn.socket], [])
        while not got.feed(conn):
            select.select([pgconn.socket], [], [])
    except BaseException:
        if pgconn.pipeline_status != PipelineStatus.OFF:
            conn.close()
        raise
    results = plans.mine(statements, sent, fresh, got.results)
    try:
        raise_first_error(results, conn.info.encoding)
    except psycopg.Error as exc:
        if exc.sqlstate == _NO_SUCH_STATEMENT:  # a tool ran DEALLOCATE on the connection
            plans.forget()
        raise
    return results


async def _ready(loop: asyncio.AbstractEventLoop, fd: int, *, write: bool = False) -> None:
    """Wait until ``fd`` is readable (or writable)."""
    future: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not future.done():
            future.set_result(None)

    (loop.add_writer if write else loop.add_reader)(fd, wake)
    try:
        await future
    finally:
        (loop.remove_writer if write else loop.remove_reader)(fd)
