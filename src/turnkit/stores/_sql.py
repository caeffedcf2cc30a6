"""The SQL both SQL stores send, written once in SQLite's ``?`` style.

SQLite runs these statements as they are; PostgreSQL runs them rendered by
``postgres._statements.pg`` (psycopg's ``%s`` placeholders, turnkit's tables and functions
qualified with the store's schema). Values always travel as bound parameters.
What only one dialect can say (PostgreSQL's one-statement load and its
server-side row-count checks, SQLite's JSON functions) stays in its store.
"""

from __future__ import annotations

from typing import Any

from .._values.records import PREVIEW_READ_CHARS
from ._sql_rows import TURN_COLUMNS

# -- a step's rows ----------------------------------------------------------------------

INSERT_MESSAGE = "INSERT INTO turnkit_messages (session_id, idx, turn_id, body) VALUES (?, ?, ?, ?)"
INSERT_STEP = "INSERT INTO turnkit_steps (session_id, turn_id, step_id, result) VALUES (?, ?, ?, ?)"
INSERT_EVENT = "INSERT INTO turnkit_events (session_id, seq, turn_id, body) VALUES (?, ?, ?, ?)"

# -- turns and sessions -----------------------------------------------------------------

# A turn's row is put by the engine's ``PutTurn`` writes (``turnkit._values.turn_rules``
# decides them): a new turn is inserted (refused if its id is taken), a stored one is
# moved only if it is still in the status the move was planned from. These
# statements check nothing else; the store turns "no row" into ``TurnMoveError``.

# A session's turns run in the order of their ``created_at``, so it is the store's,
# never a node's clock: PostgreSQL's clock in the inserting statement, on SQLite the
# writer's (one machine's, under the file's write lock), and in both at least a
# microsecond past the session's latest turn, so a later insert always sorts later
# even if that clock steps back.
# The latest is read as the first of the session's turns by time, newest first, and
# only from turns whose ``created_at`` is set (all are): that is the one index both
# stores can answer it from (PostgreSQL's holds only rows that say so, so that no
# lookup of one turn by its key ever takes it; see its migration v27), whatever
# plan was made before the table had statistics.
_AFTER_LATEST = (
    "coalesce((SELECT o.created_at FROM turnkit_turns o WHERE o.session_id = ? "
    "AND o.created_at IS NOT NULL ORDER BY o.created_at DESC LIMIT 1), 0) + 0.000001"
)
#: SQLite: the writer's time (a parameter), then the session id.
SQLITE_ORDER = f"max(?, {_AFTER_LATEST})"
#: PostgreSQL: the server's clock, then the session id.
PG_ORDER = f"GREATEST(extract(epoch FROM clock_timestamp())::double precision, {_AFTER_LATEST})"


def new_turn(order: str) -> str:
    """The insert of a new turn, its ``created_at`` given by ``order``; a turn id
    already taken inserts nothing (and reports no row)."""
    return (
        "INSERT INTO turnkit_turns (session_id, turn_id, agent, status, opening, event, "
        f"version, tenant, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, {order}) "
        "ON CONFLICT (session_id, turn_id) DO NOTHING"
    )


NEW_TURN = new_turn(SQLITE_ORDER)
PG_NEW_TURN = new_turn(PG_ORDER)
#: A stored turn's move, if it is still in the status it was planned from (the last
#: parameter); its place, opening, event and cancellation stay.
MOVE_TURN = (
    "UPDATE turnkit_turns SET status = ?, text = ?, error = ?, pending = ?, finished_at = ?, "
    "version = ?, held_by = ?, wake_at = ? WHERE session_id = ? AND turn_id = ? AND status = ?"
)
#: The session of a new turn that does not move it: made (status ``new``, with its
#: owner) if this is its first turn, else only touched.
SESSION_SEEN = (
    "INSERT INTO turnkit_sessions (session_id, agent, status, created_at, updated_at, owner) "
    "VALUES (?, ?, 'new', ?, ?, ?) ON CONFLICT (session_id) DO UPDATE SET "
    "updated_at = excluded.updated_at"
)
#: The session's row as one of its turns moves it: made (with its owner) if this is
#: its first turn, else given the turn's agent and the status.
PUT_SESSION = (
    "INSERT INTO turnkit_sessions (session_id, agent, status, created_at, updated_at, "
    "owner) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (session_id) DO UPDATE SET "
    "agent = excluded.agent, status = excluded.status, updated_at = excluded.updated_at"
)

# -- reads ------------------------------------------------------------------------------

#: The last event number a session used (the next one is this plus one): its last
#: live event's, or with none, its archive's last, or with none (erased), the one its
#: tombstone kept, so numbers carry on across resets and erasure. Three parameters,
#: each the session id.
LAST_SEQ = (
    "coalesce((SELECT max(seq) FROM turnkit_events WHERE session_id = ?), "
    "(SELECT seq FROM turnkit_archived_events WHERE session_id = ? "
    "ORDER BY generation DESC, seq DESC LIMIT 1), "
    "(SELECT erased_seq FROM turnkit_sessions WHERE session_id = ?))"
)

