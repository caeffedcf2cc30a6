"""SQLite schema migrations: an ordered list of steps and a version row.

Each entry moves the schema from version ``i`` to ``i + 1`` and runs in its own
transaction, so a database at any earlier version is brought forward safely,
also while other connections read it.
"""

from __future__ import annotations

import sqlite3

from .._errors import StoreError
from ._migration_list import Migrations, describe_migration, pending_numbers

MIGRATIONS: list[tuple[str, ...]] = [
    (
        """CREATE TABLE turnkit_sessions (
            session_id TEXT PRIMARY KEY,
            agent TEXT NOT NULL,
            status TEXT NOT NULL,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        ) WITHOUT ROWID""",
        """CREATE TABLE turnkit_turns (
            session_id TEXT NOT NULL,
            turn_id TEXT NOT NULL,
            agent TEXT NOT NULL,
            status TEXT NOT NULL,
            opening TEXT NOT NULL,
            event TEXT,
            text TEXT,
            error TEXT,
            created_at REAL NOT NULL,
            finished_at REAL,
            PRIMARY KEY (session_id, turn_id)
        )""",
        "CREATE INDEX turnkit_turns_running ON turnkit_turns (created_at) WHERE status = 'running'",
        """CREATE TABLE turnkit_messages (
            session_id TEXT NOT NULL,
            idx INTEGER NOT NULL,
            turn_id TEXT NOT NULL,
            body TEXT NOT NULL,
            PRIMARY KEY (session_id, idx)
        ) WITHOUT ROWID""",
        # Keyed by turn first: a delivery loads only its own turn's steps, and step ids
        # are unique within a session by construction, so no second index is needed.
        """CREATE TABLE turnkit_steps (
            session_id TEXT NOT NULL,
            turn_id TEXT NOT NULL,
            step_id TEXT NOT NULL,
            result TEXT NOT NULL,
            PRIMARY KEY (session_id, turn_id, step_id)
        ) WITHOUT ROWID""",
        """CREATE TABLE turnkit_events (
            session_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            turn_id TEXT NOT NULL,
            body TEXT NOT NULL,
            PRIMARY KEY (session_id, seq)
        ) WITHOUT ROWID""",
        "CREATE INDEX turnkit_events_turn ON turnkit_events (session_id, turn_id, seq)",
    ),
    # v2: human in the loop. A parked turn keeps its suspend checkpoint on its row.
    (
        "ALTER TABLE turnkit_turns ADD COLUMN pending TEXT",
        "CREATE INDEX turnkit_turns_parked ON turnkit_turns (session_id) "
        "WHERE status = 'suspended'",
    ),
    # v3: durable cancellation, and resets that archive a session's history.
    (
        "ALTER TABLE turnkit_turns ADD COLUMN cancel_reason TEXT",
        "ALTER TABLE turnkit_sessions ADD COLUMN generation INTEGER NOT NULL DEFAULT 0",
        """CREATE TABLE turnkit_generations (
            session_id TEXT NOT NULL,
            generation INTEGER NOT NULL,
            archived_at REAL NOT NULL,
            PRIMARY KEY (session_id, generation)
        ) WITHOUT ROWID""",
        """CREATE TABLE turnkit_archived_messages (
            session_id TEXT NOT NULL,
            generation INTEGER NOT NULL,
            idx INTEGER NOT NULL,
            turn_id TEXT NOT NULL,
            body TEXT NOT NULL,
            PRIMARY KEY (session_id, generation, idx)
        ) WITHOUT ROWID""",
        """CREATE TABLE turnkit_archived_steps (
            session_id TEXT NOT NULL,
            generation INTEGER NOT NULL,
            turn_id TEXT NOT NULL,
            step_id TEXT NOT NULL,
            result TEXT NOT NULL,
            PRIMARY KEY (session_id, generation, turn_id, step_id)
        ) WITHOUT ROWID""",
        """CREATE TABLE turnkit_archived_events (
            session_id TEXT NOT NULL,
            generation INTEGER NOT NULL,
            seq INTEGER NOT NULL,
            turn_id TEXT NOT NULL,
            body TEXT NOT NULL,
            PRIMARY KEY (session_id, generation, seq)
        ) WITHOUT ROWID""",
        """CREATE TABLE turnkit_archived_turns (
            session_id TEXT NOT NULL,
            generation INTEGER NOT NULL,
            turn_id TEXT NOT NULL,
            agent TEXT NOT NULL,
            status TEXT NOT NULL,
            opening TEXT NOT NULL,
            event TEXT,
            text TEXT,
            error TEXT,
            created_at REAL NOT NULL,
            finished_at REAL,
            pending TEXT,
            cancel_reason TEXT,
            PRIMARY KEY (session_id, generation, turn_id)
        ) WITHOUT ROWID""",
    ),
    # v4: the session list pages newest first per agent from an index.
    (
        "CREATE INDEX turnkit_sessions_recent ON turnkit_sessions "
        "(agent, updated_at DESC, session_id)",
    ),
    # v5: the store's identity, random and made once (idempotency keys include it).
    (
        "CREATE TABLE turnkit_store (id INTEGER PRIMARY KEY CHECK (id = 1), "
        "store_id TEXT NOT NULL)",
        "INSERT INTO turnkit_store (id, store_id) VALUES (1, lower(hex(randomblob(16))))",
    ),
    # v6: who opened each session (NULL: opened from code, or before owners were kept),
    # and the session list of one owner from an index.
    (
        "ALTER TABLE turnkit_sessions ADD COLUMN owner TEXT",
        "CREATE INDEX turnkit_sessions_owned ON turnkit_sessions "
        "(owner, agent, updated_at DESC, session_id) WHERE owner IS NOT NULL",
    ),
    # v7: a reset is a barrier kept in the store: when it was requested, until the
    # process holding the session's writer lock archives the generation.
    ("ALTER TABLE turnkit_sessions ADD COLUMN reset_requested REAL",),
    # v8: an erased session's tombstone: who erased it, when, and the last event
    # number it had used (numbering carries on after it).
    (
        "ALTER TABLE turnkit_sessions ADD COLUMN erased_by TEXT",
        "ALTER TABLE turnkit_sessions ADD COLUMN erased_at REAL",
        "ALTER TABLE turnkit_sessions ADD COLUMN erased_seq INTEGER",
    ),
    # v9: retention finds what aged out from indexes, oldest first.
    (
        "CREATE INDEX turnkit_sessions_idle ON turnkit_sessions (updated_at, session_id)",
        "CREATE INDEX turnkit_generations_age ON turnkit_generations "
        "(archived_at, session_id, generation)",
    ),
    # v10: retention cuts an ended turn's events to its last one, once: the turns
    # not cut yet, by when they ended.
    (
        "ALTER TABLE turnkit_turns ADD COLUMN events_trimmed INTEGER",
        "CREATE INDEX turnkit_turns_untrimmed ON turnkit_turns "
        "(finished_at, session_id, turn_id) "
        "WHERE finished_at IS NOT NULL AND events_trimmed IS NULL",
    ),
    # v11: the agent version each turn runs under, and the version that holds a turn
    # it refused to run (docs/deploying.md). Columns an older turnkit never reads.
    (
        "ALTER TABLE turnkit_turns ADD COLUMN version TEXT",
        "ALTER TABLE turnkit_turns ADD COLUMN held_by TEXT",
        "ALTER TABLE turnkit_archived_turns ADD COLUMN version TEXT",
    ),
    # v12: the inbox walks the parked turns of every session, oldest first.
    (
        "CREATE INDEX turnkit_turns_inbox ON turnkit_turns (created_at, session_id, turn_id) "
        "WHERE status = 'suspended'",
    ),
    # v13: a parked turn's next deadline, reminder or end of a sleep, and the index
    # the timer loop reads the due ones from, earliest first.
    (
        "ALTER TABLE turnkit_turns ADD COLUMN wake_at REAL",
        "CREATE INDEX turnkit_turns_waking ON turnkit_turns (wake_at) WHERE wake_at IS NOT NULL",
    ),
    # v14: the oldest schema version whose turnkit may still use this database,
    # recorded by each migration run (``READABLE_FROM``).
    ("ALTER TABLE turnkit_schema ADD COLUMN readable_from INTEGER",),
    # v15: whose turn it is (docs/tenants.md); '' is the default tenant.
    ("ALTER TABLE turnkit_turns ADD COLUMN tenant TEXT NOT NULL DEFAULT ''",),
    # v16: the usage ledger, what each session and tenant spent (docs/tenants.md).
    (
        "CREATE TABLE turnkit_usage (tenant TEXT NOT NULL, bucket TEXT NOT NULL, "
        "input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL, cost REAL NOT NULL, "
        "calls INTEGER NOT NULL, PRIMARY KEY (tenant, bucket))",
    ),
    # v17: blob deletions owed (``_blob_outbox``): recorded with the rows' deletion,
    # forgotten once the blobs are gone.
    (
        "CREATE TABLE turnkit_blob_deletions (id INTEGER PRIMARY KEY, "
        "session_id TEXT NOT NULL, turns TEXT)",
    ),
    # v18: a session's turns in their order, so that what a submission reads (its
    # latest turn, to place the new one after it, and its unfinished turns) is a few
    # index entries however many turns the session has had.
    (
        "CREATE INDEX turnkit_turns_by_session ON turnkit_turns (session_id, created_at)",
        "CREATE INDEX turnkit_turns_unfinished ON turnkit_turns (session_id, created_at) "
        "WHERE status IN ('queued', 'running', 'suspended')",
    ),
]

