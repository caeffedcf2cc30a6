"""``SqliteStore``: many sessions in one SQLite file, the embedded default.

A process writes a file through one connection, taken in turn by whoever commits
(``_sqlite_writer``); reads go through a connection of their own. The engine's own
commits run on the event loop's thread: in WAL mode with ``synchronous=NORMAL`` a
commit costs tens of microseconds, less than handing the work to a thread would.
A local tool may block, so its step runs on one of the store's tool threads; the
tool's first use of ``ctx.store`` takes the writer there and begins the step's
transaction, and the step's rows commit in it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import sqlite3
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, contextmanager
from typing import Any, TypeVar, cast

from .._errors import (
    ConfigurationError,
    FatalToolError,
    GenerationArchivedError,
    StoreError,
    TurnMoveError,
    WriteConflictError,
)
from .._seams.blobs import BlobStore
from .._seams.codec import Codec
from .._seams.store import ToolStep
from .._values.budgets import Spend
from .._values.events import TurnEvent, event_from_dict
from .._values.messages import Message, message_from_dict
from .._values.records import (
    Erasure,
    SessionInfo,
    SessionKey,
    SessionSnapshot,
    SessionStatus,
    TurnRecord,
    TurnStatus,
)
from .._values.step_results import StepResults
from .._values.writes import AppendMessage, CountUsage, LogEvent, PutStep, Write
from . import _archive_sql as archive_sql
from . import _blob_outbox as blob_outbox
from . import _erase_sql as erase_sql
from . import _retention_sql as retention_sql
from . import _sql as sql
from . import _usage_sql as usage_sql
from ._apply import apply_writes
from ._host_locks import HostSessionLocks
from ._off_loop import on_thread
from ._payloads import Payloads
from ._spill import DEFAULT_BLOB_THRESHOLD
from ._sql_rows import move_values, new_turn_values, refused_move, session_info
from ._sqlite_schema import migrate, read_store_id
from ._sqlite_writer import SqliteWriter
from ._tool_threads import ToolThreads
from .blobs import FileBlobStore

T = TypeVar("T")
log = logging.getLogger("turnkit.stores.sqlite")

#: The ``text`` field of a message's JSON body, in SQLite (a sealed body, a BLOB, has
#: none a store without the codec can read: its session is listed with no preview).
_TEXT_OF = (
    "CASE WHEN typeof(m.body) <> 'text' THEN NULL "
    "WHEN substr(m.body, 1, 8) = '\"\\u0000~' THEN m.body "
    "ELSE json_extract(m.body, '$.text') END"
)

#: Commits between two background WAL checkpoints (see ``SqliteStore``).
CHECKPOINT_EVERY = 256
#: WAL frames (pages) past which a background checkpoint also rewinds the WAL, so it
#: never grows to the backstop (``RESTART``; see ``SqliteStore``). A rewind holds
#: every commit of the process back for its fsync, so it waits until the WAL has
#: grown over several checkpoints: at 1,024 pages, commits of a few pages each
#: crossed it between every two checkpoints and each one stalled the writers.
RESTART_FRAMES = 4096
#: SQLite's own automatic checkpoint threshold, in pages, kept as a backstop.
CHECKPOINT_BACKSTOP_PAGES = 10_000
#: Truncate the WAL file back to this many bytes after a checkpoint.
JOURNAL_SIZE_LIMIT = 64 * 1024 * 1024
#: Appended to the database's path to name the sidecar file of session writer locks.
LOCK_FILE_SUFFIX = "-locks"


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
        return _transient(exc)


def _transient(exc: BaseException) -> bool:
    """A database that stayed locked (``SQLITE_BUSY``) or a locked table
    (``SQLITE_LOCKED``): another connection's work, gone on a retry."""
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    return isinstance(exc, sqlite3.OperationalError) and code in _TRANSIENT_CODES


#: SQLite's primary result codes for a lock another connection holds.
_TRANSIENT_CODES = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})


