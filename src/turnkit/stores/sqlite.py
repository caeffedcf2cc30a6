"""``SqliteStore``: many sessions in one SQLite file, the embedded default.

Transactions run on the calling thread: in WAL mode with ``synchronous=NORMAL`` a
commit costs tens of microseconds, less than handing the work to a thread would.
A local tool's ``ctx.store`` is this connection inside the open transaction.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, contextmanager
from typing import Any, TypeVar, cast

from .._errors import FatalToolError, StoreError
from .._seams.store import StoreHandle
from .._values.events import TurnEvent, event_from_dict
from .._values.messages import JsonObject, Message, message_from_dict
from .._values.records import (
    TERMINAL_TURN_STATUSES,
    SessionInfo,
    SessionKey,
    SessionSnapshot,
    SessionStatus,
    TurnRecord,
    TurnStatus,
    session_status_after,
)
from . import _archive_sql as archive_sql
from . import _sql as sql
from ._locks import SessionLocks
from ._sql_rows import dumps as _dumps
from ._sql_rows import session_info
from ._sql_rows import turn_from_row as _turn_from_row
from ._sqlite_schema import migrate, read_store_id

T = TypeVar("T")
log = logging.getLogger("turnkit.stores.sqlite")

#: The ``text`` field of a message's JSON body, in SQLite.
_TEXT_OF = "json_extract(m.body, '$.text')"

#: Commits between two background WAL checkpoints (see ``SqliteStore``).
CHECKPOINT_EVERY = 256
#: SQLite's own automatic checkpoint threshold, in pages, kept as a backstop.
CHECKPOINT_BACKSTOP_PAGES = 10_000
#: Truncate the WAL file back to this many bytes after a checkpoint.
JOURNAL_SIZE_LIMIT = 64 * 1024 * 1024


@contextmanager
def _reading(what: str) -> Iterator[None]:
    """Report a failed read as the store's error, naming what was being read."""
    try:
        yield
    except sqlite3.Error as exc:
        raise StoreError(f"cannot read {what}: {exc}") from exc
    except ValueError as exc:  # JSON that does not parse
        raise StoreError(f"{what} holds data that is not valid JSON: {exc}") from exc


_TRANSACTION_CONTROL = re.compile(
    r"^\s*(BEGIN|COMMIT|END|ROLLBACK(?!\s+(TRANSACTION\s+)?TO\b))\b", re.IGNORECASE
)
_ENDED = (
    "a local tool ended the step's transaction (commit or rollback on ctx.store); "
    "turnkit commits the step itself, so never end the transaction in a tool"
)


def _check_open(conn: sqlite3.Connection) -> None:
    if not conn.in_transaction:
        raise FatalToolError(_ENDED)


class _SqliteHandle:
    """``ctx.store`` for local tools: the raw connection, inside the step transaction."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def unwrap(self) -> sqlite3.Connection:
        return self._conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        if _TRANSACTION_CONTROL.match(sql):
            raise FatalToolError(f"{_ENDED}: refused {sql.split()[0].upper()}")
        rows = self._conn.execute(sql, tuple(params)).fetchall()
        _check_open(self._conn)
        return rows

    def transient(self, exc: BaseException) -> bool:
        """A database that stayed locked (``SQLITE_BUSY``) or a locked table
        (``SQLITE_LOCKED``): another connection's work, gone on a retry."""
        code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
        return isinstance(exc, sqlite3.OperationalError) and code in _TRANSIENT_CODES


#: SQLite's primary result codes for a lock another connection holds.
_TRANSIENT_CODES = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})


