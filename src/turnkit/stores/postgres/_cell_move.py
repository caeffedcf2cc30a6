"""Moving a tenant between cells: drain, copy, verify, switch, clear.

1. **Drain.** The target fences the tenant as arriving and the source as draining:
   from then on no claim takes its queued or parked turns and no new turn of it is
   stored in either cell (the turn rows refuse it, see schema v25), while the turns
   it has running finish. Once none runs, the source fence closes completely.
2. **Copy.** Every session the directory places in the source for the tenant, with
   every row keyed by it (live and archived generations, turns, steps, events,
   blobs, the session's usage row), is written into the target, one transaction per
   session that first deletes what an earlier try left there; then the tenant's
   usage totals, once per move (the target records the move's id with them).
3. **Verify.** Each session's rows are read back from both cells and compared.
4. **Switch.** The directory moves the tenant and its sessions to the target in one
   transaction; the target's fence is lifted, the source's stays, naming the target.
5. **Clear.** The source's copies are deleted.

The move's stage is kept in the home cell's ``turnkit_cell_moves``, and every step
can be run again, so a move that stopped anywhere (a crash, a drain that timed out)
is finished by starting it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from ..._errors import ConfigurationError, StoreError
from .._usage_sql import session_bucket
from ._cells import Cells

#: Tables keyed by session that a move leaves behind: the writer lease (the target
#: makes its own) and the directory (which the switch updates).
_NOT_COPIED = frozenset({"turnkit_writers", "turnkit_cell_sessions"})
#: How often the drain looks for turns still running.
_DRAIN_POLL = 0.2

#: Tells what a move does, step by step (the CLI prints it).
Progress = Callable[[str], None]


@dataclass(frozen=True)
class Moved:
    """What a finished move did: the cells, and the sessions it carried."""

    tenant: str
    source: str
    target: str
    sessions: int


@dataclass(frozen=True)
class _Move:
    tenant: str
    source: str
    target: str
    stage: str
    move_id: str


async def move_tenant(
    cells: Cells,
    tenant: str,
    target: str,
    *,
    drain_timeout: float = 60.0,
    progress: Progress = lambda line: None,
) -> Moved:
    """Move ``tenant`` (with all its sessions) to cell ``target``, or finish the move
    of it that was started before; see the module for the steps."""
    if target not in cells.cells:
        raise ConfigurationError(f"no cell {target!r}: the cells are {sorted(cells.cells)}")
    home = cells.cells[cells.home]
    async with _moving(home.async_pool, home.schema, tenant):
        return await _move(cells, tenant, target, drain_timeout, progress)


@asynccontextmanager
async def _moving(pool: AsyncConnectionPool[Any], schema: str, tenant: str) -> AsyncIterator[None]:
    """Hold the tenant's move lock (a session advisory lock in the home cell) for the
    move: a second move of the same tenant is refused instead of racing this one.
    Advisory locks are database-wide, so the key names the home cell's schema too:
    two deployments sharing a database each move their own tenant of that name."""
    async with pool.connection() as conn:
        key = "SELECT hashtextextended('turnkit/cell-move/' || %s || '/' || %s, 0)"
        cur = await conn.execute(f"SELECT pg_try_advisory_lock(({key}))", (schema, tenant))
        row = await cur.fetchone()
        if row is None or not row[0]:
            raise StoreError(f"tenant {tenant!r} is being moved by another process right now")
        try:
            yield
        finally:
            with contextlib.suppress(psycopg.Error):  # a lost connection lost the lock too
                await conn.execute(f"SELECT pg_advisory_unlock(({key}))", (schema, tenant))


async def _move(
    cells: Cells, tenant: str, target: str, drain_timeout: float, progress: Progress
) -> Moved:
    move = await _begin(cells, tenant, target)
    if move is None:
        progress(f"tenant {tenant!r} is in cell {target!r} already")
        return Moved(tenant, target, target, 0)
    source, home = cells.cells[move.source].async_pool, cells.cells[cells.home].async_pool
    goal = cells.cells[move.target].async_pool
    if move.stage == "draining":
        await _fence(goal, tenant, "arriving", move.source)
        await _fence(source, tenant, "draining", move.target, keep=True)
        progress(f"draining tenant {tenant!r} in cell {move.source!r}")
        await _drained(source, tenant, drain_timeout)
        await _fence(source, tenant, "frozen", move.target)
        move = await _stage(home, move, "copying")
    sessions = await _sessions(cells, move)
    if move.stage == "copying":
        tables = await _tables(source, goal)
        for sid in sessions:
            await _copy(source, goal, tables, tenant, sid)
            progress(f"copied session {sid}")
        await _copy_totals(source, goal, move)
        for sid in sessions:
            await _verify(source, goal, tables, sid)
        progress(f"verified {len(sessions)} sessions in cell {move.target!r}")
        move = await _switch(home, move)
        progress(f"tenant {tenant!r} now lives in cell {move.target!r}")
    await _unfence(goal, tenant)
    for sid in sessions:
        cells.directory.forget(sid)
    tables = await _tables(source, goal)
    for sid in sessions:
        await _delete(source, tables, tenant, sid)
    await _delete_totals(source, tenant)
    async with home.connection() as conn:
        await conn.execute("DELETE FROM turnkit_cell_moves WHERE tenant = %s", (tenant,))
    progress(f"cleared {len(sessions)} sessions from cell {move.source!r}")
    return Moved(tenant, move.source, move.target, len(sessions))


async def _begin(cells: Cells, tenant: str, target: str) -> _Move | None:
    """The move under way for ``tenant``, or a new one (``None``: nothing to move)."""
    async with cells.cells[cells.home].async_pool.connection() as conn, conn.transaction():
        cur = await conn.execute(
            "SELECT source, target, stage, move_id FROM turnkit_cell_moves "
            "WHERE tenant = %s FOR UPDATE",
            (tenant,),
        )
        row = await cur.fetchone()
        if row is not None:
            if row[1] != target:
                raise ConfigurationError(
                    f"tenant {tenant!r} is being moved to cell {row[1]!r}: finish that move "
                    f"first (turnkit cells move {tenant} --to {row[1]})"
                )
            return _Move(tenant, str(row[0]), str(row[1]), str(row[2]), str(row[3]))
        cur = await conn.execute(
            "SELECT cell FROM turnkit_cell_tenants WHERE tenant = %s FOR UPDATE", (tenant,)
        )
        lives = await cur.fetchone()
        if lives is None:  # never placed: it starts in the target
            await conn.execute(
                "INSERT INTO turnkit_cell_tenants (tenant, cell) VALUES (%s, %s)", (tenant, target)
            )
            return None
        if lives[0] == target:
            return None
        move = _Move(tenant, str(lives[0]), target, "draining", uuid.uuid4().hex)
        await conn.execute(
            "INSERT INTO turnkit_cell_moves (tenant, source, target, stage, move_id) "
            "VALUES (%s, %s, %s, %s, %s)",
            (tenant, move.source, move.target, move.stage, move.move_id),
        )
        return move


async def _fence(
    pool: AsyncConnectionPool[Any], tenant: str, state: str, cell: str, *, keep: bool = False
) -> None:
    """Fence ``tenant`` in a cell (``keep``: leave a fence already there as it is)."""
    conflict = "NOTHING" if keep else "UPDATE SET state = excluded.state, cell = excluded.cell"
    async with pool.connection() as conn:
        await conn.execute(
            "INSERT INTO turnkit_cell_fences (tenant, state, cell) VALUES (%s, %s, %s) "
            f"ON CONFLICT (tenant) DO {conflict}",
            (tenant, state, cell),
        )


async def _unfence(pool: AsyncConnectionPool[Any], tenant: str) -> None:
    async with pool.connection() as conn:
        await conn.execute(
            "DELETE FROM turnkit_cell_fences WHERE tenant = %s AND state = 'arriving'", (tenant,)
        )
        await conn.execute("SELECT pg_notify('turnkit_queue', current_schema())")


async def _drained(pool: AsyncConnectionPool[Any], tenant: str, timeout: float) -> None:
    """Return once no turn of ``tenant`` runs in the cell, or fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        async with pool.connection() as conn:
            cur = await conn.execute(
                "SELECT turn_id FROM turnkit_turns WHERE tenant = %s AND status = 'running' "
                "ORDER BY created_at LIMIT 5",
                (tenant,),
            )
            running = [str(r[0]) for r in await cur.fetchall()]
        if not running:
            return
        if time.monotonic() > deadline:
            raise StoreError(
                f"tenant {tenant!r} still has turns running after {timeout:g} s "
                f"({', '.join(running)}, ...); its new turns are held while it drains: "
                "run the move again to go on waiting"
            )
        await asyncio.sleep(_DRAIN_POLL)