SCHEMA_VERSION = len(MIGRATIONS)
#: The oldest schema version whose turnkit still runs against a database at
#: ``SCHEMA_VERSION`` (the last release's, docs/deploying.md "Upgrading turnkit").
#: Keep it while migrations stay additive (new nullable columns, tables, indexes);
#: raise it to the version of a migration older code cannot live with.
READABLE_FROM = 10


def stored_version(conn: sqlite3.Connection) -> tuple[int, int | None]:
    """The schema version of the database and the oldest version whose turnkit may
    use it (``None``: not recorded), without creating or changing anything."""
    exists = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'turnkit_schema'"
    ).fetchone()
    if exists is None:
        return 0, None
    columns = {row[1] for row in conn.execute("PRAGMA table_info(turnkit_schema)")}
    wanted = "version, readable_from" if "readable_from" in columns else "version, NULL"
    row = conn.execute(f"SELECT {wanted} FROM turnkit_schema WHERE id = 1").fetchone()
    if row is None:
        return 0, None
    return int(row[0]), None if row[1] is None else int(row[1])


def pending(version: int, migrations: Migrations = MIGRATIONS) -> list[int]:
    """The migrations a database at ``version`` still needs, by number."""
    return pending_numbers(version, migrations)


def describe(number: int, migrations: Migrations = MIGRATIONS) -> str:
    """Migration ``number`` in one line: what each statement does, in short."""
    return describe_migration(number, migrations)


