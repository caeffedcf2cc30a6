"""The SQL of a session reset, shared by the SQLite and PostgreSQL stores (``?`` style).

One reset is these statements in one transaction: copy every live row of the
session to the archive tables under the generation being retired, delete the live
rows, record the generation (its primary key refuses a second reset of the same
generation) and move the session to the next generation with status ``new``.
Turns still queued (submitted after the reset began, so never cancelled by it)
stay live, with their steps, and run in the new generation.
"""

from __future__ import annotations

#: Which rows of each live table a reset moves: all but a queued turn's.
_MOVED = {
    "messages": "session_id = ?",
    "events": "session_id = ?",
    "steps": "session_id = ? AND turn_id NOT IN (SELECT q.turn_id FROM turnkit_turns q "
    "WHERE q.session_id = turnkit_steps.session_id AND q.status = 'queued')",
    "turns": "session_id = ? AND status <> 'queued'",
}

ARCHIVE: tuple[str, ...] = (
    "INSERT INTO turnkit_archived_messages (session_id, generation, idx, turn_id, body) "
    "SELECT session_id, ?, idx, turn_id, body FROM turnkit_messages WHERE session_id = ?",
    "INSERT INTO turnkit_archived_steps (session_id, generation, turn_id, step_id, result) "
    "SELECT session_id, ?, turn_id, step_id, result FROM turnkit_steps WHERE " + _MOVED["steps"],
    "INSERT INTO turnkit_archived_events (session_id, generation, seq, turn_id, body) "
    "SELECT session_id, ?, seq, turn_id, body FROM turnkit_events WHERE session_id = ?",
    "INSERT INTO turnkit_archived_turns (session_id, generation, turn_id, agent, status, "
    "opening, event, text, error, created_at, finished_at, pending, cancel_reason, version) "
    "SELECT session_id, ?, turn_id, agent, status, opening, event, text, error, created_at, "
    "finished_at, pending, cancel_reason, version FROM turnkit_turns WHERE " + _MOVED["turns"],
)
CLEAR: tuple[str, ...] = tuple(
    f"DELETE FROM turnkit_{table} WHERE {where}" for table, where in _MOVED.items()
)
RECORD_GENERATION = (
    "INSERT INTO turnkit_generations (session_id, generation, archived_at) VALUES (?, ?, ?)"
)
NEXT_GENERATION = (
    "INSERT INTO turnkit_sessions (session_id, agent, status, created_at, updated_at, "
    "generation) VALUES (?, ?, 'new', ?, ?, ?) ON CONFLICT (session_id) DO UPDATE SET "
    "status = 'new', updated_at = excluded.updated_at, generation = excluded.generation, "
    "reset_requested = NULL"
)
#: A reset's barrier: the session is marked (the first request's time stays) and every
#: unfinished turn not cancelled yet is cancelled by it, in one transaction, so a turn
#: is either before the reset (cancelled, archived) or after it (runs in the new
#: generation). Without a session row there is nothing to reset.
REQUEST_RESET = (
    "UPDATE turnkit_sessions SET reset_requested = coalesce(reset_requested, ?) "
    "WHERE session_id = ?"
)
CANCEL_UNFINISHED = (
    "UPDATE turnkit_turns SET cancel_reason = ? WHERE session_id = ? "
    "AND status IN ('queued', 'running', 'suspended') AND cancel_reason IS NULL"
)
#: Ends a pending reset that had nothing to archive.
DROP_RESET = "UPDATE turnkit_sessions SET reset_requested = NULL WHERE session_id = ?"
REQUEST_CANCEL = (
    "UPDATE turnkit_turns SET cancel_reason = coalesce(cancel_reason, ?) "
    "WHERE session_id = ? AND turn_id = ?"
)
GENERATIONS = "SELECT generation FROM turnkit_generations WHERE session_id = ? ORDER BY generation"
ARCHIVED_MESSAGES = (
    "SELECT body FROM turnkit_archived_messages WHERE session_id = ? AND generation = ? "
    "ORDER BY idx"
)


def request_reset_statements(session_id: str, now: float) -> list[tuple[str, tuple[object, ...]]]:
    """The statements that record a pending reset (see ``REQUEST_RESET``)."""
    return [(REQUEST_RESET, (now, session_id)), (CANCEL_UNFINISHED, ("reset", session_id))]


def reset_statements(
    session_id: str, agent: str, generation: int, now: float
) -> list[tuple[str, tuple[object, ...]]]:
    """Every statement of one reset, with its parameters, in order."""
    out: list[tuple[str, tuple[object, ...]]] = [(sql, (generation, session_id)) for sql in ARCHIVE]
    out += [(sql, (session_id,)) for sql in CLEAR]
    out.append((RECORD_GENERATION, (session_id, generation, now)))
    out.append((NEXT_GENERATION, (session_id, agent, now, now, generation + 1)))
    return out
