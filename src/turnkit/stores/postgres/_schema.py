"""PostgreSQL schema migrations: the SQLite tables in PostgreSQL types, plus the
writer-lease table and the fence function that every step commit calls.

Each migration runs in one transaction under an advisory lock, so several
processes starting at once migrate a live database exactly once, and readers
never see a half-applied version (PostgreSQL DDL is transactional).
"""

from __future__ import annotations

import time
from typing import Any

from psycopg import errors as pg_errors
from psycopg import sql

from ..._errors import StoreError
from .._migration_list import Migrations, describe_migration, pending_numbers

#: SQLSTATE raised by ``turnkit_fence`` when another process holds the session.
FENCE_SQLSTATE = "TK001"
#: SQLSTATE raised by ``turnkit_expect_one`` when an update found no row.
MISSING_SQLSTATE = "TK002"
#: SQLSTATE raised by ``turnkit_expect_moved`` when a turn's put found no row.
MOVE_SQLSTATE = "TK003"
#: SQLSTATE raised by ``turnkit_cell_fence`` when a turn of a tenant moving between
#: cells would change in a cell that does not (or no longer) serve it.
CELL_SQLSTATE = "TK004"


def claimable(alias: str = "") -> str:
    """The condition on a turns row (named ``alias``) that some worker should run it:
    queued, running (or left running by a process that died), or parked with a
    cancellation recorded (a delivery then ends it cancelled)."""
    a = f"{alias}." if alias else ""
    return (
        f"({a}status IN ('queued', 'running') "
        f"OR ({a}status = 'suspended' AND {a}cancel_reason IS NOT NULL))"
    )


