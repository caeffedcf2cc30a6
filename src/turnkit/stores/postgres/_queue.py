"""PostgresStore as the workers' queue: the statement that claims runnable sessions,
and the notification that wakes workers when a commit makes a turn runnable.

There is no queue beside the transcript: a submitted turn is its ``queued`` row in
``turnkit_turns``. A claim takes, oldest first, the first runnable turn of sessions
no process holds, skipping rows another claim is reading (``FOR NO KEY UPDATE
SKIP LOCKED``), and takes each session's writer lock (the advisory lock of
``_writer``) in the same statement, on the lock connection: from then on the
session is the claiming process's until its delivery ends or its connection dies.
"""

from __future__ import annotations

from ._schema import claimable
from ._statements import TURN_COLUMNS_T

#: Wakes the workers listening on this database (payload: the schema).
CHANNEL = "turnkit_queue"

#: The sessions whose writer lock some connection holds, as lock keys.
_HELD = (
    "SELECT (l.classid::bigint << 32) | l.objid::bigint AS k FROM pg_locks l "
    "WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted "
    "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)


def runnable(alias: str) -> str:
    """``claimable`` for a turns row named ``alias``, less the turns stored after a
    reset that is still pending: they wait until it is carried out."""
    return (
        f"{claimable(alias)} AND NOT ({alias}.status = 'queued' "
        f"AND {alias}.cancel_reason IS NULL AND EXISTS (SELECT 1 FROM turnkit_sessions r "
        f"WHERE r.session_id = {alias}.session_id AND r.reset_requested IS NOT NULL))"
    )


#: Parameters: the agents this worker runs (a JSON array) and the sessions it skips
#: (a JSON array), twice, then how many sessions it takes at most, three times. Each
#: session's runnable turn is its oldest runnable one, so its turns run one at a time
#: in submission order; a session with a pending reset and nothing runnable left is
#: claimed for the reset. Rows: the session id (what the lock connection reads
#: first), its agent, then its turn's columns (all NULL for a reset).
CLAIM_SQL = (
    f"WITH held AS ({_HELD}), c AS ("
    "SELECT t.session_id, t.turn_id, t.created_at FROM turnkit_turns t "
    f"WHERE {runnable('t')} "
    "AND t.agent IN (SELECT json_array_elements_text(?::json)) "
    "AND t.session_id NOT IN (SELECT json_array_elements_text(?::json)) "
    "AND NOT EXISTS (SELECT 1 FROM turnkit_turns e WHERE e.session_id = t.session_id "
    f"AND {runnable('e')} AND (e.created_at, e.turn_id) < (t.created_at, t.turn_id)) "
    "AND turnkit_lock_key(t.session_id) NOT IN (SELECT k FROM held) "
    "ORDER BY t.created_at LIMIT ? FOR NO KEY UPDATE OF t SKIP LOCKED), "
    "r AS (SELECT s.session_id, NULL::text AS turn_id, s.reset_requested AS created_at "
    "FROM turnkit_sessions s WHERE s.reset_requested IS NOT NULL "
    "AND s.agent IN (SELECT json_array_elements_text(?::json)) "
    "AND s.session_id NOT IN (SELECT json_array_elements_text(?::json)) "
    "AND NOT EXISTS (SELECT 1 FROM turnkit_turns e WHERE e.session_id = s.session_id "
    f"AND {runnable('e')}) "
    "AND turnkit_lock_key(s.session_id) NOT IN (SELECT k FROM held) "
    "ORDER BY s.reset_requested LIMIT ?), "
    "p AS (SELECT * FROM c UNION ALL SELECT * FROM r ORDER BY created_at LIMIT ?) "
    # Every row of ``p`` is tried (no LIMIT out here), so no lock is taken and lost.
    f"SELECT p.session_id, s.agent, {TURN_COLUMNS_T} FROM p "
    "JOIN turnkit_sessions s ON s.session_id = p.session_id "
    "LEFT JOIN turnkit_turns t ON t.session_id = p.session_id AND t.turn_id = p.turn_id "
    "WHERE pg_try_advisory_lock(turnkit_lock_key(p.session_id)) ORDER BY p.created_at"
)

#: Sent inside a commit that makes a turn runnable (a submission, a resume, a
#: cancellation of a parked turn): delivered when, and only if, it commits. The
#: channel is a parameter: the schema qualifier ``pg`` puts on turnkit's names
#: would otherwise rename it.
WAKE_SQL = "SELECT pg_notify(?, ?)"
