"""The SQL of retention (``turnkit.Retention``), shared by the SQLite and PostgreSQL
stores (``?`` style): finding what has aged out, from an index and a page at a time,
and deleting one session's or one archived generation's rows.
"""

from __future__ import annotations

from ._erase_sql import CONTENT_TABLES

_UNFINISHED = (
    "SELECT 1 FROM turnkit_turns u WHERE u.session_id = s.session_id "
    "AND u.status IN ('queued', 'running', 'suspended')"
)

#: Sessions last updated before a time (the first parameter), with nothing queued,
#: running or parked and no reset pending, oldest first, after a ``(updated_at,
#: session_id)`` key (the page before's last), a page at a time. It walks the
#: ``turnkit_sessions_idle`` index from the key on: no table scan.
IDLE_SESSIONS = (
    "SELECT s.updated_at, s.session_id FROM turnkit_sessions s "
    "WHERE s.updated_at < ? AND (s.updated_at, s.session_id) > (?, ?) "
    f"AND s.reset_requested IS NULL AND NOT EXISTS ({_UNFINISHED}) "
    "ORDER BY s.updated_at, s.session_id LIMIT ?"
)

#: Archived generations retired before a time, oldest first, after an ``(archived_at,
#: session_id, generation)`` key, a page at a time (the ``turnkit_generations_age``
#: index).
OLD_GENERATIONS = (
    "SELECT g.archived_at, g.session_id, g.generation FROM turnkit_generations g "
    "WHERE g.archived_at < ? AND (g.archived_at, g.session_id, g.generation) > (?, ?, ?) "
    "ORDER BY g.archived_at, g.session_id, g.generation LIMIT ?"
)

_ARCHIVED = (
    "turnkit_archived_messages",
    "turnkit_archived_steps",
    "turnkit_archived_events",
    "turnkit_archived_turns",
    "turnkit_generations",
)


#: The turns of one archived generation (session, generation, the generation again)
#: that are in no other generation, live or archived: their blobs go with it.
GENERATION_ONLY_TURNS = (
    "SELECT a.turn_id FROM turnkit_archived_turns a WHERE a.session_id = ? "
    "AND a.generation = ? AND NOT EXISTS (SELECT 1 FROM turnkit_turns t "
    "WHERE t.session_id = a.session_id AND t.turn_id = a.turn_id) "
    "AND NOT EXISTS (SELECT 1 FROM turnkit_archived_turns o "
    "WHERE o.session_id = a.session_id AND o.turn_id = a.turn_id AND o.generation <> ?)"
)


def drop_generation_statements(
    session_id: str, generation: int
) -> list[tuple[str, tuple[object, ...]]]:
    """The statements that delete one archived generation of one session."""
    return [
        (f"DELETE FROM {table} WHERE session_id = ? AND generation = ?", (session_id, generation))
        for table in _ARCHIVED
    ]


#: The session's row goes only if it is still idle: updated before the cutoff, with
#: nothing unfinished and no reset pending (checked in the same statement).
_PRUNE_ROW = (
    "DELETE FROM turnkit_sessions WHERE session_id = ? AND updated_at < ? "
    "AND reset_requested IS NULL AND NOT EXISTS (SELECT 1 FROM turnkit_turns u "
    "WHERE u.session_id = turnkit_sessions.session_id "
    "AND u.status IN ('queued', 'running', 'suspended'))"
)


def prune_session_statements(
    session_id: str, idle_before: float
) -> list[tuple[str, tuple[object, ...]]]:
    """The statements that delete an idle session whole: its row first, under the
    idleness check, then its contents only if the row is gone (so a session that
    is not idle keeps everything)."""
    sid = session_id
    gone = "NOT EXISTS (SELECT 1 FROM turnkit_sessions r WHERE r.session_id = ?)"
    out: list[tuple[str, tuple[object, ...]]] = [(_PRUNE_ROW, (sid, idle_before))]
    out += [
        (f"DELETE FROM {table} WHERE session_id = ? AND {gone}", (sid, sid))
        for table in CONTENT_TABLES
    ]
    return out


#: Ended turns whose events are not trimmed yet, oldest first, after a key (the
#: ``turnkit_turns_untrimmed`` index: only such turns are in it).
ENDED_TURNS = (
    "SELECT t.finished_at, t.session_id, t.turn_id FROM turnkit_turns t "
    "WHERE t.finished_at IS NOT NULL AND t.events_trimmed IS NULL AND t.finished_at < ? "
    "AND (t.finished_at, t.session_id, t.turn_id) > (?, ?, ?) "
    "ORDER BY t.finished_at, t.session_id, t.turn_id LIMIT ?"
)


def trim_events_statements(session_id: str, turn_id: str) -> list[tuple[str, tuple[object, ...]]]:
    """Cut an ended turn's events to its last one, and mark it trimmed."""
    sid, tid = session_id, turn_id
    ended = (
        "EXISTS (SELECT 1 FROM turnkit_turns t WHERE t.session_id = ? AND t.turn_id = ? "
        "AND t.finished_at IS NOT NULL)"
    )
    last = "(SELECT max(l.seq) FROM turnkit_events l WHERE l.session_id = ? AND l.turn_id = ?)"
    return [
        (
            f"DELETE FROM turnkit_events WHERE session_id = ? AND turn_id = ? AND {ended} "
            f"AND seq < {last}",
            (sid, tid, sid, tid, sid, tid),
        ),
        (
            "UPDATE turnkit_turns SET events_trimmed = 1 WHERE session_id = ? AND turn_id = ? "
            "AND finished_at IS NOT NULL",
            (sid, tid),
        ),
    ]