MIGRATIONS: list[tuple[str, ...]] = [
    (
        """CREATE TABLE turnkit_sessions (
            session_id text PRIMARY KEY,
            agent text NOT NULL,
            status text NOT NULL,
            created_at double precision NOT NULL,
            updated_at double precision NOT NULL
        )""",
        """CREATE TABLE turnkit_turns (
            session_id text NOT NULL,
            turn_id text NOT NULL,
            agent text NOT NULL,
            status text NOT NULL,
            opening text NOT NULL,
            event text,
            text text,
            error text,
            created_at double precision NOT NULL,
            finished_at double precision,
            PRIMARY KEY (session_id, turn_id)
        )""",
        "CREATE INDEX turnkit_turns_running ON turnkit_turns (created_at) WHERE status = 'running'",
        """CREATE TABLE turnkit_messages (
            session_id text NOT NULL,
            idx integer NOT NULL,
            turn_id text NOT NULL,
            body text NOT NULL,
            PRIMARY KEY (session_id, idx)
        )""",
        """CREATE TABLE turnkit_steps (
            session_id text NOT NULL,
            turn_id text NOT NULL,
            step_id text NOT NULL,
            result text NOT NULL,
            PRIMARY KEY (session_id, turn_id, step_id)
        )""",
        """CREATE TABLE turnkit_events (
            session_id text NOT NULL,
            seq bigint NOT NULL,
            turn_id text NOT NULL,
            body text NOT NULL,
            PRIMARY KEY (session_id, seq)
        )""",
        "CREATE INDEX turnkit_events_turn ON turnkit_events (session_id, turn_id, seq)",
        # The current writer of each session: a token per lock acquisition. Every
        # commit checks it (and share-locks the row, so a takeover waits for the
        # commit in flight), so a process that lost its lock can never write.
        """CREATE TABLE turnkit_writers (
            session_id text PRIMARY KEY,
            token text NOT NULL,
            holder text NOT NULL,
            since double precision NOT NULL
        )""",
        """CREATE FUNCTION turnkit_fence(sid text, tok text) RETURNS void
        LANGUAGE plpgsql AS $fn$
        BEGIN
            PERFORM 1 FROM {schema}.turnkit_writers
                WHERE session_id = sid AND token = tok FOR SHARE;
            IF NOT FOUND THEN
                RAISE EXCEPTION USING ERRCODE = '{sqlstate}',
                    MESSAGE = 'session ' || sid || ' is held by another writer';
            END IF;
        END
        $fn$""",
        # Fails the transaction unless exactly one row was changed: lets a pipelined
        # commit check an UPDATE's row count server-side, before its COMMIT runs.
        """CREATE FUNCTION turnkit_expect_one(n bigint, what text) RETURNS void
        LANGUAGE plpgsql AS $fn$
        BEGIN
            IF n <> 1 THEN
                RAISE EXCEPTION USING ERRCODE = '{sqlstate_missing}', MESSAGE = what;
            END IF;
        END
        $fn$""",
    ),
    # v2: human in the loop. A parked turn keeps its suspend checkpoint on its row.
    (
        "ALTER TABLE turnkit_turns ADD COLUMN pending text",
        "CREATE INDEX turnkit_turns_parked ON turnkit_turns (session_id) "
        "WHERE status = 'suspended'",
    ),
    # v3: durable cancellation, and resets that archive a session's history.
    (
        "ALTER TABLE turnkit_turns ADD COLUMN cancel_reason text",
        "ALTER TABLE turnkit_sessions ADD COLUMN generation integer NOT NULL DEFAULT 0",
        """CREATE TABLE turnkit_generations (
            session_id text NOT NULL,
            generation integer NOT NULL,
            archived_at double precision NOT NULL,
            PRIMARY KEY (session_id, generation)
        )""",
        """CREATE TABLE turnkit_archived_messages (
            session_id text NOT NULL,
            generation integer NOT NULL,
            idx integer NOT NULL,
            turn_id text NOT NULL,
            body text NOT NULL,
            PRIMARY KEY (session_id, generation, idx)
        )""",
        """CREATE TABLE turnkit_archived_steps (
            session_id text NOT NULL,
            generation integer NOT NULL,
            turn_id text NOT NULL,
            step_id text NOT NULL,
            result text NOT NULL,
            PRIMARY KEY (session_id, generation, turn_id, step_id)
        )""",
        """CREATE TABLE turnkit_archived_events (
            session_id text NOT NULL,
            generation integer NOT NULL,
            seq bigint NOT NULL,
            turn_id text NOT NULL,
            body text NOT NULL,
            PRIMARY KEY (session_id, generation, seq)
        )""",
        """CREATE TABLE turnkit_archived_turns (
            session_id text NOT NULL,
            generation integer NOT NULL,
            turn_id text NOT NULL,
            agent text NOT NULL,
            status text NOT NULL,
            opening text NOT NULL,
            event text,
            text text,
            error text,
            created_at double precision NOT NULL,
            finished_at double precision,
            pending text,
            cancel_reason text,
            PRIMARY KEY (session_id, generation, turn_id)
        )""",
    ),
    # v4: the session list pages newest first per agent from an index.
    (
        "CREATE INDEX turnkit_sessions_recent ON turnkit_sessions "
        "(agent, updated_at DESC, session_id)",
    ),
    # v5: the store's identity, random and made once (idempotency keys include it).
    (
        "CREATE TABLE turnkit_store (id integer PRIMARY KEY CHECK (id = 1), "
        "store_id text NOT NULL)",
        "INSERT INTO turnkit_store (id, store_id) "
        "VALUES (1, replace(gen_random_uuid()::text, '-', ''))",
    ),
    # v6: who opened each session (NULL: opened from code, or before owners were kept),
    # and the session list of one owner from an index.
    (
        "ALTER TABLE turnkit_sessions ADD COLUMN owner text",
        "CREATE INDEX turnkit_sessions_owned ON turnkit_sessions "
        "(owner, agent, updated_at DESC, session_id) WHERE owner IS NOT NULL",
    ),
    # v7: the turns table as the workers' queue. The runnable turns (queued, running,
    # parked with a cancellation to close) by age, and the writer lock's key computed
    # in SQL, so one statement can pick sessions and lock them.
    (
        f"CREATE INDEX turnkit_turns_claimable ON turnkit_turns (created_at) WHERE {claimable()}",
        """CREATE FUNCTION turnkit_lock_key(sid text) RETURNS bigint
        LANGUAGE sql IMMUTABLE AS $fn$
            SELECT ('x' || substr(md5('{schema}/' || sid), 1, 16))::bit(64)::bigint
        $fn$""",
    ),
    # v8: a reset is a barrier kept in the store: when it was requested, until the
    # process holding the session's writer lock archives the generation.
    ("ALTER TABLE turnkit_sessions ADD COLUMN reset_requested double precision",),
    # v9: the sessions with a reset pending, for the claim that carries them out (a
    # handful at most, so every claim reads them from this index, not the table).
    (
        "CREATE INDEX turnkit_sessions_resetting ON turnkit_sessions (reset_requested) "
        "WHERE reset_requested IS NOT NULL",
    ),
    # v10: the key that signs the event relay's notifications. Any role that may
    # connect can LISTEN and NOTIFY on any channel; only turnkit's roles can read
    # this table, so only they can sign a notification the relay accepts.
    # gen_random_uuid() draws from PostgreSQL's strong random source.
    (
        "CREATE TABLE turnkit_relay_key (id integer PRIMARY KEY CHECK (id = 1), key text NOT NULL)",
        "INSERT INTO turnkit_relay_key (id, key) VALUES "
        "(1, replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''))",
        "REVOKE ALL ON turnkit_relay_key FROM PUBLIC",
    ),
    # v11: a fenced commit names who holds the session now, for the one line the
    # fenced process logs.
    (
        """CREATE OR REPLACE FUNCTION turnkit_fence(sid text, tok text) RETURNS void
        LANGUAGE plpgsql AS $fn$
        DECLARE
            current text;
        BEGIN
            PERFORM 1 FROM {schema}.turnkit_writers
                WHERE session_id = sid AND token = tok FOR SHARE;
            IF NOT FOUND THEN
                SELECT holder INTO current FROM {schema}.turnkit_writers WHERE session_id = sid;
                RAISE EXCEPTION USING ERRCODE = '{sqlstate}',
                    MESSAGE = 'session ' || sid || ' is held by '
                        || coalesce(current, 'no writer');
            END IF;
        END
        $fn$""",
    ),
    # v12: a turn's put (``PutTurn``) that finds no row (its id taken, or the turn no
    # longer in the status the move was planned from) fails with its own SQLSTATE,
    # so the store raises ``TurnMoveError`` without reading the message.
    (
        """CREATE FUNCTION turnkit_expect_moved(n bigint, what text) RETURNS void
        LANGUAGE plpgsql AS $fn$
        BEGIN
            IF n <> 1 THEN
                RAISE EXCEPTION USING ERRCODE = '{sqlstate_move}', MESSAGE = what;
            END IF;
        END
        $fn$""",
    ),
    # v13: an erased session's tombstone: who erased it, when, and the last event
    # number it had used (numbering carries on after it).
    (
        "ALTER TABLE turnkit_sessions ADD COLUMN erased_by text",
        "ALTER TABLE turnkit_sessions ADD COLUMN erased_at double precision",
        "ALTER TABLE turnkit_sessions ADD COLUMN erased_seq bigint",
    ),
    # v14: retention finds what aged out from indexes, oldest first.
    (
        "CREATE INDEX turnkit_sessions_idle ON turnkit_sessions (updated_at, session_id)",
        "CREATE INDEX turnkit_generations_age ON turnkit_generations "
        "(archived_at, session_id, generation)",
    ),
    # v15: retention cuts an ended turn's events to its last one, once: the turns
    # not cut yet, by when they ended.
    (
        "ALTER TABLE turnkit_turns ADD COLUMN events_trimmed integer",
        "CREATE INDEX turnkit_turns_untrimmed ON turnkit_turns "
        "(finished_at, session_id, turn_id) "
        "WHERE finished_at IS NOT NULL AND events_trimmed IS NULL",
    ),
    # v16: the agent version each turn runs under, and the version that holds a turn
    # it refused to run (docs/deploying.md). Nullable columns without a default: added
    # without rewriting the table, and an older turnkit's statements never name them.
    (
        "ALTER TABLE turnkit_turns ADD COLUMN version text",
        "ALTER TABLE turnkit_turns ADD COLUMN held_by text",
        "ALTER TABLE turnkit_archived_turns ADD COLUMN version text",
    ),
    # v17: the inbox walks the parked turns of every session, oldest first.
    (
        "CREATE INDEX turnkit_turns_inbox ON turnkit_turns (created_at, session_id, turn_id) "
        "WHERE status = 'suspended'",
    ),
    # v18: a parked turn's next deadline, reminder or end of a sleep, and the index
    # the timer loop reads the due ones from, earliest first.
    (
        "ALTER TABLE turnkit_turns ADD COLUMN wake_at double precision",
        "CREATE INDEX turnkit_turns_waking ON turnkit_turns (wake_at) WHERE wake_at IS NOT NULL",
    ),
    # v19: the oldest schema version whose turnkit may still use this schema,
    # recorded by each migration run (``READABLE_FROM``); and the live workers: what
    # each runs (``{agent: its version}``) and the turn versions it serves (a JSON
    # array; NULL: all), refreshed as it claims, so a scrape can count the turns
    # waiting on a version nobody serves.
    (
        "ALTER TABLE turnkit_schema ADD COLUMN readable_from integer",
        """CREATE TABLE turnkit_workers (
            holder text PRIMARY KEY,
            agents text NOT NULL,
            serves text,
            seen_at double precision NOT NULL
        )""",
    ),
    # v20: whose turn it is (docs/tenants.md; '' is the default tenant: a constant
    # default adds the column without rewriting the table), and the claim's way in:
    # the runnable turns by tenant, oldest first, which the claim walks one tenant at
    # a time to take turns fairly across tenants.
    (
        "ALTER TABLE turnkit_turns ADD COLUMN tenant text NOT NULL DEFAULT ''",
        f"CREATE INDEX turnkit_turns_tenant_queue ON turnkit_turns (tenant, created_at) "
        f"WHERE {claimable()}",
        # A tenant's concurrency slots are advisory locks keyed (this, slot number):
        # the two-int form, apart from the sessions' one-bigint writer locks.
        """CREATE FUNCTION turnkit_tenant_key(tenant text) RETURNS integer
        LANGUAGE sql IMMUTABLE AS $fn$
            SELECT ('x' || substr(md5('{schema}/tenant/' || tenant), 1, 8))::bit(32)::integer
        $fn$""",
    ),
    # v21: large payloads (``blobs=True``): each kept once per turn, by its SHA-256,
    # referred to from its rows; deleted with its session or its turn's generation.
    (
        "CREATE TABLE turnkit_blobs (session_id text NOT NULL, turn_id text NOT NULL, "
        "name text NOT NULL, data text NOT NULL, PRIMARY KEY (session_id, turn_id, name))",
    ),
    # v22: which process wrote each logged event (its ``PostgresStore.holder``), for
    # the console's timeline to show the worker of each step and takeovers. Every
    # connection of a store names its holder in the ``turnkit.holder`` setting, and
    # the column's default reads it, so no insert changes; rows logged before, or by
    # a turnkit that does not name itself, keep NULL. Added without a default and
    # given one after, so existing rows are not rewritten.
    (
        "ALTER TABLE turnkit_events ADD COLUMN holder text",
        "ALTER TABLE turnkit_events ALTER COLUMN holder "
        "SET DEFAULT nullif(current_setting('turnkit.holder', true), '')",
    ),
    # v23: the usage ledger, what each session and tenant spent (docs/tenants.md).
    (
        "CREATE TABLE turnkit_usage (tenant text NOT NULL, bucket text NOT NULL, "
        "input_tokens bigint NOT NULL, output_tokens bigint NOT NULL, "
        "cost double precision NOT NULL, calls bigint NOT NULL, PRIMARY KEY (tenant, bucket))",
    ),
    # v24: model rate limits shared by every process (docs/tenants.md): a log of the
    # calls still inside some limit's window (a call counts from when it was let go
    # until a window after it ended), the provider's blocks (a 429's retry-after),
    # and the take that checks and logs a call in one step under a per-limit
    # transaction lock, so two takers never both get the last place.
    (
        "CREATE TABLE turnkit_rate_log (key text NOT NULL, ticket bigserial, "
        "at double precision NOT NULL, done double precision, "
        "tokens bigint NOT NULL DEFAULT 0, PRIMARY KEY (key, ticket))",
        "CREATE TABLE turnkit_rate_blocks (key text PRIMARY KEY, until double precision NOT NULL)",
        # A call still in flight counts as happening now, unless it began more than
        # ``stale`` seconds ago (its process died during it): then as ended when it began.
        """CREATE FUNCTION turnkit_rate_take(k text, max_requests integer, max_tokens bigint,
            win double precision, slack double precision, stale double precision)
        RETURNS TABLE (wait double precision, taken bigint)
        LANGUAGE plpgsql AS $fn$
        DECLARE
            now_ double precision;
            n bigint;
            used bigint;
            oldest double precision;
            blocked double precision;
            t bigint;
        BEGIN
            PERFORM pg_advisory_xact_lock(hashtext('{schema}/rate/' || k));
            now_ := extract(epoch FROM clock_timestamp());
            SELECT b.until INTO blocked FROM {schema}.turnkit_rate_blocks b WHERE b.key = k;
            IF blocked IS NOT NULL AND blocked > now_ THEN
                RETURN QUERY SELECT blocked - now_, NULL::bigint;
                RETURN;
            END IF;
            DELETE FROM {schema}.turnkit_rate_log l WHERE l.key = k
                AND coalesce(l.done, CASE WHEN l.at < now_ - stale THEN l.at END)
                    < now_ - win - slack;
            SELECT count(*), coalesce(sum(l.tokens), 0),
                    min(coalesce(l.done, CASE WHEN l.at < now_ - stale THEN l.at ELSE now_ END))
                INTO n, used, oldest
                FROM {schema}.turnkit_rate_log l WHERE l.key = k;
            IF max_requests IS NOT NULL AND n >= max_requests THEN
                RETURN QUERY SELECT e.at + win + slack - now_, NULL::bigint FROM (
                    SELECT coalesce(l.done, CASE WHEN l.at < now_ - stale THEN l.at
                        ELSE now_ END) AS at
                    FROM {schema}.turnkit_rate_log l WHERE l.key = k) e
                    ORDER BY e.at OFFSET n - max_requests LIMIT 1;
                RETURN;
            END IF;
            IF max_tokens IS NOT NULL AND n > 0 AND used >= max_tokens THEN
                RETURN QUERY SELECT oldest + win + slack - now_, NULL::bigint;
                RETURN;
            END IF;
            INSERT INTO {schema}.turnkit_rate_log (key, at) VALUES (k, now_)
                RETURNING ticket INTO t;
            RETURN QUERY SELECT 0.0::double precision, t;
        END
        $fn$""",
    ),
    # v25: cells (docs/deploying.md "Cells"). In the directory's schema: where each
    # tenant lives and each session was placed, and the moves under way. In every
    # cell: the fences of tenants moving out or in (a fenced tenant's turns are not
    # claimed, and its turn rows refuse changes but the ones a running turn makes
    # while its tenant drains), and the moves whose usage totals arrived here.
    (
        "CREATE TABLE turnkit_cell_tenants (tenant text PRIMARY KEY, cell text NOT NULL)",
        "CREATE TABLE turnkit_cell_sessions (session_id text PRIMARY KEY, "
        "tenant text NOT NULL, cell text NOT NULL)",
        "CREATE INDEX turnkit_cell_sessions_tenant ON turnkit_cell_sessions (tenant, cell)",
        "CREATE TABLE turnkit_cell_moves (tenant text PRIMARY KEY, source text NOT NULL, "
        "target text NOT NULL, stage text NOT NULL, move_id text NOT NULL)",
        "CREATE TABLE turnkit_cell_fences (tenant text PRIMARY KEY, state text NOT NULL, "
        "cell text NOT NULL)",
        "CREATE TABLE turnkit_cell_arrivals (move_id text PRIMARY KEY, tenant text NOT NULL)",
        """CREATE FUNCTION turnkit_cell_fence() RETURNS trigger LANGUAGE plpgsql AS $fn$
        DECLARE
            who text;
            f record;
        BEGIN
            IF TG_OP = 'DELETE' THEN who := OLD.tenant; ELSE who := NEW.tenant; END IF;
            SELECT c.state, c.cell INTO f FROM {schema}.turnkit_cell_fences c
                WHERE c.tenant = who;
            IF NOT FOUND OR current_setting('turnkit.cell_move', true) = who THEN
                IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
                RETURN NEW;
            END IF;
            IF f.state = 'draining' AND TG_OP = 'UPDATE' AND OLD.status = 'running' THEN
                RETURN NEW;
            END IF;
            RAISE EXCEPTION USING ERRCODE = '{sqlstate_cell}', MESSAGE = format(
                'tenant %L %s cell %L: its turns cannot change here; try again',
                who, CASE f.state WHEN 'arriving' THEN 'is arriving from'
                    WHEN 'draining' THEN 'is moving to' ELSE 'has moved to' END, f.cell);
        END
        $fn$""",
        "CREATE TRIGGER turnkit_cell_fence BEFORE INSERT OR UPDATE OR DELETE ON turnkit_turns "
        "FOR EACH ROW EXECUTE FUNCTION turnkit_cell_fence()",
    ),
    # v26: a session's turns in their order, so that what a submission reads (its
    # latest turn, to place the new one after it, and its unfinished turns) is a few
    # index entries however many turns the session has had (it read all of them:
    # 4 ms a submission at 20,000).
    (
        "CREATE INDEX turnkit_turns_by_session ON turnkit_turns (session_id, created_at)",
        "CREATE INDEX turnkit_turns_unfinished ON turnkit_turns (session_id, created_at) "
        "WHERE status IN ('queued', 'running', 'suspended')",
    ),
    # v27: v26's index by session and time, for the latest turn only. Planned
    # before the table had statistics (a new schema; autovacuum off or not run yet),
    # a lookup of one turn by session and id took it (smaller than the primary key)
    # and read every turn of the session to find one: a delivery's load, a turn's
    # read. ``created_at`` is never NULL, so the predicate keeps every row, but only
    # a query that says ``created_at IS NOT NULL`` may use the index: the latest
    # turn's read (``_sql._AFTER_LATEST``) does.
    (
        "DROP INDEX turnkit_turns_by_session",
        "CREATE INDEX turnkit_turns_by_session ON turnkit_turns (session_id, created_at) "
        "WHERE created_at IS NOT NULL",
    ),
]