class _SqliteTransaction:
    def __init__(self, conn: sqlite3.Connection, session_id: str) -> None:
        self._conn = conn
        self._sid = session_id

    @property
    def handle(self) -> StoreHandle:
        return _SqliteHandle(self._conn)

    def append_message(self, index: int, message: Message) -> None:
        _check_open(self._conn)
        self._conn.execute(
            sql.INSERT_MESSAGE, (self._sid, index, message.turn_id, _dumps(message.to_dict()))
        )

    def put_step(self, step_id: str, turn_id: str, result: Any) -> None:
        _check_open(self._conn)
        self._conn.execute(sql.INSERT_STEP, (self._sid, turn_id, step_id, _dumps(result)))

    def log_event(self, event: TurnEvent) -> None:
        _check_open(self._conn)
        self._conn.execute(
            sql.INSERT_EVENT, (self._sid, event.seq, event.turn_id, _dumps(event.to_dict()))
        )

    def request_cancel(self, turn_id: str, reason: str) -> None:
        _check_open(self._conn)
        cur = self._conn.execute(archive_sql.REQUEST_CANCEL, (reason, self._sid, turn_id))
        if cur.rowcount != 1:
            raise StoreError(f"session {self._sid}: no turn {turn_id} to cancel")

    def archive_generation(self, generation: int, agent: str) -> None:
        _check_open(self._conn)
        statements = archive_sql.reset_statements(self._sid, agent, generation, time.time())
        for statement, params in statements:
            try:
                self._conn.execute(statement, params)
            except sqlite3.IntegrityError as exc:
                if statement is not archive_sql.RECORD_GENERATION:
                    raise
                raise StoreError(
                    f"session {self._sid}: generation {generation} was already archived "
                    "(another reset came first)"
                ) from exc

    def open_turn(self, record: TurnRecord, *, owner: str | None = None) -> None:
        _check_open(self._conn)
        now = time.time()
        self._conn.execute(
            sql.OPEN_TURN,
            (
                self._sid,
                record.turn_id,
                record.agent,
                _dumps(record.opening),
                _dumps(record.event) if record.event is not None else None,
                record.created_at or now,
            ),
        )
        self._conn.execute(sql.UPSERT_SESSION, (self._sid, record.agent, now, now, owner))

    def set_turn_status(
        self,
        turn_id: str,
        status: TurnStatus,
        *,
        text: str | None = None,
        error: str | None = None,
        pending: JsonObject | None = None,
    ) -> None:
        _check_open(self._conn)
        now = time.time()
        terminal = status in TERMINAL_TURN_STATUSES
        kept = _dumps(pending) if status == "suspended" and pending is not None else None
        cur = self._conn.execute(
            sql.SET_TURN_STATUS,
            (status, text, error, now if terminal else None, kept, self._sid, turn_id),
        )
        if cur.rowcount != 1:
            raise StoreError(f"session {self._sid}: no turn {turn_id} to update")
        self._conn.execute(sql.SET_SESSION_STATUS, (session_status_after(status), now, self._sid))