EVENTS = "SELECT body FROM turnkit_events WHERE session_id = ? AND seq > ? ORDER BY seq"
TURN_EVENTS = (
    "SELECT body FROM turnkit_events WHERE session_id = ? AND turn_id = ? AND seq > ? ORDER BY seq"
)
TURN = f"SELECT {TURN_COLUMNS} FROM turnkit_turns WHERE session_id = ? AND turn_id = ?"
UNFINISHED = (
    f"SELECT {TURN_COLUMNS} FROM turnkit_turns WHERE session_id = ? "
    "AND status IN ('queued', 'running', 'suspended') ORDER BY created_at"
)
CANCEL_REASON = "SELECT cancel_reason FROM turnkit_turns WHERE session_id = ? AND turn_id = ?"
STATUS = "SELECT status FROM turnkit_sessions WHERE session_id = ?"
#: What ``recover()`` picks up: turns left running by a dead process, queued ones,
#: and parked ones a version held (a delivery of another version may take them on).
UNFINISHED_TURNS = (
    f"SELECT {TURN_COLUMNS} FROM turnkit_turns WHERE status IN ('queued', 'running') "
    "OR (status = 'suspended' AND held_by IS NOT NULL) ORDER BY created_at"
)

#: The inbox: parked turns store-wide, oldest first, after a ``(created_at,
#: session_id, turn_id)`` key, a page at a time (the ``turnkit_turns_inbox`` index).
PARKED_TURNS = (
    f"SELECT {TURN_COLUMNS} FROM turnkit_turns WHERE status = 'suspended' "
    "AND (created_at, session_id, turn_id) > (?, ?, ?) "
    "ORDER BY created_at, session_id, turn_id LIMIT ?"
)

#: Parked turns whose clock has come (``TimerStore.due_turns``), from the index on
#: ``wake_at``; a turn with a cancellation recorded is left to what ends it.
DUE_TURNS = (
    f"SELECT {TURN_COLUMNS} FROM turnkit_turns WHERE wake_at IS NOT NULL AND wake_at <= ? "
    "AND status = 'suspended' AND cancel_reason IS NULL "
    "ORDER BY wake_at, session_id, turn_id LIMIT ?"
)
NEXT_WAKE = (
    "SELECT min(wake_at) FROM turnkit_turns WHERE wake_at IS NOT NULL "
    "AND status = 'suspended' AND cancel_reason IS NULL"
)

#: How many turns are queued, running and parked, store-wide (for monitoring).
#: Which of a page of sessions (a JSON array) have a turn of a tenant.
SESSIONS_OF_TENANT = (
    "SELECT DISTINCT session_id FROM turnkit_turns WHERE tenant = ? "
    "AND session_id IN (SELECT value FROM json_each(?))"
)
TURN_COUNTS = (
    "SELECT status, count(*) FROM turnkit_turns "
    "WHERE status IN ('queued', 'running', 'suspended') GROUP BY status"
)


# -- session lists ----------------------------------------------------------------------

#: The ``turnkit_sessions`` columns a session list selects (``with_previews`` adds one).
SESSION_COLUMNS = "session_id, agent, status, updated_at, owner"
SESSIONS = f"SELECT {SESSION_COLUMNS} FROM turnkit_sessions"


def with_previews(sessions_sql: str, text_of: str | None) -> str:
    """``sessions_sql`` (selecting ``SESSION_COLUMNS``, ordered and limited as it
    likes) with one more column: the start of each session's first
    message's text, read by primary key for the rows it returns and no others.
    ``text_of`` is the dialect's expression for the ``text`` field of the JSON body
    ``m.body``; ``None`` (an encrypted store, whose bodies only the process can read)
    selects the whole body instead."""
    start = "m.body" if text_of is None else f"substr({text_of}, 1, {PREVIEW_READ_CHARS})"
    first = (
        f"SELECT {start} FROM turnkit_messages m WHERE m.session_id = p.session_id AND m.idx = 0"
    )
    return (
        f"SELECT p.session_id, p.agent, p.status, p.updated_at, p.owner, ({first}) "
        f"FROM ({sessions_sql}) p ORDER BY p.updated_at DESC, p.session_id"
    )


def session_page_sql(
    agent: str | None,
    limit: int,
    after: tuple[float, str] | None,
    *,
    text_of: str | None,
    owner: str | None = None,
) -> tuple[str, tuple[Any, ...]]:
    """The ``session_page`` query, the same on both SQL stores but for the JSON
    expression ``text_of``; with an agent it walks the ``(agent, updated_at DESC,
    session_id)`` index (with an owner too, the ``(owner, agent, …)`` one), and
    previews are read for the page's rows only."""
    where: list[str] = []
    params: list[Any] = []
    if owner is not None:
        where.append("owner = ?")
        params.append(owner)
    if agent is not None:
        where.append("agent = ?")
        params.append(agent)
    if after is not None:
        where.append("(updated_at < ? OR (updated_at = ? AND session_id > ?))")
        params += [after[0], after[0], after[1]]
    sql = SESSIONS
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY updated_at DESC, session_id LIMIT ?"
    return with_previews(sql, text_of), (*params, limit)