SCHEMA_VERSION = len(MIGRATIONS)
#: The oldest schema version whose turnkit still runs against a schema at
#: ``SCHEMA_VERSION`` (the last release's, docs/deploying.md "Upgrading turnkit").
#: Keep it while migrations stay additive (new nullable columns, tables, indexes);
#: raise it to the version of a migration older code cannot live with.
READABLE_FROM = 15
#: How long a migration waits for a table lock before it lets the traffic through
#: and tries again (a long transaction of a running node must not stall the rest
#: behind the migration's lock), and how long it keeps trying.
LOCK_WAIT = "2s"
MIGRATE_DEADLINE = 120.0


def read_store_id(conn: Any, schema: str) -> str:
    """The identity ``schema`` was given when its tables were created."""
    query = sql.SQL("SELECT store_id FROM {}.turnkit_store WHERE id = 1")
    row = conn.execute(query.format(sql.Identifier(schema))).fetchone()
    if row is None:
        raise StoreError(f"schema {schema!r} has no store identity (turnkit_store is empty)")
    return str(row[0])


def read_relay_key(conn: Any, schema: str) -> bytes:
    """The key that signs ``schema``'s relay notifications."""
    query = sql.SQL("SELECT key FROM {}.turnkit_relay_key WHERE id = 1")
    row = conn.execute(query.format(sql.Identifier(schema))).fetchone()
    if row is None:
        raise StoreError(f"schema {schema!r} has no relay key (turnkit_relay_key is empty)")
    return str(row[0]).encode()