class _SqliteSession:
    def __init__(self, store: SqliteStore, session_id: str) -> None:
        self._store = store
        self._sid = session_id

    @property
    def session_id(self) -> str:
        return self._sid

    def writer(self) -> AbstractAsyncContextManager[None]:
        # In-process only: one runtime per SQLite file is the supported deployment.
        return self._store._locks.hold(self._sid)

    async def load(self, turn_id: str | None = None, *, from_index: int = 0) -> SessionSnapshot:
        conn = self._store.connection
        with _reading(f"session {self._sid}"):
            # One read transaction, so the snapshot is consistent across the tables.
            conn.execute("BEGIN")
            try:
                return self._read_snapshot(conn, turn_id, from_index)
            finally:
                conn.execute("COMMIT")

    def _read_snapshot(
        self, conn: sqlite3.Connection, turn_id: str | None, from_index: int
    ) -> SessionSnapshot:
        rows = conn.execute(
            "SELECT body FROM turnkit_messages WHERE session_id = ? AND idx >= ? ORDER BY idx",
            (self._sid, from_index),
        ).fetchall()
        messages = [message_from_dict(json.loads(r[0])) for r in rows]
        steps: dict[str, Any] = {}
        turn = None
        if turn_id is not None:
            for step_id, result in conn.execute(
                "SELECT step_id, result FROM turnkit_steps WHERE session_id = ? AND turn_id = ?",
                (self._sid, turn_id),
            ):
                steps[step_id] = json.loads(result)
            turn = self._read_turn(conn, turn_id)
        # Numbering carries on across resets, so an event id a client kept from an
        # earlier generation never names a newer event.
        seq_row = conn.execute(f"SELECT {sql.LAST_SEQ}", (self._sid, self._sid)).fetchone()
        agent_row = conn.execute(
            "SELECT agent, generation, owner FROM turnkit_sessions WHERE session_id = ?",
            (self._sid,),
        ).fetchone()
        return SessionSnapshot(
            messages=messages,
            store_id=self._store.store_id,
            steps=steps,
            turn=turn,
            agent=agent_row[0] if agent_row else None,
            next_seq=(seq_row[0] or 0) + 1,
            generation=agent_row[1] if agent_row else 0,
            from_index=from_index,
            owner=agent_row[2] if agent_row else None,
        )

    async def commit(self, work: Callable[[Any], T]) -> T:
        conn = self._store.connection
        await self._begin(conn)
        try:
            result = work(_SqliteTransaction(conn, self._sid))
            conn.execute("COMMIT")
        except BaseException as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.IntegrityError):
                raise StoreError(
                    f"session {self._sid}: commit failed: {exc} (another writer advanced "
                    "this session; run one runtime per session at a time)"
                ) from exc
            if isinstance(exc, sqlite3.Error):
                # Only the store's own statements get here: tool errors arrive wrapped.
                raise StoreError(f"session {self._sid}: commit failed: {exc}") from exc
            raise
        self._store._committed()
        return result

    async def _begin(self, conn: sqlite3.Connection) -> None:
        """``BEGIN IMMEDIATE``, waiting for another process's write lock without blocking
        the event loop: the connection never busy-waits, this retries with a sleep."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._store.busy_timeout
        delay = 0.001
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                # The extended code (SQLITE_BUSY_RECOVERY, …) carries BUSY in its low byte.
                if getattr(exc, "sqlite_errorcode", 0) & 0xFF != sqlite3.SQLITE_BUSY:
                    raise StoreError(f"session {self._sid}: cannot begin: {exc}") from exc
                if loop.time() >= deadline:
                    raise StoreError(
                        f"session {self._sid}: the database stayed locked by another "
                        f"connection for {self._store.busy_timeout:g}s"
                    ) from exc
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)

    async def turn(self, turn_id: str) -> TurnRecord | None:
        with _reading(f"turn {turn_id}"):
            return self._read_turn(self._store.connection, turn_id)

    def _read_turn(self, conn: sqlite3.Connection, turn_id: str) -> TurnRecord | None:
        row = conn.execute(sql.TURN, (self._sid, turn_id)).fetchone()
        return _turn_from_row(row) if row else None

    async def messages(self) -> list[Message]:
        with _reading(f"session {self._sid}"):
            rows = self._store.connection.execute(sql.MESSAGES, (self._sid,)).fetchall()
            return [message_from_dict(json.loads(r[0])) for r in rows]

    async def events(self, *, turn_id: str | None = None, after: int = 0) -> list[TurnEvent]:
        with _reading(f"events of session {self._sid}"):
            return self._read_events(turn_id, after)

    def _read_events(self, turn_id: str | None, after: int) -> list[TurnEvent]:
        conn = self._store.connection
        if turn_id is None:
            rows = conn.execute(sql.EVENTS, (self._sid, after)).fetchall()
        else:
            rows = conn.execute(sql.TURN_EVENTS, (self._sid, turn_id, after)).fetchall()
        return [event_from_dict(json.loads(r[0])) for r in rows]

    async def generations(self) -> list[int]:
        with _reading(f"generations of session {self._sid}"):
            rows = self._store.connection.execute(archive_sql.GENERATIONS, (self._sid,))
            return [int(r[0]) for r in rows.fetchall()]

    async def archived_messages(self, generation: int) -> list[Message]:
        with _reading(f"session {self._sid} generation {generation}"):
            rows = self._store.connection.execute(
                archive_sql.ARCHIVED_MESSAGES, (self._sid, generation)
            ).fetchall()
            return [message_from_dict(json.loads(r[0])) for r in rows]

    async def unfinished(self) -> list[TurnRecord]:
        with _reading(f"session {self._sid}"):
            rows = self._store.connection.execute(sql.UNFINISHED, (self._sid,)).fetchall()
            return [_turn_from_row(r) for r in rows]

    async def parked(self) -> TurnRecord | None:
        with _reading(f"session {self._sid}"):
            row = self._store.connection.execute(sql.PARKED, (self._sid,)).fetchone()
            return _turn_from_row(row) if row else None

    async def status(self) -> SessionStatus:
        with _reading(f"session {self._sid}"):
            row = self._store.connection.execute(sql.STATUS, (self._sid,)).fetchone()
        return cast(SessionStatus, row[0]) if row else "new"


def _not_open() -> StoreError:
    return StoreError(
        "SqliteStore is not open: use it through `async with Runtime(...)` "
        "or await store.open() first"
    )


class SqliteStore:
    """Sessions in one SQLite file (WAL). ``busy_timeout`` is how long, in seconds, a
    write waits for another process's lock before failing.

    WAL checkpoints (copying committed pages back into the database file, with an
    fsync) run on a worker thread every ``CHECKPOINT_EVERY`` commits instead of
    inside whichever commit crosses SQLite's threshold, so they never stall the
    event loop; SQLite's own automatic checkpoint stays on as a backstop.
    """

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout: float = 5.0) -> None:
        self.path = os.fspath(path)
        self.busy_timeout = busy_timeout
        self._conn: sqlite3.Connection | None = None
        self._store_id: str | None = None
        self._since_checkpoint = 0
        self._checkpoint: asyncio.Future[None] | None = None
        self._checkpoint_conn: sqlite3.Connection | None = None
        #: How many background checkpoints have completed (for monitoring and tests).
        self.checkpoints = 0
        self._locks = SessionLocks()

    def _committed(self) -> None:
        """Count a commit; start a background checkpoint when enough have piled up."""
        self._since_checkpoint += 1
        if self._since_checkpoint < CHECKPOINT_EVERY or self._checkpoint is not None:
            return
        self._since_checkpoint = 0
        self._checkpoint = asyncio.get_running_loop().run_in_executor(None, self._run_checkpoint)
        self._checkpoint.add_done_callback(self._checkpoint_done)

    def _run_checkpoint(self) -> None:
        if self._checkpoint_conn is None:
            self._checkpoint_conn = sqlite3.connect(
                self.path,
                timeout=self.busy_timeout,
                isolation_level=None,
                check_same_thread=False,
            )
        self._checkpoint_conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    def _checkpoint_done(self, future: asyncio.Future[None]) -> None:
        self._checkpoint = None
        if future.cancelled():
            return
        if future.exception() is not None:
            log.warning("background WAL checkpoint of %s failed: %s", self.path, future.exception())
        else:
            self.checkpoints += 1

    @property
    def connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise _not_open()
        return self._conn

    @property
    def store_id(self) -> str:
        """The identity this file was given when turnkit created its tables (random,
        kept in the file): the same in every process that opens it."""
        if self._store_id is None:
            raise _not_open()
        return self._store_id

    async def open(self) -> None:
        if self._conn is not None:
            return
        parent = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(parent):
            raise StoreError(f"SqliteStore: directory {parent!r} does not exist")
        # Migrations may wait for another process's lock: do it off the event loop.
        self._conn = await asyncio.to_thread(self._connect)

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False
        )
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            # Backstop only: the background checkpoint normally runs long before this.
            conn.execute(f"PRAGMA wal_autocheckpoint = {CHECKPOINT_BACKSTOP_PAGES}")
            conn.execute(f"PRAGMA journal_size_limit = {JOURNAL_SIZE_LIMIT}")
            migrate(conn)
            self._store_id = read_store_id(conn)
            # From here on a locked database is waited for in ``_begin``, off the loop.
            conn.execute("PRAGMA busy_timeout = 0")
        except BaseException as exc:
            conn.close()
            if isinstance(exc, sqlite3.DatabaseError):
                raise StoreError(f"SqliteStore: cannot open {self.path!r}: {exc}") from exc
            raise
        return conn

    async def close(self) -> None:
        if self._checkpoint is not None:
            await asyncio.wait([self._checkpoint])
        if self._checkpoint_conn is not None:
            self._checkpoint_conn.close()
            self._checkpoint_conn = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def session(self, session_id: str) -> _SqliteSession:
        return _SqliteSession(self, session_id)

    async def sessions(self) -> list[SessionInfo]:
        with _reading("the session list"):
            rows = self.connection.execute(sql.with_previews(sql.SESSIONS, _TEXT_OF)).fetchall()
        return sorted((session_info(r) for r in rows), key=lambda i: i.session_id)

    async def session_page(
        self,
        *,
        agent: str | None = None,
        limit: int,
        after: SessionKey | None = None,
        owner: str | None = None,
    ) -> list[SessionInfo]:
        query, params = sql.session_page_sql(agent, limit, after, text_of=_TEXT_OF, owner=owner)
        with _reading("the session list"):
            rows = self.connection.execute(query, params).fetchall()
        return [session_info(r) for r in rows]

    async def unfinished_turns(self) -> list[TurnRecord]:
        with _reading("unfinished turns"):
            rows = self.connection.execute(sql.UNFINISHED_TURNS).fetchall()
            return [_turn_from_row(r) for r in rows]