class _ToolHandle:
    """``ctx.store`` on a tool thread: the store's write connection, which the tool
    takes (in turn with every other writer of the process) and whose transaction
    begins (``BEGIN IMMEDIATE``) at the tool's first use, so a tool that blocks
    before it writes holds nothing meanwhile."""

    def __init__(self, store: SqliteStore, session_id: str) -> None:
        self._store = store
        self._sid = session_id
        #: The connection whose transaction the tool began, once it has; the tool
        #: then holds the writer until ``_run_tool`` lets it go.
        self.conn: sqlite3.Connection | None = None
        #: Why the transaction could not begin: the step fails with it even if the
        #: tool caught it.
        self.failed: StoreError | None = None

    def _open(self) -> sqlite3.Connection:
        if self.conn is not None:
            return self.conn
        if self.failed is not None:
            raise self.failed
        writer = self._store._write_connection
        writer.turns.take_blocking()  # on this thread, not the loop
        try:
            _begin_blocking(writer.conn, self._store.busy_timeout)
        except StoreError as exc:
            writer.turns.release()
            self.failed = StoreError(f"session {self._sid}: cannot begin the tool's step: {exc}")
            raise self.failed from exc
        self.conn = writer.conn
        return self.conn

    def release(self) -> None:
        """Let the writer go (``_run_tool``, once the step committed or rolled back)."""
        if self.conn is not None:
            self.conn = None
            self._store._write_connection.turns.release()

    def unwrap(self) -> sqlite3.Connection:
        return self._open()

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return _SqliteHandle(self._open()).execute(sql, params)

    def transient(self, exc: BaseException) -> bool:
        return _transient(exc)


def _try_begin(conn: sqlite3.Connection, what: str) -> bool:
    """``BEGIN IMMEDIATE``: whether it began (``False``: another connection holds
    the write lock)."""
    try:
        conn.execute("BEGIN IMMEDIATE")
        return True
    except sqlite3.OperationalError as exc:
        # The extended code (SQLITE_BUSY_RECOVERY, …) carries BUSY in its low byte.
        if getattr(exc, "sqlite_errorcode", 0) & 0xFF != sqlite3.SQLITE_BUSY:
            raise StoreError(f"session {what}: cannot begin: {exc}") from exc
        return False