async def _stage(pool: AsyncConnectionPool[Any], move: _Move, stage: str) -> _Move:
    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE turnkit_cell_moves SET stage = %s WHERE tenant = %s", (stage, move.tenant)
        )
    return _Move(move.tenant, move.source, move.target, stage, move.move_id)


async def _sessions(cells: Cells, move: _Move) -> list[str]:
    """The tenant's sessions to carry (or, once switched, to clear from the source):
    those the directory places in the move's cell for the tenant. Sessions the
    source holds turns of that the directory never saw (stored there before it was
    a cell) are recorded first."""
    async with cells.cells[move.source].async_pool.connection() as conn:
        cur = await conn.execute(
            "SELECT DISTINCT session_id FROM turnkit_turns WHERE tenant = %s", (move.tenant,)
        )
        found = {str(r[0]) for r in await cur.fetchall()}
    home = cells.cells[cells.home].async_pool
    async with home.connection() as conn, conn.transaction():
        for sid in sorted(found):
            await conn.execute(
                "INSERT INTO turnkit_cell_sessions (session_id, tenant, cell) "
                "VALUES (%s, %s, %s) ON CONFLICT (session_id) DO NOTHING",
                (sid, move.tenant, move.source),
            )
        cell = move.source if move.stage != "switched" else move.target
        cur = await conn.execute(
            "SELECT session_id FROM turnkit_cell_sessions WHERE tenant = %s AND cell = %s",
            (move.tenant, cell),
        )
        return sorted(str(r[0]) for r in await cur.fetchall())