def stored_version(conn: Any, schema: str) -> tuple[int, int | None]:
    """``schema``'s version and the oldest version whose turnkit may use it (``None``:
    not recorded), read on a psycopg connection without changing anything."""
    quoted = sql.Identifier(schema).as_string(conn)
    found = conn.execute("SELECT to_regclass(%s)", (f"{quoted}.turnkit_schema",)).fetchone()
    if found[0] is None:
        return 0, None
    has_floor = conn.execute(
        "SELECT 1 FROM pg_attribute WHERE attrelid = %s::regclass AND attname = 'readable_from' "
        "AND NOT attisdropped",
        (f"{quoted}.turnkit_schema",),
    ).fetchone()
    wanted = "version, readable_from" if has_floor else "version, NULL"
    row = conn.execute(f"SELECT {wanted} FROM {quoted}.turnkit_schema WHERE id = 1").fetchone()
    if row is None:
        return 0, None
    return int(row[0]), None if row[1] is None else int(row[1])


def pending(version: int, migrations: Migrations = MIGRATIONS) -> list[int]:
    """The migrations a schema at ``version`` still needs, by number."""
    return pending_numbers(version, migrations)


def describe(number: int, migrations: Migrations = MIGRATIONS) -> str:
    """Migration ``number`` in one line: what each statement does, in short."""
    return describe_migration(number, migrations)