def _begin_blocking(conn: sqlite3.Connection, timeout: float) -> None:
    """``BEGIN IMMEDIATE`` on a thread that may block: another process's lock is
    waited for up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    delay = 0.001
    while not _try_begin(conn, "the tool's step"):
        if time.monotonic() >= deadline:
            raise StoreError(f"the database stayed locked by another connection for {timeout:g}s")
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def _commit_failed(session_id: str, exc: BaseException) -> BaseException:
    """What a failed commit raises: the store's own SQL errors as ``StoreError``s,
    anything else (a tool's error, the engine's) unchanged."""
    if isinstance(exc, sqlite3.IntegrityError):
        return WriteConflictError(
            f"session {session_id}: commit failed: {exc} (another writer advanced "
            "this session; run one runtime per session at a time)"
        )
    if isinstance(exc, sqlite3.Error):
        # Only the store's own statements get here: tool errors arrive wrapped.
        return StoreError(f"session {session_id}: commit failed: {exc}")
    return exc


class _SqliteTransaction:
    def __init__(
        self,
        conn: sqlite3.Connection,
        session_id: str,
        payloads: Payloads,
        blobs: BlobStore | None = None,
        owes: bool = False,
    ) -> None:
        self._conn = conn
        self._sid = session_id
        self._payloads = payloads
        self._blobs = blobs
        #: Whether deleting rows owes blob deletions: the store has blobs, or this
        #: file has kept some (a store opened without them records what it owes).
        self._owes = owes or blobs is not None
        self._dump = payloads.dumper(blobs.put if blobs is not None else None)
        #: Whether this transaction records a cancellation (others are then told).
        self.cancels = False
        #: Blob deletions owed once the rows that refer to them are gone (committed):
        #: (their ``turnkit_blob_deletions`` row, the turns as JSON, whether every
        #: blob of the session goes).
        self.after: list[tuple[int, str, bool]] = []

    def apply(self, writes: Sequence[Write]) -> None:
        """Make ``writes`` in order: the rows a step commits (messages, steps, events)
        here, without a call per write through ``apply_writes``; from the first write
        of another kind, the rest through it."""
        conn = self._conn
        _check_open(conn)
        sid, dump, execute = self._sid, self._dump, conn.execute
        for i, w in enumerate(writes):
            if type(w) is AppendMessage:
                message = w.message
                tid = message.turn_id
                body = dump(sid, "message", message.to_dict(), tid)
                execute(sql.INSERT_MESSAGE, (sid, w.index, tid, body))
            elif type(w) is PutStep:
                stored = dump(sid, "step", w.result, w.turn_id)
                execute(sql.INSERT_STEP, (sid, w.turn_id, w.step_id, stored))
            elif type(w) is LogEvent:
                event = w.event
                tid = event.turn_id
                body = dump(sid, "event", event.to_dict(), tid)
                execute(sql.INSERT_EVENT, (sid, event.seq, tid, body))
            else:
                apply_writes(self, writes[i:])
                return

    def append_message(self, index: int, message: Message) -> None:
        _check_open(self._conn)
        turn_id = message.turn_id
        body = self._dump(self._sid, "message", message.to_dict(), turn_id)
        self._conn.execute(sql.INSERT_MESSAGE, (self._sid, index, turn_id, body))

    def put_step(self, step_id: str, turn_id: str, result: Any) -> None:
        _check_open(self._conn)
        stored = self._dump(self._sid, "step", result, turn_id)
        self._conn.execute(sql.INSERT_STEP, (self._sid, turn_id, step_id, stored))

    def count_usage(self, w: CountUsage) -> None:
        _check_open(self._conn)
        for statement, params in usage_sql.count_statements(self._sid, w):
            self._conn.execute(statement, params)

    def log_event(self, event: TurnEvent) -> None:
        _check_open(self._conn)
        turn_id = event.turn_id
        body = self._dump(self._sid, "event", event.to_dict(), turn_id)
        self._conn.execute(sql.INSERT_EVENT, (self._sid, event.seq, turn_id, body))

    def request_cancel(self, turn_id: str, reason: str) -> None:
        _check_open(self._conn)
        cur = self._conn.execute(archive_sql.REQUEST_CANCEL, (reason, self._sid, turn_id))
        if cur.rowcount != 1:
            raise StoreError(f"session {self._sid}: no turn {turn_id} to cancel")
        self.cancels = True

    def archive_generation(self, generation: int, agent: str) -> None:
        _check_open(self._conn)
        statements = archive_sql.reset_statements(self._sid, agent, generation, time.time())
        for statement, params in statements:
            try:
                self._conn.execute(statement, params)
            except sqlite3.IntegrityError as exc:
                if statement is not archive_sql.RECORD_GENERATION:
                    raise
                raise GenerationArchivedError(
                    f"session {self._sid}: generation {generation} was already archived "
                    "(another reset came first)"
                ) from exc

    def erase_session(self, by: str | None) -> None:
        _check_open(self._conn)
        turns = blob_outbox.session_turns(self._conn, self._sid) if self._owes else ""
        for statement, params in erase_sql.erase_statements(self._sid, by, time.time()):
            self._conn.execute(statement, params)
        if self._owes:
            self._owe(turns, whole=True)

    def _owe(self, turns: str, *, whole: bool = False) -> None:
        """Record a blob deletion this transaction's rows owe (see ``_blob_outbox``)."""
        cur = self._conn.execute(blob_outbox.OWE, (self._sid, turns))
        self.after.append((int(cur.lastrowid or 0), turns, whole))

    def drop_generation(self, generation: int) -> None:
        _check_open(self._conn)
        if self._owes:
            rows = self._conn.execute(
                retention_sql.GENERATION_ONLY_TURNS, (self._sid, generation, generation)
            ).fetchall()
            self._owe(json.dumps([r[0] for r in rows]))
        for statement, params in retention_sql.drop_generation_statements(self._sid, generation):
            self._conn.execute(statement, params)

    def trim_events(self, turn_id: str) -> None:
        _check_open(self._conn)
        for statement, params in retention_sql.trim_events_statements(self._sid, turn_id):
            self._conn.execute(statement, params)

    def prune_session(self, idle_before: float) -> None:
        _check_open(self._conn)
        turns = blob_outbox.session_turns(self._conn, self._sid) if self._owes else ""
        for statement, params in retention_sql.prune_session_statements(self._sid, idle_before):
            self._conn.execute(statement, params)
        if self._owes:  # owed only if the session's row went
            owe = (self._sid, turns, self._sid)
            cur = self._conn.execute(blob_outbox.OWE_IF_PRUNED, owe)
            if cur.rowcount == 1:
                self.after.append((int(cur.lastrowid or 0), turns, True))

    def request_reset(self) -> None:
        _check_open(self._conn)
        for statement, params in archive_sql.request_reset_statements(self._sid, time.time()):
            self._conn.execute(statement, params)
        self.cancels = True

    def drop_reset(self) -> None:
        _check_open(self._conn)
        self._conn.execute(archive_sql.DROP_RESET, (self._sid,))

    def put_turn(
        self,
        record: TurnRecord,
        expect: TurnStatus | None,
        session_status: SessionStatus | None,
        owner: str | None,
    ) -> None:
        _check_open(self._conn)
        now = time.time()
        sid = self._sid
        if expect is None:
            values = new_turn_values(sid, record, now, self._payloads, self._dump)
            cur = self._conn.execute(sql.NEW_TURN, values)
        else:
            values = move_values(sid, record, expect, self._payloads, self._dump)
            cur = self._conn.execute(sql.MOVE_TURN, values)
        if cur.rowcount != 1:
            raise TurnMoveError(refused_move(sid, record, expect))
        if session_status is not None:
            row = (sid, record.agent, session_status, now, now, owner)
            self._conn.execute(sql.PUT_SESSION, row)
        elif expect is None:
            self._conn.execute(sql.SESSION_SEEN, (sid, record.agent, now, now, owner))


