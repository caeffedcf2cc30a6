"""Where each tenant lives and where each session was placed: the directory of a
deployment over several cells, kept in one of them (the home cell).

A tenant is pinned to a cell the first time one of its sessions is placed (by the
app's placement function), and stays there until a move changes it; a session is
placed once, in its tenant's cell, and follows its tenant's moves. Every process
reads the directory and keeps what it read for ``refresh`` seconds at most.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from psycopg_pool import AsyncConnectionPool

#: Picks a new tenant's cell from the cells' names.
Placement = Callable[[str], str]


def stable_hash(cells: Sequence[str]) -> Placement:
    """The default placement: rendezvous hashing of the tenant over the cells' names.

    Every process computes the same cell for a tenant without asking anyone, and
    adding a cell changes the choice for about one new tenant in ``len(cells) + 1``
    only (tenants already placed stay where the directory pinned them anyway)."""
    names = tuple(cells)

    def place(tenant: str) -> str:
        return max(names, key=lambda cell: hashlib.sha256(f"{cell}\0{tenant}".encode()).digest())

    return place


#: Pin the tenant where the placement puts it, unless it lives somewhere already;
#: place the session in its tenant's cell, unless it was placed already; read back
#: where it is. Parameters: tenant, cell; session, tenant, tenant; session.
_PIN = (
    "INSERT INTO turnkit_cell_tenants (tenant, cell) VALUES (%s, %s) "
    "ON CONFLICT (tenant) DO NOTHING"
)
_PLACE = (
    "INSERT INTO turnkit_cell_sessions (session_id, tenant, cell) "
    "SELECT %s, %s, cell FROM turnkit_cell_tenants WHERE tenant = %s "
    "ON CONFLICT (session_id) DO NOTHING"
)
_WHERE = "SELECT cell FROM turnkit_cell_sessions WHERE session_id = %s"


class Directory:
    """The home cell's directory, read through ``pool`` and cached per session."""

    def __init__(self, pool: Callable[[], AsyncConnectionPool[Any]], refresh: float) -> None:
        self._pool = pool
        self._refresh = refresh
        self._cached: dict[str, tuple[str | None, float]] = {}

    def known(self, session_id: str) -> str | None:
        """The cell ``session_id`` was last seen in, however old (for hints only)."""
        found = self._cached.get(session_id)
        return found[0] if found is not None else None

    def saw(self, session_id: str, cell: str) -> None:
        """Note that ``cell`` just handed out ``session_id`` (a claim found it there)."""
        self._cached[session_id] = (cell, time.monotonic())

    def forget(self, session_id: str) -> None:
        """Read ``session_id``'s cell again next time (its tenant moved)."""
        self._cached.pop(session_id, None)

    async def cell_of(self, session_id: str) -> str | None:
        """The cell ``session_id`` was placed in (``None``: never placed)."""
        found = self._cached.get(session_id)
        if found is not None and time.monotonic() - found[1] < self._refresh:
            return found[0]
        async with self._pool().connection() as conn:
            row = await (await conn.execute(_WHERE, (session_id,))).fetchone()
        cell = None if row is None else str(row[0])
        self._cached[session_id] = (cell, time.monotonic())
        return cell

    async def place(self, session_id: str, tenant: str, default: str) -> str:
        """Place ``session_id`` in ``tenant``'s cell (pinning the tenant to ``default``
        if it lives nowhere yet), unless it was placed already; its cell."""
        found = self._cached.get(session_id)
        if found is not None and found[0] is not None:
            return found[0]
        async with self._pool().connection() as conn, conn.transaction():
            await conn.execute(_PIN, (tenant, default))
            await conn.execute(_PLACE, (session_id, tenant, tenant))
            row = await (await conn.execute(_WHERE, (session_id,))).fetchone()
        assert row is not None  # placed by this transaction or an earlier one
        cell = str(row[0])
        self._cached[session_id] = (cell, time.monotonic())
        return cell

    async def adopt(self, session_id: str, tenant: str, cell: str) -> str:
        """Record that ``session_id`` already lives in ``cell`` (it was stored there
        before the directory knew it: a database that became a cell); its cell."""
        async with self._pool().connection() as conn, conn.transaction():
            await conn.execute(
                "INSERT INTO turnkit_cell_sessions (session_id, tenant, cell) "
                "VALUES (%s, %s, %s) ON CONFLICT (session_id) DO NOTHING",
                (session_id, tenant, cell),
            )
            row = await (await conn.execute(_WHERE, (session_id,))).fetchone()
        assert row is not None
        placed = str(row[0])
        self._cached[session_id] = (placed, time.monotonic())
        return placed

    async def cells_of(self, session_ids: Sequence[str]) -> dict[str, str]:
        """The cells ``session_ids`` were placed in (those never placed are left out)."""
        if not session_ids:
            return {}
        async with self._pool().connection() as conn:
            cur = await conn.execute(
                "SELECT session_id, cell FROM turnkit_cell_sessions WHERE session_id = ANY(%b)",
                (list(session_ids),),
            )
            rows = await cur.fetchall()
        return {str(s): str(c) for s, c in rows}

    async def layout(self) -> Layout:
        """Where every tenant and how many sessions live, and the moves under way."""
        async with self._pool().connection() as conn:
            cur = await conn.execute("SELECT tenant, cell FROM turnkit_cell_tenants ORDER BY 1")
            tenants = {str(t): str(c) for t, c in await cur.fetchall()}
            cur = await conn.execute(
                "SELECT cell, count(*) FROM turnkit_cell_sessions GROUP BY cell ORDER BY 1"
            )
            sessions = {str(c): int(n) for c, n in await cur.fetchall()}
            cur = await conn.execute(
                "SELECT tenant, source, target, stage FROM turnkit_cell_moves ORDER BY 1"
            )
            moves = [MoveUnderWay(*map(str, row)) for row in await cur.fetchall()]
        return Layout(tenants, sessions, moves)


@dataclass(frozen=True)
class MoveUnderWay:
    """A tenant's move that has not finished: where from and to, and how far it got
    (``draining``, ``copying`` or ``switched``)."""

    tenant: str
    source: str
    target: str
    stage: str


@dataclass(frozen=True)
class Layout:
    """What the directory says: each tenant's cell, each cell's count of sessions
    placed through it, and the moves under way."""

    tenants: dict[str, str]
    sessions: dict[str, int]
    moves: list[MoveUnderWay]