#: A table keyed by session and its columns, in the source's order.
Table = tuple[str, tuple[str, ...]]


async def _tables(
    source: AsyncConnectionPool[Any], target: AsyncConnectionPool[Any]
) -> list[Table]:
    """Every table of the cells' schema with a ``session_id`` column (all but those a
    move leaves), checked to have the same columns in both cells."""
    found = []
    for pool in (source, target):
        async with pool.connection() as conn:
            cur = await conn.execute(
                "SELECT c.table_name, array_agg(c.column_name::text ORDER BY c.ordinal_position) "
                "FROM information_schema.columns c WHERE c.table_schema = current_schema() "
                "AND c.table_name IN (SELECT table_name FROM information_schema.columns "
                "WHERE table_schema = current_schema() AND column_name = 'session_id') "
                "GROUP BY c.table_name ORDER BY c.table_name"
            )
            found.append(
                [(str(t), tuple(cols)) for t, cols in await cur.fetchall() if t not in _NOT_COPIED]
            )
    if found[0] != found[1]:
        raise StoreError(
            "the two cells' schemas differ (a migration ran in one only): "
            "run turnkit migrate on every cell, then the move again"
        )
    return found[0]


def _select(table: Table) -> sql.Composed:
    name, columns = table
    return sql.SQL("SELECT {} FROM {} WHERE session_id = %s ORDER BY {}").format(
        sql.SQL(", ").join(map(sql.Identifier, columns)),
        sql.Identifier(name),
        sql.SQL(", ").join(sql.Literal(n + 1) for n in range(len(columns))),
    )


_USAGE = (
    "SELECT tenant, bucket, input_tokens, output_tokens, cost, calls FROM turnkit_usage "
    "WHERE bucket = %s ORDER BY tenant"
)


async def _rows(conn: psycopg.AsyncConnection[Any], tables: Sequence[Table], sid: str) -> Any:
    """Everything ``sid`` has in the cell, table by table (and its usage row)."""
    out = []
    for table in tables:
        out.append(await (await conn.execute(_select(table), (sid,))).fetchall())
    out.append(await (await conn.execute(_USAGE, (session_bucket(sid),))).fetchall())
    return out


async def _copy(
    source: AsyncConnectionPool[Any],
    target: AsyncConnectionPool[Any],
    tables: Sequence[Table],
    tenant: str,
    sid: str,
) -> None:
    """Write ``sid``'s rows into the target in one transaction, replacing whatever an
    earlier try of the move left there."""
    async with source.connection() as conn:
        rows = await _rows(conn, tables, sid)
    async with target.connection() as conn, conn.transaction():
        await _mover(conn, tenant)
        await _clear(conn, tables, sid)
        for (name, columns), found in zip(tables, rows, strict=False):
            if not found:
                continue
            insert = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
                sql.Identifier(name),
                sql.SQL(", ").join(map(sql.Identifier, columns)),
                sql.SQL(", ").join(sql.Placeholder() * len(columns)),
            )
            async with conn.cursor() as cur:
                await cur.executemany(insert, found)
        async with conn.cursor() as cur:
            await cur.executemany(
                "INSERT INTO turnkit_usage (tenant, bucket, input_tokens, output_tokens, cost, "
                "calls) VALUES (%s, %s, %s, %s, %s, %s)",
                rows[-1],
            )