def _delete_blobs(
    session_id: str, blobs: BlobStore | None, owed: list[tuple[int, str, bool]]
) -> list[int]:
    """Delete the blobs a committed erasure or retention pass left without rows (the
    caller still holds the session's writer lock); the ``turnkit_blob_deletions`` rows
    now done."""
    if blobs is None:
        return []
    for _, turns, whole in owed:
        try:
            blob_outbox.carry_out(blobs, session_id, turns, whole)
        except StoreError as exc:
            raise StoreError(
                f"session {session_id}: its rows are deleted, but not all its blobs yet: "
                f"{exc} (the store deletes them when it next opens)"
            ) from exc
    return [row for row, _, _ in owed]


class _SqliteSession:
    def __init__(self, store: SqliteStore, session_id: str) -> None:
        self._store = store
        self._sid = session_id
        #: The last cancel_reason read: (turn id, the lock file's mark then, reason).
        self._cancel_seen: tuple[str, bytes | None, str | None] = ("", None, None)

    @property
    def session_id(self) -> str:
        return self._sid

    def writer(self) -> AbstractAsyncContextManager[None]:
        # Across processes too: see HostSessionLocks.
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
        load = self._store._payloads.load
        sid = self._sid
        messages = [message_from_dict(load(sid, "message", r[0])) for r in rows]
        steps: dict[str, Any] = {}
        turn = None
        if turn_id is not None:
            for step_id, result in conn.execute(
                "SELECT step_id, result FROM turnkit_steps WHERE session_id = ? AND turn_id = ?",
                (sid, turn_id),
            ):
                steps[step_id] = load(sid, "step", result)
            turn = self._read_turn(conn, turn_id)
        # Numbering carries on across resets, so an event id a client kept from an
        # earlier generation never names a newer event.
        seq_row = conn.execute(f"SELECT {sql.LAST_SEQ}", (sid, sid, sid)).fetchone()
        agent_row = conn.execute(
            "SELECT agent, generation, owner, reset_requested, erased_by, erased_at "
            "FROM turnkit_sessions WHERE session_id = ?",
            (sid,),
        ).fetchone()
        return SessionSnapshot(
            messages=messages,
            store_id=self._store.store_id,
            steps=StepResults(steps),
            turn=turn,
            agent=agent_row[0] if agent_row else None,
            next_seq=(seq_row[0] or 0) + 1,
            generation=agent_row[1] if agent_row else 0,
            from_index=from_index,
            owner=agent_row[2] if agent_row else None,
            reset_requested=bool(agent_row and agent_row[3] is not None),
            erased=Erasure(agent_row[4], agent_row[5])
            if agent_row and agent_row[5] is not None
            else None,
        )

    async def commit(self, writes: Sequence[Write]) -> None:
        writer = self._store._write_connection
        await writer.turns.take()
        try:
            conn = writer.conn
            await self._begin(conn)
            store = self._store
            tx = _SqliteTransaction(
                conn, self._sid, store._payloads, store.blobs, store._owes_blobs
            )
            try:
                tx.apply(writes)
                conn.execute("COMMIT")
            except BaseException as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                failure = _commit_failed(self._sid, exc)
                if failure is exc:
                    raise
                raise failure from exc
        finally:
            writer.turns.release()
        self._store._committed()
        if tx.after and self._store.blobs is not None:
            await self._forget(_delete_blobs(self._sid, self._store.blobs, tx.after))
        if tx.cancels:
            self._store._locks.signal()

    async def _forget(self, done: list[int]) -> None:
        """Forget the blob deletions carried out (a commit of their own)."""
        writer = self._store._write_connection
        await writer.turns.take()
        try:
            conn = writer.conn
            await self._begin(conn)
            try:
                conn.executemany(blob_outbox.DONE, [(row,) for row in done])
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        finally:
            writer.turns.release()

    async def run_tool(self, step: ToolStep[T]) -> T:
        """The step runs on a tool thread and its rows commit there, in one hop: in
        the tool's transaction if the tool used ``ctx.store``, else in one the thread
        begins once the tool has returned (taking the write connection in its turn,
        as every commit does)."""
        store = self._store
        handle = _ToolHandle(store, self._sid)

        def run() -> T:
            try:
                return self._run_step(step, handle)
            finally:
                handle.release()

        result = await on_thread(store._tools, run)
        store._committed()
        return result

    def _run_step(self, step: ToolStep[T], handle: _ToolHandle) -> T:
        """On a tool thread: the step, then the step's rows and the commit in the
        transaction the tool began (or, if it began none, one begun now); all of it
        rolled back if any of it fails."""
        try:
            result, writes = step(handle)
            if handle.failed is not None:  # the tool caught it; the step cannot land
                raise handle.failed
            conn = handle.unwrap()  # (the tool's transaction, or a new one)
            store = self._store
            blobs = store.blobs
            tx = _SqliteTransaction(conn, self._sid, store._payloads, blobs, store._owes_blobs)
            tx.apply(writes)
            conn.execute("COMMIT")
            # Its owed rows stay until the next open's sweep: no tool step erases.
            _delete_blobs(self._sid, store.blobs, tx.after)
            return result
        except BaseException as exc:
            began = handle.conn
            if began is not None and began.in_transaction:
                began.execute("ROLLBACK")
            if handle.failed is not None and exc is not handle.failed:
                raise handle.failed from exc
            failure = _commit_failed(self._sid, exc)
            if failure is exc:
                raise
            raise failure from exc

    async def _begin(self, conn: sqlite3.Connection) -> None:
        """``BEGIN IMMEDIATE`` on the write connection this task holds. Within the
        process nobody else writes, so a lock held here is another process's: wait
        for it up to ``busy_timeout`` without blocking the event loop."""
        if _try_begin(conn, self._sid):
            return  # no other process holds it: the usual case
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._store.busy_timeout
        delay = 0.001
        while True:
            if loop.time() >= deadline:
                raise StoreError(
                    f"session {self._sid}: the database stayed locked by another "
                    f"connection for {self._store.busy_timeout:g}s"
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)
            if _try_begin(conn, self._sid):
                return

    async def turn(self, turn_id: str) -> TurnRecord | None:
        with _reading(f"turn {turn_id}"):
            return self._read_turn(self._store.connection, turn_id)

    async def spend(self, tenant: str) -> tuple[Spend, Spend]:
        """What this session spent, and what ``tenant`` did (see ``UsageLedger``)."""
        with _reading(f"the spend of session {self._sid}"):
            rows = self._store.connection.execute(
                usage_sql.SPEND, usage_sql.spend_params(self._sid, tenant)
            ).fetchall()
        return usage_sql.split_spend(rows)

    async def cancel_reason(self, turn_id: str) -> str | None:
        # Every process that records a cancellation changes the lock file's mark
        # after its commit, so the row needs reading only when the mark has moved.
        mark = self._store._locks.mark()
        seen_turn, seen_mark, reason = self._cancel_seen
        if seen_turn == turn_id and mark is not None and mark == seen_mark:
            return reason
        with _reading(f"turn {turn_id}"):
            row = self._store.connection.execute(sql.CANCEL_REASON, (self._sid, turn_id)).fetchone()
        reason = row[0] if row is not None else None
        self._cancel_seen = (turn_id, mark, reason)
        return reason

    def _read_turn(self, conn: sqlite3.Connection, turn_id: str) -> TurnRecord | None:
        row = conn.execute(sql.TURN, (self._sid, turn_id)).fetchone()
        return self._store._payloads.turn_from_row(row) if row else None

    async def events(self, *, turn_id: str | None = None, after: int = 0) -> list[TurnEvent]:
        with _reading(f"events of session {self._sid}"):
            return self._read_events(turn_id, after)

    def _read_events(self, turn_id: str | None, after: int) -> list[TurnEvent]:
        conn = self._store.connection
        if turn_id is None:
            rows = conn.execute(sql.EVENTS, (self._sid, after)).fetchall()
        else:
            rows = conn.execute(sql.TURN_EVENTS, (self._sid, turn_id, after)).fetchall()
        load, sid = self._store._payloads.load, self._sid
        return [event_from_dict(load(sid, "event", r[0])) for r in rows]

    async def generations(self) -> list[int]:
        with _reading(f"generations of session {self._sid}"):
            rows = self._store.connection.execute(archive_sql.GENERATIONS, (self._sid,))
            return [int(r[0]) for r in rows.fetchall()]

    async def archived_messages(self, generation: int) -> list[Message]:
        with _reading(f"session {self._sid} generation {generation}"):
            rows = self._store.connection.execute(
                archive_sql.ARCHIVED_MESSAGES, (self._sid, generation)
            ).fetchall()
            load, sid = self._store._payloads.load, self._sid
            return [message_from_dict(load(sid, "message", r[0])) for r in rows]

    async def unfinished(self) -> list[TurnRecord]:
        with _reading(f"session {self._sid}"):
            rows = self._store.connection.execute(sql.UNFINISHED, (self._sid,)).fetchall()
            return [self._store._payloads.turn_from_row(r) for r in rows]

    async def status(self) -> SessionStatus:
        with _reading(f"session {self._sid}"):
            row = self._store.connection.execute(sql.STATUS, (self._sid,)).fetchone()
        return cast(SessionStatus, row[0]) if row else "new"