def migrate(conn: Any, schema: str, migrations: list[tuple[str, ...]] = MIGRATIONS) -> int:
    """Bring ``schema`` up to date on an autocommit psycopg connection; return the version.

    Online: each attempt waits at most ``LOCK_WAIT`` for a table's lock (running
    nodes' transactions go on meanwhile) and is tried again until
    ``MIGRATE_DEADLINE``. A schema a newer turnkit migrated is used as it is if that
    turnkit recorded this one may still use it (``READABLE_FROM``), else refused.
    """
    deadline = time.monotonic() + MIGRATE_DEADLINE
    pause = 0.1
    while True:
        try:
            return _migrate_once(conn, schema, migrations)
        except pg_errors.LockNotAvailable as exc:
            if time.monotonic() + pause > deadline:
                raise StoreError(
                    f"migrating schema {schema!r}: a table stayed locked by other "
                    f"transactions for {MIGRATE_DEADLINE:g}s ({exc}); try again"
                ) from exc
            time.sleep(pause)
            pause = min(pause * 2, 5.0)


def _migrate_once(conn: Any, schema: str, migrations: list[tuple[str, ...]]) -> int:
    quoted = sql.Identifier(schema).as_string(conn)
    with conn.transaction():
        # One migrator at a time per schema, across every process.
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"turnkit-migrate:{schema}",))
        # Created only when missing: a role that owns (or may create in) an existing
        # schema needs no CREATE privilege on the database, and an up-to-date schema
        # needs no CREATE at all.
        exists = "SELECT 1 FROM pg_namespace WHERE nspname = %s"
        if conn.execute(exists, (schema,)).fetchone() is None:
            try:
                with conn.transaction():  # a savepoint: losing the race below is fine
                    conn.execute(f"CREATE SCHEMA {quoted}")
            except (pg_errors.UniqueViolation, pg_errors.DuplicateSchema):
                pass  # created this moment by someone outside our lock (an app's setup)
        if (
            conn.execute("SELECT to_regclass(%s)", (f"{quoted}.turnkit_schema",)).fetchone()[0]
            is None
        ):
            conn.execute(
                f"CREATE TABLE {quoted}.turnkit_schema "
                "(id integer PRIMARY KEY CHECK (id = 1), version integer NOT NULL)"
            )
        version, readable_from = stored_version(conn, schema)
        if version > len(migrations):
            if readable_from is not None and readable_from <= len(migrations):
                return version  # a newer turnkit's additive migrations: still ours to use
            raise StoreError(
                f"database schema {schema!r} is version {version}, newer than this turnkit "
                f"knows ({len(migrations)}) and not readable by it; upgrade turnkit"
            )
        # From here on, a lock another transaction holds fails this attempt quickly.
        conn.execute(f"SET LOCAL lock_timeout = '{LOCK_WAIT}'")
        for target in range(version + 1, len(migrations) + 1):
            conn.execute(f"SET LOCAL search_path TO {quoted}")
            for statement in migrations[target - 1]:
                conn.execute(
                    statement.format(
                        schema=quoted,
                        sqlstate=FENCE_SQLSTATE,
                        sqlstate_missing=MISSING_SQLSTATE,
                        sqlstate_move=MOVE_SQLSTATE,
                        sqlstate_cell=CELL_SQLSTATE,
                    )
                )
            conn.execute(
                f"INSERT INTO {quoted}.turnkit_schema (id, version) VALUES (1, %s) "
                "ON CONFLICT (id) DO UPDATE SET version = excluded.version",
                (target,),
            )
            if target == len(migrations) and migrations is MIGRATIONS:
                conn.execute(
                    f"UPDATE {quoted}.turnkit_schema SET readable_from = %s", (READABLE_FROM,)
                )
    return len(migrations)