def current_version(conn: sqlite3.Connection) -> int:
    conn.execute(
        "CREATE TABLE IF NOT EXISTS turnkit_schema (id INTEGER PRIMARY KEY CHECK (id = 1), "
        "version INTEGER NOT NULL)"
    )
    row = conn.execute("SELECT version FROM turnkit_schema WHERE id = 1").fetchone()
    return int(row[0]) if row else 0


def read_store_id(conn: sqlite3.Connection) -> str:
    """The identity this database was given when its tables were created."""
    row = conn.execute("SELECT store_id FROM turnkit_store WHERE id = 1").fetchone()
    if row is None:
        raise StoreError("the database has no store identity (turnkit_store is empty)")
    return str(row[0])


def migrate(conn: sqlite3.Connection, migrations: list[tuple[str, ...]] = MIGRATIONS) -> int:
    """Apply every migration past the stored version; return the version reached.

    A database written by a newer turnkit is refused rather than misread.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = current_version(conn)
    finally:
        conn.execute("COMMIT")
    if version > len(migrations):
        readable_from = stored_version(conn)[1]
        if readable_from is not None and readable_from <= len(migrations):
            return version  # a newer turnkit's additive migrations: still ours to use
        raise StoreError(
            f"database schema is version {version}, newer than this turnkit knows "
            f"({len(migrations)}) and not readable by it; upgrade turnkit"
        )
    for target in range(version + 1, len(migrations) + 1):
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Re-read under the write lock: another process may have migrated meanwhile.
            if current_version(conn) >= target:
                conn.execute("COMMIT")
                continue
            for statement in migrations[target - 1]:
                conn.execute(statement)
            conn.execute(
                "INSERT INTO turnkit_schema (id, version) VALUES (1, ?) "
                "ON CONFLICT (id) DO UPDATE SET version = excluded.version",
                (target,),
            )
            if target == len(migrations) and migrations is MIGRATIONS:
                conn.execute("UPDATE turnkit_schema SET readable_from = ?", (READABLE_FROM,))
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
    return len(migrations)