def _configure(conn: sqlite3.Connection) -> None:
    """The per-connection settings every connection of the store uses."""
    conn.execute("PRAGMA synchronous = NORMAL")
    # Backstop only: the background checkpoint normally runs long before this.
    conn.execute(f"PRAGMA wal_autocheckpoint = {CHECKPOINT_BACKSTOP_PAGES}")
    conn.execute(f"PRAGMA journal_size_limit = {JOURNAL_SIZE_LIMIT}")


def _blob_store(blobs: BlobStore | str | os.PathLike[str] | None) -> BlobStore | None:
    """``blobs`` as a ``BlobStore``: a path names a ``FileBlobStore`` directory."""
    if blobs is None or isinstance(blobs, BlobStore):
        return blobs
    if isinstance(blobs, (str, os.PathLike)):
        return FileBlobStore(blobs)
    raise ConfigurationError(
        f"SqliteStore blobs must be a BlobStore or a directory, got {type(blobs).__name__}"
    )


def _not_open() -> StoreError:
    return StoreError(
        "SqliteStore is not open: use it through `async with Runtime(...)` "
        "or await store.open() first"
    )


class SqliteStore:
    """Sessions in one SQLite file (WAL). ``busy_timeout`` is how long, in seconds, a
    write waits for another process's lock before failing.

    Several processes on one host may share the file: a session is run by one of
    them at a time, held through a lock on ``<path>-locks`` that the kernel drops
    when its process dies. A delivery waits up to ``writer_timeout`` seconds for a
    session another process is running, then raises ``SessionBusyError``.

    ``codec`` (a ``turnkit.Codec``, such as ``turnkit.crypto.EnvelopeCodec``) seals
    every payload the file keeps: messages, step results, events, and each turn's
    opening, inbound event, suspend checkpoint, answer and error (see docs/security.md).

    WAL checkpoints (copying committed pages back into the database file, with an
    fsync) run on a worker thread every ``CHECKPOINT_EVERY`` commits instead of
    inside whichever commit crosses SQLite's threshold, so they never stall the
    event loop. A passive checkpoint cannot rewind a WAL that commits keep
    extending, so one that leaves ``RESTART_FRAMES`` or more behind it is followed by
    a ``RESTART`` (commits wait for it in ``_begin``): the WAL then stays small
    instead of growing to SQLite's own automatic checkpoint, kept as a backstop.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout: float = 5.0,
        tool_threads: int = 8,
        writer_timeout: float = 30.0,
        codec: Codec | None = None,
        blobs: BlobStore | str | os.PathLike[str] | None = None,
        blob_threshold: int = DEFAULT_BLOB_THRESHOLD,
    ) -> None:
        if isinstance(tool_threads, bool) or not isinstance(tool_threads, int) or tool_threads < 1:
            raise ConfigurationError(
                f"SqliteStore needs tool_threads >= 1 (how many local tools may run at "
                f"once), got {tool_threads!r}"
            )
        self.path = os.fspath(path)
        self.busy_timeout = busy_timeout
        self.tool_threads = tool_threads
        self.writer_timeout = writer_timeout
        #: Where payloads over ``blob_threshold`` bytes go (see ``BlobStore``).
        self.blobs = _blob_store(blobs)
        #: Whether this file has kept blobs though this store has none: its erasures
        #: and retention then record the deletions they owe (``_blob_outbox``).
        self._owes_blobs = False
        #: What every payload goes through on its way in and out (see ``Codec``).
        self._payloads = Payloads(
            codec,
            binary=True,
            blob_type=bytearray,  # sqlite3 binds it as it is (see Payloads)
            threshold=blob_threshold,
            get_blob=self.blobs.get if self.blobs is not None else None,
        )
        #: Reads, on the event loop's thread (``connection``).
        self._conn: sqlite3.Connection | None = None
        #: Every write, taken in turn by the loop's commits and the tool threads.
        self._writer: SqliteWriter | None = None
        #: The threads local tools run on.
        self._tool_threads: ToolThreads | None = None
        self._store_id: str | None = None
        self._since_checkpoint = 0
        #: The background checkpoint running or last run, on its own thread.
        self._checkpoint: Future[None] | None = None
        self._checkpointer: ThreadPoolExecutor | None = None
        self._checkpoint_conn: sqlite3.Connection | None = None
        #: How many background checkpoints have completed, and how many of them
        #: rewound the WAL (for monitoring and tests).
        self.checkpoints = 0
        self.restarts = 0
        in_memory = self.path in ("", ":memory:") or self.path.startswith("file:")
        self._locks = HostSessionLocks(
            None if in_memory else self.path + LOCK_FILE_SUFFIX, writer_timeout
        )

    def _committed(self) -> None:
        """Count a commit; start a background checkpoint when enough have piled up."""
        self._since_checkpoint += 1
        if self._since_checkpoint < CHECKPOINT_EVERY:
            return
        running, checkpointer = self._checkpoint, self._checkpointer
        if checkpointer is None or (running is not None and not running.done()):
            return
        self._since_checkpoint = 0
        # Its end is noted on its own thread, not through the event loop: a busy loop
        # (a turn whose steps never wait) must not keep the next one from starting.
        self._checkpoint = checkpointer.submit(self._run_checkpoint)
        self._checkpoint.add_done_callback(self._checkpoint_done)

    def _run_checkpoint(self) -> None:
        if self._checkpoint_conn is None:
            self._checkpoint_conn = sqlite3.connect(
                self.path,
                timeout=self.busy_timeout,
                isolation_level=None,
                check_same_thread=False,
            )
        conn = self._checkpoint_conn
        _, frames, _ = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        writer = self._writer
        if frames >= RESTART_FRAMES and writer is not None:
            # Commits made during the passive pass kept the WAL from being rewound;
            # this pass copies the few frames since and makes the next writer start
            # the WAL from its beginning. It takes its turn with this process's
            # writers, so none of them meets it at SQLite's lock.
            writer.turns.take_blocking()
            try:
                conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchall()
            finally:
                writer.turns.release()
            self.restarts += 1

    def _checkpoint_done(self, future: Future[None]) -> None:
        if future.cancelled():
            return
        if future.exception() is not None:
            log.warning("background WAL checkpoint of %s failed: %s", self.path, future.exception())
        else:
            self.checkpoints += 1

    @property
    def connection(self) -> sqlite3.Connection:
        """The connection the store reads through (on the event loop's thread). It
        never writes: every write goes through the store's one write connection."""
        if self._conn is None:
            raise _not_open()
        return self._conn

    @property
    def writes_waiting(self) -> int:
        """How many commits of this store wait for its write connection right now
        (for monitoring: a number that stays high means a tool holds its step)."""
        return self._writer.turns.waiting if self._writer is not None else 0

    @property
    def _write_connection(self) -> SqliteWriter:
        if self._writer is None:
            raise _not_open()
        return self._writer

    @property
    def _tools(self) -> ToolThreads:
        if self._tool_threads is None:
            raise _not_open()
        return self._tool_threads

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
        write_conn = await asyncio.to_thread(self._connect)
        try:
            self._conn = await asyncio.to_thread(self._connect_reader, write_conn)
            self._locks.open()
        except BaseException:
            if self._conn is not None and self._conn is not write_conn:
                self._conn.close()
            self._conn = None
            write_conn.close()
            raise
        self._writer = SqliteWriter(write_conn)
        self._checkpointer = ThreadPoolExecutor(1, thread_name_prefix="turnkit-sqlite-checkpoint")
        self._tool_threads = ToolThreads(self.tool_threads, "turnkit-sqlite-tool")

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False
        )
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            _configure(conn)
            migrate(conn)
            self._store_id = read_store_id(conn)
            if self.blobs is not None:  # what a process that died left owed
                conn.execute(blob_outbox.MARK_KEPT)
                blob_outbox.sweep(conn, self.blobs)
            else:
                self._owes_blobs = conn.execute(blob_outbox.KEPT).fetchone() is not None
            # From here on a locked database is waited for in ``_begin``, off the loop.
            conn.execute("PRAGMA busy_timeout = 0")
        except BaseException as exc:
            conn.close()
            if isinstance(exc, sqlite3.DatabaseError):
                raise StoreError(f"SqliteStore: cannot open {self.path!r}: {exc}") from exc
            raise
        return conn

    def _connect_reader(self, write_conn: sqlite3.Connection) -> sqlite3.Connection:
        """The read connection: its own, so reads never see a tool's open step (an
        in-memory database has a single connection, as it is one per connection)."""
        if self.path in ("", ":memory:") or self.path.startswith("file:"):
            return write_conn
        conn = sqlite3.connect(
            self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False
        )
        _configure(conn)
        return conn

    async def close(self) -> None:
        threads, self._tool_threads = self._tool_threads, None
        if threads is not None:
            # A tool still blocking is not waited for (as on PostgreSQL): the write
            # connection closes under it, which rolls its step back.
            threads.shutdown()
        writer, self._writer = self._writer, None
        if writer is not None and writer.conn is not self._conn:
            writer.conn.close()
        checkpointer, self._checkpointer = self._checkpointer, None
        if self._checkpoint is not None:
            await asyncio.wait([asyncio.wrap_future(self._checkpoint)])
        if checkpointer is not None:
            checkpointer.shutdown(wait=False)
        if self._checkpoint_conn is not None:
            self._checkpoint_conn.close()
            self._checkpoint_conn = None
        if self._conn is not None:
            self._locks.close()
            self._conn.close()
            self._conn = None

    def session(self, session_id: str) -> _SqliteSession:
        return _SqliteSession(self, session_id)

    async def session_page(
        self,
        *,
        agent: str | None = None,
        limit: int,
        after: SessionKey | None = None,
        owner: str | None = None,
    ) -> list[SessionInfo]:
        sealed = self._payloads.codec is not None
        text_of = None if sealed else _TEXT_OF
        query, params = sql.session_page_sql(agent, limit, after, text_of=text_of, owner=owner)
        with _reading("the session list"):
            rows = self.connection.execute(query, params).fetchall()
            return [session_info(r, self._payloads if sealed else None) for r in rows]

    async def unfinished_turns(self) -> list[TurnRecord]:
        with _reading("unfinished turns"):
            rows = self.connection.execute(sql.UNFINISHED_TURNS).fetchall()
            return [self._payloads.turn_from_row(r) for r in rows]

    async def parked_turns(
        self, *, limit: int, after: tuple[float, str, str] | None = None
    ) -> list[TurnRecord]:
        """See ``turnkit.stores.InboxStore``."""
        start = after or (float("-inf"), "", "")
        with _reading("parked turns"):
            rows = self.connection.execute(sql.PARKED_TURNS, (*start, limit)).fetchall()
            return [self._payloads.turn_from_row(r) for r in rows]

    async def due_turns(self, before: float, *, limit: int) -> list[TurnRecord]:
        """See ``turnkit.stores.TimerStore``."""
        with _reading("due turns"):
            rows = self.connection.execute(sql.DUE_TURNS, (before, limit)).fetchall()
            return [self._payloads.turn_from_row(r) for r in rows]

    async def next_wake(self) -> float | None:
        """See ``turnkit.stores.TimerStore``."""
        with _reading("the next wake"):
            row = self.connection.execute(sql.NEXT_WAKE).fetchone()
        return None if row is None or row[0] is None else float(row[0])

    async def idle_sessions(
        self, before: float, *, limit: int, after: tuple[float, str] | None = None
    ) -> list[tuple[float, str]]:
        """See ``turnkit.stores.PrunableStore``."""
        start = after or (float("-inf"), "")
        with _reading("idle sessions"):
            rows = self.connection.execute(
                retention_sql.IDLE_SESSIONS, (before, *start, limit)
            ).fetchall()
        return [(float(at), str(sid)) for at, sid in rows]

    async def old_generations(
        self, before: float, *, limit: int, after: tuple[float, str, int] | None = None
    ) -> list[tuple[float, str, int]]:
        """See ``turnkit.stores.PrunableStore``."""
        start = after or (float("-inf"), "", -1)
        with _reading("old generations"):
            rows = self.connection.execute(
                retention_sql.OLD_GENERATIONS, (before, *start, limit)
            ).fetchall()
        return [(float(at), str(sid), int(g)) for at, sid, g in rows]

    async def ended_turns(
        self, before: float, *, limit: int, after: tuple[float, str, str] | None = None
    ) -> list[tuple[float, str, str]]:
        """See ``turnkit.stores.PrunableStore``."""
        start = after or (float("-inf"), "", "")
        with _reading("ended turns"):
            rows = self.connection.execute(
                retention_sql.ENDED_TURNS, (before, *start, limit)
            ).fetchall()
        return [(float(at), str(sid), str(tid)) for at, sid, tid in rows]

    async def sessions_of_tenant(self, tenant: str, session_ids: Sequence[str]) -> set[str]:
        """See ``turnkit.stores.TenantView``."""
        params = (tenant, json.dumps(list(session_ids)))
        with _reading(f"the sessions of tenant {tenant!r}"):
            rows = self.connection.execute(sql.SESSIONS_OF_TENANT, params).fetchall()
        return {str(row[0]) for row in rows}

    async def usage_by_tenant(self) -> dict[str, Spend]:
        """What each tenant spent on model calls (see ``UsageLedger``)."""
        with _reading("usage by tenant"):
            rows = self.connection.execute(usage_sql.BY_TENANT).fetchall()
        return {str(r[0]): usage_sql.spend_of(r) for r in rows}

    async def turn_counts(self) -> dict[str, int]:
        """How many turns are ``queued``, ``running`` and ``suspended`` (for monitoring)."""
        with _reading("turn counts"):
            rows = self.connection.execute(sql.TURN_COUNTS).fetchall()
        return {"queued": 0, "running": 0, "suspended": 0} | {str(s): int(n) for s, n in rows}