async def _mover(conn: psycopg.AsyncConnection[Any], tenant: str) -> None:
    """Let this transaction change the fenced tenant's turn rows (it is the move)."""
    await conn.execute("SELECT set_config('turnkit.cell_move', %s, true)", (tenant,))


async def _clear(conn: psycopg.AsyncConnection[Any], tables: Sequence[Table], sid: str) -> None:
    for name, _ in tables:
        query = sql.SQL("DELETE FROM {} WHERE session_id = %s").format(sql.Identifier(name))
        await conn.execute(query, (sid,))
    await conn.execute("DELETE FROM turnkit_usage WHERE bucket = %s", (session_bucket(sid),))


async def _copy_totals(
    source: AsyncConnectionPool[Any], target: AsyncConnectionPool[Any], move: _Move
) -> None:
    """Add the tenant's usage totals to the target's, once per move."""
    async with source.connection() as conn:
        cur = await conn.execute(
            "SELECT bucket, input_tokens, output_tokens, cost, calls FROM turnkit_usage "
            "WHERE tenant = %s AND bucket LIKE 't:%%'",
            (move.tenant,),
        )
        totals = await cur.fetchall()
    async with target.connection() as conn, conn.transaction():
        cur = await conn.execute(
            "INSERT INTO turnkit_cell_arrivals (move_id, tenant) VALUES (%s, %s) "
            "ON CONFLICT (move_id) DO NOTHING RETURNING move_id",
            (move.move_id, move.tenant),
        )
        if await cur.fetchone() is None:
            return  # added by an earlier try of this move
        for bucket, tokens_in, tokens_out, cost, calls in totals:
            await conn.execute(
                "INSERT INTO turnkit_usage AS u (tenant, bucket, input_tokens, output_tokens, "
                "cost, calls) VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (tenant, bucket) "
                "DO UPDATE SET input_tokens = u.input_tokens + excluded.input_tokens, "
                "output_tokens = u.output_tokens + excluded.output_tokens, "
                "cost = u.cost + excluded.cost, calls = u.calls + excluded.calls",
                (move.tenant, bucket, tokens_in, tokens_out, cost, calls),
            )


async def _verify(
    source: AsyncConnectionPool[Any],
    target: AsyncConnectionPool[Any],
    tables: Sequence[Table],
    sid: str,
) -> None:
    async with source.connection() as conn:
        here = await _rows(conn, tables, sid)
    async with target.connection() as conn:
        there = await _rows(conn, tables, sid)
    for (name, _), mine, theirs in zip([*tables, ("turnkit_usage", ())], here, there, strict=True):
        if mine != theirs:
            raise StoreError(
                f"session {sid}: {name} differs between the cells after the copy "
                f"({len(mine)} rows in the source, {len(theirs)} in the target); "
                "run the move again to copy it afresh"
            )


async def _switch(pool: AsyncConnectionPool[Any], move: _Move) -> _Move:
    """Point the directory at the target for the tenant and its sessions."""
    async with pool.connection() as conn, conn.transaction():
        await conn.execute(
            "UPDATE turnkit_cell_sessions SET cell = %s WHERE tenant = %s AND cell = %s",
            (move.target, move.tenant, move.source),
        )
        await conn.execute(
            "UPDATE turnkit_cell_tenants SET cell = %s WHERE tenant = %s",
            (move.target, move.tenant),
        )
        await conn.execute(
            "UPDATE turnkit_cell_moves SET stage = 'switched' WHERE tenant = %s", (move.tenant,)
        )
    return _Move(move.tenant, move.source, move.target, "switched", move.move_id)


async def _delete(
    pool: AsyncConnectionPool[Any], tables: Sequence[Table], tenant: str, sid: str
) -> None:
    async with pool.connection() as conn, conn.transaction():
        await _mover(conn, tenant)
        await _clear(conn, tables, sid)


async def _delete_totals(pool: AsyncConnectionPool[Any], tenant: str) -> None:
    async with pool.connection() as conn:
        await conn.execute(
            "DELETE FROM turnkit_usage WHERE tenant = %s AND bucket LIKE 't:%%'", (tenant,)
        )
