"""The SQL of a session's erasure, shared by the SQLite and PostgreSQL stores (``?`` style).

One erasure is these statements in one transaction: the session's row first becomes
a tombstone (who, when, and the last event number it used), then every row keyed by
the session, in the live tables and in every archived generation, is deleted. A
session the store never saw has no row, so nothing is written for it.
"""

from __future__ import annotations

from ._sql import LAST_SEQ

#: Every table of the store that holds a session's contents, keyed by ``session_id``.
#: ``turnkit_sessions`` is not among them: its row stays, as the tombstone.
CONTENT_TABLES: tuple[str, ...] = (
    "turnkit_messages",
    "turnkit_steps",
    "turnkit_events",
    "turnkit_turns",
    "turnkit_generations",
    "turnkit_archived_messages",
    "turnkit_archived_steps",
    "turnkit_archived_events",
    "turnkit_archived_turns",
)

#: Parameters: who, when, the session id (for ``LAST_SEQ``'s three reads), when, and
#: the session id of the row.
TOMBSTONE = (
    "UPDATE turnkit_sessions SET erased_by = ?, erased_at = ?, "
    f"erased_seq = {LAST_SEQ}, status = 'new', generation = generation + 1, "
    "reset_requested = NULL, updated_at = ? WHERE session_id = ?"
)


def erase_statements(
    session_id: str, by: str | None, now: float
) -> list[tuple[str, tuple[object, ...]]]:
    """Every statement of one erasure, with its parameters, in order."""
    sid = session_id
    out: list[tuple[str, tuple[object, ...]]] = [(TOMBSTONE, (by, now, sid, sid, sid, now, sid))]
    out += [(f"DELETE FROM {table} WHERE session_id = ?", (sid,)) for table in CONTENT_TABLES]
    return out
