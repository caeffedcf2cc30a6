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

#: Every advisory lock granted in this database: ``n`` 1 for a session's writer lock
#: (one bigint key, ``a``/``b`` its halves), 2 for a tenant's slot (``a`` the
#: tenant's key as an unsigned 32-bit number, ``b`` the slot).
_LOCKS = (
    "SELECT l.classid::bigint AS a, l.objid::bigint AS b, l.objsubid AS n FROM pg_locks l "
    "WHERE l.locktype = 'advisory' AND l.granted "
    "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)


def runnable(alias: str) -> str:
    """``claimable`` for a turns row named ``alias``, less the turns stored after a
    reset that is still pending: they wait until it is carried out. (The session is
    read by key, row by row, as a scalar subquery: an ``EXISTS`` there the planner
    may run as one read of every session into a hash, a whole-table read on a plan
    made when the table was small.)"""
    return (
        f"{claimable(alias)} AND NOT ({alias}.status = 'queued' "
        f"AND {alias}.cancel_reason IS NULL AND (SELECT r.reset_requested "
        f"FROM turnkit_sessions r WHERE r.session_id = {alias}.session_id) IS NOT NULL)"
    )


def served(alias: str) -> str:
    """The turns a worker serves, by version: parameters the served versions (a JSON
    array, or NULL: every version) twice. A turn recorded without a version (before
    turns kept one) is every worker's."""
    return (
        f"(?::json IS NULL OR {alias}.version IS NULL "
        f"OR {alias}.version IN (SELECT json_array_elements_text(?::json)))"
    )


#: Parked turns whose time has come, earliest first (``TimerStore.due_turns``), less
#: those of a tenant fenced for a move between cells: they wake in the cell the
#: tenant moves to. Parameters: the time, the most.
DUE_TURNS_SQL = (
    f"SELECT {TURN_COLUMNS_T} FROM turnkit_turns t WHERE t.wake_at IS NOT NULL "
    "AND t.wake_at <= ? AND t.status = 'suspended' AND t.cancel_reason IS NULL "
    "AND NOT EXISTS (SELECT 1 FROM turnkit_cell_fences cf WHERE cf.tenant = t.tenant) "
    "ORDER BY t.wake_at, t.session_id, t.turn_id LIMIT ?"
)

#: The earliest ``wake_at`` among the same turns (``TimerStore.next_wake``).
NEXT_WAKE_SQL = (
    "SELECT min(t.wake_at) FROM turnkit_turns t WHERE t.wake_at IS NOT NULL "
    "AND t.status = 'suspended' AND t.cancel_reason IS NULL "
    "AND NOT EXISTS (SELECT 1 FROM turnkit_cell_fences cf WHERE cf.tenant = t.tenant)"
)

#: How the claim gives back a slot it took for a session it then could not lock.
SLOT_GIVEN_BACK = "pg_advisory_unlock(p.key, p.slot)"

#: The claim, fair across tenants (docs/tenants.md). ``tn`` walks the tenants that
#: have runnable turns (a loose scan of ``turnkit_turns_tenant_queue``: one index
#: probe per tenant); ``q`` gives each its cap and how many of its sessions run now
#: (its slot locks, read from ``pg_locks``); ``c`` takes each tenant's oldest
#: runnable turns of sessions nobody holds, no more than its free slots; ``k`` ranks
#: them within their tenant. A candidate's place is its tenant's running count plus
#: its rank, so the claim fills the least-served tenants first and goes round the
#: tenants one turn each (oldest turn first among equals). A capped tenant's slots
#: are numbered 0 to cap - 1: ``f`` lists its free ones in a random order (so two
#: claims at once mostly try different ones), and its r-th candidate takes the r-th.
#: An uncapped tenant's session takes a slot numbered by its own id (a hash), so
#: concurrent claims never contend for one; it is there to be counted.
#: Every row kept takes its slot lock and then its session's writer lock (a slot
#: taken for a session another claim locked first is let go at once), so the slots
#: held are the tenant's running sessions, across every process, and a capped
#: tenant never has more slots than its cap. The lock connection holds both until
#: the delivery ends (or dies with it).
#:
#: Parameters, CTE by CTE. ``q``: the per-tenant caps (a JSON object), the default
#: cap (NULL: none). ``c`` (runnable turns): the agents this worker runs (a JSON
#: array), the sessions it skips (a JSON array), the versions it serves twice (see
#: ``served``), how many sessions it takes at most. ``f``: the most again. ``r``
#: (pending resets): the agents, the skipped sessions, the most. ``h`` (held turns to
#: try again, by a worker whose version is none of those that held them: see
#: ``TurnRecord.held_by``): whether to look at all (a boolean: the worker sweeps
#: them now and then), the worker's own version of each agent (a JSON object), the
#: agents, the skipped sessions, the served versions twice, the most. Then the most
#: in all. A session's runnable turn is its oldest runnable one, so its turns run one
#: at a time in submission order; a session with a pending reset and nothing
#: runnable left is claimed for the reset; a session whose turn is held by another
#: version than this worker's (and has nothing runnable) is claimed for that turn
#: (neither takes a slot). Rows: the session id (what the lock connection reads
#: first), its agent, its turn's columns (all NULL for a reset), then its tenant's
#: key and slot (NULL without one). A tenant fenced for a move between cells
#: (``turnkit_cell_fences``) has none of its turns claimed but those left running
#: while it drains, so that they end before it is copied.
CLAIM_SQL = (
    f"WITH RECURSIVE locks AS MATERIALIZED ({_LOCKS}), "
    "held AS (SELECT (a << 32) | b AS k FROM locks WHERE n = 1), "
    "slots AS (SELECT a AS tk, b AS slot FROM locks WHERE n = 2), "
    "tn(tenant) AS ("
    f"(SELECT t.tenant FROM turnkit_turns t WHERE {claimable('t')} ORDER BY t.tenant LIMIT 1) "
    "UNION ALL SELECT (SELECT t.tenant FROM turnkit_turns t "
    f"WHERE {claimable('t')} AND t.tenant > tn.tenant ORDER BY t.tenant LIMIT 1) "
    "FROM tn WHERE tn.tenant IS NOT NULL), "
    "q AS (SELECT tn.tenant, z.key, z.tk, z.cap, "
    "(SELECT count(*) FROM slots s WHERE s.tk = z.tk) AS busy FROM tn "
    "CROSS JOIN LATERAL (SELECT turnkit_tenant_key(tn.tenant) AS key, "
    "turnkit_tenant_key(tn.tenant)::bigint & 4294967295 AS tk, "
    "coalesce((?::json ->> tn.tenant)::integer, ?::integer) AS cap) z "
    "WHERE tn.tenant IS NOT NULL), "
    "c AS (SELECT q.tenant, q.key, q.busy, q.cap, x.* FROM q CROSS JOIN LATERAL ("
    "SELECT t.session_id, t.turn_id, t.created_at FROM turnkit_turns t "
    f"WHERE t.tenant = q.tenant AND {runnable('t')} "
    "AND t.agent IN (SELECT json_array_elements_text(?::json)) "
    "AND t.session_id NOT IN (SELECT json_array_elements_text(?::json)) "
    f"AND {served('t')} "
    "AND NOT EXISTS (SELECT 1 FROM turnkit_cell_fences cf WHERE cf.tenant = t.tenant "
    "AND (cf.state <> 'draining' OR t.status <> 'running')) "
    "AND NOT EXISTS (SELECT 1 FROM turnkit_turns e WHERE e.session_id = t.session_id "
    f"AND {runnable('e')} AND (e.created_at, e.turn_id) < (t.created_at, t.turn_id)) "
    "AND turnkit_lock_key(t.session_id) NOT IN (SELECT k FROM held) "
    "ORDER BY t.created_at "
    "LIMIT GREATEST(0, LEAST(?::integer, coalesce(q.cap - q.busy, 2147483647))) "
    "FOR NO KEY UPDATE OF t SKIP LOCKED) x), "
    "k AS (SELECT c.*, row_number() OVER (PARTITION BY c.tenant "
    "ORDER BY c.created_at, c.turn_id) AS r FROM c), "
    "f AS (SELECT q.tenant, g.slot, row_number() OVER (PARTITION BY q.tenant "
    "ORDER BY random()) AS r FROM q CROSS JOIN LATERAL generate_series(0, "
    "LEAST(q.cap::bigint, q.busy + ?::integer) - 1) g(slot) "
    "WHERE q.cap IS NOT NULL AND q.tenant IN (SELECT tenant FROM c) "
    "AND NOT EXISTS (SELECT 1 FROM slots b WHERE b.tk = q.tk AND b.slot = g.slot)), "
    "w AS (SELECT k.session_id, k.turn_id, k.created_at, k.key, "
    "coalesce(f.slot::integer, hashtext(k.session_id)) AS slot, "
    "k.busy + k.r AS place FROM k LEFT JOIN f ON f.tenant = k.tenant AND f.r = k.r "
    "WHERE k.cap IS NULL OR f.slot IS NOT NULL), "
    "r AS (SELECT s.session_id, NULL::text AS turn_id, s.reset_requested AS created_at, "
    "NULL::integer AS key, NULL::integer AS slot, 0::bigint AS place "
    "FROM turnkit_sessions s WHERE s.reset_requested IS NOT NULL "
    "AND s.agent IN (SELECT json_array_elements_text(?::json)) "
    "AND s.session_id NOT IN (SELECT json_array_elements_text(?::json)) "
    "AND NOT EXISTS (SELECT 1 FROM turnkit_turns e WHERE e.session_id = s.session_id "
    f"AND {runnable('e')}) "
    "AND NOT EXISTS (SELECT 1 FROM turnkit_turns e JOIN turnkit_cell_fences cf "
    "ON cf.tenant = e.tenant WHERE e.session_id = s.session_id) "
    "AND turnkit_lock_key(s.session_id) NOT IN (SELECT k FROM held) "
    "ORDER BY s.reset_requested LIMIT ?), "
    "h AS (SELECT t.session_id, t.turn_id, t.created_at, NULL::integer AS key, "
    "NULL::integer AS slot, 0::bigint AS place FROM turnkit_turns t "
    "WHERE ?::boolean AND t.status = 'suspended' AND t.held_by IS NOT NULL "
    "AND NOT EXISTS (SELECT 1 FROM turnkit_cell_fences cf WHERE cf.tenant = t.tenant) "
    "AND t.cancel_reason IS NULL "
    "AND NOT ((?::json ->> t.agent) = ANY (string_to_array(t.held_by, ','))) "
    "AND t.agent IN (SELECT json_array_elements_text(?::json)) "
    "AND t.session_id NOT IN (SELECT json_array_elements_text(?::json)) "
    f"AND {served('t')} "
    "AND NOT EXISTS (SELECT 1 FROM turnkit_turns e WHERE e.session_id = t.session_id "
    f"AND {runnable('e')}) "
    "AND turnkit_lock_key(t.session_id) NOT IN (SELECT k FROM held) "
    "ORDER BY t.created_at LIMIT ? FOR NO KEY UPDATE OF t SKIP LOCKED), "
    "p AS (SELECT * FROM w UNION ALL SELECT * FROM r UNION ALL SELECT * FROM h "
    "ORDER BY place, created_at LIMIT ?) "
    # Every row of ``p`` is tried (no LIMIT out here), so no lock is taken and lost;
    # CASE fixes the order: the slot first, then the session, or else the slot goes
    # back. Only CASE: the planner folds ``unlock(...) AND false`` to ``false`` and
    # never calls the unlock (it did, and a claim that lost a session to another
    # kept its slot, holding the tenant under its cap until the worker stopped).
    # The session and the turn are looked up row by row, by primary key (LATERAL,
    # and LIMIT so the planner cannot flatten them into a join): a join left to the
    # planner read and sorted every turn in the table when it planned on statistics
    # from when the table was small (a prepared plan is kept until the table is next
    # analyzed): 20 ms a claim at 4,000 turns, and growing.
    f"SELECT p.session_id, s.agent, {TURN_COLUMNS_T}, p.key, p.slot FROM p "
    "CROSS JOIN LATERAL (SELECT s0.agent FROM turnkit_sessions s0 "
    "WHERE s0.session_id = p.session_id LIMIT 1) s "
    "LEFT JOIN LATERAL (SELECT * FROM turnkit_turns t0 "
    "WHERE t0.session_id = p.session_id AND t0.turn_id = p.turn_id LIMIT 1) t ON true "
    "WHERE CASE WHEN p.slot IS NULL THEN pg_try_advisory_lock(turnkit_lock_key(p.session_id)) "
    "WHEN pg_try_advisory_lock(p.key, p.slot) THEN CASE "
    "WHEN pg_try_advisory_lock(turnkit_lock_key(p.session_id)) THEN true "
    f"WHEN {SLOT_GIVEN_BACK} THEN false ELSE false END "
    "ELSE false END ORDER BY p.place, p.created_at"
)

#: Seconds a worker counts as alive after it last said so (it says so every
#: ``Worker``'s ``_SEEN_EVERY``), and after which a silent one's row is deleted.
WORKER_ALIVE = 30.0
WORKER_FORGOTTEN = 3600.0

#: A worker saying it is alive: its holder name, what it runs (``{agent: version}``
#: as JSON), the versions it serves (a JSON array, or NULL: all). The time is the
#: server's, so every node's liveness is read on one clock.
WORKER_SEEN_SQL = (
    "INSERT INTO turnkit_workers (holder, agents, serves, seen_at) VALUES "
    "(?, ?, ?, extract(epoch FROM clock_timestamp())::double precision) "
    "ON CONFLICT (holder) DO UPDATE SET agents = excluded.agents, serves = excluded.serves, "
    "seen_at = excluded.seen_at RETURNING holder"
)
#: A worker leaving (it stopped), and workers silent for long (they died), gone.
WORKER_GONE_SQL = (
    "DELETE FROM turnkit_workers WHERE holder = ? "
    "OR seen_at < extract(epoch FROM clock_timestamp())::double precision - ? RETURNING holder"
)
#: The turns waiting on a version no live worker serves, by agent and version: queued
#: or left running (or held, waiting for another version than the one that held it)
#: with no worker seen within the last ``?`` seconds running their agent and serving
#: their version. Turns recorded without a version are left out (every worker's).
UNSERVED_SQL = (
    "SELECT t.agent, t.version, count(*) FROM turnkit_turns t "
    "WHERE (t.status IN ('queued', 'running') "
    "OR (t.status = 'suspended' AND t.held_by IS NOT NULL AND t.cancel_reason IS NULL)) "
    "AND t.version IS NOT NULL AND NOT EXISTS (SELECT 1 FROM turnkit_workers w "
    "WHERE w.seen_at > extract(epoch FROM clock_timestamp())::double precision - ? "
    "AND (w.agents::json ->> t.agent) IS NOT NULL "
    "AND (w.serves IS NULL OR t.version IN (SELECT json_array_elements_text(w.serves::json))) "
    "AND (t.held_by IS NULL "
    "OR NOT ((w.agents::json ->> t.agent) = ANY (string_to_array(t.held_by, ','))))) "
    "GROUP BY t.agent, t.version ORDER BY t.agent, t.version"
)

#: The workers seen within the last ``?`` seconds (the console's live view).
LIVE_WORKERS_SQL = (
    "SELECT holder, agents, serves, seen_at FROM turnkit_workers "
    "WHERE seen_at > extract(epoch FROM clock_timestamp())::double precision - ? "
    "ORDER BY holder"
)
#: The oldest ``?`` running turns (from the partial index on running turns), each
#: with the process that last took its session's writer lock.
HELD_SESSIONS_SQL = (
    "SELECT t.session_id, t.turn_id, t.agent, t.tenant, w.holder, w.since "
    "FROM turnkit_turns t LEFT JOIN turnkit_writers w ON w.session_id = t.session_id "
    "WHERE t.status = 'running' ORDER BY t.created_at LIMIT ?"
)
#: Which of a page of sessions (a JSON array) have a turn of a tenant.
SESSIONS_OF_TENANT_SQL = (
    "SELECT DISTINCT session_id FROM turnkit_turns WHERE tenant = ? "
    "AND session_id IN (SELECT json_array_elements_text(?::json))"
)
#: Which process wrote each logged event of a session (where it is known).
EVENT_WRITERS_SQL = (
    "SELECT seq, holder FROM turnkit_events WHERE session_id = ? AND holder IS NOT NULL"
)

#: Sent inside a commit that makes a turn runnable (a submission, a resume, a
#: cancellation of a parked turn): delivered when, and only if, it commits. The
#: channel is a parameter: the schema qualifier ``pg`` puts on turnkit's names
#: would otherwise rename it.
WAKE_SQL = "SELECT pg_notify(?, ?)"
