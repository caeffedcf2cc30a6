"""Blob deletions a SQLite store owes: written in the transaction that deletes the rows
(an erasure, an idle session, an archived generation), carried out right after it
commits, and forgotten once done. A process that dies in between leaves the row, and
the next store to open the file carries it out, so no blob outlives its rows for
longer than a restart. A store opened without its blobs (the command line, say,
without ``TURNKIT_BLOBS``) records what it owes the same way, for the next store
opened with them to carry out.

A row names the turns whose blobs go. Right after the commit, under the session's
writer lock, an erasure or a pruned session deletes every blob of the session; the
sweep at open holds no such lock, and the session may have taken new turns since, so
it deletes only the turns the row names.
"""

from __future__ import annotations

import json
import logging
import sqlite3

from .._errors import StoreError
from .._seams.blobs import BlobStore

log = logging.getLogger("turnkit.stores.sqlite")

#: ``turns``: a JSON array of turn ids.
OWE = "INSERT INTO turnkit_blob_deletions (session_id, turns) VALUES (?, ?)"
#: After an idle session's statements: owed only if its row is gone.
OWE_IF_PRUNED = (
    "INSERT INTO turnkit_blob_deletions (session_id, turns) SELECT ?, ? "
    "WHERE NOT EXISTS (SELECT 1 FROM turnkit_sessions WHERE session_id = ?)"
)
#: Every turn of a session, live or archived (session, session).
SESSION_TURNS = (
    "SELECT turn_id FROM turnkit_turns WHERE session_id = ? "
    "UNION SELECT turn_id FROM turnkit_archived_turns WHERE session_id = ?"
)
OWED = "SELECT id, session_id, turns FROM turnkit_blob_deletions WHERE id > 0 ORDER BY id LIMIT ?"
#: Row 0 marks a file that has kept blobs: a store opened on it without them still
#: records the deletions its erasures and retention owe, for one with them to carry out.
MARK_KEPT = (
    "INSERT OR IGNORE INTO turnkit_blob_deletions (id, session_id, turns) VALUES (0, '', '[]')"
)
KEPT = "SELECT 1 FROM turnkit_blob_deletions WHERE id = 0"
DONE = "DELETE FROM turnkit_blob_deletions WHERE id = ?"


def session_turns(conn: sqlite3.Connection, session_id: str) -> str:
    """Every turn of the session, as an owed row names them."""
    rows = conn.execute(SESSION_TURNS, (session_id, session_id)).fetchall()
    return json.dumps([r[0] for r in rows])


def carry_out(blobs: BlobStore, session_id: str, turns: str, whole: bool = False) -> None:
    """Delete the blobs one owed row names (``whole``: every blob of the session)."""
    if whole:
        blobs.delete_session(session_id)
    else:
        blobs.delete_turns(session_id, json.loads(turns))


def sweep(conn: sqlite3.Connection, blobs: BlobStore, batch: int = 500) -> int:
    """Carry out every deletion left owed (a process died before it could), on the
    store's write connection while it opens; return how many. A failed one stays owed."""
    done = 0
    while True:
        rows = conn.execute(OWED, (batch,)).fetchall()
        if not rows:
            return done
        finished: list[int] = []
        for row_id, session_id, turns in rows:
            try:
                carry_out(blobs, session_id, turns)
            except StoreError as exc:
                log.warning("owed blob deletion of session %s failed: %s", session_id, exc)
                continue
            finished.append(row_id)
        if finished:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany(DONE, [(i,) for i in finished])
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        done += len(finished)
        if len(finished) < len(rows):
            return done  # what failed stays owed, for the next open
